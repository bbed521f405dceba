/* blazr kernels — float weights with their top byte coded in 4 bits (kinds BLZ_BF16Z, BLZ_F32Z): every bit of a
 * bf16 weight kept in 3/4 of the bytes, of an f32 weight in 7/8, so a decode step that reads its weights at the
 * memory's rate reads them 1.3× (bf16) or 1.14× (f32) faster.
 *
 * Why: a float decode step is a read of the weights. On a 2-vCPU Zen 5 both blazr's kernels and llama.cpp's
 * read them near the memory's rate (benchmarks/NOTES.md §53, §55), so no kernel of stored float weights can be
 * much faster than another. A weight's top byte is its sign and 7 of its 8 exponent bits, and weights use few
 * exponents: the 15 most frequent top bytes of a random N(0, σ²) row cover all but ~1e-4 of it.
 * So the top byte is a 4-bit code into a 16-entry table of the row; the rest of the bits are kept as they are;
 * the rare top bytes are kept whole in a short list (the escapes). Lossless: the kernels see the bits as
 * stored, and give the same bits as the stored kind's kernel on the same weight (linear_16bit.c's bf16,
 * linear_float.c's f32), at every row count and on every build. Cold one-row passes (2 threads, Zen 5): bf16z
 * 1.3-1.4× the weights a second of the bf16 kernel at the same GB/s.
 *
 * Layout of one row of K weights (K a multiple of 64 below 65536; row bytes blz_bz_row_bytes(K, f32)):
 * - bytes 0-15: the top byte of code c (c = 0: 0x00, also the escapes' placeholder); bytes 16-31: 0;
 * - cap = blz_bz_cap(K) escapes of 4 bytes: uint16 column, uint16 top 16 bits, by column, then 0xFFFF
 *   columns (at most cap − 1 used, so a 0xFFFF always ends the list);
 * - K/64 blocks of 96 bytes (f32z: 224): 64 bytes — the byte under the top one (bits 16-23 of an f32, 0-7 of
 *   a bf16) — at block position p, then 32 bytes of codes (code of position p: nibble p & 1 of byte p/2);
 *   f32z then the low 16 bits, 64 uint16 at blz_bz_low_at(p). Column j of a block is at position
 *   blz_bz_pos(j, f32): where the AVX-512 decode — codes looked up with vpshufb, bytes interleaved per 128-bit
 *   lane into top 16-bit words, then (bf16z) split into fp32 by a shift and a mask or (f32z) interleaved with
 *   the low words — leaves it in lane j % 16 of register j / 16. An escaped column has code 0; its top byte is
 *   or-ed into its lane before the lane is used.
 * The sums are the stored kind's (columns k..k+15 of each 32 into one accumulator, k+16..k+31 into the other,
 * in column order, then blz_quarters512 for bf16, f32's reduce for f32), so the bits are the stored kernel's:
 * decode (M ≤ 8) as streams of rows; prefill (more rows) by gemm_float.c's panel GEMM on 16 rows decoded at a
 * time into L2 (blz_bz_decode_rows) — f32's prefill GEMM's bits. AVX2 builds run the same steps on each half
 * of a block's bytes, which leaves columns 16·i + 8·h .. + 7 in one register (bz_half) — the 8 columns the
 * stored AVX2 kernels sum into one accumulator —, so there too the bits are the stored kernel's (one row as
 * the balanced walk, 2-8 rows as the stored kinds' AVX2 row tiles). The scalar build decodes the whole
 * weight and runs the stored kernel on it (tests; the loader codes weights only where a vector decode runs). */
#include "blazr_kernels.h"

#define BZ_PF 3072 /* prefetch distance of a row stream, in bytes (2048 weights, as the bf16 kernel's) */

/* Bytes of one block: 64 under the top bytes, 32 of codes, and for f32z 128 of the low 16 bits. */
BLZ_INLINE int64_t bz_block_bytes(const int f32) { return f32 ? 224 : 96; }

