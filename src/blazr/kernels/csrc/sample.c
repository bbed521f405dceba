/* blazr kernels — choosing the next token from rows of logits x [B, V] (fp32, rows contiguous).
 *
 * blz_argmax_rows: out[b] = the first index of row b's largest value; NaN counts as −inf (an all-NaN row
 * gives 0).
 *
 * blz_sample_rows: one draw per row from the temperature / min-p distribution, by inverse CDF. With
 * x' = min(x, FLT_MAX), m = max x' (NaN ignored) and t_i = (x'_i − m) · (1/T_b):
 *     e_i = exp(t_i)   if t_i ≥ −87 (else 0; NaN gives 0),   then 0 where e_i < min_p_b
 * (e_i = p_i / p_max, so min-p's "p_i ≥ min_p · p_max" is "e_i ≥ min_p"). The drawn token is the first i
 * whose running sum of e exceeds u_b · Σe (u_b in [0, 1): the caller's uniform, so a seeded request draws
 * from its own generator); if rounding leaves the target at or past the sum, the last token with e > 0.
 * A row with no value above −inf gives 0. exp is one fixed sequence of fp32 operations (Cephes' range
 * reduction and degree-5 polynomial, explicit FMAs, ≤ 2 ulp): the AVX2 and portable paths compute the same
 * bits. The sum is fixed too: blocks of 64 values, each summed as 8 lanes (lane j adds elements j, j + 8, …
 * in order) reduced as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), the block sums added in order; the draw finds
 * the block whose sum crosses the target, then walks that block's values one by one. So every build draws
 * the same token, and a row's draw does not depend on the others in its batch.
 *
 * Cost: two passes over a row (max, then exp and block sums) plus one block; about 20 µs per 49k-value row
 * on one AVX2 core, where torch's softmax / cumsum / searchsorted took ~0.5 ms.
 */
#include <float.h>
#include <stdlib.h>

#include "blazr_kernels.h"

#define SB 64 /* values per summation block */

static const float EXP_LO = -87.0f;

/* exp(t) for t in [−87, 0] (callers pass nothing else that is kept): n = round(t·log2 e), r = t − n·ln 2 in
 * two parts, exp(r) by Cephes' polynomial, times 2^n (n ≥ −126: a normal float). */
BLZ_INLINE float exp_scalar(float t) {
    const float n = nearbyintf(t * 1.44269504088896341f);
    float r = fmaf(n, -0.693359375f, t);
    r = fmaf(n, 2.12194440e-4f, r);
    const float z = r * r;
    float y = 1.9875691500e-4f;
    y = fmaf(y, r, 1.3981999507e-3f);
    y = fmaf(y, r, 8.3334519073e-3f);
    y = fmaf(y, r, 4.1665795894e-2f);
    y = fmaf(y, r, 1.6666665459e-1f);
    y = fmaf(y, r, 5.0000001201e-1f);
    y = fmaf(y, z, r);
    y = y + 1.0f;
    union {
        uint32_t u;
        float f;
    } scale = {.u = (uint32_t)((int32_t)n + 127) << 23};
    return y * scale.f;
}

/* The kept weight of one value (see the header). */
BLZ_INLINE float weight_scalar(float x, float m, float inv_t, float min_p) {
    const float t = (fminf(x, FLT_MAX) - m) * inv_t; /* fminf(NaN, MAX) is MAX: NaN handled below */
    if (x != x || !(t >= EXP_LO)) return 0.0f;
    const float e = exp_scalar(t);
    return e < min_p ? 0.0f : e;
}

#ifdef BLZ_AVX2
BLZ_INLINE __m256 exp_avx2(__m256 t) {
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(t, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693359375f), t);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
    const __m256 z = _mm256_mul_ps(r, r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, z, r);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* weight_scalar on 8 values. Lanes whose t is below −87 or NaN are 0 (their exp is computed on a clamped
 * t and discarded). */
BLZ_INLINE __m256 weight_avx2(__m256 x, __m256 m, __m256 inv_t, __m256 min_p) {
    const __m256 t = _mm256_mul_ps(_mm256_sub_ps(_mm256_min_ps(x, _mm256_set1_ps(FLT_MAX)), m), inv_t);
    const __m256 keep = _mm256_and_ps(_mm256_cmp_ps(t, _mm256_set1_ps(EXP_LO), _CMP_GE_OQ),
                                      _mm256_cmp_ps(x, x, _CMP_ORD_Q));
    const __m256 e = exp_avx2(_mm256_max_ps(t, _mm256_set1_ps(EXP_LO)));
    return _mm256_and_ps(e, _mm256_and_ps(keep, _mm256_cmp_ps(e, min_p, _CMP_GE_OQ)));
}

BLZ_INLINE float lane_tree(__m256 a) {
    float l[8];
    _mm256_storeu_ps(l, a);
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}
#endif

/* max over a row of min(x, FLT_MAX), NaN ignored (−inf when nothing else). */
static float row_max(const float *x, int64_t V) {
    float m = -INFINITY;
    int64_t i = 0;
#ifdef BLZ_AVX2
    __m256 acc = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= V; i += 8) acc = _mm256_max_ps(_mm256_loadu_ps(x + i), acc); /* NaN x: keeps acc */
    float l[8];
    _mm256_storeu_ps(l, acc);
    for (int j = 0; j < 8; ++j) m = l[j] > m ? l[j] : m;
#endif
    for (; i < V; ++i) m = x[i] > m ? x[i] : m;
    return fminf(m, FLT_MAX);
}

