/* blazr kernels — linear layers with 16-bit float weights: f16 and bf16.
 *
 * The weights are IEEE half (a GGUF F16 tensor as stored) or bf16 bits (a BF16 tensor, a bf16 checkpoint, or
 * `--quantize bf16`), x and the sums fp32: w widened exactly (f16: vcvtph2ps; bf16: a 16-bit shift), x used
 * as given — the result is (W · x) in fp32 up to summation order, with no rounding of x. Both kinds run the
 * same code, the widening a compile-time choice, so a weight whose values both formats hold gives the same
 * bits as f16 and as bf16. (llama.cpp rounds x to the weight's format for its F16 / BF16 dots, and blazr's
 * bf16 did until 2026-11: vdpbf16ps on x rounded to bf16. That rounding turns a 1-ulp fp32 difference in
 * x — attention over a cached prefix rounds apart from a whole prefill — into a 1-ulp bf16 one, 2¹⁶ times
 * larger, so chunked prefill and decode could leave the whole prefill's logits by 1 % on one host and not on
 * another; NOTES §44.) Two paths, each giving a row the same bits whatever the other rows of the call
 * (prefill and decode agree to fp32 rounding, as a float32 model's GEMM and GEMV):
 * - decode (M ≤ HALF_ROWWISE_M = 8): weight rows streamed one at a time against up to HALF_MX x rows
 *   (AVX-512: 4 — 5-8 rows in two passes —, AVX2: 2), widened as read (prefetched ahead into L2 from 2 x rows on); four accumulators per (row,
 *   x row) pair — the 8-wide quarters of each 32-element chunk, the tail (masked x, zero-padded w) into
 *   quarters 0.. of one more —, summed as blz_hsum256((a0 + a1) + (a2 + a3)). AVX-512 holds quarters 0|1
 *   and 2|3 in two 16-lane registers (FMAs are lane-wise; a missing tail quarter adds +0·0, which changes
 *   no sum), so both widths give the same bits; there 1-8-row calls read several weight rows at once as
 *   streams (blz_gemv_streams), on AVX2 one-row calls (Zen 3, cold 1B shapes: bf16 15.0 → 20.4 GB/s, f16
 *   12.2 → 15.6 in 4 streams, NOTES §76).
 * - prefill and larger decode batches (more rows): gemm_float.c's GEMM — x rows in vector lanes at 13-16
 *   rows on AVX-512, panels otherwise (on Zen 3, Llama-3.2-1B's shapes, the dot-product tiles before it ran
 *   at 50-77 GFLOP/s).
 */
#include "blazr_kernels.h"

#define HALF_PF 2048     /* prefetch distance of a decode weight row stream, in weights (4 KB) */
#ifndef HALF_ROWWISE_M
/* up to 8 x rows: the decode path, whose result for a row never depends on the call's other rows (a decode
 * batch, a MoE expert's tokens, MLA's heads); more take the GEMM. On AVX-512 the weight streams take 5-8
 * rows as two passes of the 4-row kernel over each step's weight rows (the second from L1): Zen 5, cold 1B
 * shapes, 2 threads, 8 rows 13.2 GB/s as the row walk, 24.4 as the GEMM. */
#define HALF_ROWWISE_M 8
#endif
#ifdef BLZ_AVX512
#define HALF_MX 4 /* x rows per pass over a weight row (each weight widened once for them) */
#define HALF_STREAM_M HALF_ROWWISE_M /* x rows the weight streams take: all of the decode path's */
#else
#define HALF_MX 2
#define HALF_STREAM_M 1 /* AVX2: one x row; 2-8 by the row loop */
#endif

/* One 16-bit weight widened to fp32, exactly: bf16 (`bf`) or f16 bits. */
BLZ_INLINE float half_to_fp32(uint16_t h, const int bf) { return bf ? blz_bf16_to_fp32(h) : blz_fp16_to_fp32(h); }

#ifdef BLZ_AVX512
/* 16 weights from p widened to fp32 (bf16: zero-extended to 32 bits and shifted into the high half). */
BLZ_INLINE __m512 half16_ps(const uint16_t *p, const int bf) {
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return bf ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
}

