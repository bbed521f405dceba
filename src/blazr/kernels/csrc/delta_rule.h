/* blazr kernels — the delta rule's state products, shared by the gated DeltaNet (deltanet.c) and Kimi Delta
 * Attention (kda.c) kernels: a decode step's two passes over a state S [Dk, Dv] (predict Sᵀk, then update S
 * and read Sᵀq), the prefill's register-blocked product and row update, and the shared limits and gates.
 * Every product is a sequential fma sum per output element, so every ISA path gives the same bits.
 */
#ifndef BLAZR_DELTA_RULE_H
#define BLAZR_DELTA_RULE_H

#include "blazr_kernels.h"

#define DN_MAX_K 16       /* conv taps */
#define DN_MAX_CHUNK 256  /* tokens per chunk */
#define DN_MAX_CUTS 128   /* snapshot offsets per sequence and call */
#define DN_L2_EPS 1e-6f   /* FLA's L2-norm eps (HF: rsqrt(Σx² + 1e-6)) */
#define DN_LOG_FLOOR -80.0f /* log-decays floored before exp (exp(−80) = 1.8e-35: no subnormals) */

BLZ_INLINE float dn_softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }
BLZ_INLINE float dn_exp(float x) { return expf(fmaxf(x, DN_LOG_FLOOR)); }

/* ------------------------------------------------------------------------------------- decode state rows */

/* kv[v] = Σ_i (decay·S[i, v])·k[i], for v < Dv (S [Dk, Dv]). */
static void dn_predict(const float *S, int64_t Dk, int64_t Dv, float decay, const float *k, float *kv) {
    int64_t v = 0;
#if defined(BLZ_AVX512)
    const __m512 d = _mm512_set1_ps(decay);
    for (; v + 64 <= Dv; v += 64) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t i = 0; i < Dk; ++i) {
            const float *s = S + i * Dv + v;
            const __m512 ki = _mm512_set1_ps(k[i]);
            a0 = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_loadu_ps(s)), ki, a0);
            a1 = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_loadu_ps(s + 16)), ki, a1);
            a2 = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_loadu_ps(s + 32)), ki, a2);
            a3 = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_loadu_ps(s + 48)), ki, a3);
        }
        _mm512_storeu_ps(kv + v, a0);
        _mm512_storeu_ps(kv + v + 16, a1);
        _mm512_storeu_ps(kv + v + 32, a2);
        _mm512_storeu_ps(kv + v + 48, a3);
    }
    for (; v + 16 <= Dv; v += 16) {
        __m512 a0 = _mm512_setzero_ps();
        for (int64_t i = 0; i < Dk; ++i)
            a0 = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_loadu_ps(S + i * Dv + v)), _mm512_set1_ps(k[i]), a0);
        _mm512_storeu_ps(kv + v, a0);
    }
#elif defined(BLZ_AVX2)
    const __m256 d = _mm256_set1_ps(decay);
    for (; v + 32 <= Dv; v += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t i = 0; i < Dk; ++i) {
            const float *s = S + i * Dv + v;
            const __m256 ki = _mm256_set1_ps(k[i]);
            a0 = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_loadu_ps(s)), ki, a0);
            a1 = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_loadu_ps(s + 8)), ki, a1);
            a2 = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_loadu_ps(s + 16)), ki, a2);
            a3 = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_loadu_ps(s + 24)), ki, a3);
        }
        _mm256_storeu_ps(kv + v, a0);
        _mm256_storeu_ps(kv + v + 8, a1);
        _mm256_storeu_ps(kv + v + 16, a2);
        _mm256_storeu_ps(kv + v + 24, a3);
    }
    for (; v + 8 <= Dv; v += 8) {
        __m256 a0 = _mm256_setzero_ps();
        for (int64_t i = 0; i < Dk; ++i)
            a0 = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_loadu_ps(S + i * Dv + v)), _mm256_set1_ps(k[i]), a0);
        _mm256_storeu_ps(kv + v, a0);
    }
#endif
    for (; v < Dv; ++v) {
        float a = 0.0f;
        for (int64_t i = 0; i < Dk; ++i) a = fmaf(decay * S[i * Dv + v], k[i], a);
        kv[v] = a;
    }
}

