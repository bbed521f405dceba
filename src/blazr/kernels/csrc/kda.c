/* blazr kernels — Kimi Delta Attention (Kimi-Linear) with the conv and delta-rule states advanced in place in
 * their pools: the decode step (one new token for each of B sequences of one layer) and the prefill (n new
 * tokens of each of B sequences) in the chunked WY form, from the projections' outputs to the gated-norm
 * output that o_proj reads. The gated delta rule of deltanet.c with a channel-wise decay: one log-decay per
 * head and key channel (its state products in delta_rule.h).
 *
 * Per token, qkv = [q | k | v] (H heads of D each, W = H·D; C = 3·W conv channels), f [W] (f_b(f_a(x))),
 * b [H] (b_proj(x)), gate [W] (g_b(g_a(x))):
 *   u_c = silu(Σ_{j<K} w[c, j]·x(t − (K−1) + j, c)), x of earlier tokens from the conv state [C, K−1];
 *   q, k per head: x / sqrt(Σx² + 1e-6) (q then · D^-½);
 *   g[h, c] = −exp(A_log[h])·softplus(f[h, c] + dt_bias[h, c]), β[h] = sigmoid(b[h]);
 *   state S [D, D] of (slot, h):  S[c, :] ← e^{g[h, c]}·S[c, :];  S ← S + k ⊗ β(v − Sᵀk);  o = Sᵀq;
 *   y = (w · o / sqrt(mean(o²) + eps)) · sigmoid(gate), per head.
 * Layouts (fp32, row-major): qkv [T, 3·W], f / gate [T, W], b [T, H], conv_w [C, K], conv_pool [S, C, K−1],
 * dt_bias [W], A_log [H], norm_w [D], state_pool [S, H, D, D], slots int64 (distinct), y [T, W].
 *
 * The decode step first decays the state's rows in place (each element decay·s, rounded, as the sequential
 * recurrence), then runs deltanet.c's two passes with decay 1 (exact), so every ISA path gives the same
 * bits and a sequence's result never depends on the batch or the thread count.
 *
 * The prefill runs the chunked form of blazr/model/delta_rule.py per (sequence, head), with G [n, D] the
 * per-channel cumulative log-decay from the chunk's start: (I + L)[U | W] = [βv | β(e^{G_i} ∘ k_i)] with
 * L_ij = β_i Σ_c k_ic k_jc e^{G_ic − G_jc}; v_new = U − W·S; o_i = (q_i ∘ e^{G_i})·S + Σ_{j≤i} (Σ_c q_ic k_jc
 * e^{G_ic − G_jc}) v_new_j; S ← diag(e^{G_last})·S + Σ_j (k_j ∘ e^{G_last − G_j}) v_newⱼᵀ. The Gram matrices
 * weigh each channel by its own decay (n²·D exps per chunk, 8 lanes at a time: kda_gram_pair); the state
 * products are register-blocked.
 */
#include "blazr_kernels.h"

#include "delta_rule.h"

typedef struct {
    int64_t H, D, K, C, W, S;
    float eps;
} kda_geom;

/* q, k heads of one post-conv row u [C]: L2-normalised in place, q also · D^-½. */
static void kda_norm_qk(const kda_geom *g, float *u) {
    const float scale = 1.0f / sqrtf((float)g->D);
    for (int64_t j = 0; j < 2 * g->H; ++j) {
        float *x = u + j * g->D, ss = 0.0f;
        for (int64_t i = 0; i < g->D; ++i) ss = fmaf(x[i], x[i], ss);
        const float r = 1.0f / sqrtf(ss + DN_L2_EPS);
        if (j < g->H)
            for (int64_t i = 0; i < g->D; ++i) x[i] = (x[i] * r) * scale;
        else
            for (int64_t i = 0; i < g->D; ++i) x[i] *= r;
    }
}

/* The gates of one token: the channel-wise log-decay gl [W] and β [H]. */
static void kda_gates(const kda_geom *g, const float *f, const float *b, const float *dt_bias, const float *A_log,
                      float *gl, float *beta) {
    for (int64_t h = 0; h < g->H; ++h) {
        const float a = -expf(A_log[h]);
        for (int64_t c = h * g->D; c < (h + 1) * g->D; ++c) gl[c] = a * dn_softplus(f[c] + dt_bias[c]);
        beta[h] = 1.0f / (1.0f + expf(-b[h]));
    }
}

