/* blazr kernels — the causal depthwise convolution of LFM2's gated short conv and of Mamba1, its state
 * advanced in place in a pool: the decode step (one new row for each of B sequences) and the prefill (n_b new
 * rows of each of B sequences), one entry point `blz_causal_conv`.
 *
 * Per sequence b (state slot s), channel c < C, kernel width K, new row t:
 *   u[t, c] = gin[t, c]·x[t, c]  (gin NULL: x[t, c])                          LFM2: B·x
 *   v[t, c] = bias_c + Σ_{k<K} w[c, k]·u[t − (K−1) + k, c]                   (rows before the first: the state)
 *   y[t, c] = gout[t, c]·act(v[t, c])  (gout NULL: act(v); act: identity, or SiLU when `silu`)   LFM2: C·v
 * and the state keeps the last K−1 inputs u (reaching into the old state when n < K−1).
 * Layouts (fp32, row-major): x, gin, gout rows of stride ld (column views of one in_proj output), w [C, K],
 * bias [C] or NULL, state pool [S, K−1, C] (tap-major: a step reads and shifts whole rows of C channels,
 * vectorised), y [T, C] contiguous. index: the decode step's slots [B] (prefill = 0), or per sequence
 * (row0, n, slot, fresh) [B, 4] (prefill = 1; fresh = 1 starts from a zero state: the slot may hold a
 * previous owner's); slots distinct.
 *
 * Sums run k = 0 .. K−1 from the bias, one fma each, in every path (AVX-512, AVX2, scalar): the same bits on
 * every ISA and whatever the batch or thread count — a row depends on its own sequence only. SiLU takes
 * blz_silu_rows' exp (the same bits in its vector and scalar steps).
 */
#include "blazr_kernels.h"

#define BLZ_CONV_MAX_K 16

/* acc[c] = fma(w[c], v[c], acc[c]) for c < n. */
static void fma_rows(float *restrict acc, const float *restrict w, const float *restrict v, int64_t n) {
    int64_t c = 0;
#if defined(BLZ_AVX512)
    for (; c + 16 <= n; c += 16)
        _mm512_storeu_ps(acc + c,
                         _mm512_fmadd_ps(_mm512_loadu_ps(w + c), _mm512_loadu_ps(v + c), _mm512_loadu_ps(acc + c)));
#elif defined(BLZ_AVX2)
    for (; c + 8 <= n; c += 8)
        _mm256_storeu_ps(acc + c,
                         _mm256_fmadd_ps(_mm256_loadu_ps(w + c), _mm256_loadu_ps(v + c), _mm256_loadu_ps(acc + c)));
#endif
    for (; c < n; ++c) acc[c] = fmaf(w[c], v[c], acc[c]);
}

/* out[c] = a[c]·b[c] for c < n (b NULL: a copy). */
static void mul_rows(float *out, const float *a, const float *b, int64_t n) {
    if (!b) {
        memcpy(out, a, (size_t)n * sizeof(float));
        return;
    }
    int64_t c = 0;
#if defined(BLZ_AVX512)
    for (; c + 16 <= n; c += 16)
        _mm512_storeu_ps(out + c, _mm512_mul_ps(_mm512_loadu_ps(a + c), _mm512_loadu_ps(b + c)));
#elif defined(BLZ_AVX2)
    for (; c + 8 <= n; c += 8) _mm256_storeu_ps(out + c, _mm256_mul_ps(_mm256_loadu_ps(a + c), _mm256_loadu_ps(b + c)));
#endif
    for (; c < n; ++c) out[c] = a[c] * b[c];
}

/* One output row over channels [c0, c1): taps[k] points at input row k of the window (K rows, the last the
 * new one), already gated; wt the taps transposed [K, C]. */
static void conv_row(float *restrict y, const float *const *taps, const float *wt, const float *bias,
                     const float *gout, int64_t C, int64_t K, int silu, int64_t c0, int64_t c1) {
    const int64_t n = c1 - c0;
    if (bias)
        memcpy(y + c0, bias + c0, (size_t)n * sizeof(float));
    else
        memset(y + c0, 0, (size_t)n * sizeof(float));
    for (int64_t k = 0; k < K; ++k) fma_rows(y + c0, wt + k * C + c0, taps[k] + c0, n);
    if (silu) blz_silu_rows(y + c0, n);
    if (gout) mul_rows(y + c0, y + c0, gout + c0, n);
}