/* The top 16 bits (bf16z: all 16) of column j of the row at w (any build; the reference of the decode). */
static uint16_t bz_top(const uint8_t *w, int64_t K, int64_t j, const int f32) {
    const uint16_t *esc = (const uint16_t *)(w + 32);
    for (int64_t e = 0; e < blz_bz_cap(K) && esc[2 * e] != 0xFFFF; ++e)
        if (esc[2 * e] == j) return esc[2 * e + 1];
    const uint8_t *b = w + 32 + 4 * blz_bz_cap(K) + j / 64 * bz_block_bytes(f32);
    const int p = blz_bz_pos((int)(j % 64), f32), c = (b[64 + p / 2] >> (4 * (p & 1))) & 15;
    return (uint16_t)(w[c] << 8 | b[p]);
}

/* f32z: the low 16 bits of column j. */
static uint16_t bz_low(const uint8_t *w, int64_t K, int64_t j) {
    uint16_t v;
    memcpy(&v, w + 32 + 4 * blz_bz_cap(K) + j / 64 * 224 + blz_bz_low_at(blz_bz_pos((int)(j % 64), 1)), 2);
    return v;
}

/* The blocks of rows esc[r] / b[r], r < nr, each by STEP(patch): the blocks up to the rows' next escape run
 * without a test (STEP(0)), then that block with its escapes put in place (STEP(1)). */
#define BZ_BLOCKS(STEP)                                                                  \
    for (int64_t k = 0; k < K; k += 64) {                                                \
        int64_t stop = K; /* the first block holding an escape of one of the rows */     \
        _Pragma("GCC unroll 4") for (int r = 0; r < nr; ++r)                             \
            stop = blz_min(stop, (int64_t)(esc[r][0] & ~63));                            \
        for (; k < stop; k += 64) STEP(0);                                               \
        if (k < K) STEP(1);                                                              \
    }

/* With `pf`, a block's length of each row's bytes BZ_PF ahead fetched into L2. */
#define BZ_PREFETCH()                                                                    \
    _Pragma("GCC unroll 4") for (int r = 0; pf && r < nr; ++r) {                         \
        for (int64_t l = 0; l < bz_block_bytes(f32); l += 64)                            \
            _mm_prefetch((const char *)(b[r] + BZ_PF + l), _MM_HINT_T1);                 \
    }

#ifdef BLZ_AVX512
/* One block's 64 weights as fp32: f[i] lane l = column 16·i + l (escapes not yet in place: their top 16 bits
 * are 0). */
BLZ_INLINE void bz_block(const uint8_t *b, __m512i table, __m512 f[4], const int f32) {
    const __m512i lo = _mm512_loadu_si512(b);
    const __m512i cw = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(b + 64)));
    const __m512i c = _mm512_ternarylogic_epi32(cw, _mm512_slli_epi16(cw, 4), _mm512_set1_epi16(0x0f0f), 0xA8);
    const __m512i hi = _mm512_shuffle_epi8(table, c);
    const __m512i w0 = _mm512_unpacklo_epi8(lo, hi), w1 = _mm512_unpackhi_epi8(lo, hi);
    const __m512i top = _mm512_set1_epi32((int)0xffff0000);
    __m512i v[4];
    if (f32) { /* the low 16 bits beside: each dword (low word, top word), the words interleaved */
        const __m512i L0 = _mm512_loadu_si512(b + 96), L1 = _mm512_loadu_si512(b + 160);
        v[0] = _mm512_unpacklo_epi16(L0, w0), v[1] = _mm512_unpackhi_epi16(L0, w0);
        v[2] = _mm512_unpacklo_epi16(L1, w1), v[3] = _mm512_unpackhi_epi16(L1, w1);
    } else {
        v[0] = _mm512_slli_epi32(w0, 16), v[1] = _mm512_and_si512(w0, top);
        v[2] = _mm512_slli_epi32(w1, 16), v[3] = _mm512_and_si512(w1, top);
    }
    for (int i = 0; i < 4; ++i) f[i] = _mm512_castsi512_ps(v[i]);
}

/* The escapes of the block at column k put in their lanes (*esc: the row's next escape): their top 16 bits
 * or-ed in. Each register by a constant index, so that f stays in registers. */