/* y[i] = (w[i] · (o[i] · r)) · sigmoid(gate[i]), r = 1 / sqrt(mean(o²) + eps), over one head's D. */
static void kda_gated_norm(const float *o, const float *gate, const float *w, int64_t D, float eps, float *y) {
    float ss = 0.0f;
    for (int64_t i = 0; i < D; ++i) ss = fmaf(o[i], o[i], ss);
    const float r = 1.0f / sqrtf(ss / (float)D + eps);
    for (int64_t i = 0; i < D; ++i) y[i] = (w[i] * (o[i] * r)) * (1.0f / (1.0f + expf(-gate[i])));
}

/* S [D, D] rows scaled in place: S[c, :] ← e^{gl[c]}·S[c, :]. */
static void kda_decay_rows(float *S, int64_t D, const float *gl) {
    for (int64_t c = 0; c < D; ++c) {
        const float d = dn_exp(gl[c]);
        float *s = S + c * D;
        for (int64_t v = 0; v < D; ++v) s[v] = d * s[v];
    }
}

static int kda_check(const kda_geom *g) {
    if (g->H <= 0 || g->D <= 0 || g->K < 2 || g->K > DN_MAX_K || g->S < 0) return BLZ_EINVAL;
    return BLZ_OK;
}

#define KDA_CONV_PARTS 16 /* a decode step's conv channels, split over the threads (B is often 1) */

BLZ_EXPORT int blz_kda_step(const float *qkv, const float *f, const float *b, const float *gate, const int64_t *slots,
                            int64_t B, const float *conv_w, float *conv_pool, int64_t K, const float *dt_bias,
                            const float *A_log, const float *norm_w, float *state_pool, int64_t S, int64_t H,
                            int64_t D, float eps, float *y, int nthreads) {
    const kda_geom g = {H, D, K, 3 * H * D, H * D, S, eps};
    if (B < 0 || kda_check(&g)) return BLZ_EINVAL;
    for (int64_t i = 0; i < B; ++i)
        if (slots[i] < 0 || slots[i] >= S) return BLZ_ERANGE;
    if (B == 0) return BLZ_OK;
    const int64_t C = g.C, W = g.W;
    /* per sequence: post-conv row [C], log-decays [W], β [H]; per (sequence, head) work [2·D] */
    float *u = blz_scratch((size_t)(B * (C + W + H) + B * H * 2 * D) * sizeof(float));
    if (!u) return BLZ_ENOMEM;
    float *gl = u + B * C, *bt = gl + B * W, *work = bt + B * H;
    const int nt = blz_threads(nthreads, B * H * D * D, 1 << 14);
#pragma omp parallel num_threads(nt)
    {
        /* Rows that share a slot run in row order (a sequence's consecutive tokens as rows): the threads
         * split the channels (conv) and the heads (delta rule), never the rows. */
#pragma omp for schedule(static)
        for (int64_t part = 0; part < KDA_CONV_PARTS; ++part) {
            const int64_t c0 = C * part / KDA_CONV_PARTS, c1 = C * (part + 1) / KDA_CONV_PARTS;
            for (int64_t s = 0; s < B; ++s)
                dn_conv_step(qkv + s * C, conv_pool + slots[s] * C * (K - 1), u + s * C, conv_w, K, c0, c1);
        }
#pragma omp for schedule(static)
        for (int64_t s = 0; s < B; ++s) {
            kda_gates(&g, f + s * W, b + s * H, dt_bias, A_log, gl + s * W, bt + s * H);
            kda_norm_qk(&g, u + s * C);
        }
#pragma omp for schedule(static)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t s = 0; s < B; ++s) {
                const int64_t sh = s * H + h;
                const float *ur = u + s * C, *q = ur + h * D, *k = ur + W + h * D, *v = ur + 2 * W + h * D;
                float *St = state_pool + (slots[s] * H + h) * D * D, *delta = work + sh * 2 * D, *o = delta + D;
                const float beta = bt[s * H + h];
                kda_decay_rows(St, D, gl + s * W + h * D);
                dn_predict(St, D, D, 1.0f, k, delta);
                for (int64_t i = 0; i < D; ++i) delta[i] = (v[i] - delta[i]) * beta;
                dn_update(St, D, D, 1.0f, k, delta, q, o);
                kda_gated_norm(o, gate + s * W + h * D, norm_w, D, eps, y + s * W + h * D);
            }
    }
    return BLZ_OK;
}

