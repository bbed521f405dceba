/* blazr kernels — choosing the next token from rows of logits x [B, V] (fp32, rows contiguous).
 *
 * blz_argmax_rows: out[b] = the first index of row b's largest value; NaN counts as −inf (an all-NaN row
 * gives 0).
 *
 * blz_sample_rows: one draw per row from the temperature / min-p / top-k / top-p distribution, by inverse
 * CDF (vLLM's order: top-k sees what min-p left, top-p what top-k left). With x' = min(x, FLT_MAX),
 * m = max x' (NaN ignored) and t_i = (x'_i − m) · (1/T_b):
 *     e_i = exp(t_i)   if t_i ≥ −87 (else 0; NaN gives 0),   then 0 where e_i < min_p_b
 * (e_i = p_i / p_max, so min-p's "p_i ≥ min_p · p_max" is "e_i ≥ min_p"). u_b in [0, 1) is the caller's
 * uniform (a seeded request draws it from its own generator).
 * - Plain rows (top_k 0 or ≥ V, top_p 1): the drawn token is the first i whose running sum of e exceeds
 *   u_b · Σe; if rounding leaves the target at or past the sum, the last token with e > 0. The sum has a
 *   fixed order: blocks of 64 values, each summed as 8 lanes (lane j adds elements j, j + 8, … in order)
 *   reduced as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), the block sums added in order; the draw finds the block
 *   whose sum crosses the target, then walks that block's values one by one.
 * - Ranked rows: the tokens with e > 0 sorted by e descending (ties: lower id first); top-k keeps the first
 *   k; top-p then keeps the shortest prefix whose sum reaches top_p · (the mass top-k left: the sum of the
 *   k, else Σe in the lane order above); the draw walks that prefix in order, as above. Only candidates
 *   are sorted: a 1024-bucket histogram of e's top bits (exponent and 3 mantissa bits) finds the bucket
 *   where the k-th largest value, or the top-p mass, is reached; the buckets from there up (one more
 *   for top-p, against rounding) are collected and sorted.
 * A row with no value above −inf gives 0. exp is one fixed sequence of fp32 operations (Cephes' range
 * reduction and degree-5 polynomial, explicit FMAs, ≤ 2 ulp): the AVX2 and portable paths compute the same
 * bits, and every sum has one order, so every build draws the same token, and a row's draw does not depend
 * on the others in its batch.
 *
 * Cost: two passes over a row (max, then exp and block sums) plus one block; about 20 µs per 49k-value row
 * on one AVX2 core, where torch's softmax / cumsum / searchsorted took ~0.5 ms. Ranked rows add a
 * histogram pass and a sort of the candidates (a few hundred for top-p 0.9 of a peaked distribution; all
 * of them for a flat one).
 */
#include <float.h>
#include <stdlib.h>

#include "blazr_kernels.h"

#define SB 64 /* values per summation block */

static const float EXP_LO = -87.0f;

/* The kept weight of one value (see the header). */
BLZ_INLINE float weight_scalar(float x, float m, float inv_t, float min_p) {
    const float t = (fminf(x, FLT_MAX) - m) * inv_t; /* fminf(NaN, MAX) is MAX: NaN handled below */
    if (x != x || !(t >= EXP_LO)) return 0.0f;
    const float e = blz_exp_poly(t); /* blz_exp256's operations: the vector steps' bits */
    return e < min_p ? 0.0f : e;
}

#ifdef BLZ_AVX2
/* weight_scalar on 8 values. Lanes whose t is below −87 or NaN are 0 (their exp is computed on a clamped
 * t and discarded). */
BLZ_INLINE __m256 weight_avx2(__m256 x, __m256 m, __m256 inv_t, __m256 min_p) {
    const __m256 t = _mm256_mul_ps(_mm256_sub_ps(_mm256_min_ps(x, _mm256_set1_ps(FLT_MAX)), m), inv_t);
    const __m256 keep = _mm256_and_ps(_mm256_cmp_ps(t, _mm256_set1_ps(EXP_LO), _CMP_GE_OQ),
                                      _mm256_cmp_ps(x, x, _CMP_ORD_Q));
    const __m256 e = blz_exp256(_mm256_max_ps(t, _mm256_set1_ps(EXP_LO))); /* blz_exp_poly's operations */
    return _mm256_and_ps(e, _mm256_and_ps(keep, _mm256_cmp_ps(e, min_p, _CMP_GE_OQ)));
}

#endif

/* The largest value of a row, NaN ignored (−inf when nothing else). */
static float max_not_nan(const float *x, int64_t V) {
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
    return m;
}

