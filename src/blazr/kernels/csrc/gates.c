/* blazr kernels — the small elementwise pieces of gated attention and gated MoE (Qwen3-Next, Qwen3.5,
 * OLMo-Hybrid, Qwen3 / Gemma's q/k norm), in place on views of a fused projection's output so that a decode
 * step stays kernel calls only:
 *   head_rms_norm: RMSNorm of each group of D features (a head's, or a whole row's) of a row-strided view;
 *   sigmoid_mul:   x ← x · sigmoid(g), g one value per element or one per row;
 *   mul:           x ← x · g, the same shapes (Gemma 4's per-layer gate: act(gate(x)) · the layer's input);
 *   copy_rows:     rows of x into rows of out, either strided (Zamba2's concat of the residual and the
 *                  token embeddings: each into its half of one row).
 * Plain C loops (`#pragma omp simd` vectorises them for the host), as norm_rope.c; rows split over OpenMP
 * threads only when the call is large enough to pay for it.
 */
#include <string.h>

#include "blazr_kernels.h"

#define GATES_PARALLEL_MIN 32768 /* elements below which a call stays on one thread */

/* out[t·ldo + h·D + i] ← w[i] · (x / sqrt(mean_i(x²) + eps)) of x[t·ldt + h·D + i], t < T, h < H, i < D
 * (each token's H groups back to back: q or k heads inside a fused projection's row; H = 1: one group of a
 * whole row's width): blz_rms_norm on each token's [H, D] block. out NULL: in place (out = x, ldo = ldt);
 * else x is left as it is (Gemma 4's values: a weightless norm of the k rows, before their own norm). */
BLZ_EXPORT int blz_head_rms_norm(float *x, int64_t T, int64_t H, int64_t D, int64_t ldt, const float *w, float eps,
                                 float *out, int64_t ldo, int nthreads) {
    if (out == NULL) out = x, ldo = ldt;
    if (T < 0 || H <= 0 || D <= 0 || (T > 1 && (ldt < H * D || ldo < H * D))) return BLZ_EINVAL;
    if (T > 1 && ldt == H * D && ldo == H * D) /* one block of rows */
        return blz_rms_norm(x, w, T * H, D, eps, out, nthreads);
    for (int64_t t = 0; t < T; ++t) {
        const int rc = blz_rms_norm(x + t * ldt, w, H, D, eps, out + t * ldo, nthreads);
        if (rc != BLZ_OK) return rc;
    }
    return BLZ_OK;
}

/* x[m·ldx + n] ← x · sigmoid(g[m·ldg + n]) (gw = N) or · sigmoid(g[m·ldg]) (gw = 1), m < M, n < N. */
BLZ_EXPORT int blz_sigmoid_mul(float *x, int64_t M, int64_t N, int64_t ldx, const float *g, int64_t ldg, int64_t gw,
                               int nthreads) {
    if (M < 0 || N <= 0 || (gw != 1 && gw != N) || (M > 1 && (ldx < N || ldg < gw))) return BLZ_EINVAL;
#pragma omp parallel for schedule(static) num_threads(nthreads > 0 ? nthreads : 1) \
    if (M * N >= GATES_PARALLEL_MIN && M > 1)
    for (int64_t m = 0; m < M; ++m) {
        float *xr = x + m * ldx;
        const float *gr = g + m * ldg;
        if (gw == 1) {
            const float s = 1.0f / (1.0f + expf(-gr[0]));
            for (int64_t n = 0; n < N; ++n) xr[n] *= s;
        } else {
            for (int64_t n = 0; n < N; ++n) xr[n] *= 1.0f / (1.0f + expf(-gr[n]));
        }
    }
    return BLZ_OK;
}

/* x[m·ldx + n] ← x · g[m·ldg + n] (gw = N) or · g[m·ldg] (gw = 1), m < M, n < N: one rounding a product,
 * as torch's `x * g`; ldg = 0 gives every row the same g (a learned scalar, gw = 1: Gemma 4's layer scale). */
BLZ_EXPORT int blz_mul(float *x, int64_t M, int64_t N, int64_t ldx, const float *g, int64_t ldg, int64_t gw,
                       int nthreads) {
    if (M < 0 || N <= 0 || (gw != 1 && gw != N) || (M > 1 && (ldx < N || (ldg != 0 && ldg < gw)))) return BLZ_EINVAL;
#pragma omp parallel for schedule(static) num_threads(nthreads > 0 ? nthreads : 1) \
    if (M * N >= GATES_PARALLEL_MIN && M > 1)
    for (int64_t m = 0; m < M; ++m) {
        float *xr = x + m * ldx;
        const float *gr = g + m * ldg;
        if (gw == 1) {
            const float s = gr[0];
#pragma omp simd
            for (int64_t n = 0; n < N; ++n) xr[n] *= s;
        } else {
#pragma omp simd
            for (int64_t n = 0; n < N; ++n) xr[n] *= gr[n];
        }
    }
    return BLZ_OK;
}

/* out[m·ldo + n] ← x[m·ldx + n], m < M, n < N (bit for bit). */
BLZ_EXPORT int blz_copy_rows(const float *x, int64_t M, int64_t N, int64_t ldx, float *out, int64_t ldo) {
    if (M < 0 || N <= 0 || (M > 1 && (ldx < N || ldo < N))) return BLZ_EINVAL;
    for (int64_t m = 0; m < M; ++m) memcpy(out + m * ldo, x + m * ldx, (size_t)N * sizeof(float));
    return BLZ_OK;
}