/* S[i, v] ← fma(k[i], delta[v], decay·S[i, v]);  o[v] = Σ_i S[i, v]·q[i] (the updated S). */
static void dn_update(float *S, int64_t Dk, int64_t Dv, float decay, const float *k, const float *delta,
                      const float *q, float *o) {
    int64_t v = 0;
#if defined(BLZ_AVX512)
    const __m512 d = _mm512_set1_ps(decay);
    for (; v + 32 <= Dv; v += 32) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0;
        const __m512 e0 = _mm512_loadu_ps(delta + v), e1 = _mm512_loadu_ps(delta + v + 16);
        for (int64_t i = 0; i < Dk; ++i) {
            float *s = S + i * Dv + v;
            const __m512 ki = _mm512_set1_ps(k[i]), qi = _mm512_set1_ps(q[i]);
            const __m512 t0 = _mm512_fmadd_ps(ki, e0, _mm512_mul_ps(d, _mm512_loadu_ps(s)));
            const __m512 t1 = _mm512_fmadd_ps(ki, e1, _mm512_mul_ps(d, _mm512_loadu_ps(s + 16)));
            _mm512_storeu_ps(s, t0);
            _mm512_storeu_ps(s + 16, t1);
            a0 = _mm512_fmadd_ps(t0, qi, a0);
            a1 = _mm512_fmadd_ps(t1, qi, a1);
        }
        _mm512_storeu_ps(o + v, a0);
        _mm512_storeu_ps(o + v + 16, a1);
    }
    for (; v + 16 <= Dv; v += 16) {
        __m512 a0 = _mm512_setzero_ps();
        const __m512 e0 = _mm512_loadu_ps(delta + v);
        for (int64_t i = 0; i < Dk; ++i) {
            float *s = S + i * Dv + v;
            const __m512 t0 = _mm512_fmadd_ps(_mm512_set1_ps(k[i]), e0, _mm512_mul_ps(d, _mm512_loadu_ps(s)));
            _mm512_storeu_ps(s, t0);
            a0 = _mm512_fmadd_ps(t0, _mm512_set1_ps(q[i]), a0);
        }
        _mm512_storeu_ps(o + v, a0);
    }
#elif defined(BLZ_AVX2)
    const __m256 d = _mm256_set1_ps(decay);
    for (; v + 16 <= Dv; v += 16) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0;
        const __m256 e0 = _mm256_loadu_ps(delta + v), e1 = _mm256_loadu_ps(delta + v + 8);
        for (int64_t i = 0; i < Dk; ++i) {
            float *s = S + i * Dv + v;
            const __m256 ki = _mm256_set1_ps(k[i]), qi = _mm256_set1_ps(q[i]);
            const __m256 t0 = _mm256_fmadd_ps(ki, e0, _mm256_mul_ps(d, _mm256_loadu_ps(s)));
            const __m256 t1 = _mm256_fmadd_ps(ki, e1, _mm256_mul_ps(d, _mm256_loadu_ps(s + 8)));
            _mm256_storeu_ps(s, t0);
            _mm256_storeu_ps(s + 8, t1);
            a0 = _mm256_fmadd_ps(t0, qi, a0);
            a1 = _mm256_fmadd_ps(t1, qi, a1);
        }
        _mm256_storeu_ps(o + v, a0);
        _mm256_storeu_ps(o + v + 8, a1);
    }
    for (; v + 8 <= Dv; v += 8) {
        __m256 a0 = _mm256_setzero_ps();
        const __m256 e0 = _mm256_loadu_ps(delta + v);
        for (int64_t i = 0; i < Dk; ++i) {
            float *s = S + i * Dv + v;
            const __m256 t0 = _mm256_fmadd_ps(_mm256_set1_ps(k[i]), e0, _mm256_mul_ps(d, _mm256_loadu_ps(s)));
            _mm256_storeu_ps(s, t0);
            a0 = _mm256_fmadd_ps(t0, _mm256_set1_ps(q[i]), a0);
        }
        _mm256_storeu_ps(o + v, a0);
    }
#endif
    for (; v < Dv; ++v) {
        float a = 0.0f;
        for (int64_t i = 0; i < Dk; ++i) {
            const float t = fmaf(k[i], delta[v], decay * S[i * Dv + v]);
            S[i * Dv + v] = t;
            a = fmaf(t, q[i], a);
        }
        o[v] = a;
    }
}