BLZ_INLINE void bz_patch(const uint16_t **esc, int64_t k, __m512 f[4]) {
    for (const uint16_t *e = *esc; e[0] < k + 64; e += 2, *esc = e) {
        const int j = (int)(e[0] - k);
        const __m512i v = _mm512_set1_epi32((int)((uint32_t)e[1] << 16));
        for (int i = 0; i < 4; ++i) {
            const __mmask16 mk = (__mmask16)((j >> 4) == i ? 1u << (j & 15) : 0u);
            f[i] = _mm512_castsi512_ps(_mm512_mask_or_epi32(_mm512_castps_si512(f[i]), mk, _mm512_castps_si512(f[i]), v));
        }
    }
}

/* One block at column k of each row r < nr, decoded and summed into a[r][m] for m < nx; `patch`: the block may
 * hold escapes (else none of the rows has one there, and the loop has no branch — with one, GCC kept x's
 * vectors on the stack across it and the 4-row pass ran at half speed). */
#define BZ_STEP(patch)                                                                                     \
    do {                                                                                                   \
        BZ_PREFETCH();                                                                                     \
        _Pragma("GCC unroll 4") for (int r = 0; r < nr; ++r) {                                             \
            __m512 f[4];                                                                                   \
            bz_block(b[r], tab[r], f, f32);                                                                \
            if (patch) bz_patch(&esc[r], k, f);                                                            \
            b[r] += bz_block_bytes(f32);                                                                   \
            _Pragma("GCC unroll 4") for (int m = 0; m < nx; ++m) {                                         \
                a[r][m][0] = _mm512_fmadd_ps(f[0], _mm512_loadu_ps(xr[m] + k), a[r][m][0]);                \
                a[r][m][1] = _mm512_fmadd_ps(f[1], _mm512_loadu_ps(xr[m] + k + 16), a[r][m][1]);           \
                a[r][m][0] = _mm512_fmadd_ps(f[2], _mm512_loadu_ps(xr[m] + k + 32), a[r][m][0]);           \
                a[r][m][1] = _mm512_fmadd_ps(f[3], _mm512_loadu_ps(xr[m] + k + 48), a[r][m][1]);           \
            }                                                                                              \
        }                                                                                                  \
    } while (0)

/* res[r·nx + m] = row w[r] · x row xr[m] for r < nr, m < nx (nr · nx ≤ 8; constants after inlining): the sums
 * of linear_16bit.c's half_rows_simd (bf16z) or linear_float.c's f32_tile (f32z), in the same order — columns
 * k..k+15 of each 32 into one accumulator, k+16..k+31 into the other — and their final sums. The blocks up to
 * the rows' next escape run without a test, then that block with its escapes put in place. */
BLZ_INLINE void bz_rows_simd(const int nr, const int nx, const uint8_t *const *w, int64_t K, const float *const *xr,
                             float *res, const int pf, const int f32) {
    __m512 a[4][4][2];
    __m512i tab[4];
    const uint8_t *b[4];
    const uint16_t *esc[4];
#pragma GCC unroll 4
    for (int r = 0; r < nr; ++r) {
#pragma GCC unroll 4
        for (int m = 0; m < nx; ++m) a[r][m][0] = a[r][m][1] = _mm512_setzero_ps();
        tab[r] = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)w[r]));
        esc[r] = (const uint16_t *)(w[r] + 32);
        b[r] = w[r] + 32 + 4 * blz_bz_cap(K);
    }
    BZ_BLOCKS(BZ_STEP);
#pragma GCC unroll 4
    for (int r = 0; r < nr; ++r)
#pragma GCC unroll 4
        for (int m = 0; m < nx; ++m)
            res[r * nx + m] = f32 ? _mm512_reduce_add_ps(_mm512_add_ps(a[r][m][0], a[r][m][1]))
                                  : blz_quarters512(a[r][m][0], a[r][m][1]);
}

