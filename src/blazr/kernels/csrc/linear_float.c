/* blazr kernels — linear layers with float weights (fp32 and bf16).
 *
 * Computes out[M, N] = x[M, K] · Wᵀ (+ bias) (+ residual), or the SwiGLU form (see linear_q.c), with
 * W [N, K] row-major, fp32 or bf16 (raw uint16 bits); x and out are fp32.
 *
 * f32:  fp32 FMA, two independent accumulators per x row; 16 floats per vector, masked tail.
 * bf16: x is rounded once per call to bf16 (round-to-nearest-even, as torch's `x.to(bfloat16)`), into a
 *       zero-padded scratch copy; vdpbf16ps multiplies pairs of bf16 exactly and accumulates in fp32, so
 *       the result equals (bf16(x) · W) computed in fp32 up to summation order.
 * Both tile up to 4 x rows per weight load (weights streamed once per call for any M), and split the N
 * output rows over OpenMP threads. Scalar fallbacks compute the same sums in plain loops.
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

/* bf16: dot products of weight row w[K] (bf16 bits) with bf16 x rows xb[m·ldx] (zero-padded to ldx, a
 * multiple of 32) → res. */
BLZ_INLINE void bf16_tile(const int mt, const uint16_t *restrict w, int64_t K, const uint16_t *restrict xb,
                          int64_t ldx, float *restrict res) {
#ifdef BLZ_BF16
    __m512 acc[4][2];
    for (int m = 0; m < 4; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) {
        const __m512i w0 = _mm512_loadu_si512(w + k), w1 = _mm512_loadu_si512(w + k + 32);
        for (int m = 0; m < mt; ++m) {
            const uint16_t *xm = xb + m * ldx + k;
            acc[m][0] = _mm512_dpbf16_ps(acc[m][0], (__m512bh)_mm512_loadu_si512(xm), (__m512bh)w0);
            acc[m][1] = _mm512_dpbf16_ps(acc[m][1], (__m512bh)_mm512_loadu_si512(xm + 32), (__m512bh)w1);
        }
    }
    for (; k < K; k += 32) {
        const __mmask32 mk = K - k >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << (K - k)) - 1u);
        const __m512i w0 = _mm512_maskz_loadu_epi16(mk, w + k);
        for (int m = 0; m < mt; ++m)
            acc[m][0] =
                _mm512_dpbf16_ps(acc[m][0], (__m512bh)_mm512_loadu_si512(xb + m * ldx + k), (__m512bh)w0);
    }
    for (int m = 0; m < mt; ++m) res[m] = _mm512_reduce_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]));
#else
    for (int m = 0; m < mt; ++m) {
        const uint16_t *xm = xb + m * ldx;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t k = 0; k < K; ++k) acc += blz_bf16_to_fp32(w[k]) * blz_bf16_to_fp32(xm[k]);
        res[m] = acc;
    }
#endif
}

/* Round rows x[M, K] to bf16 into xb[M, ldx], zero-padding columns K .. ldx-1. */
static void x_to_bf16(const float *restrict x, int64_t K, uint16_t *restrict xb, int64_t ldx) {
    int64_t k = 0;
#ifdef BLZ_BF16
    for (; k + 32 <= K; k += 32) {
        const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + k + 16), _mm512_loadu_ps(x + k));
        _mm512_storeu_si512(xb + k, (__m512i)v);
    }
#endif
    for (; k < K; ++k) xb[k] = blz_fp32_to_bf16(x[k]);
    for (; k < ldx; ++k) xb[k] = 0;
}

#define BLZ_TILE_SWITCH(FN, mt, ...) \
    switch (mt) {                    \
        case 1:                      \
            FN(1, __VA_ARGS__);      \
            break;                   \
        case 2:                      \
            FN(2, __VA_ARGS__);      \
            break;                   \
        case 3:                      \
            FN(3, __VA_ARGS__);      \
            break;                   \
        default:                     \
            FN(4, __VA_ARGS__);      \
    }

/* fp32 weights: x [M, K], w [N, K], bias [N] or NULL, residual [M, N] or NULL (may equal out). */
BLZ_EXPORT int blz_linear_f32(const float *x, int64_t M, int64_t K, const float *w, int64_t N,
                              const float *bias, const float *residual, float *out, int swiglu,
                              int nthreads) {
    if (M < 0 || N < 0 || K <= 0 || (swiglu && (N % 2 || residual))) return BLZ_EINVAL;
    if (M == 0 || N == 0) return BLZ_OK;
    const int64_t nout = swiglu ? N / 2 : N;
    const int nt = blz_threads(nthreads, M * N * K, BLZ_LINEAR_PARALLEL_MIN);
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

/* bf16 weights (uint16 bits): x [M, K] fp32, w [N, K], otherwise as blz_linear_f32. */
BLZ_EXPORT int blz_linear_bf16(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N,
                               const float *bias, const float *residual, float *out, int swiglu,
                               int nthreads) {
    if (M < 0 || N < 0 || K <= 0 || (swiglu && (N % 2 || residual))) return BLZ_EINVAL;
    if (M == 0 || N == 0) return BLZ_OK;
    const int64_t ldx = blz_round_up(K, 32), nout = swiglu ? N / 2 : N;
    uint16_t *xb = blz_scratch((size_t)(M * ldx) * sizeof(uint16_t));
    if (!xb) return BLZ_ENOMEM;
    const int nt = blz_threads(nthreads, M * N * K, BLZ_LINEAR_PARALLEL_MIN);
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; ++m) x_to_bf16(x + m * K, K, xb + m * ldx, ldx);
#pragma omp for schedule(static)
        for (int64_t n = 0; n < nout; ++n) {
            for (int64_t m0 = 0; m0 < M; m0 += 4) {
                const int mt = (int)blz_min(4, M - m0);
                float r[4], g[4];
                BLZ_TILE_SWITCH(bf16_tile, mt, w + n * K, K, xb + m0 * ldx, ldx, r);
                if (swiglu) BLZ_TILE_SWITCH(bf16_tile, mt, w + (n + nout) * K, K, xb + m0 * ldx, ldx, g);
                blz_epilogue(r, g, mt, m0, n, N, nout, bias, residual, out, swiglu);
            }
        }
    }
    return BLZ_OK;
}