/* max over a row of min(x, FLT_MAX), NaN ignored (−inf when nothing else). */
static float row_max(const float *x, int64_t V) { return fminf(max_not_nan(x, V), FLT_MAX); }

/* w = the kept weights of block [i0, i0 + SB) (0 past V); returns their sum in the fixed lane order. */
static float block_weights(const float *x, int64_t i0, int64_t V, float m, float inv_t, float min_p, float *w) {
    int64_t j = 0;
#ifdef BLZ_AVX2
    const __m256 vm = _mm256_set1_ps(m), vt = _mm256_set1_ps(inv_t), vp = _mm256_set1_ps(min_p);
    for (; j + 8 <= SB && i0 + j + 8 <= V; j += 8)
        _mm256_storeu_ps(w + j, weight_avx2(_mm256_loadu_ps(x + i0 + j), vm, vt, vp));
#endif
    for (; j < SB; ++j) w[j] = i0 + j < V ? weight_scalar(x[i0 + j], m, inv_t, min_p) : 0.0f;
    float l[8];
    for (int r = 0; r < 8; ++r) {
        l[r] = w[r];
        for (int v = 1; v < SB / 8; ++v) l[r] += w[8 * v + r];
    }
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* A plain row (see the header); sums: scratch of ⌈V/SB⌉ block sums. */
static int64_t draw_row(const float *x, int64_t V, float inv_t, float min_p, float u, float *sums) {
    const float m = row_max(x, V);
    if (m == -INFINITY) return 0;
    const int64_t nblocks = (V + SB - 1) / SB;
    float w[SB], total = 0.0f;
    for (int64_t k = 0; k < nblocks; ++k) total += sums[k] = block_weights(x, k * SB, V, m, inv_t, min_p, w);
    const float target = u * total;
    float run = 0.0f;
    for (int64_t k = 0; k < nblocks; ++k) {
        if (!(run + sums[k] > target)) {
            run += sums[k];
            continue;
        }
        block_weights(x, k * SB, V, m, inv_t, min_p, w);
        int64_t last = -1;
        for (int j = 0; j < SB; ++j) {
            if (w[j] > 0.0f) last = k * SB + j;
            run += w[j];
            if (run > target) return k * SB + j;
        }
        if (last >= 0) return last; /* the block's sum crossed, its values one by one did not (rounding) */
    }
    for (int64_t k = nblocks - 1; k >= 0; --k) { /* target at or past the sum: the last kept token */
        if (!(sums[k] > 0.0f)) continue;
        block_weights(x, k * SB, V, m, inv_t, min_p, w);
        for (int j = SB - 1; j >= 0; --j)
            if (w[j] > 0.0f) return k * SB + j;
    }
    return 0; /* unreachable: the max itself weighs 1 */
}

typedef struct {
    float v;
    int32_t i;
} cand_t;

static int by_weight(const void *pa, const void *pb) {
    const cand_t *a = pa, *b = pb;
    if (a->v != b->v) return a->v > b->v ? -1 : 1;
    return (a->i > b->i) - (a->i < b->i);
}

#define NBUCKET 1024 /* kept weights are normal floats in (0, 1]: bits >> 20 in [8, 0x3f8] */
#define NHIST 4      /* histogram copies, so that runs of one bucket are not one chain of increments */

BLZ_INLINE int bucket(float v) {
    union {
        float f;
        uint32_t u;
    } b = {.f = v};
    return (int)(b.u >> 20);
}

/* A ranked row (see the header). Two passes over the weights, block by block (no row-sized scratch):
 * the histogram (and Σe, and each block's largest weight in bmax[⌈V/SB⌉]), then the candidates, from
 * the blocks that hold any (few, for a peaked distribution), into an array of the count the histogram
 * gives. Returns −1 if that allocation fails. */
static int64_t draw_ranked(const float *x, int64_t V, float inv_t, float min_p, int64_t k, float top_p, float u,
                           float *bmax) {
    const float m = row_max(x, V);
    if (m == -INFINITY) return 0;
    const int top_k = k > 0 && k < V;
    int32_t count[NHIST][NBUCKET]; /* 48 KB of stack with mass */
    double mass[NHIST][NBUCKET];
    memset(count, 0, sizeof count);
    if (!top_k) memset(mass, 0, sizeof mass);
    float w[SB], total = 0.0f;
    for (int64_t i0 = 0; i0 < V; i0 += SB) {
        total += block_weights(x, i0, V, m, inv_t, min_p, w);
        float top = 0.0f;
        for (int j = 0; j < SB; ++j) top = w[j] > top ? w[j] : top;
        bmax[i0 / SB] = top;
        if (top_k)
            for (int j = 0; j < SB; ++j) count[j % NHIST][bucket(w[j])] += 1;
        else
            for (int j = 0; j < SB; ++j) {
                count[j % NHIST][bucket(w[j])] += 1;
                mass[j % NHIST][bucket(w[j])] += w[j];
            }
    }
    int from = 1; /* the lowest bucket collected (bucket 0 holds e = 0 only) */
    int64_t ncand = 0;
    double acc = 0.0;
    for (int b = NBUCKET - 1; b >= 1; --b) {
        int64_t nb = 0;
        double mb = 0.0;
        for (int h = 0; h < NHIST; ++h) nb += count[h][b], mb += top_k ? 0.0 : mass[h][b];
        ncand += nb;
        acc += top_k ? (double)nb : mb;
        from = b;
        if (nb && acc >= (top_k ? (double)k : (double)top_p * total)) {
            if (!top_k) /* one more non-empty bucket below: the fp32 prefix sums may reach later */
                for (int c = b - 1; c >= 1; --c) {
                    int64_t nc = 0;
                    for (int h = 0; h < NHIST; ++h) nc += count[h][c];
                    if (nc) {
                        ncand += nc, from = c;
                        break;
                    }
                }
            break;
        }
    }
    cand_t *c = malloc((size_t)(ncand ? ncand : 1) * sizeof *c);
    if (!c) return -1;
    int64_t n = 0;
    for (int64_t i0 = 0; i0 < V && n < ncand; i0 += SB) {
        if (!(bmax[i0 / SB] > 0.0f) || bucket(bmax[i0 / SB]) < from) continue;
        block_weights(x, i0, V, m, inv_t, min_p, w);
        for (int j = 0; j < SB; ++j)
            if (w[j] > 0.0f && bucket(w[j]) >= from) c[n++] = (cand_t){w[j], (int32_t)(i0 + j)};
    }
    qsort(c, (size_t)n, sizeof *c, by_weight);
    if (top_k && n > k) n = k;
    float kept = total;
    if (top_k) {
        kept = 0.0f;
        for (int64_t j = 0; j < n; ++j) kept += c[j].v;
    }
    if (top_p < 1.0f) {
        const float reach = top_p * kept;
        float cum = 0.0f;
        int64_t j = 0;
        while (j < n && cum < reach) cum += c[j++].v;
        n = j;
    }
    float nucleus = 0.0f;
    for (int64_t j = 0; j < n; ++j) nucleus += c[j].v;
    const float target = u * nucleus;
    float run = 0.0f;
    int64_t token = n ? c[n - 1].i : 0;
    for (int64_t j = 0; j < n; ++j) {
        run += c[j].v;
        if (run > target) {
            token = c[j].i;
            break;
        }
    }
    free(c);
    return token;
}

BLZ_EXPORT int blz_sample_rows(const float *x, int64_t B, int64_t V, const float *temperature,
                               const float *min_p, const int64_t *top_k, const float *top_p, const float *u,
                               int64_t *out, int nthreads) {
    if (B < 0 || V <= 0 || V > INT32_MAX) return BLZ_EINVAL;
    for (int64_t b = 0; b < B; ++b)
        if (!(temperature[b] > 0.0f) || !(temperature[b] < INFINITY) || !(u[b] >= 0.0f && u[b] < 1.0f) ||
            !(min_p[b] >= 0.0f && min_p[b] <= 1.0f) || top_k[b] < 0 || !(top_p[b] > 0.0f && top_p[b] <= 1.0f))
            return BLZ_EINVAL;
    const int64_t nblocks = (V + SB - 1) / SB;
    float *sums = malloc((size_t)(B * nblocks) * sizeof(float));
    if (!sums) return BLZ_ENOMEM;
    int failed = 0;
#pragma omp parallel for schedule(static) num_threads(nthreads > 0 ? nthreads : 1) if (B > 1) \
    reduction(| : failed)
    for (int64_t b = 0; b < B; ++b) {
        const float *row = x + b * V, inv_t = 1.0f / temperature[b];
        if ((top_k[b] > 0 && top_k[b] < V) || top_p[b] < 1.0f) {
            out[b] = draw_ranked(row, V, inv_t, min_p[b], top_k[b], top_p[b], u[b], sums + b * nblocks);
            failed |= out[b] < 0;
        } else {
            out[b] = draw_row(row, V, inv_t, min_p[b], u[b], sums + b * nblocks);
        }
    }
    free(sums);
    return failed ? BLZ_ENOMEM : BLZ_OK;
}

static int64_t argmax_row(const float *x, int64_t V) {
    const float m = max_not_nan(x, V);
    int64_t i = 0;
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