/* nr rows × mt ≤ 4 x rows, as blz_gemv_streams makes them: (1..4, 1) or (1..2, 2..4), as linear_16bit.c. */
BLZ_INLINE void bz_streams4(const int nr, const int mt, const void *const *rows, int64_t K, const float *xf,
                            float *res, const int f32) {
    const uint8_t *const *w = (const uint8_t *const *)rows;
    const float *xr[4] = {xf, xf + K, xf + 2 * K, xf + 3 * K};
#define BZ_NR(NX)                                                     \
    switch (nr) {                                                     \
        case 1: bz_rows_simd(1, NX, w, K, xr, res, 1, f32); return;    \
        case 2: bz_rows_simd(2, NX, w, K, xr, res, 1, f32); return;    \
    }
    switch (mt) {
        case 2: BZ_NR(2) break;
        case 3: BZ_NR(3) break;
        case 4: BZ_NR(4) break;
    }
#undef BZ_NR
#define BZ_ONE_X(NR, ...) bz_rows_simd(NR, 1, __VA_ARGS__)
    BLZ_TILE_SWITCH(BZ_ONE_X, nr, w, K, xr, res, 1, f32);
#undef BZ_ONE_X
}

/* blz_rows_fn of blz_gemv_streams: 5-8 x rows as rows 0-3 and then the rest against the same weight rows. */
BLZ_INLINE void bz_streams(const int nr, const int mt, const void *const *rows, int64_t K, const void *x, float *res,
                           const int f32) {
    const float *xf = (const float *)x;
    if (mt <= 4) {
        bz_streams4(nr, mt, rows, K, xf, res, f32);
        return;
    }
    float lo[2 * 4], hi[2 * 4];
    bz_streams4(nr, 4, rows, K, xf, lo, f32);
    bz_streams4(nr, mt - 4, rows, K, xf + 4 * K, hi, f32);
    blz_merge_passes(nr, mt, lo, hi, res);
}

static void bf16z_streams(const int nr, const int mt, const void *const *rows, int64_t K, const void *x, float *res) {
    bz_streams(nr, mt, rows, K, x, res, 0);
}

static void f32z_streams(const int nr, const int mt, const void *const *rows, int64_t K, const void *x, float *res) {
    bz_streams(nr, mt, rows, K, x, res, 1);
}
#elif defined(BLZ_AVX2)
/* Half h (0, 1) of one block's 64 weights as fp32: f[i] = columns 16·i + 8·h .. 16·i + 8·h + 7 — the AVX-512
 * decode's steps, each within a 128-bit lane, on half the bytes, so its register i's lanes 8h .. 8h + 7 (escapes
 * not yet in place: their top 16 bits are 0). */
BLZ_INLINE void bz_half(const uint8_t *b, const int h, __m256i table, __m256 f[4], const int f32) {
    const __m256i lo = _mm256_loadu_si256((const __m256i *)(b + 32 * h));
    const __m256i cw = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(b + 64 + 16 * h)));
    const __m256i c = _mm256_and_si256(_mm256_or_si256(cw, _mm256_slli_epi16(cw, 4)), _mm256_set1_epi16(0x0f0f));
    const __m256i hi = _mm256_shuffle_epi8(table, c);
    const __m256i w0 = _mm256_unpacklo_epi8(lo, hi), w1 = _mm256_unpackhi_epi8(lo, hi);
    __m256i v[4];
    if (f32) {
        const __m256i L0 = _mm256_loadu_si256((const __m256i *)(b + 96 + 32 * h));
        const __m256i L1 = _mm256_loadu_si256((const __m256i *)(b + 160 + 32 * h));
        v[0] = _mm256_unpacklo_epi16(L0, w0), v[1] = _mm256_unpackhi_epi16(L0, w0);
        v[2] = _mm256_unpacklo_epi16(L1, w1), v[3] = _mm256_unpackhi_epi16(L1, w1);
    } else {
        const __m256i top = _mm256_set1_epi32((int)0xffff0000);
        v[0] = _mm256_slli_epi32(w0, 16), v[1] = _mm256_and_si256(w0, top);
        v[2] = _mm256_slli_epi32(w1, 16), v[3] = _mm256_and_si256(w1, top);
    }
    for (int i = 0; i < 4; ++i) f[i] = _mm256_castsi256_ps(v[i]);
}