/* res[r·nx + m] = weight row w[r] · x row xr[m] for r < nr, m < nx (nr · nx ≤ 8, constants after inlining):
 * every pair by the same operations, whatever nr and nx — the AVX2 form below in 512-bit registers, the
 * quarters of a chunk side by side in a[.][.][0] (0 | 1) and a[.][.][1] (2 | 3): the same sums. */
BLZ_INLINE void half_rows_simd(const int nr, const int nx, const int bf, const uint16_t *const *w, int64_t K,
                               const float *const *xr, float *res, const int pf) {
    __m512 a[4][4][2];
    for (int r = 0; r < nr; ++r)
        for (int m = 0; m < nx; ++m) a[r][m][0] = a[r][m][1] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        for (int r = 0; pf && r < nr; ++r) _mm_prefetch((const char *)(w[r] + k + HALF_PF), _MM_HINT_T1);
        for (int h = 0; h < 2; ++h)
            for (int r = 0; r < nr; ++r) {
                const __m512 wv = half16_ps(w[r] + k + 16 * h, bf);
                for (int m = 0; m < nx; ++m)
                    a[r][m][h] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xr[m] + k + 16 * h), a[r][m][h]);
            }
    }
    if (k < K)
        for (int r = 0; r < nr; ++r) {
            uint16_t t[32] = {0};
            memcpy(t, w[r] + k, (size_t)(K - k) * sizeof(uint16_t));
            for (int h = 0; 16 * h < K - k; ++h) {
                const __m512 wv = half16_ps(t + 16 * h, bf);
                const int64_t left = K - k - 16 * h;
                const __mmask16 mk = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
                for (int m = 0; m < nx; ++m)
                    a[r][m][h] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(mk, xr[m] + k + 16 * h), a[r][m][h]);
            }
        }
    for (int r = 0; r < nr; ++r)
        for (int m = 0; m < nx; ++m) res[r * nx + m] = blz_quarters512(a[r][m][0], a[r][m][1]);
}
#elif defined(BLZ_AVX2)
/* 8 weights from p widened to fp32. */
BLZ_INLINE __m256 half8_ps(const uint16_t *p, const int bf) {
    const __m128i h = _mm_loadu_si128((const __m128i *)p);
    return bf ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)) : _mm256_cvtph_ps(h);
}

/* res[r·nx + m] = weight row w[r] · x row xr[m] for r < nr, m < nx ((nr, nx) = (1..4, 1) or (1, 1..2),
 * constants after inlining): every pair by the same operations, whatever nr and nx. */
BLZ_INLINE void half_rows_simd(const int nr, const int nx, const int bf, const uint16_t *const *w, int64_t K,
                               const float *const *xr, float *res, const int pf) {
    __m256 a[4][2][4];
    for (int r = 0; r < nr; ++r)
        for (int m = 0; m < nx; ++m)
            for (int i = 0; i < 4; ++i) a[r][m][i] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        if (pf) _mm_prefetch((const char *)(w[0] + k + HALF_PF), _MM_HINT_T1);
        for (int i = 0; i < 4; ++i)
            for (int r = 0; r < nr; ++r) {
                const __m256 wv = half8_ps(w[r] + k + 8 * i, bf);
                for (int m = 0; m < nx; ++m)
                    a[r][m][i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xr[m] + k + 8 * i), a[r][m][i]);
            }
    }
    if (k < K)
        for (int r = 0; r < nr; ++r) {
            uint16_t t[32] = {0};
            memcpy(t, w[r] + k, (size_t)(K - k) * sizeof(uint16_t));
            for (int i = 0; 8 * i < K - k; ++i) {
                const __m256 wv = half8_ps(t + 8 * i, bf);
                const __m256i mk = blz_mask256(K - k - 8 * i);
                for (int m = 0; m < nx; ++m)
                    a[r][m][i] = _mm256_fmadd_ps(wv, _mm256_maskload_ps(xr[m] + k + 8 * i, mk), a[r][m][i]);
            }
        }
    for (int r = 0; r < nr; ++r)
        for (int m = 0; m < nx; ++m)
            res[r * nx + m] = blz_quarters256(a[r][m][0], a[r][m][1], a[r][m][2], a[r][m][3]);
}
#endif

