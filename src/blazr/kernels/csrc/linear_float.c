/* blazr kernels — linear layers with fp32 weights (16-bit float weights: linear_16bit.c).
 *
 * Computes out[M, N] = x[M, K] · Wᵀ (+ bias) (+ residual), or the SwiGLU form (see linear_q.c), with
 * W [N, K] row-major fp32; x and out are fp32.
 *
 * fp32 FMA, two independent accumulators per x row; 16 floats per vector (8 on AVX2), masked tail; tiles of
 * up to 4 x rows per weight row, at every M for decode calls — on AVX-512 up to 8 rows as weight row streams
 * (blz_gemv_streams: the same sums; 4-8 rows read cold weights 1.4-1.5× faster than the tiles' one walk a
 * thread, NOTES §59), on AVX2 one-row calls (Zen 3, cold 1B shapes: 14.3 → 20.2 GB/s in 4 streams, §76) —,
 * a prefill call (BLZ_GEMM) of more than 8 rows
 * takes gemm_float.c's panel GEMM on every AVX2 host (on Sapphire Rapids the tiles ran 500-row prefill GEMMs
 * at 31 GFLOP/s, x streaming from L3 for every weight row; the panel 250-320; which float32 layers send
 * prefill here is quantize.py's kernel_prefill_f32). So f32 prefill has two paths, each giving a row the
 * same bits whatever the other rows of its call; the two agree to fp32 rounding, as a float32 model's GEMM
 * and GEMV. Every path splits the N output rows over OpenMP threads; the scalar fallback computes the same
 * sums in plain loops.
 */
#include "blazr_kernels.h"

#if defined(BLZ_AVX2) && !defined(BLZ_AVX512)
/* res[r·nx + m] = weight row w[r] · x row xr[m] for r < nr, m < nx ((1, 1..4) or (1..4, 1), constants after
 * inlining): every pair by the same operations, whatever nr and nx — two 8-lane FMA chains over 16-float
 * steps, the masked tail into the first, one hsum. The tiles' form (one weight row) and the streams' (one
 * x row). */
BLZ_INLINE void f32_pairs256(const int nr, const int nx, const float *const *w, int64_t K, const float *const *xr,
                             float *restrict res) {
    __m256 acc[4][4][2];
    for (int r = 0; r < nr; ++r)
        for (int m = 0; m < nx; ++m) acc[r][m][0] = acc[r][m][1] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16)
        for (int r = 0; r < nr; ++r) {
            const __m256 w0 = _mm256_loadu_ps(w[r] + k), w1 = _mm256_loadu_ps(w[r] + k + 8);
            for (int m = 0; m < nx; ++m) {
                acc[r][m][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xr[m] + k), acc[r][m][0]);
                acc[r][m][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xr[m] + k + 8), acc[r][m][1]);
            }
        }
    for (; k < K; k += 8) {
        const __m256i mk = blz_mask256(K - k);
        for (int r = 0; r < nr; ++r) {
            const __m256 w0 = _mm256_maskload_ps(w[r] + k, mk);
            for (int m = 0; m < nx; ++m)
                acc[r][m][0] = _mm256_fmadd_ps(w0, _mm256_maskload_ps(xr[m] + k, mk), acc[r][m][0]);
        }
    }
    for (int r = 0; r < nr; ++r)
        for (int m = 0; m < nx; ++m) res[r * nx + m] = blz_hsum256(_mm256_add_ps(acc[r][m][0], acc[r][m][1]));
}
#endif

/* fp32: dot products of weight row w[K] with x rows x[m·ldx], m < mt → res. */
BLZ_INLINE void f32_tile(const int mt, const float *restrict w, int64_t K, const float *restrict x,
                         int64_t ldx, float *restrict res) {
#ifdef BLZ_AVX512
    __m512 acc[4][2];
    for (int m = 0; m < 4; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        const __m512 w0 = _mm512_loadu_ps(w + k), w1 = _mm512_loadu_ps(w + k + 16);
        for (int m = 0; m < mt; ++m) {
            acc[m][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + m * ldx + k), acc[m][0]);
            acc[m][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + m * ldx + k + 16), acc[m][1]);
        }
    }
    for (; k < K; k += 16) {
        const __mmask16 mk = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1u);
        const __m512 w0 = _mm512_maskz_loadu_ps(mk, w + k);
        for (int m = 0; m < mt; ++m)
            acc[m][0] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(mk, x + m * ldx + k), acc[m][0]);
    }
    for (int m = 0; m < mt; ++m) res[m] = _mm512_reduce_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]));
#elif defined(BLZ_AVX2)
    const float *wr[1] = {w}, *xr[4] = {x, x + ldx, x + 2 * ldx, x + 3 * ldx};
    f32_pairs256(1, mt, wr, K, xr, res);