/* The escapes of the block at column k (e: the row's next one) that fall in half h put in their lanes. Each
 * register by a constant index, so that f stays in registers; the caller moves its escape pointer past the
 * block. */
BLZ_INLINE void bz_patch_half(const uint16_t *e, int64_t k, const int h, __m256 f[4]) {
    for (; e[0] < k + 64; e += 2) {
        const int j = (int)(e[0] - k);
        if ((j >> 3 & 1) != h) continue;
        const __m256i at = _mm256_cmpeq_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(j & 7));
        const __m256i v = _mm256_and_si256(at, _mm256_set1_epi32((int)((uint32_t)e[1] << 16)));
        for (int i = 0; i < 4; ++i)
            if (j >> 4 == i) f[i] = _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(f[i]), v));
    }
}

/* One block at column k of each row r < nr, decoded a half at a time and summed into a[r][m] for m < nx: bf16z
 * columns 8q .. 8q + 7 of each 32 into quarter q (linear_16bit.c's AVX2 rows), f32z columns k .. k + 7 of each
 * 16 into a[.][.][0], k + 8 .. k + 15 into [1] (linear_float.c's AVX2 f32_tile). */
#define BZ_STEP2(patch)                                                                                    \
    do {                                                                                                   \
        BZ_PREFETCH();                                                                                     \
        _Pragma("GCC unroll 4") for (int r = 0; r < nr; ++r) {                                             \
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h) {                                          \
                __m256 f[4];                                                                               \
                bz_half(b[r], h, tab[r], f, f32);                                                          \
                if (patch) bz_patch_half(esc[r], k, h, f);                                                 \
                _Pragma("GCC unroll 4") for (int m = 0; m < nx; ++m) {                                     \
                    _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i) {                                  \
                        const int q = f32 ? h : 2 * (i & 1) + h;                                           \
                        a[r][m][q] = _mm256_fmadd_ps(f[i], _mm256_loadu_ps(xr[m] + k + 16 * i + 8 * h),    \
                                                     a[r][m][q]);                                          \
                    }                                                                                      \
                }                                                                                          \
            }                                                                                              \
            if (patch)                                                                                     \
                while (esc[r][0] < k + 64) esc[r] += 2;                                                    \
            b[r] += bz_block_bytes(f32);                                                                   \
        }                                                                                                  \
    } while (0)

/* res[r·nx + m] = row w[r] · x row xr[m] for r < nr, m < nx (constants after inlining; (1..4, 1) or (1, 1..4)):
 * the stored AVX2 kernels' sums in their order, and their final sums (blz_quarters256, f32's blz_hsum256). */
BLZ_INLINE void bz_rows_simd(const int nr, const int nx, const uint8_t *const *w, int64_t K, const float *const *xr,
                             float *res, const int pf, const int f32) {
    __m256 a[4][4][4];
    __m256i tab[4];
    const uint8_t *b[4];
    const uint16_t *esc[4];
#pragma GCC unroll 4
    for (int r = 0; r < nr; ++r) {
#pragma GCC unroll 4
        for (int m = 0; m < nx; ++m)
            for (int q = 0; q < 4; ++q) a[r][m][q] = _mm256_setzero_ps();
        tab[r] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)w[r]));
        esc[r] = (const uint16_t *)(w[r] + 32);
        b[r] = w[r] + 32 + 4 * blz_bz_cap(K);
    }
    BZ_BLOCKS(BZ_STEP2);
#pragma GCC unroll 4
    for (int r = 0; r < nr; ++r)
#pragma GCC unroll 4
        for (int m = 0; m < nx; ++m)
            res[r * nx + m] = f32 ? blz_hsum256(_mm256_add_ps(a[r][m][0], a[r][m][1]))
                                  : blz_quarters256(a[r][m][0], a[r][m][1], a[r][m][2], a[r][m][3]);
}

