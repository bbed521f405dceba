/* blazr kernels — repacking ggml-ordered Q4_0 / Q4_1 / Q8_0 blocks into the row-packed layout of the
 * block linear kernel (linear_q.c), at model load.
 *
 * The C twin of `pack_blocks_reference` (kernels/quant.py, whose module docstring describes the layout);
 * the two agree byte for byte (tests/test_pack.py). Rows go in groups of 16, the last group padded with zero
 * rows; a group is K/32 tiles, tile b holding block b of the group's 16 rows:
 *   [16 f16 d][16 f16 m, q4_1 only][quants: byte 4j + i of 64-byte chunk c = quant byte 4c + i of row j]
 * with q8_0's int8 values stored + 128 (xor 0x80; a padding row's quants therefore read 0x80 there). Plain
 * byte moves: the same code for every target, each OpenMP thread a contiguous share of the row groups (its
 * part of the output mapped first, `blz_populate`). `blz_pack_rows` takes each row by address instead (a
 * GGUF's fused, un-permuted or per-expert rows packed straight from the file's map, never gathered first).
 */
#include "blazr_kernels.h"

/* Bytes of one ggml block and of its per-row header (d, and m for q4_1); 0 for an unknown kind. */
int blz_block_bytes(int kind, int *header) {
    switch (kind) {
    case BLZ_Q4_0: *header = 2; return 18;
    case BLZ_Q4_1: *header = 4; return 20;
    case BLZ_Q8_0: *header = 2; return 34;
    default: return 0;
    }
}

/* One row (or a padding row when `src` is NULL) of a 16-row group into its place in every tile (also
 * quantize.c's last step). */
void blz_pack_row(const uint8_t *src, int64_t nb, int bs, int header, uint32_t flip, int j, uint8_t *group) {
    const int64_t tile = (int64_t)16 * bs;
    const int words = (bs - header) / 4; /* 4-byte quant words per row: 4 (4-bit kinds) or 8 (q8_0) */
    uint8_t *t = group;
    for (int64_t b = 0; b < nb; ++b, t += tile) {
        uint8_t *q = t + 16 * header;
        if (!src) {
            memset(t + 2 * j, 0, 2);
            if (header == 4) memset(t + 32 + 2 * j, 0, 2);
            for (int c = 0; c < words; ++c) memcpy(q + 64 * c + 4 * j, &flip, 4);
            continue;
        }
        const uint8_t *blk = src + b * bs;
        memcpy(t + 2 * j, blk, 2);
        if (header == 4) memcpy(t + 32 + 2 * j, blk + 2, 2);
        for (int c = 0; c < words; ++c) {
            uint32_t w;
            memcpy(&w, blk + header + 4 * c, 4);
            w ^= flip;
            memcpy(q + 64 * c + 4 * j, &w, 4);
        }
    }
}

/* Both entries below: row n of the source is at src + n · row bytes (contiguous) or at rows[n] (rows != NULL). */
static int pack(int kind, const uint8_t *src, const int64_t *rows, int64_t N, int64_t K, uint8_t *dst, int nthreads) {
    int header = 0;
    const int bs = blz_block_bytes(kind, &header);
    if (!bs || N < 0 || K <= 0 || K % BLZ_QK) return BLZ_EINVAL;
    const int64_t nb = K / BLZ_QK, row = nb * bs, G = (N + 15) / 16;
    const uint32_t flip = kind == BLZ_Q8_0 ? 0x80808080u : 0;
#pragma omp parallel num_threads(nthreads > 0 ? nthreads : 1)
    {
        int64_t lo, hi;
        blz_thread_share(G, &lo, &hi);
        blz_populate(dst + lo * 16 * row, (hi - lo) * 16 * row);
        for (int64_t g = lo; g < hi; ++g) {
            uint8_t *group = dst + g * 16 * row;
            for (int j = 0; j < 16; ++j) {
                const int64_t n = g * 16 + j;
                const uint8_t *at = n >= N ? NULL : rows ? (const uint8_t *)(intptr_t)rows[n] : src + n * row;
                blz_pack_row(at, nb, bs, header, flip, j, group);
            }
        }
    }
    return BLZ_OK;
}

/* Pack ggml-ordered blocks src (N rows of K/32 blocks, contiguous) of `kind` (BLZ_Q4_0 / Q4_1 / Q8_0) into
 * dst, uint8 [⌈N/16⌉, 16 · K/32 · block bytes], every byte written (padding rows included). */
BLZ_EXPORT int blz_pack_blocks(int kind, const uint8_t *src, int64_t N, int64_t K, uint8_t *dst, int nthreads) {
    return pack(kind, src, NULL, N, K, dst, nthreads);
}

/* blz_pack_blocks with each row found on its own: rows[n] is the address of row n's K/32 ggml blocks (rows
 * of a file's memory map, in any order — fused q|k|v or gate|up parts, llama.cpp's permuted q/k rows put
 * back, one expert's rows), so a fused or reordered weight is packed without first being gathered. */
BLZ_EXPORT int blz_pack_rows(int kind, const int64_t *rows, int64_t N, int64_t K, uint8_t *dst, int nthreads) {
    return pack(kind, NULL, rows, N, K, dst, nthreads);
}

/* Gather N rows of row_bytes bytes each, row n from address rows[n], into dst [N, row_bytes] (a weight kept
 * as stored whose rows do not lie in order in the file: fused q|k|v or gate|up parts, llama.cpp's permuted
 * q/k rows put back — F16 / BF16 and K-quant rows are used as they are, only moved). */
BLZ_EXPORT int blz_gather_rows(const int64_t *rows, int64_t N, int64_t row_bytes, uint8_t *dst, int nthreads) {
    if (N < 0 || row_bytes <= 0) return BLZ_EINVAL;
#pragma omp parallel num_threads(nthreads > 0 ? nthreads : 1)
    {
        int64_t lo, hi;
        blz_thread_share(N, &lo, &hi);
        blz_populate(dst + lo * row_bytes, (hi - lo) * row_bytes);
        for (int64_t n = lo; n < hi; ++n)
            memcpy(dst + n * row_bytes, (const uint8_t *)(intptr_t)rows[n], (size_t)row_bytes);
    }
    return BLZ_OK;
}
