/* blazr kernels — the small glue of a forward: the embedding row gather, the scaled add (residual
 * adds, Granite's embedding / residual / logits multipliers), the logits' soft-cap (Gemma 2) and the MLP
 * activations that the linear epilogue does not fuse (GELU, ReLU², gated or not), so that a whole decode
 * step is kernel calls and can be recorded as one plan. Plain C loops, vectorised by the compiler
 * (`#pragma omp simd`), but GELU's, which has 8-lane steps of its own (gelu256). */
#include <string.h>

#include "blazr_kernels.h"

/* embedding: out[t, :] = scale · table[ids[t], :] for t < T; table [V, D], out [T, D] fp32. An id outside
 * [0, V) returns BLZ_ERANGE before anything is written. scale == 1 copies the rows bit for bit. */
BLZ_EXPORT int blz_embedding(const int64_t *ids, int64_t T, const float *table, int64_t V, int64_t D,
                             float scale, float *out) {
    if (T < 0 || V <= 0 || D <= 0) return BLZ_EINVAL;
    for (int64_t t = 0; t < T; ++t)
        if (ids[t] < 0 || ids[t] >= V) return BLZ_ERANGE;
    for (int64_t t = 0; t < T; ++t) {
        const float *row = table + ids[t] * D;
        float *o = out + t * D;
        if (scale == 1.0f) {
            memcpy(o, row, (size_t)D * sizeof(float));
        } else {
#pragma omp simd
            for (int64_t i = 0; i < D; ++i) o[i] = scale * row[i];
        }
    }
    return BLZ_OK;
}

/* axpby: out[i] = a·x[i] + b·y[i] for i < n (y may be NULL: out = a·x); out may alias x or y. Products
 * are rounded before the sum (the library builds with -ffp-contract=off), as torch's `x + b * y`. */
BLZ_EXPORT int blz_axpby(const float *x, float a, const float *y, float b, int64_t n, float *out) {
    if (n < 0) return BLZ_EINVAL;
    if (y == NULL) {
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) out[i] = a * x[i];
    } else if (a == 1.0f) {
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) out[i] = x[i] + b * y[i];
    } else {
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) out[i] = a * x[i] + b * y[i];
    }
    return BLZ_OK;
}

/* softcap: x[i] ← cap · tanh(x[i] / cap) in place for i < n (cap > 0; blz_softcap_rows), Gemma 2's final
 * logits; blocks of 4096 values split over the threads (a value's bits do not depend on the split). */
BLZ_EXPORT int blz_softcap(float *x, int64_t n, float cap, int nthreads) {
    if (n < 0 || !(cap > 0.0f)) return BLZ_EINVAL;
    const int64_t blk = 4096, nb = (n + blk - 1) / blk;
#pragma omp parallel for schedule(static) num_threads(nthreads > 0 ? nthreads : 1) if (nb > 1)
    for (int64_t b = 0; b < nb; ++b) blz_softcap_rows(x + b * blk, blz_min(blk, n - b * blk), cap);
    return BLZ_OK;
}

/* GELU, tanh approximation: 0.5·v·(1 + tanh u) with u = √(2/π)·(v + 0.044715·v³), computed as the equal
 * v·sigmoid(2u) = v / (1 + e^(−2u)) — one exp, no cancellation where v < 0 —, e by blz_exp_poly here and by
 * blz_exp256 in gelu256 (the same operations lane for lane, so the vector steps and the tail, and every build,
 * give the same bits; ≤ ~4 ulp from the exact formula). */
BLZ_INLINE float gelu_tanh(float v) {
    const float c = 0.044715f * v * v * v;
    return v / (1.0f + blz_exp_poly((v + c) * -1.5957691216057308f));
}

#ifdef BLZ_AVX2
BLZ_INLINE __m256 gelu256(__m256 v) {
    const __m256 c = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), v), v), v);
    const __m256 e = blz_exp256(_mm256_mul_ps(_mm256_add_ps(v, c), _mm256_set1_ps(-1.5957691216057308f)));
    return _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}
#endif

/* The MLP activations computed one value at a time, by code: 2 ReLU², 3 GELU (exact, erf); 0, SiLU, and 1,
 * GELU's tanh approximation, run in act_row's 8-lane steps. */
BLZ_INLINE float activate(float v, int kind) {
    if (kind == 3) return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    const float r = v > 0.0f ? v : 0.0f;
    return r * r;
}

/* Row om[0..n) = act(g[i]) (· up[i] where up is given) for SiLU (`gelu` 0: blz_silu256 / blz_silu) or GELU's
 * tanh form (1: gelu256 / gelu_tanh), 8 lanes at a time where the build has them: the vector steps and the
 * scalar tail give the same bits. */
static void act_row(const int gelu, const float *g, const float *up, int64_t n, float *om) {
    int64_t i = 0;
#ifdef BLZ_AVX2
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(g + i);
        __m256 y = gelu ? gelu256(v) : blz_silu256(v);
        if (up) y = _mm256_mul_ps(y, _mm256_loadu_ps(up + i));
        _mm256_storeu_ps(om + i, y);
    }
#endif
    for (; i < n; ++i) {
        const float y = gelu ? gelu_tanh(g[i]) : blz_silu(g[i]);
        om[i] = up ? y * up[i] : y;
    }
}

/* Elements from which an activation call splits its rows over the threads (an OpenMP fork costs ~1-2 µs). */
#define ACT_PARALLEL_MIN 65536

/* activation over rows of x [M, N]: gated → out [M, N/2] = act(x[:, :N/2]) · x[:, N/2:] (the [gate; up]
 * halves of a fused projection); else out [M, N] = act(x). out may equal x when not gated. Rows split over up
 * to nthreads threads when the call is large (a prompt's rows); every element is computed alone, so the bits
 * do not depend on the split. */
BLZ_EXPORT int blz_activation(const float *x, int64_t M, int64_t N, int kind, int gated, float *out, int nthreads) {
    if (M < 0 || N <= 0 || kind < 0 || kind > 3 || (gated && N % 2)) return BLZ_EINVAL;
    const int64_t nout = gated ? N / 2 : N;
#pragma omp parallel for schedule(static) num_threads(nthreads > 0 ? nthreads : 1) \
    if (M * nout >= ACT_PARALLEL_MIN && M > 1 && nthreads > 1)
    for (int64_t m = 0; m < M; ++m) {
        const float *xm = x + m * N;
        float *om = out + m * nout;
        if (kind <= 1) {
            act_row(kind, xm, gated ? xm + nout : NULL, nout, om);
        } else if (gated) {
            for (int64_t i = 0; i < nout; ++i) om[i] = activate(xm[i], kind) * xm[nout + i];
        } else {
            for (int64_t i = 0; i < nout; ++i) om[i] = activate(xm[i], kind);
        }
    }
    return BLZ_OK;
}