/* blz_rows_fn of blz_gemv_streams for one x row: nr ≤ BLZ_STREAMS weight rows at once. */
BLZ_INLINE void bz_streams1(const int nr, const void *const *rows, int64_t K, const void *x, float *res,
                            const int f32) {
    const uint8_t *const *w = (const uint8_t *const *)rows;
    const float *xr[1] = {(const float *)x};
#define BZ_ONE_X(NR, ...) bz_rows_simd(NR, 1, __VA_ARGS__)
    BLZ_TILE_SWITCH(BZ_ONE_X, nr, w, K, xr, res, 1, f32);
#undef BZ_ONE_X
}

static void bf16z_streams(const int nr, const int mt, const void *const *rows, int64_t K, const void *x, float *res) {
    (void)mt; /* one x row */
    bz_streams1(nr, rows, K, x, res, 0);
}

static void f32z_streams(const int nr, const int mt, const void *const *rows, int64_t K, const void *x, float *res) {
    (void)mt;
    bz_streams1(nr, rows, K, x, res, 1);
}

/* Weight row w against x rows x[m·K], m < mt ≤ BZ_MX(f32) (each weight decoded once for them): res[m]. */
#define BZ_MX(f32) ((f32) ? 4 : 2) /* x rows of a pass: bf16z's 4 accumulators a pair fill 8 of 16 registers at 2 */
BLZ_INLINE void bz_row(const int mt, const uint8_t *w, int64_t K, const float *x, float *res, const int f32) {
    const float *xr[4] = {x, x + K, x + 2 * K, x + 3 * K};
    const uint8_t *wr[1] = {w};
#define BZ_X(NX, ...) bz_rows_simd(1, NX, __VA_ARGS__)
    if (f32) {
        BLZ_TILE_SWITCH(BZ_X, mt, wr, K, xr, res, 1, 1);
    } else if (mt == 1) {
        bz_rows_simd(1, 1, wr, K, xr, res, 1, 0);
    } else {
        bz_rows_simd(1, 2, wr, K, xr, res, 1, 0);
    }
#undef BZ_X
}
#endif

/* Rows n0 .. n0 + nr − 1 decoded: dst[(n − n0)·K + j] = the weight of row n, column j — bf16 bits (uint16) for
 * bf16z, fp32 (float) for f32z, or fp32 for both when `wide`. */
BLZ_INLINE void bz_decode_rows(const uint8_t *w, int64_t K, int64_t n0, int64_t nr, void *dst, int f32, int wide) {
    const int64_t rb = blz_bz_row_bytes(K, f32);
    for (int64_t n = n0; n < n0 + nr; ++n) {
        const uint8_t *row = w + n * rb;
#ifdef BLZ_AVX512
        const __m512i tab = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)row));
        const uint16_t *esc = (const uint16_t *)(row + 32);
        const uint8_t *b = row + 32 + 4 * blz_bz_cap(K);
        for (int64_t k = 0; k < K; k += 64, b += bz_block_bytes(f32)) {
            __m512 f[4];
            bz_block(b, tab, f, f32);
            if (esc[0] < k + 64) bz_patch(&esc, k, f);
            for (int i = 0; i < 4; ++i)
                if (f32 || wide)
                    _mm512_storeu_ps((float *)dst + (n - n0) * K + k + 16 * i, f[i]);
                else
                    _mm256_storeu_si256((__m256i *)((uint16_t *)dst + (n - n0) * K + k + 16 * i),
                                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(f[i]), 16)));
        }
#elif defined(BLZ_AVX2)
        const __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)row));
        const uint16_t *esc = (const uint16_t *)(row + 32);
        const uint8_t *b = row + 32 + 4 * blz_bz_cap(K);
        for (int64_t k = 0; k < K; k += 64, b += bz_block_bytes(f32)) {
            for (int h = 0; h < 2; ++h) {
                __m256 f[4];
                bz_half(b, h, tab, f, f32);
                if (esc[0] < k + 64) bz_patch_half(esc, k, h, f);
                for (int i = 0; i < 4; ++i) {
                    const int64_t at = (n - n0) * K + k + 16 * i + 8 * h;
                    if (f32 || wide) {
                        _mm256_storeu_ps((float *)dst + at, f[i]);
                    } else {
                        const __m256i t = _mm256_srli_epi32(_mm256_castps_si256(f[i]), 16);
                        _mm_storeu_si128((__m128i *)((uint16_t *)dst + at),
                                         _mm_packus_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1)));
                    }
                }
            }
            while (esc[0] < k + 64) esc += 2;
        }
