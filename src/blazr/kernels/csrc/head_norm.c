/* blazr kernels — per-head RMSNorm in place (attention's q / k norm, LFM2): x [T, H, Dh] with token rows of
 * stride ldx and each token's heads contiguous (the q and k heads of a fused qkv row), head h normalised
 * over its Dh features and scaled by w1 [Dh] for h < H1 (the q heads), by w2 [Dh] after (the k heads):
 *     x[t, h, :] ← w · x[t, h, :] / sqrt(mean(x[t, h, :]²) + eps)
 * — blz_rms_norm's formula (norm_rope.c), head by head. A head's result depends on its own values only. */
#include "blazr_kernels.h"

BLZ_EXPORT int blz_head_rms_norm(float *x, int64_t T, int64_t ldx, int64_t H, int64_t Dh, const float *w1, int64_t H1,
                                 const float *w2, float eps, int nthreads) {
    if (T < 0 || H <= 0 || Dh <= 0 || H1 < 0 || H1 > H || ldx < H * Dh || (H1 < H && !w2)) return BLZ_EINVAL;
#pragma omp parallel for schedule(static) num_threads(nthreads > 0 ? nthreads : 1) if (T * H * Dh >= (1 << 15))
    for (int64_t th = 0; th < T * H; ++th) {
        const int64_t t = th / H, h = th % H;
        float *v = x + t * ldx + h * Dh;
        const float *w = h < H1 ? w1 : w2;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < Dh; ++i) ss += v[i] * v[i];
        const float r = 1.0f / sqrtf(ss / (float)Dh + eps);
#pragma omp simd
        for (int64_t i = 0; i < Dh; ++i) v[i] = w[i] * (v[i] * r);
    }
    return BLZ_OK;
}