/* out[m, n] = (init ? si·init[m, n] : 0) + Σ_d A[m, d]·Bm[d, n] for m < M, n < N, d < Kd, each a sequential
 * fma sum over d (the same bits on every path); out may be init (in place). Register blocks of 4 rows. */
static void dn_matmul(float *out, int64_t ldo, const float *init, int64_t ldi, float si, const float *A,
                      int64_t lda, int64_t M, int64_t Kd, const float *Bm, int64_t ldb, int64_t N) {
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
        const int64_t mr = blz_min(4, M - m0);
        int64_t n = 0;
#if defined(BLZ_AVX512)
        for (; n + 16 <= N; n += 16) {
            __m512 acc[4];
            for (int64_t r = 0; r < mr; ++r)
                acc[r] = init ? _mm512_mul_ps(_mm512_set1_ps(si), _mm512_loadu_ps(init + (m0 + r) * ldi + n))
                              : _mm512_setzero_ps();
            for (int64_t d = 0; d < Kd; ++d) {
                const __m512 bv = _mm512_loadu_ps(Bm + d * ldb + n);
                for (int64_t r = 0; r < mr; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(A[(m0 + r) * lda + d]), bv, acc[r]);
            }
            for (int64_t r = 0; r < mr; ++r) _mm512_storeu_ps(out + (m0 + r) * ldo + n, acc[r]);
        }
#elif defined(BLZ_AVX2)
        for (; n + 8 <= N; n += 8) {
            __m256 acc[4];
            for (int64_t r = 0; r < mr; ++r)
                acc[r] = init ? _mm256_mul_ps(_mm256_set1_ps(si), _mm256_loadu_ps(init + (m0 + r) * ldi + n))
                              : _mm256_setzero_ps();
            for (int64_t d = 0; d < Kd; ++d) {
                const __m256 bv = _mm256_loadu_ps(Bm + d * ldb + n);
                for (int64_t r = 0; r < mr; ++r) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(A[(m0 + r) * lda + d]), bv, acc[r]);
            }
            for (int64_t r = 0; r < mr; ++r) _mm256_storeu_ps(out + (m0 + r) * ldo + n, acc[r]);
        }
#endif
        for (; n < N; ++n)
            for (int64_t r = 0; r < mr; ++r) {
                float a = init ? si * init[(m0 + r) * ldi + n] : 0.0f;
                for (int64_t d = 0; d < Kd; ++d) a = fmaf(A[(m0 + r) * lda + d], Bm[d * ldb + n], a);
                out[(m0 + r) * ldo + n] = a;
            }
    }
}