#else
        for (int64_t j = 0; j < K; ++j) {
            const uint16_t t = bz_top(row, K, j, f32);
            if (f32 || wide) {
                const uint32_t bits = (uint32_t)t << 16 | (f32 ? bz_low(row, K, j) : 0);
                memcpy((float *)dst + (n - n0) * K + j, &bits, 4);
            } else {
                ((uint16_t *)dst)[(n - n0) * K + j] = t;
            }
        }
#endif
    }
}

void blz_bz_decode_rows(const uint8_t *w, int64_t K, int64_t n0, int64_t nr, void *dst, int f32) {
    bz_decode_rows(w, K, n0, nr, dst, f32, 0);
}

void blz_bz_decode_rows_f32(const uint8_t *w, int64_t K, int64_t n0, int64_t nr, float *dst, int f32) {
    bz_decode_rows(w, K, n0, nr, dst, f32, 1);
}

/* x [M, K] fp32, w [N] coded rows of blz_bz_row_bytes(K, f32): the result of the stored kind's kernel (bit for
 * bit) on the decoded weight — blz_linear_bf16's, or blz_linear_f32_gemm's with a prefill call's GEMM past 8
 * rows. */
int blz_linear_coded(const int f32, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N,
                     const float *bias, const float *residual, float *out, int swiglu, int nthreads) {
    if (M < 0 || N < 0 || K <= 0 || K % 64 || K >= 65536 || (swiglu && (N % 2 || residual))) return BLZ_EINVAL;
    if (M == 0 || N == 0) return BLZ_OK;
    const int nt = blz_threads(nthreads, M * N * K, BLZ_LINEAR_PARALLEL_MIN);
#ifdef BLZ_AVX512
    if (M <= 8) {
        blz_team_t team;
        blz_team_init(&team, nt, swiglu ? N / 2 : N, blz_gemv_parts(BLZ_TUNE_STREAMS_Z, (int)M, swiglu));
#pragma omp parallel num_threads(nt)
        blz_gemv_streams(f32 ? f32z_streams : bf16z_streams, w, NULL, blz_bz_row_bytes(K, f32), K, x, (int)M, N,
                         bias, residual, out, swiglu, &team);
        return BLZ_OK;
    }
#elif defined(BLZ_AVX2)
    const int64_t nout = swiglu ? N / 2 : N;
    if (M == 1) {
        blz_team_t team;
        blz_team_init(&team, nt, nout, blz_gemv_parts(BLZ_TUNE_STREAMS_Z, 1, swiglu));
#pragma omp parallel num_threads(nt)
        blz_gemv_streams(f32 ? f32z_streams : bf16z_streams, w, NULL, blz_bz_row_bytes(K, f32), K, x, 1, N, bias,
                         residual, out, swiglu, &team);
        return BLZ_OK;
    }
    if (M <= 8) { /* the stored kinds' AVX2 form: each weight row against BZ_MX x rows at a time */
        const int64_t rb = blz_bz_row_bytes(K, f32);
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t n = 0; n < nout; ++n)
            for (int64_t m0 = 0; m0 < M; m0 += BZ_MX(f32)) {
                const int mt = (int)blz_min(BZ_MX(f32), M - m0);
                float r[4], g[4];
                bz_row(mt, w + n * rb, K, x + m0 * K, r, f32);
                if (swiglu) bz_row(mt, w + (n + nout) * rb, K, x + m0 * K, g, f32);
                blz_epilogue(r, g, mt, m0, n, N, nout, bias, residual, out, swiglu);
            }
        return BLZ_OK;
    }
#endif
#ifdef BLZ_AVX2 /* AVX-512 builds too: more rows on the panel GEMM, rows decoded into L2 16 at a time */
    return blz_panel_gemm(w, NULL, f32 ? BLZ_PANEL_F32Z : BLZ_PANEL_BF16Z, x, M, K, N, bias, residual, out, swiglu,
                          nt);
