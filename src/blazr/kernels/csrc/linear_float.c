/* blazr kernels — linear layers with fp32 weights (16-bit float weights: linear_16bit.c).
 *
 * Computes out[M, N] = x[M, K] · Wᵀ (+ bias) (+ residual), or the SwiGLU form (see linear_q.c), with
 * W [N, K] row-major fp32; x and out are fp32.
 *
 * fp32 FMA, two independent accumulators per x row; 16 floats per vector (8 on AVX2), masked tail; tiles of
 * up to 4 x rows per weight row, at every M for decode calls — a prefill call (BLZ_GEMM) of more than 8 rows
 * takes gemm_float.c's panel GEMM on every AVX2 host (on Sapphire Rapids the tiles ran 500-row prefill GEMMs
 * at 31 GFLOP/s, x streaming from L3 for every weight row; the panel 250-320; which float32 layers send
 * prefill here is quantize.py's kernel_prefill_f32). So f32 prefill has two paths, each giving a row the
 * same bits whatever the other rows of its call; the two agree to fp32 rounding, as a float32 model's GEMM
 * and GEMV. Every path splits the N output rows over OpenMP threads; the scalar fallback computes the same
 * sums in plain loops.
 */
#include "blazr_kernels.h"

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
    __m256 acc[4][2];
    for (int m = 0; m < 4; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        const __m256 w0 = _mm256_loadu_ps(w + k), w1 = _mm256_loadu_ps(w + k + 8);
        for (int m = 0; m < mt; ++m) {
            acc[m][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + m * ldx + k), acc[m][0]);
            acc[m][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + m * ldx + k + 8), acc[m][1]);
        }
    }
    for (; k < K; k += 8) {
        const __m256i mk = blz_mask256(K - k);
        const __m256 w0 = _mm256_maskload_ps(w + k, mk);
        for (int m = 0; m < mt; ++m)
            acc[m][0] = _mm256_fmadd_ps(w0, _mm256_maskload_ps(x + m * ldx + k, mk), acc[m][0]);
    }
    for (int m = 0; m < mt; ++m) res[m] = blz_hsum256(_mm256_add_ps(acc[m][0], acc[m][1]));
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

static void f32_streams(const int nr, const int mt, const void *const *rows, int64_t K, const void *x, float *res) {
    (void)mt; /* one x row */
    BLZ_TILE_SWITCH(f32_rows1, nr, (const float *const *)rows, K, x, res);
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
    if (M == 1) {
        blz_team_t team;
        blz_team_init(&team, nt, nout, blz_gemv_parts(BLZ_TUNE_STREAMS_F, 1, swiglu));
#pragma omp parallel num_threads(nt)
        blz_gemv_streams(f32_streams, (const uint8_t *)w, NULL, 4 * K, K, x, 1, N, bias, residual, out, swiglu, &team);
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
