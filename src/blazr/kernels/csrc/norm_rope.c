/* blazr kernels — RMSNorm, Mamba2's gated RMSNorm and NeoX (half-split) rotary embedding.
 *
 * Both are short elementwise loops written in plain C; `#pragma omp simd` lets the compiler vectorise them
 * for the host ISA (AVX-512 with -march=native, SSE2 in the fallback build), so there is no separate
 * intrinsics path. Rows are split over OpenMP threads only when the call is large enough to pay for it.
 */
#include "blazr_kernels.h"

/* Elements below which a call stays on one thread (an OpenMP fork costs ~1-2 µs). */
#define BLZ_PARALLEL_MIN 32768

/* rms_norm: out[m, :] = w * (x[m, :] / sqrt(mean(x[m, :]²) + eps)), x and out [M, D] (out may equal x),
 * w [D]; statistics in fp32. */
BLZ_EXPORT int blz_rms_norm(const float *x, const float *w, int64_t M, int64_t D, float eps, float *out,
                            int nthreads) {
    if (M < 0 || D <= 0) return BLZ_EINVAL;
#pragma omp parallel for schedule(static) num_threads(nthreads > 0 ? nthreads : 1) \
    if (M * D >= BLZ_PARALLEL_MIN && M > 1)
    for (int64_t m = 0; m < M; ++m) {
        const float *xm = x + m * D;
        float *om = out + m * D;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < D; ++i) ss += xm[i] * xm[i];
        const float r = 1.0f / sqrtf(ss / (float)D + eps);
#pragma omp simd
        for (int64_t i = 0; i < D; ++i) om[i] = w[i] * (xm[i] * r);
    }
    return BLZ_OK;
}

/* rope_neox, in place on x [T, H, Dh] (token t's heads start at x + t·ldx, heads contiguous, so q and k
 * can be rotated inside a fused qkv row): for each token and head, with c = cos[pos[t], i],
 * s = sin[pos[t], i] and half = R/2, rotates pairs (x[i], x[i + half]) for i < half:
 *     x[i] ← x[i]·c − x[i+half]·s,   x[i+half] ← x[i+half]·c + x[i]·s.
 * Features R .. Dh-1 are left alone. cos/sin are [P, R/2]; a position outside [0, P) returns BLZ_ERANGE
 * before anything is written. */
BLZ_EXPORT int blz_rope_neox(float *x, int64_t T, int64_t H, int64_t Dh, int64_t ldx, const int64_t *pos,
                             const float *cos, const float *sin, int64_t P, int64_t R, int nthreads) {
    if (T < 0 || H <= 0 || R <= 0 || R % 2 || R > Dh || ldx < H * Dh) return BLZ_EINVAL;
    for (int64_t t = 0; t < T; ++t)
        if (pos[t] < 0 || pos[t] >= P) return BLZ_ERANGE;
    const int64_t half = R / 2;
#pragma omp parallel for schedule(static) num_threads(nthreads > 0 ? nthreads : 1) \
    if (T * H * R >= BLZ_PARALLEL_MIN && T > 1)
    for (int64_t t = 0; t < T; ++t) {
        const float *c = cos + pos[t] * half, *s = sin + pos[t] * half;
        for (int64_t h = 0; h < H; ++h) {
            float *x1 = x + t * ldx + h * Dh, *x2 = x1 + half;
#pragma omp simd
            for (int64_t i = 0; i < half; ++i) {
                const float a = x1[i], b = x2[i];
                x1[i] = a * c[i] - b * s[i];
                x2[i] = b * c[i] + a * s[i];
            }
        }
    }
    return BLZ_OK;
}

#define GATE_CHUNK 256 /* silu(z) values computed at a time, on the stack */

/* g[i] = silu(z[i]) for i < n ≤ GATE_CHUNK (blz_silu_rows: the same bits wherever the chunk starts). */
BLZ_INLINE void gate_chunk(const float *z, int64_t n, float *g) {
    memcpy(g, z, (size_t)n * sizeof(float));
    blz_silu_rows(g, n);
}

/* o[i] = y[i] · silu(z[i]) for i < n (o may equal y). */
BLZ_INLINE void gate_mul(const float *y, const float *z, float *o, int64_t n) {
    float g[GATE_CHUNK];
    for (int64_t i0 = 0; i0 < n; i0 += GATE_CHUNK) {
        const int64_t c = blz_min(GATE_CHUNK, n - i0);
        gate_chunk(z + i0, c, g);
        for (int64_t i = 0; i < c; ++i) o[i0 + i] = y[i0 + i] * g[i];
    }
}

/* gated_rms_norm (Mamba2's output norm), rows of D split in groups of `group` features:
 *   norm_before_gate = 0:  v = y · silu(z);  out = w · v / sqrt(mean_group(v²) + eps)
 *   norm_before_gate = 1:  out = w · (y / sqrt(mean_group(y²) + eps)) · silu(z)
 *   w = NULL:              out = y · silu(z)  (no norm: FalconH1 without its Mamba norm)
 * y and out [M, D] (out may equal y), z rows at z + m·ldz (a view into the in_proj output), w [D]; fp32. */
BLZ_EXPORT int blz_gated_rms_norm(const float *y, const float *z, int64_t ldz, const float *w, int64_t M, int64_t D,
                                  int64_t group, float eps, int norm_before_gate, float *out, int nthreads) {
    if (M < 0 || D <= 0 || group <= 0 || D % group || ldz < D) return BLZ_EINVAL;
#pragma omp parallel for schedule(static) num_threads(nthreads > 0 ? nthreads : 1) \
    if (M * D >= BLZ_PARALLEL_MIN && M > 1)
    for (int64_t m = 0; m < M; ++m) {
        const float *ym = y + m * D, *zm = z + m * ldz;
        float *om = out + m * D, g[GATE_CHUNK];
        if (!w) { /* the gate alone */
            gate_mul(ym, zm, om, D);
            continue;
        }
        for (int64_t g0 = 0; g0 < D; g0 += group) {
            float ss = 0.0f;
            if (norm_before_gate) {
#pragma omp simd reduction(+ : ss)
                for (int64_t i = g0; i < g0 + group; ++i) ss += ym[i] * ym[i];
                const float r = 1.0f / sqrtf(ss / (float)group + eps);
                for (int64_t i0 = g0; i0 < g0 + group; i0 += GATE_CHUNK) {
                    const int64_t n = blz_min(GATE_CHUNK, g0 + group - i0);
                    gate_chunk(zm + i0, n, g);
                    for (int64_t i = 0; i < n; ++i) om[i0 + i] = w[i0 + i] * ((ym[i0 + i] * r) * g[i]);
                }
            } else {
                gate_mul(ym + g0, zm + g0, om + g0, group);
#pragma omp simd reduction(+ : ss)
                for (int64_t i = g0; i < g0 + group; ++i) ss += om[i] * om[i];
                const float r = 1.0f / sqrtf(ss / (float)group + eps);
#pragma omp simd
                for (int64_t i = g0; i < g0 + group; ++i) om[i] = w[i] * (om[i] * r);
            }
        }
    }
    return BLZ_OK;
}