/* ------------------------------------------------------------------------------------------------ prefill */

/* One pair of the chunk's Gram matrices: *sq = Σ_d q_d·k'_d, *sk = Σ_d k_d·k'_d with k'_d = kj_d·e^{Gi_d − Gj_d}
 * (the log-decay floored at DN_LOG_FLOOR), in 8 partial sums (lane d mod 8: the AVX2 lanes, or one by one
 * on the scalar path, exp by blz_exp256 / blz_exp_poly: the same bits) added in a fixed order. */
static void kda_gram_pair(const float *qi, const float *ki, const float *kj, const float *Gi, const float *Gj,
                          int64_t D, float *sq, float *sk) {
    float aq[8] = {0.0f}, ak[8] = {0.0f};
    int64_t d = 0;
#if defined(BLZ_AVX2)
    __m256 vq = _mm256_setzero_ps(), vk = vq;
    const __m256 floor = _mm256_set1_ps(DN_LOG_FLOOR);
    for (; d + 8 <= D; d += 8) {
        const __m256 x = _mm256_max_ps(_mm256_sub_ps(_mm256_loadu_ps(Gi + d), _mm256_loadu_ps(Gj + d)), floor);
        const __m256 kje = _mm256_mul_ps(_mm256_loadu_ps(kj + d), blz_exp256(x));
        vq = _mm256_fmadd_ps(_mm256_loadu_ps(qi + d), kje, vq);
        vk = _mm256_fmadd_ps(_mm256_loadu_ps(ki + d), kje, vk);
    }
    _mm256_storeu_ps(aq, vq);
    _mm256_storeu_ps(ak, vk);
#endif
    for (; d < D; ++d) {
        const float kje = kj[d] * blz_exp_poly(fmaxf(Gi[d] - Gj[d], DN_LOG_FLOOR));
        aq[d % 8] = fmaf(qi[d], kje, aq[d % 8]);
        ak[d % 8] = fmaf(ki[d], kje, ak[d % 8]);
    }
    *sq = ((aq[0] + aq[1]) + (aq[2] + aq[3])) + ((aq[4] + aq[5]) + (aq[6] + aq[7]));
    *sk = ((ak[0] + ak[1]) + (ak[2] + ak[3])) + ((ak[4] + ak[5]) + (ak[6] + ak[7]));
}

/* The scratch of one (sequence, head) task for chunks of ≤ Cs tokens. */
typedef struct {
    float *G, *L, *QK, *Wm, *V, *O, *KT, *Q;
} kda_chunk_buf;

static size_t kda_chunk_floats(int64_t Cs, int64_t D) {
    return (size_t)(Cs * D + 2 * Cs * Cs + Cs * 2 * D + 2 * Cs * D + D * Cs + Cs * D);
}

static kda_chunk_buf kda_chunk_layout(float *p, int64_t Cs, int64_t D) {
    kda_chunk_buf c;
    c.G = p;
    c.L = c.G + Cs * D;
    c.QK = c.L + Cs * Cs;
    c.Wm = c.QK + Cs * Cs;
    c.V = c.Wm + Cs * 2 * D;
    c.O = c.V + Cs * D;
    c.KT = c.O + Cs * D;
    c.Q = c.KT + D * Cs;
    return c;
}

/* One chunk of n tokens (rows r0 .. r0+n−1) of head h, state S [D, D] in place, its gated-norm output into y.
 * u: post-conv rows (q, k normed); gl [T, W], beta [T, H]: the gates. */