/* Decode: res[m] = weight row w · x row x + m·K for m < mt (≤ HALF_MX). Scalar fallback: the same four
 * quarter sums per chunk and the same tree (lane order within a quarter differs from the SIMD path). */
BLZ_INLINE void half_rows(const int mt, const int bf, const uint16_t *restrict w, int64_t K,
                          const float *restrict x, float *res, const int pf) {
#ifdef BLZ_AVX2
    const float *xr[4] = {x, x + K, x + 2 * K, x + 3 * K};
    const uint16_t *wr[1] = {w};
    switch (mt) {
        case 1: half_rows_simd(1, 1, bf, wr, K, xr, res, pf); break;
#if HALF_MX > 2
        case 3: half_rows_simd(1, 3, bf, wr, K, xr, res, pf); break;
        case 4: half_rows_simd(1, 4, bf, wr, K, xr, res, pf); break;
#endif
        default: half_rows_simd(1, 2, bf, wr, K, xr, res, pf);
    }
#else
    (void)pf;
    for (int m = 0; m < mt; ++m) {
        const float *xm = x + m * K;
        float q[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int64_t k = 0; k < K; ++k) q[(k / 8) % 4] += half_to_fp32(w[k], bf) * xm[k];
        res[m] = (q[0] + q[1]) + (q[2] + q[3]);
    }
#endif
}

#if defined(BLZ_AVX512) && BLZ_STREAMS > 1
/* nr rows × mt x rows: (1..4, 1) or (1..2, 2..8), as blz_gemv_streams makes them; prefetched from 2 x rows on;
 * 5-8 x rows as rows 0-3 and then the rest against the same weight rows (each pair by the same operations). */
BLZ_INLINE void half_streams4(const int bf, const int nr, const int mt, const void *const *rows, int64_t K,
                              const float *xf, float *res) {
    const uint16_t *const *w = (const uint16_t *const *)rows;
    const float *xr[4] = {xf, xf + K, xf + 2 * K, xf + 3 * K};

#define HALF_NR(NX, PF)                                               \
    switch (nr) {                                                     \
        case 1: half_rows_simd(1, NX, bf, w, K, xr, res, PF); return; \
        case 2: half_rows_simd(2, NX, bf, w, K, xr, res, PF); return; \
    }
    switch (mt) {
        case 2: HALF_NR(2, 1) break;
        case 3: HALF_NR(3, 1) break;
        case 4: HALF_NR(4, 1) break;
    }
#undef HALF_NR
#define HALF_ONE_X(NR, ...) half_rows_simd(NR, 1, bf, __VA_ARGS__)
    BLZ_TILE_SWITCH(HALF_ONE_X, nr, w, K, xr, res, 0);
#undef HALF_ONE_X
}

BLZ_INLINE void half_streams(const int bf, const int nr, const int mt, const void *const *rows, int64_t K,
                             const void *x, float *res) {
    const float *xf = (const float *)x;
    if (mt <= 4) {
        half_streams4(bf, nr, mt, rows, K, xf, res);
        return;
    }
    float lo[2 * 4], hi[2 * 4];
    half_streams4(bf, nr, 4, rows, K, xf, lo);
    half_streams4(bf, nr, mt - 4, rows, K, xf + 4 * K, hi);
    blz_merge_passes(nr, mt, lo, hi, res);
}

static void f16_streams(const int nr, const int mt, const void *const *rows, int64_t K, const void *x, float *res) {
    half_streams(0, nr, mt, rows, K, x, res);
}

static void bf16_streams(const int nr, const int mt, const void *const *rows, int64_t K, const void *x, float *res) {
    half_streams(1, nr, mt, rows, K, x, res);
}
#elif defined(BLZ_AVX2) && BLZ_STREAMS > 1
/* blz_rows_fn of blz_gemv_streams for one x row (AVX2: the one-row calls only): nr ≤ 4 weight rows at once. */
BLZ_INLINE void half_streams1(const int bf, const int nr, const void *const *rows, int64_t K, const void *x,
                              float *res) {
    const uint16_t *const *w = (const uint16_t *const *)rows;
    const float *xr[1] = {(const float *)x};
#define HALF_ONE_X(NR, ...) half_rows_simd(NR, 1, bf, __VA_ARGS__)
    BLZ_TILE_SWITCH(HALF_ONE_X, nr, w, K, xr, res, 0);
#undef HALF_ONE_X
}