/* y[c] = bias_c + Σ_{k<K−1} w[c, k]·st[k, c] + w[c, K−1]·u[c] for c in [c0, c1), the taps of w [C, K] gathered
 * where they lie: the same fma order as conv_row's lanes. */
static void conv_taps_in_place(float *restrict y, const float *restrict st, const float *restrict u,
                               const float *restrict w, const float *bias, int64_t C, int64_t K, int64_t c0,
                               int64_t c1) {
    const int64_t Kw = K - 1;
    int64_t c = c0;
#if defined(BLZ_AVX512)
    const __m512i lane = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)K));
    for (; c + 16 <= c1 && (c + 16) * K < (1LL << 31); c += 16) {
        __m512 acc = bias ? _mm512_loadu_ps(bias + c) : _mm512_setzero_ps();
        for (int64_t k = 0; k < Kw; ++k)
            acc = _mm512_fmadd_ps(_mm512_i32gather_ps(lane, w + c * K + k, 4), _mm512_loadu_ps(st + k * C + c), acc);
        acc = _mm512_fmadd_ps(_mm512_i32gather_ps(lane, w + c * K + Kw, 4), _mm512_loadu_ps(u + c), acc);
        _mm512_storeu_ps(y + c, acc);
    }
#elif defined(BLZ_AVX2)
    const __m256i lane = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)K));
    for (; c + 8 <= c1 && (c + 8) * K < (1LL << 31); c += 8) {
        __m256 acc = bias ? _mm256_loadu_ps(bias + c) : _mm256_setzero_ps();
        for (int64_t k = 0; k < Kw; ++k)
            acc = _mm256_fmadd_ps(_mm256_i32gather_ps(w + c * K + k, lane, 4), _mm256_loadu_ps(st + k * C + c), acc);
        acc = _mm256_fmadd_ps(_mm256_i32gather_ps(w + c * K + Kw, lane, 4), _mm256_loadu_ps(u + c), acc);
        _mm256_storeu_ps(y + c, acc);
    }
#endif
    for (; c < c1; ++c) {
        const float *wc = w + c * K;
        float acc = bias ? bias[c] : 0.0f;
        for (int64_t k = 0; k < Kw; ++k) acc = fmaf(wc[k], st[k * C + c], acc);
        y[c] = fmaf(wc[Kw], u[c], acc);
    }
}

/* Checks a recurrent kernel's `index` (the decode step's slots [B], or the prefill's (row0, n, slot, fresh)
 * [B, 4]) against S state slots — slots in range, rows non-negative, a prefill's slots distinct (a decode
 * step's rows that share a slot run in row order: a sequence's consecutive tokens) — and sets *T to the rows
 * it spans. */
int blz_recurrent_rows(const int64_t *index, int64_t B, int prefill, int64_t S, int64_t *T) {
    *T = prefill ? 0 : B;
    for (int64_t b = 0; b < B; ++b) {
        const int64_t slot = prefill ? index[4 * b + 2] : index[b];
        if (prefill && (index[4 * b] < 0 || index[4 * b + 1] < 0)) return BLZ_EINVAL;
        if (slot < 0 || slot >= S) return BLZ_ERANGE;
        for (int64_t o = 0; prefill && o < b; ++o)
            if (index[4 * o + 2] == slot) return BLZ_EINVAL;
        if (prefill) *T = blz_max(*T, index[4 * b] + index[4 * b + 1]);
    }
    return BLZ_OK;
}

#define CONV_PARTS 16 /* a decode step's channels, split over the threads (a decode batch is often one row) */