/* Sum of the kept weights of block [i0, i0 + SB) (values past V count as 0), in the fixed lane order. */
static float block_sum(const float *x, int64_t i0, int64_t V, float m, float inv_t, float min_p) {
#ifdef BLZ_AVX2
    float pad[SB];
    const float *src = x + i0;
    if (i0 + SB > V) { /* the row's last, partial block: −inf beyond V weighs 0 */
        for (int64_t j = 0; j < SB; ++j) pad[j] = i0 + j < V ? x[i0 + j] : -INFINITY;
        src = pad;
    }
    const __m256 vm = _mm256_set1_ps(m), vt = _mm256_set1_ps(inv_t), vp = _mm256_set1_ps(min_p);
    __m256 acc = weight_avx2(_mm256_loadu_ps(src), vm, vt, vp);
    for (int v = 1; v < SB / 8; ++v) acc = _mm256_add_ps(acc, weight_avx2(_mm256_loadu_ps(src + 8 * v), vm, vt, vp));
    return lane_tree(acc);
#else
    float l[8];
    for (int j = 0; j < 8; ++j) {
        l[j] = i0 + j < V ? weight_scalar(x[i0 + j], m, inv_t, min_p) : 0.0f;
        for (int v = 1; v < SB / 8; ++v) {
            const int64_t i = i0 + 8 * v + j;
            l[j] += i < V ? weight_scalar(x[i], m, inv_t, min_p) : 0.0f;
        }
    }
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
#endif
}

static int64_t draw_row(const float *x, int64_t V, float inv_t, float min_p, float u, float *sums) {
    const float m = row_max(x, V);
    if (m == -INFINITY) return 0;
    const int64_t nblocks = (V + SB - 1) / SB;
    float total = 0.0f;
    for (int64_t k = 0; k < nblocks; ++k) {
        sums[k] = block_sum(x, k * SB, V, m, inv_t, min_p);
        total += sums[k];
    }
    const float target = u * total;
    float run = 0.0f;
    for (int64_t k = 0; k < nblocks; ++k) {
        if (!(run + sums[k] > target)) {
            run += sums[k];
            continue;
        }
        const int64_t end = (k + 1) * SB < V ? (k + 1) * SB : V;
        int64_t last = -1;
        for (int64_t i = k * SB; i < end; ++i) {
            const float e = weight_scalar(x[i], m, inv_t, min_p);
            if (e > 0.0f) last = i;
            run += e;
            if (run > target) return i;
        }
        if (last >= 0) return last; /* the block's sum crossed, its values one by one did not (rounding) */
    }
    for (int64_t k = nblocks - 1; k >= 0; --k) { /* target at or past the sum: the last kept token */
        if (!(sums[k] > 0.0f)) continue;
        const int64_t end = (k + 1) * SB < V ? (k + 1) * SB : V;
        for (int64_t i = end - 1; i >= k * SB; --i)
            if (weight_scalar(x[i], m, inv_t, min_p) > 0.0f) return i;
    }
    return 0; /* unreachable: the max itself weighs 1 */
}

BLZ_EXPORT int blz_sample_rows(const float *x, int64_t B, int64_t V, const float *temperature,
                               const float *min_p, const float *u, int64_t *out, int nthreads) {
    if (B < 0 || V <= 0) return BLZ_EINVAL;
    for (int64_t b = 0; b < B; ++b)
        if (!(temperature[b] > 0.0f) || !(temperature[b] < INFINITY) || !(u[b] >= 0.0f && u[b] < 1.0f) ||
            !(min_p[b] >= 0.0f && min_p[b] <= 1.0f))
            return BLZ_EINVAL;
    const int64_t nblocks = (V + SB - 1) / SB;
    float *sums = malloc((size_t)(B * nblocks) * sizeof(float));
    if (!sums) return BLZ_ENOMEM;
#pragma omp parallel for schedule(static) num_threads(nthreads > 0 ? nthreads : 1) if (B > 1)
    for (int64_t b = 0; b < B; ++b)
        out[b] = draw_row(x + b * V, V, 1.0f / temperature[b], min_p[b], u[b], sums + b * nblocks);
    free(sums);
    return BLZ_OK;
}

static int64_t argmax_row(const float *x, int64_t V) {
    float m = -INFINITY;
    int64_t i = 0;
#ifdef BLZ_AVX2
    __m256 acc = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= V; i += 8) acc = _mm256_max_ps(_mm256_loadu_ps(x + i), acc);
    float l[8];
    _mm256_storeu_ps(l, acc);
    for (int j = 0; j < 8; ++j) m = l[j] > m ? l[j] : m;
#endif
    for (; i < V; ++i) m = x[i] > m ? x[i] : m;
    i = 0;
#ifdef BLZ_AVX2
    const __m256 vm = _mm256_set1_ps(m);
    for (; i + 8 <= V; i += 8) {
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vm, _CMP_EQ_OQ));
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
#endif
    for (; i < V; ++i)
        if (x[i] == m) return i;
    return 0; /* every value NaN */
}

BLZ_EXPORT int blz_argmax_rows(const float *x, int64_t B, int64_t V, int64_t *out, int nthreads) {
    if (B < 0 || V <= 0) return BLZ_EINVAL;
#pragma omp parallel for schedule(static) num_threads(nthreads > 0 ? nthreads : 1) if (B > 1)
    for (int64_t b = 0; b < B; ++b) out[b] = argmax_row(x + b * V, V);
    return BLZ_OK;
}
