/* blazr kernels — Q8_0 weights (as a GGUF stores them) against fp32 activations: the exact-activation form
 * of blz_linear_q8g, reached through blz_linear_q with kind BLZ_Q8_0G | BLZ_XF32.
 *
 * Computes out[M, N] = x[M, K] · Wᵀ (+ bias[N]) (+ residual[M, N]), or the SwiGLU form of blz_epilogue, for w in
 * ggml's Q8_0 layout (row n: K/32 blocks of 34 bytes, [f16 d][32 int8 q]; or at tab[n], BLZ_ROWS). The int8
 * kernel (linear_q8.c) rounds every activation to 8 bits per block of 32, as llama.cpp does: an error of up to
 * amax/254 per element, which reaches the logits unfiltered when the weight is a model's output head. Here x is
 * used as given and each weight widened exactly — d·q, an 11-bit by 8-bit product, is an fp32 value —, so the
 * result is the float model's W·x up to fp32 summation order. The order is linear_16bit.c's: per 32-element
 * block (= a Q8_0 block) four 8-wide quarters, each an fp32 FMA chain over the blocks, summed as
 * blz_hsum256((a0 + a1) + (a2 + a3)); AVX-512 holds quarters 0|1 and 2|3 in two 16-lane registers (the same
 * sums). A row's result never depends on the call's other rows: every (weight row, x row) pair is computed by
 * the same operations, x rows in passes of up to XF_MX against each weight row — several weight rows read at
 * once as streams (blz_gemv_streams), as the float kinds' decode: at one x row on AVX2 builds (Zen 3, cold:
 * Qwen3-0.6B's 151936 × 1024 head 11.3 → 14.5 GB/s in 4 streams, NOTES §76), on AVX-512 ones each walk of
 * the weight serving up to XF_PASS x rows (5-8 of them against one weight row at a time: a speculative
 * verification's 5 rows read the weight once, widened once). The portable scalar path keeps the quarters
 * and the tree (its lane order within a quarter differs, as linear_16bit.c's).
 *
 * Cost: the int8 kernel's bytes, with 4 vector operations per 16 weights instead of a quarter of one — the
 * same speed where a GEMV waits on memory (one or a few rows), slower in compute-bound many-row calls; it is
 * meant for output heads (loading/gguf: the head of a GGUF kept as stored), whose calls hold one row per
 * sequence.
 *
 * Shapes: M x rows, K in features (a multiple of 32), N out features (SwiGLU: N = 2·I), nb = K/32.
 */
#include "blazr_kernels.h"

#define XB 34 /* bytes per block: f16 d, 32 int8 */
#ifdef BLZ_AVX512
#define XF_MX 4   /* x rows per register pass over a weight row (each weight widened once for them) */
#define XF_PASS 8 /* x rows per walk of the weight (two register passes over each step's rows) */
#else
#define XF_MX 2
#endif

#ifdef BLZ_AVX512
/* The 16 weights q[0..15] · d widened exactly to fp32. */
BLZ_INLINE __m512 q8_16_ps(const uint8_t *q, const __m512 d) {
    const __m128i b = _mm_loadu_si128((const __m128i *)q);
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), d);
}

/* res[r·nx + m] = weight row w[r] · x row xr[m] for r < nr, m < nx (constants after inlining; nr · nx ≤ 8),
 * every pair by the same operations: quarters 0|1 of a block in a[.][.][0], 2|3 in a[.][.][1]. */
BLZ_INLINE void xf_rows_simd(const int nr, const int nx, const uint8_t *const *w, int64_t K, const float *const *xr,
                             float *res) {
    __m512 a[4][8][2];
    for (int r = 0; r < nr; ++r)
        for (int m = 0; m < nx; ++m) a[r][m][0] = a[r][m][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < K / BLZ_QK; ++b)
        for (int r = 0; r < nr; ++r) {
            const uint8_t *blk = w[r] + b * XB;
            uint16_t h;
            memcpy(&h, blk, 2);
            const __m512 d = _mm512_set1_ps(_cvtsh_ss(h)); /* F16C: exact */
            for (int s = 0; s < 2; ++s) {
                const __m512 wv = q8_16_ps(blk + 2 + 16 * s, d);
                for (int m = 0; m < nx; ++m)
                    a[r][m][s] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xr[m] + b * BLZ_QK + 16 * s), a[r][m][s]);
            }
        }
    for (int r = 0; r < nr; ++r)
        for (int m = 0; m < nx; ++m) res[r * nx + m] = blz_quarters512(a[r][m][0], a[r][m][1]);
}
#elif defined(BLZ_AVX2)
/* The 8 weights q[0..7] · d widened exactly to fp32. */
BLZ_INLINE __m256 q8_8_ps(const uint8_t *q, const __m256 d) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)q);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), d);
}