#else
    for (int m = 0; m < mt; ++m) {
        const float *xm = x + m * ldx;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t k = 0; k < K; ++k) acc += w[k] * xm[k];
        res[m] = acc;
    }
#endif
}

#if defined(BLZ_AVX512) && BLZ_STREAMS > 1
#define F32_PF 1024 /* prefetch distance of a decode weight row stream from 2 x rows on, in weights (4 KB) */

/* One x row (M = 1) against weight rows w[0..nr-1] (nr ≤ 4, a constant after inlining; one per stream):
 * res[r] by f32_tile's operations for row r. */
BLZ_INLINE void f32_rows1(const int nr, const float *const *w, int64_t K, const float *restrict x,
                          float *restrict res) {
    __m512 acc[4][2];
    for (int r = 0; r < nr; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        const __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
        for (int r = 0; r < nr; ++r) {
            acc[r][0] = _mm512_fmadd_ps(_mm512_loadu_ps(w[r] + k), x0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(_mm512_loadu_ps(w[r] + k + 16), x1, acc[r][1]);
        }
    }
    for (; k < K; k += 16) {
        const __mmask16 mk = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1u);
        const __m512 x0 = _mm512_maskz_loadu_ps(mk, x + k);
        for (int r = 0; r < nr; ++r) acc[r][0] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, w[r] + k), x0, acc[r][0]);
    }
    for (int r = 0; r < nr; ++r) res[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
}

/* Weight rows w[0..nr-1] × x rows xr[0..nx-1] (nr ≤ 2, 2 ≤ nx ≤ 4, constants after inlining): res[r·nx + m]
 * by f32_tile's operations for the pair, whatever nr and nx (one x row: f32_rows1); the rows prefetched
 * ahead into L2 (the 16-bit kernel's rule from 2 x rows on: a step long enough for the hardware's own
 * prefetch to fall behind). */
BLZ_INLINE void f32_rows(const int nr, const int nx, const float *const *w, int64_t K, const float *const *xr,
                         float *restrict res) {
    __m512 acc[2][4][2];
    for (int r = 0; r < nr; ++r)
        for (int m = 0; m < nx; ++m) acc[r][m][0] = acc[r][m][1] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        for (int r = 0; r < nr; ++r) {
            _mm_prefetch((const char *)(w[r] + k + F32_PF), _MM_HINT_T1);
            _mm_prefetch((const char *)(w[r] + k + F32_PF + 16), _MM_HINT_T1);
        }
        for (int r = 0; r < nr; ++r) {
            const __m512 w0 = _mm512_loadu_ps(w[r] + k), w1 = _mm512_loadu_ps(w[r] + k + 16);
            for (int m = 0; m < nx; ++m) {
                acc[r][m][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xr[m] + k), acc[r][m][0]);
                acc[r][m][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr[m] + k + 16), acc[r][m][1]);
            }
        }
    }
    for (; k < K; k += 16) {
        const __mmask16 mk = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1u);
        for (int r = 0; r < nr; ++r) {
            const __m512 w0 = _mm512_maskz_loadu_ps(mk, w[r] + k);
            for (int m = 0; m < nx; ++m)
                acc[r][m][0] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(mk, xr[m] + k), acc[r][m][0]);
        }
    }
    for (int r = 0; r < nr; ++r)
        for (int m = 0; m < nx; ++m) res[r * nx + m] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][m][0], acc[r][m][1]));
}

/* nr rows × mt ≤ 4 x rows, as blz_gemv_streams makes them: (1..4, 1) or (1..2, 2..4). */
BLZ_INLINE void f32_streams4(const int nr, const int mt, const float *const *w, int64_t K, const float *xf,
                             float *res) {
    const float *xr[4] = {xf, xf + K, xf + 2 * K, xf + 3 * K};
#define F32_NR(NX)                                           \
    switch (nr) {                                            \
        case 1: f32_rows(1, NX, w, K, xr, res); return;      \
        case 2: f32_rows(2, NX, w, K, xr, res); return;      \
    }
    switch (mt) {
        case 2: F32_NR(2) break;
        case 3: F32_NR(3) break;
        case 4: F32_NR(4) break;
    }
#undef F32_NR
    BLZ_TILE_SWITCH(f32_rows1, nr, w, K, xf, res); /* one x row: the second pass of 5 */
}

/* blz_rows_fn of blz_gemv_streams for one x row (a function of its own, so that GCC inlines it into the walk:
 * behind f32_streams' branches it was called through the pointer, and read q 2048 × 2048 ~8 % slower). */
static void f32_streams1(const int nr, const int mt, const void *const *rows, int64_t K, const void *x, float *res) {
    (void)mt; /* one x row */
    BLZ_TILE_SWITCH(f32_rows1, nr, (const float *const *)rows, K, x, res);
}

/* blz_rows_fn of blz_gemv_streams for 2-8 x rows: 5-8 as rows 0-3 and then the rest against the same weight
 * rows. */