#else
    const size_t esize = f32 ? sizeof(float) : sizeof(uint16_t);
    /* slot 3: slot 1 holds the buffers of a kernel that calls this one (moe.c's routed rows, coded experts) */
    uint8_t *dec = blz_scratch_slot(3, (size_t)(N * K) * esize);
    if (!dec) return BLZ_ENOMEM;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t n = 0; n < N; ++n) blz_bz_decode_rows(w, K, n, 1, dec + (size_t)(n * K) * esize, f32);
    if (f32)
        return blz_linear_f32_gemm(x, M, K, (const float *)dec, N, bias, residual, out, swiglu, nthreads, M > 8);
    return blz_linear_bf16(x, M, K, (const uint16_t *)dec, N, bias, residual, out, swiglu, nthreads);
#endif
}

/* Code the rows w [N, K] (bf16 bits, or f32 when `f32`) into out (N rows of blz_bz_row_bytes(K, f32)): each
 * row's table its 15 most frequent non-zero top bytes (the lower first on ties) beside 0x00. Returns the number of rows with more than cap − 1 escapes (0: out holds
 * the weight; else the weight is not codable, out's contents unspecified), or BLZ_EINVAL for a K the layout
 * cannot hold. */
BLZ_EXPORT int64_t blz_pack_coded(const void *w, int64_t N, int64_t K, int f32, uint8_t *out, int nthreads) {
    if (N < 0 || K <= 0 || K % 64 || K >= 65536) return BLZ_EINVAL;
    const int64_t rb = blz_bz_row_bytes(K, f32), cap = blz_bz_cap(K), bb = bz_block_bytes(f32);
    int64_t over = 0;
#pragma omp parallel for schedule(static) reduction(+ : over) num_threads(blz_threads(nthreads, N * K, 1 << 20))
    for (int64_t n = 0; n < N; ++n) {
        const uint16_t *s16 = (const uint16_t *)w + n * K;
        const uint32_t *s32 = (const uint32_t *)w + n * K;
        uint8_t *row = out + n * rb;
        int64_t hist[256] = {0};
        for (int64_t j = 0; j < K; ++j) ++hist[(f32 ? s32[j] >> 24 : (uint32_t)s16[j] >> 8) & 0xff];
        int code[256], tab[16] = {0};
        for (int e = 0; e < 256; ++e) code[e] = -1;
        code[0] = 0;
        for (int c = 1; c < 16; ++c) {
            int best = 0;
            int64_t most = 0;
            for (int e = 1; e < 256; ++e)
                if (code[e] < 0 && hist[e] > most) best = e, most = hist[e];
            if (!best) break; /* no other top byte in the row */
            tab[c] = best;
            code[best] = c;
        }
        for (int c = 0; c < 16; ++c) row[c] = (uint8_t)tab[c];
        memset(row + 16, 0, 16);
        uint16_t *esc = (uint16_t *)(row + 32);
        for (int64_t e = 0; e < 2 * cap; ++e) esc[e] = 0xFFFF;
        int64_t ne = 0;
        uint8_t *b = row + 32 + 4 * cap;
        for (int64_t k = 0; k < K; k += 64, b += bb) {
            memset(b + 64, 0, 32);
            for (int j = 0; j < 64; ++j) {
                const uint16_t h = f32 ? (uint16_t)(s32[k + j] >> 16) : s16[k + j];
                const int p = blz_bz_pos(j, f32);
                int c = code[h >> 8];
                if (c < 0) { /* an escape: its top byte 0 here, its top 16 bits in the list */
                    if (ne < cap - 1) {
                        esc[2 * ne] = (uint16_t)(k + j);
                        esc[2 * ne + 1] = h;
                    }
                    ++ne;
                    c = 0;
                }
                b[p] = (uint8_t)h;
                b[64 + p / 2] |= (uint8_t)(c << (4 * (p & 1)));
                if (f32) { /* the low 16 bits */
                    const uint16_t low = (uint16_t)s32[k + j];
                    memcpy(b + blz_bz_low_at(p), &low, 2);
                }
            }
        }
        over += ne > cap - 1;
    }
    return over;
}