static void f16_streams(const int nr, const int mt, const void *const *rows, int64_t K, const void *x, float *res) {
    (void)mt;
    half_streams1(0, nr, rows, K, x, res);
}

static void bf16_streams(const int nr, const int mt, const void *const *rows, int64_t K, const void *x, float *res) {
    (void)mt;
    half_streams1(1, nr, rows, K, x, res);
}
#endif

/* 16-bit weights (uint16 bits, bf16 when `bf`, else f16): x [M, K] fp32, w [N, K] — or, with a row table
 * `tab` (int64 [N], BLZ_ROWS), row n at tab[n] —, otherwise as blz_linear_f32. */
BLZ_INLINE int half_linear(const int bf, const float *x, int64_t M, int64_t K, const uint16_t *w,
                           const int64_t *tab, int64_t N, const float *bias, const float *residual, float *out,
                           int swiglu, int nthreads) {
    if (M < 0 || N < 0 || K <= 0 || (swiglu && (N % 2 || residual))) return BLZ_EINVAL;
    if (M == 0 || N == 0) return BLZ_OK;
    const int64_t nout = swiglu ? N / 2 : N;
    const int nt = blz_threads(nthreads, M * N * K, BLZ_LINEAR_PARALLEL_MIN);
#if BLZ_STREAMS > 1
    if (M <= HALF_STREAM_M) { /* weight streams (knob streams_f) */
        blz_team_t team;
        blz_team_init(&team, nt, nout, blz_gemv_parts(BLZ_TUNE_STREAMS_F, (int)M, swiglu));
#pragma omp parallel num_threads(nt)
        blz_gemv_streams(bf ? bf16_streams : f16_streams, (const uint8_t *)w, tab, 2 * K, K, x, (int)M, N, bias,
                         residual, out, swiglu, &team);
        return BLZ_OK;
    }
#endif
    if (M <= HALF_ROWWISE_M) {
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t n = 0; n < nout; ++n)
            for (int64_t m0 = 0; m0 < M; m0 += HALF_MX) {
                const int mt = (int)blz_min(HALF_MX, M - m0);
                float r[HALF_MX], g[HALF_MX];
                const uint16_t *wg = blz_weight_row16(w, tab, n, K);
                half_rows(mt, bf, wg, K, x + m0 * K, r, M >= 2 && m0 == 0);
                if (swiglu) {
                    const uint16_t *wu = blz_weight_row16(w, tab, n + nout, K);
                    half_rows(mt, bf, wu, K, x + m0 * K, g, M >= 2 && m0 == 0);
                }
                blz_epilogue(r, g, mt, m0, n, N, nout, bias, residual, out, swiglu);
            }
        return BLZ_OK;
    }
    return blz_panel_gemm(w, tab, bf ? BLZ_PANEL_BF16 : BLZ_PANEL_F16, x, M, K, N, bias, residual, out, swiglu, nt);
}

int blz_linear_f16_rows(const float *x, int64_t M, int64_t K, const uint16_t *w, const int64_t *tab, int64_t N,
                        const float *bias, const float *residual, float *out, int swiglu, int nthreads) {
    return half_linear(0, x, M, K, w, tab, N, bias, residual, out, swiglu, nthreads);
}

int blz_linear_bf16_rows(const float *x, int64_t M, int64_t K, const uint16_t *w, const int64_t *tab, int64_t N,
                         const float *bias, const float *residual, float *out, int swiglu, int nthreads) {
    return half_linear(1, x, M, K, w, tab, N, bias, residual, out, swiglu, nthreads);
}

/* blz_linear_f16_rows / blz_linear_bf16_rows on a weight whose rows follow each other from w. */
BLZ_EXPORT int blz_linear_f16(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N,
                              const float *bias, const float *residual, float *out, int swiglu, int nthreads) {
    return half_linear(0, x, M, K, w, NULL, N, bias, residual, out, swiglu, nthreads);
}

BLZ_EXPORT int blz_linear_bf16(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N,
                               const float *bias, const float *residual, float *out, int swiglu, int nthreads) {
    return half_linear(1, x, M, K, w, NULL, N, bias, residual, out, swiglu, nthreads);
}