static void kda_chunk(const kda_geom *g, int64_t h, float *S, const float *u, const float *gate, const float *gl,
                      const float *beta, int64_t r0, int64_t n, const float *norm_w, kda_chunk_buf *c, float *y) {
    const int64_t H = g->H, D = g->D, C = g->C, W = g->W, Wd = 2 * D;
    const float *q0 = u + r0 * C + h * D, *k0 = u + r0 * C + W + h * D, *v0 = u + r0 * C + 2 * W + h * D;
    for (int64_t i = 0; i < n; ++i) /* G_i = Σ_{t ≤ i} g_t per channel */
        for (int64_t d = 0; d < D; ++d)
            c->G[i * D + d] = (i ? c->G[(i - 1) * D + d] : 0.0f) + gl[(r0 + i) * W + h * D + d];
    /* QK_ij = Σ_d q_id k_jd e^{G_id − G_jd} (j ≤ i), L_ij = β_i Σ_d k_id k_jd e^{G_id − G_jd} (j < i) */
    for (int64_t i = 0; i < n; ++i) {
        const float *qi = q0 + i * C, *ki = k0 + i * C, *Gi = c->G + i * D, bi = beta[(r0 + i) * H + h];
        for (int64_t j = 0; j <= i; ++j) {
            float sq, sk;
            kda_gram_pair(qi, ki, k0 + j * C, Gi, c->G + j * D, D, &sq, &sk);
            c->QK[i * n + j] = sq;
            if (j < i) c->L[i * n + j] = bi * sk;
        }
        /* rows of W: [β v | β e^{G_i} ∘ k], then forward substitution through the earlier rows */
        float *wi = c->Wm + i * Wd, *Qi = c->Q + i * D;
        const float *vi = v0 + i * C;
        for (int64_t d = 0; d < D; ++d) {
            const float e = dn_exp(Gi[d]);
            wi[d] = bi * vi[d];
            wi[D + d] = bi * (e * ki[d]);
            Qi[d] = qi[d] * e;
        }
        for (int64_t j = 0; j < i; ++j) dn_axpy(wi, c->L[i * n + j], c->Wm + j * Wd, Wd);
    }
    /* v_new = U − W_k·S;  O = (q ∘ e^G)·S + Σ_{j ≤ i} QK_ij v_new_j */
    dn_matmul(c->V, D, NULL, 0, 0.0f, c->Wm + D, Wd, n, D, S, D, D);
    for (int64_t i = 0; i < n; ++i)
        for (int64_t d = 0; d < D; ++d) c->V[i * D + d] = c->Wm[i * Wd + d] - c->V[i * D + d];
    dn_matmul(c->O, D, NULL, 0, 0.0f, c->Q, D, n, D, S, D, D);
    for (int64_t i = 0; i < n; ++i) {
        float *oi = c->O + i * D;
        for (int64_t j = 0; j <= i; ++j) dn_axpy(oi, -c->QK[i * n + j], c->V + j * D, D);
        kda_gated_norm(oi, gate + (r0 + i) * W + h * D, norm_w, D, g->eps, y + (r0 + i) * W + h * D);
    }
    /* S ← diag(e^{G_last})·S + K'ᵀ V_new, K'[j, d] = k_jd e^{G_last,d − G_jd} (as kᵀ [D, n]) */
    const float *last = c->G + (n - 1) * D;
    kda_decay_rows(S, D, last);
    for (int64_t j = 0; j < n; ++j)
        for (int64_t d = 0; d < D; ++d) c->KT[d * n + j] = k0[j * C + d] * dn_exp(last[d] - c->G[j * D + d]);
    dn_matmul(S, D, S, D, 1.0f, c->KT, n, D, n, c->V, D, D);
}

/* The prefill of one layer: n_b new tokens of each of B sequences. seqs [B, 4] int64 per sequence (row0, n,
 * slot, fresh) and saves [ns, 3] int64 (b, k, dst) as blz_deltanet_prefill's: rows row0 .. row0+n−1 of qkv /
 * f / b / gate / y; fresh = 1 starts from zero states; sequence b's states after its first k tokens are also
 * copied to slot dst (the chunks are cut there). chunk: tokens per chunk (≤ DN_MAX_CHUNK). Other arguments as
 * blz_kda_step. */