BLZ_EXPORT int blz_causal_conv(const float *x, const float *gin, const float *gout, int64_t ld, const int64_t *index,
                               int64_t B, int prefill, const float *w, const float *bias, float *state, int64_t S,
                               int64_t C, int64_t K, int silu, float *y, int nthreads) {
    if (B < 0 || C <= 0 || K < 2 || K > BLZ_CONV_MAX_K || S < 0 || ld < C) return BLZ_EINVAL;
    int64_t T;
    const int rc = blz_recurrent_rows(index, B, prefill, S, &T);
    if (rc != BLZ_OK || T == 0) return rc;
    const int64_t Kw = K - 1;
    if (!prefill) { /* one row per sequence: the taps read where they lie (no transposed copy to make) */
        float *u = blz_scratch((size_t)(B * C) * sizeof(float));
        if (!u) return BLZ_ENOMEM;
        const int nt = blz_threads(nthreads, B * C * K, 1 << 14);
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t part = 0; part < CONV_PARTS; ++part) { /* channels split, rows in order (see above) */
            const int64_t c0 = C * part / CONV_PARTS, c1 = C * (part + 1) / CONV_PARTS;
            for (int64_t b = 0; b < B; ++b) {
                float *st = state + index[b] * Kw * C, *ub = u + b * C, *yb = y + b * C;
                mul_rows(ub + c0, x + b * ld + c0, gin ? gin + b * ld + c0 : NULL, c1 - c0);
                conv_taps_in_place(yb, st, ub, w, bias, C, K, c0, c1);
                if (silu) blz_silu_rows(yb + c0, c1 - c0);
                if (gout) mul_rows(yb + c0, yb + c0, gout + b * ld + c0, c1 - c0);
                for (int64_t k = 0; k + 1 < Kw; ++k)
                    memcpy(st + k * C + c0, st + (k + 1) * C + c0, (size_t)(c1 - c0) * 4);
                memcpy(st + (Kw - 1) * C + c0, ub + c0, (size_t)(c1 - c0) * sizeof(float));
            }
        }
        return BLZ_OK;
    }
    /* scratch: the taps transposed [K, C], the gated new rows u [T, C], a zero row */
    float *wt = blz_scratch((size_t)(K * C + T * C + C) * sizeof(float));
    if (!wt) return BLZ_ENOMEM;
    float *u = wt + K * C, *zero = u + T * C;
    for (int64_t c = 0; c < C; ++c)
        for (int64_t k = 0; k < K; ++k) wt[k * C + c] = w[c * K + k];
    memset(zero, 0, (size_t)C * sizeof(float));
    const int nt = blz_threads(nthreads, T * C * K, 1 << 14);
#pragma omp parallel num_threads(nt)
    {
        for (int64_t b = 0; b < B; ++b) {
            const int64_t row0 = index[4 * b], n = index[4 * b + 1], fresh = index[4 * b + 3];
            float *st = state + index[4 * b + 2] * Kw * C;
#pragma omp for schedule(static)
            for (int64_t t = 0; t < n; ++t) {
                const int64_t r = row0 + t;
                mul_rows(u + r * C, x + r * ld, gin ? gin + r * ld : NULL, C);
            }
            /* (implicit barrier) every gated row is in u */
#pragma omp for schedule(static)
            for (int64_t t = 0; t < n; ++t) {
                const float *taps[BLZ_CONV_MAX_K];
                for (int64_t k = 0; k < K; ++k) {
                    const int64_t j = t - Kw + k; /* the window's row k: new row j, or state row Kw + j */
                    taps[k] = j >= 0 ? u + (row0 + j) * C : fresh ? zero : st + (Kw + j) * C;
                }
                conv_row(y + (row0 + t) * C, taps, wt, bias, gout ? gout + (row0 + t) * ld : NULL, C, K, silu, 0, C);
            }
            /* (implicit barrier) the new state: the last K−1 inputs, reaching into the old state when n < K−1 */
#pragma omp single
            for (int64_t k = 0; k < Kw; ++k) { /* ascending: row k + n of the old state is not yet overwritten */
                const int64_t j = n - Kw + k;
                if (j >= 0)
                    memcpy(st + k * C, u + (row0 + j) * C, (size_t)C * sizeof(float));
                else if (fresh)
                    memset(st + k * C, 0, (size_t)C * sizeof(float));
                else
                    memmove(st + k * C, st + (Kw + j) * C, (size_t)C * sizeof(float));
            }
        }
    }
    return BLZ_OK;
}