/* res[r·nx + m] = weight row w[r] · x row xr[m] for r < nr, m < nx ((1..4, 1) or (1, 1..2)): every pair by the
 * same operations, whatever nr and nx. */
BLZ_INLINE void xf_rows_simd(const int nr, const int nx, const uint8_t *const *w, int64_t K, const float *const *xr,
                             float *res) {
    __m256 a[4][2][4];
    for (int r = 0; r < nr; ++r)
        for (int m = 0; m < nx; ++m)
            for (int i = 0; i < 4; ++i) a[r][m][i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < K / BLZ_QK; ++b)
        for (int r = 0; r < nr; ++r) {
            const uint8_t *blk = w[r] + b * XB;
            uint16_t h;
            memcpy(&h, blk, 2);
            const __m256 d = _mm256_set1_ps(_cvtsh_ss(h)); /* F16C: exact */
            for (int i = 0; i < 4; ++i) {
                const __m256 wv = q8_8_ps(blk + 2 + 8 * i, d);
                for (int m = 0; m < nx; ++m)
                    a[r][m][i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xr[m] + b * BLZ_QK + 8 * i), a[r][m][i]);
            }
        }
    for (int r = 0; r < nr; ++r)
        for (int m = 0; m < nx; ++m)
            res[r * nx + m] = blz_quarters256(a[r][m][0], a[r][m][1], a[r][m][2], a[r][m][3]);
}
#endif

/* res[m] = weight row w · x row x + m·K for m < mt (≤ XF_MX). Scalar fallback: the same four quarter sums per
 * block and the same tree. */
BLZ_INLINE void xf_rows(const int mt, const uint8_t *restrict w, int64_t K, const float *restrict x, float *res) {
#ifdef BLZ_AVX2
    const float *xr[4] = {x, x + K, x + 2 * K, x + 3 * K};
    const uint8_t *wr[1] = {w};
    switch (mt) {
        case 1: xf_rows_simd(1, 1, wr, K, xr, res); break;
#if XF_MX > 2
        case 3: xf_rows_simd(1, 3, wr, K, xr, res); break;
        case 4: xf_rows_simd(1, 4, wr, K, xr, res); break;
#endif
        default: xf_rows_simd(1, 2, wr, K, xr, res);
    }
#else
    for (int m = 0; m < mt; ++m) {
        const float *xm = x + m * K;
        float q[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int64_t b = 0; b < K / BLZ_QK; ++b) {
            uint16_t h;
            memcpy(&h, w + b * XB, 2);
            const float d = blz_fp16_to_fp32(h);
            const int8_t *qb = (const int8_t *)(w + b * XB + 2);
            for (int e = 0; e < BLZ_QK; ++e) q[e / 8] = fmaf((float)qb[e] * d, xm[b * BLZ_QK + e], q[e / 8]);
        }
        res[m] = (q[0] + q[1]) + (q[2] + q[3]);
    }
#endif
}

#if defined(BLZ_AVX512) && BLZ_STREAMS > 1
/* nr weight rows × mt ≤ 4 x rows: (1..4, 1) or (1..2, 2..4). */
BLZ_INLINE void xf_streams4(const int nr, const int mt, const uint8_t *const *w, int64_t K, const float *xf,
                            float *res) {
    const float *xr[4] = {xf, xf + K, xf + 2 * K, xf + 3 * K};
#define XF_NR(NX)                                           \
    switch (nr) {                                           \
        case 1: xf_rows_simd(1, NX, w, K, xr, res); return; \
        case 2: xf_rows_simd(2, NX, w, K, xr, res); return; \
    }
    switch (mt) {
        case 2: XF_NR(2) break;
        case 3: XF_NR(3) break;
        case 4: XF_NR(4) break;
    }
#undef XF_NR
#define XF_ONE_X(NR, ...) xf_rows_simd(NR, 1, __VA_ARGS__)
    BLZ_TILE_SWITCH(XF_ONE_X, nr, w, K, xr, res);
#undef XF_ONE_X
}

/* nr weight rows × mt ≤ XF_PASS x rows, as blz_gemv_streams makes them: 5-8 x rows one weight row at a time,
 * all in registers (8 × 2 accumulators; each pair by the same operations). */