BLZ_EXPORT int blz_kda_prefill(const float *qkv, const float *f, const float *b, const float *gate,
                               const int64_t *seqs, int64_t B, const int64_t *saves, int64_t ns, const float *conv_w,
                               float *conv_pool, int64_t K, const float *dt_bias, const float *A_log,
                               const float *norm_w, float *state_pool, int64_t S, int64_t H, int64_t D, int64_t chunk,
                               float eps, float *y, int nthreads) {
    const kda_geom g = {H, D, K, 3 * H * D, H * D, S, eps};
    if (B < 0 || ns < 0 || chunk < 1 || chunk > DN_MAX_CHUNK || kda_check(&g)) return BLZ_EINVAL;
    int64_t T;
    const int rc = dn_check_prefill(seqs, B, saves, ns, S, &T);
    if (rc != BLZ_OK) return rc;
    if (T == 0 && ns == 0) return BLZ_OK;
    const int64_t C = g.C, W = g.W;
    float *u = blz_scratch((size_t)(T * C + T * W + T * H + K * C) * sizeof(float)); /* post-conv, gates, taps */
    if (!u) return BLZ_ENOMEM;
    float *gl = u + T * C, *bt = gl + T * W, *wt = bt + T * H;
    for (int64_t c = 0; c < C; ++c)
        for (int64_t j = 0; j < K; ++j) wt[j * C + c] = conv_w[c * K + j];
    const int nt = blz_threads(nthreads, T * C * K + T * H * D * D, 1 << 14);
    int failed = 0;
#pragma omp parallel num_threads(nt)
    {
        for (int64_t s = 0; s < B; ++s) {
            const int64_t row0 = seqs[4 * s], n = seqs[4 * s + 1], fresh = seqs[4 * s + 3];
            const float *cs = conv_pool + seqs[4 * s + 2] * C * (K - 1);
#pragma omp for schedule(static)
            for (int64_t t = 0; t < n; ++t) {
                float *ur = u + (row0 + t) * C;
                blz_conv_row(qkv + row0 * C, C, t, wt, NULL, fresh ? NULL : cs, C, K, ur);
                blz_silu_rows(ur, C);
                kda_norm_qk(&g, ur);
                kda_gates(&g, f + (row0 + t) * W, b + (row0 + t) * H, dt_bias, A_log, gl + (row0 + t) * W,
                          bt + (row0 + t) * H);
            }
            /* (implicit barrier) conv states: the snapshots', then the slot's — the K−1 inputs before the offset */
#pragma omp for schedule(static)
            for (int64_t c = 0; c < C; ++c) dn_conv_states(qkv, C, seqs + 4 * s, s, saves, ns, conv_pool, C, K, c);
        }
        const int64_t Cs = chunk;
        float *buf = blz_scratch_slot(1, kda_chunk_floats(Cs, D) * sizeof(float));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
        kda_chunk_buf cb = kda_chunk_layout(buf, Cs, D);
#pragma omp for schedule(dynamic, 1)
        for (int64_t sh = 0; sh < B * H; ++sh) {
            const int64_t s = sh / H, h = sh % H;
            const int64_t row0 = seqs[4 * s], n = seqs[4 * s + 1];
            float *st = state_pool + (seqs[4 * s + 2] * H + h) * D * D;
            if (seqs[4 * s + 3]) memset(st, 0, (size_t)(D * D) * sizeof(float));
            if (!buf) continue;
            int64_t cuts[DN_MAX_CUTS + 1], dsts[DN_MAX_CUTS + 1];
            const int64_t nc = dn_snapshot_cuts(saves, ns, s, n, cuts, dsts);
            int64_t done = 0;
            for (int64_t v = 0; v <= nc; ++v) {
                for (int64_t c0 = done; c0 < cuts[v]; c0 += Cs)
                    kda_chunk(&g, h, st, u, gate, gl, bt, row0 + c0, blz_min(Cs, cuts[v] - c0), norm_w, &cb, y);
                if (dsts[v] >= 0) memcpy(state_pool + (dsts[v] * H + h) * D * D, st, (size_t)(D * D) * sizeof(float));
                done = cuts[v];
            }
        }
    }
    return failed ? BLZ_ENOMEM : BLZ_OK;
}