static void f32_streams(const int nr, const int mt, const void *const *rows, int64_t K, const void *x, float *res) {
    const float *const *w = (const float *const *)rows;
    const float *xf = (const float *)x;
    if (mt <= 4) {
        f32_streams4(nr, mt, w, K, xf, res);
        return;
    }
    float lo[2 * 4], hi[2 * 4];
    f32_streams4(nr, 4, w, K, xf, lo);
    f32_streams4(nr, mt - 4, w, K, xf + 4 * K, hi);
    blz_merge_passes(nr, mt, lo, hi, res);
}
#elif defined(BLZ_AVX2) && BLZ_STREAMS > 1
/* blz_rows_fn of blz_gemv_streams for one x row (AVX2: the one-row calls only): nr ≤ 4 weight rows at once,
 * each by f32_tile's operations. */
static void f32_streams1(const int nr, const int mt, const void *const *rows, int64_t K, const void *x, float *res) {
    (void)mt; /* one x row */
    const float *xr[1] = {(const float *)x};
#define F32_ONE_X(NR, ...) f32_pairs256(NR, 1, __VA_ARGS__)
    BLZ_TILE_SWITCH(F32_ONE_X, nr, (const float *const *)rows, K, xr, res);
#undef F32_ONE_X
}
#endif

#define F32_ROWWISE_M 8 /* AVX2 without AVX-512: more x rows take gemm_float.c's panel GEMM */

/* fp32 weights: x [M, K], w [N, K], bias [N] or NULL, residual [M, N] or NULL (may equal out); with
 * `gemm` (a prefill call) more than F32_ROWWISE_M rows run the panel GEMM on AVX2 hosts without AVX-512 —
 * otherwise every row the same tiles, whatever M (decode: batch-invariant bit for bit). */
int blz_linear_f32_gemm(const float *x, int64_t M, int64_t K, const float *w, int64_t N, const float *bias,
                        const float *residual, float *out, int swiglu, int nthreads, int gemm) {
    if (M < 0 || N < 0 || K <= 0 || (swiglu && (N % 2 || residual))) return BLZ_EINVAL;
    if (M == 0 || N == 0) return BLZ_OK;
    const int64_t nout = swiglu ? N / 2 : N;
    const int nt = blz_threads(nthreads, M * N * K, BLZ_LINEAR_PARALLEL_MIN);
    if (gemm && M > F32_ROWWISE_M)
        return blz_panel_gemm(w, NULL, BLZ_PANEL_F32, x, M, K, N, bias, residual, out, swiglu, nt);
#if defined(BLZ_AVX512) && BLZ_STREAMS > 1
    if (M <= 8) {
        blz_team_t team;
        blz_team_init(&team, nt, nout, blz_gemv_parts(BLZ_TUNE_STREAMS_F, (int)M, swiglu));
        if (M == 1) {
#pragma omp parallel num_threads(nt)
            blz_gemv_streams(f32_streams1, (const uint8_t *)w, NULL, 4 * K, K, x, 1, N, bias, residual, out, swiglu,
                             &team);
        } else {
#pragma omp parallel num_threads(nt)
            blz_gemv_streams(f32_streams, (const uint8_t *)w, NULL, 4 * K, K, x, (int)M, N, bias, residual, out,
                             swiglu, &team);
        }
        return BLZ_OK;
    }
#elif defined(BLZ_AVX2) && BLZ_STREAMS > 1
    if (M == 1) { /* AVX2: one-row calls as streams (knob streams_f), more rows by the tiles below */
        blz_team_t team;
        blz_team_init(&team, nt, nout, blz_gemv_parts(BLZ_TUNE_STREAMS_F, 1, swiglu));
#pragma omp parallel num_threads(nt)
        blz_gemv_streams(f32_streams1, (const uint8_t *)w, NULL, 4 * K, K, x, 1, N, bias, residual, out, swiglu,
                         &team);
        return BLZ_OK;
    }
#endif
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t n = 0; n < nout; ++n) {
        for (int64_t m0 = 0; m0 < M; m0 += 4) {
            const int mt = (int)blz_min(4, M - m0);
            float r[4], g[4];
            BLZ_TILE_SWITCH(f32_tile, mt, w + n * K, K, x + m0 * K, K, r);
            if (swiglu) BLZ_TILE_SWITCH(f32_tile, mt, w + (n + nout) * K, K, x + m0 * K, K, g);
            blz_epilogue(r, g, mt, m0, n, N, nout, bias, residual, out, swiglu);
        }
    }
    return BLZ_OK;
}

BLZ_EXPORT int blz_linear_f32(const float *x, int64_t M, int64_t K, const float *w, int64_t N,
                              const float *bias, const float *residual, float *out, int swiglu,
                              int nthreads) {
    return blz_linear_f32_gemm(x, M, K, w, N, bias, residual, out, swiglu, nthreads, 0);
}