static void xf_streams(const int nr, const int mt, const void *const *rows, int64_t K, const void *x, float *res) {
    const uint8_t *const *w = (const uint8_t *const *)rows;
    const float *xf = (const float *)x;
    if (mt <= 4) {
        xf_streams4(nr, mt, w, K, xf, res);
        return;
    }
    const float *xr[8];
    for (int m = 0; m < 8; ++m) xr[m] = xf + (m < mt ? m : 0) * K;
    for (int r = 0; r < nr; ++r) switch (mt) {
            case 5: xf_rows_simd(1, 5, w + r, K, xr, res + r * mt); break;
            case 6: xf_rows_simd(1, 6, w + r, K, xr, res + r * mt); break;
            case 7: xf_rows_simd(1, 7, w + r, K, xr, res + r * mt); break;
            default: xf_rows_simd(1, 8, w + r, K, xr, res + r * mt);
        }
}
#elif defined(BLZ_AVX2) && BLZ_STREAMS > 1
/* blz_rows_fn of blz_gemv_streams for one x row (AVX2: the one-row calls only): nr ≤ 4 weight rows at once. */
static void xf_streams1(const int nr, const int mt, const void *const *rows, int64_t K, const void *x, float *res) {
    (void)mt;
    const float *xr[1] = {(const float *)x};
#define XF_ONE_X(NR, ...) xf_rows_simd(NR, 1, __VA_ARGS__)
    BLZ_TILE_SWITCH(XF_ONE_X, nr, (const uint8_t *const *)rows, K, xr, res);
#undef XF_ONE_X
}
#endif

/* See the file header. x [M, K], w [N][K/32 · 34] (or row n at tab[n]), bias [N] or NULL, residual [M, N] or
 * NULL (may equal out), out [M, N] (SwiGLU: [M, N/2]). */
int blz_linear_q8g_xf(const float *x, int64_t M, int64_t K, const uint8_t *w, const int64_t *tab, int64_t N,
                      const float *bias, const float *residual, float *out, int swiglu, int nthreads) {
    if (M < 0 || N < 0 || K <= 0 || K % BLZ_QK || (swiglu && (N % 2 || residual))) return BLZ_EINVAL;
    if (M == 0 || N == 0) return BLZ_OK;
    const int64_t nout = swiglu ? N / 2 : N, row_bytes = K / BLZ_QK * XB;
    const int nt = blz_threads(nthreads, M * N * K, BLZ_LINEAR_PARALLEL_MIN);
#if defined(BLZ_AVX512) && BLZ_STREAMS > 1
    for (int64_t m0 = 0; m0 < M; m0 += XF_PASS) { /* each pass: up to XF_PASS x rows against every weight row */
        const int mt = (int)blz_min(XF_PASS, M - m0);
        blz_team_t team;
        blz_team_init(&team, nt, nout, blz_gemv_parts(BLZ_TUNE_STREAMS_F, mt, swiglu));
#pragma omp parallel num_threads(nt)
        blz_gemv_streams(xf_streams, w, tab, row_bytes, K, x + m0 * K, mt, N, bias,
                         residual ? residual + m0 * N : NULL, out + m0 * nout, swiglu, &team);
    }
    return BLZ_OK;
#else
#if defined(BLZ_AVX2) && BLZ_STREAMS > 1
    if (M == 1) { /* AVX2: one-row calls as streams (knob streams_f), more rows by the row loop below */
        blz_team_t team;
        blz_team_init(&team, nt, nout, blz_gemv_parts(BLZ_TUNE_STREAMS_F, 1, swiglu));
#pragma omp parallel num_threads(nt)
        blz_gemv_streams(xf_streams1, w, tab, row_bytes, K, x, 1, N, bias, residual, out, swiglu, &team);
        return BLZ_OK;
    }
#endif
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t n = 0; n < nout; ++n)
        for (int64_t m0 = 0; m0 < M; m0 += XF_MX) {
            const int mt = (int)blz_min(XF_MX, M - m0);
            float r[XF_MX], g[XF_MX];
            xf_rows(mt, blz_weight_row(w, tab, n, row_bytes), K, x + m0 * K, r);
            if (swiglu) xf_rows(mt, blz_weight_row(w, tab, n + nout, row_bytes), K, x + m0 * K, g);
            blz_epilogue(r, g, mt, m0, n, N, nout, bias, residual, out, swiglu);
        }
    return BLZ_OK;
#endif
}
