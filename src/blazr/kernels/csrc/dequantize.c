/* blazr kernels — ggml Q4_0 / Q4_1 / Q8_0 blocks (as a GGUF file stores them) to float32, at model load:
 * the tensors a model needs as float (a GGUF's token embedding table, a path without kernels).
 *
 * The C twin of loading/gguf.py's block dequantizers (torch), which reproduce `gguf.quants.dequantize` bit
 * for bit: the f16 scale (and min) widened to fp32, then one product (and one sum) per value, each rounded
 * on its own (the build passes -ffp-contract=off):
 *   q8_0: d·q       q4_0: d·(q − 8)       q4_1: d·q + m
 * with byte j of a 4-bit block holding element j (low nibble) and j + 16 (high nibble). Tested equal to both
 * (tests/test_quantize_kernel.py). One OpenMP chunk of rows per thread; plain loops the compiler vectorises.
 */
#include "blazr_kernels.h"

BLZ_INLINE float f16_field(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return blz_fp16_to_fp32(h);
}

static void dequantize_block(int kind, const uint8_t *restrict blk, float *restrict out) {
    const float d = f16_field(blk);
    if (kind == BLZ_Q8_0) {
        for (int j = 0; j < BLZ_QK; ++j) out[j] = d * (float)(int8_t)blk[2 + j];
    } else if (kind == BLZ_Q4_0) {
        for (int j = 0; j < BLZ_QK / 2; ++j) {
            out[j] = d * (float)((blk[2 + j] & 0x0F) - 8);
            out[j + 16] = d * (float)((blk[2 + j] >> 4) - 8);
        }
    } else {
        const float m = f16_field(blk + 2);
        for (int j = 0; j < BLZ_QK / 2; ++j) {
            out[j] = d * (float)(blk[4 + j] & 0x0F) + m;
            out[j + 16] = d * (float)(blk[4 + j] >> 4) + m;
        }
    }
}

/* Dequantize ggml-ordered blocks src (N rows of K/32 blocks of `kind`: BLZ_Q4_0 / Q4_1 / Q8_0, contiguous)
 * into dst, float32 [N, K]. */
BLZ_EXPORT int blz_dequantize_blocks(int kind, const uint8_t *src, int64_t N, int64_t K, float *dst,
                                     int nthreads) {
    int header = 0;
    const int bs = blz_block_bytes(kind, &header);
    if (!bs || N < 0 || K <= 0 || K % BLZ_QK) return BLZ_EINVAL;
    const int64_t nb = K / BLZ_QK;
#pragma omp parallel for schedule(static) num_threads(nthreads > 0 ? nthreads : 1)
    for (int64_t n = 0; n < N; ++n)
        for (int64_t b = 0; b < nb; ++b) dequantize_block(kind, src + (n * nb + b) * bs, dst + n * K + b * BLZ_QK);
    return BLZ_OK;
}