/* y[i] -= c·x[i] (c = −1: +=), i < n. */
static void dn_axpy(float *y, float c, const float *x, int64_t n) {
    int64_t i = 0;
#if defined(BLZ_AVX512)
    const __m512 cv = _mm512_set1_ps(c);
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fnmadd_ps(cv, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
#elif defined(BLZ_AVX2)
    const __m256 cv = _mm256_set1_ps(c);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fnmadd_ps(cv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
    for (; i < n; ++i) y[i] = fmaf(-c, x[i], y[i]);
}

/* One decode row of the short causal conv that DeltaNet and KDA run over their q / k / v channels, channels
 * [c0, c1): u[c] = silu(Σ_j w[c][j]·(the K−1 stored inputs, then x[c])[j]) (no bias), the state [C][K−1]
 * shifted to end with x[c]. A decode step calls it row after row for each channel part, so rows that share a
 * slot see each other's inputs in row order. */
static void dn_conv_step(const float *x, float *state, float *u, const float *conv_w, int64_t K, int64_t c0,
                         int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
        const float *w = conv_w + c * K;
        float *st = state + c * (K - 1), acc = 0.0f;
        for (int64_t j = 0; j < K - 1; ++j) acc = fmaf(w[j], st[j], acc);
        acc = fmaf(w[K - 1], x[c], acc);
        for (int64_t j = 0; j < K - 2; ++j) st[j] = st[j + 1];
        st[K - 2] = x[c];
        u[c] = acc;
    }
    blz_silu_rows(u + c0, c1 - c0);
}

/* The prefill's sequences and snapshots checked (seqs [B, 4]: first row, tokens, slot, fresh; saves [ns, 3]:
 * sequence, token offset, snapshot slot — inside the sequence, slots among S and distinct from the sequences',
 * at most DN_MAX_CUTS a sequence); *T = the rows the sequences span. BLZ_OK, BLZ_EINVAL or BLZ_ERANGE. */
static int dn_check_prefill(const int64_t *seqs, int64_t B, const int64_t *saves, int64_t ns, int64_t S,
                            int64_t *T) {
    *T = 0;
    for (int64_t b = 0; b < B; ++b) {
        const int64_t *q = seqs + 4 * b;
        if (q[0] < 0 || q[1] < 0) return BLZ_EINVAL;
        if (q[2] < 0 || q[2] >= S) return BLZ_ERANGE;
        for (int64_t c = 0; c < b; ++c)
            if (seqs[4 * c + 2] == q[2]) return BLZ_EINVAL;
        *T = blz_max(*T, q[0] + q[1]);
    }
    for (int64_t s = 0; s < ns; ++s) {
        const int64_t *sv = saves + 3 * s;
        if (sv[0] < 0 || sv[0] >= B || sv[1] <= 0 || sv[1] >= seqs[4 * sv[0] + 1]) return BLZ_EINVAL;
        if (sv[2] < 0 || sv[2] >= S) return BLZ_ERANGE;
        for (int64_t b = 0; b < B; ++b)
            if (seqs[4 * b + 2] == sv[2]) return BLZ_EINVAL;
        int64_t cuts = 0;
        for (int64_t r = 0; r < ns; ++r) cuts += saves[3 * r] == sv[0];
        if (cuts > DN_MAX_CUTS) return BLZ_EINVAL;
    }
    return BLZ_OK;
}

/* Channel c's conv states after sequence `b` (seqs row `q`) of a prefill over x [T, ld]: each snapshot's, then
 * the slot's own — the K−1 inputs before the offset (before the sequence: the slot's state, or 0 when fresh).
 * conv_pool [S, C, K−1]. */
static void dn_conv_states(const float *x, int64_t ld, const int64_t *q, int64_t b, const int64_t *saves,
                           int64_t ns, float *conv_pool, int64_t C, int64_t K, int64_t c) {
    const int64_t row0 = q[0], n = q[1], fresh = q[3];
    float *st = conv_pool + q[2] * C * (K - 1) + c * (K - 1), next[DN_MAX_K];
    for (int64_t s = 0; s <= ns; ++s) {
        if (s < ns && saves[3 * s] != b) continue;
        const int64_t at = s < ns ? saves[3 * s + 1] : n;
        for (int64_t j = 0; j < K - 1; ++j) {
            const int64_t r = at - (K - 1) + j;
            next[j] = r >= 0 ? x[(row0 + r) * ld + c] : fresh ? 0.0f : st[(K - 1) + r];
        }
        float *dst = s < ns ? conv_pool + saves[3 * s + 2] * C * (K - 1) + c * (K - 1) : st;
        memcpy(dst, next, (size_t)(K - 1) * sizeof(float));
    }
}

/* The prefill's state snapshots of sequence `seq` (saves [ns, 3]: sequence, token offset, snapshot slot) in
 * offset order: cuts[0..nc) the offsets, dsts the slots, then cuts[nc] = n (the sequence's end) with dsts[nc]
 * = -1. Arrays of DN_MAX_CUTS + 1 (the callers' checks bound the count); returns nc. */
static int64_t dn_snapshot_cuts(const int64_t *saves, int64_t ns, int64_t seq, int64_t n, int64_t *cuts,
                                int64_t *dsts) {
    int64_t nc = 0;
    for (int64_t v = 0; v < ns; ++v) /* insertion sort */
        if (saves[3 * v] == seq) {
            int64_t p = nc++;
            for (; p > 0 && cuts[p - 1] > saves[3 * v + 1]; --p) cuts[p] = cuts[p - 1], dsts[p] = dsts[p - 1];
            cuts[p] = saves[3 * v + 1], dsts[p] = saves[3 * v + 2];
        }
    cuts[nc] = n, dsts[nc] = -1;
    return nc;
}

#endif /* BLAZR_DELTA_RULE_H */
