/* blazr kernels — gated DeltaNet (Qwen3-Next, Qwen3.5, OLMo-Hybrid) with the conv and delta-rule states
 * advanced in place in their pools: the decode step (one new token for each of B sequences of one layer) and
 * the prefill (n new tokens of each of B sequences) in the chunked WY form, both from the in-projections'
 * outputs to the gated-norm output that out_proj reads.
 *
 * Per token, qkvz = [q | k | v | z] (q, k: Hk·Dk; v, z: Hv·Dv; C = 2·Hk·Dk + Hv·Dv conv channels) and
 * ba = [b | a] (Hv each):
 *   u_c = silu(Σ_{j<K} w[c, j]·x(t − (K−1) + j, c)), x of earlier tokens from the conv state [C, K−1];
 *   q, k per head: x / sqrt(Σx² + 1e-6) (q then · Dk^-½); value head h reads head kh = h / (Hv/Hk), or
 *   h % Hk when `tiled` (llama.cpp's value-head order);
 *   g = −exp(A_log[h])·softplus(a + dt_bias[h]), β = beta_scale·sigmoid(b);
 *   state S [Dk, Dv] of (slot, h):  S ← e^g·S;  S ← S + k ⊗ β(v − Sᵀk);  o = Sᵀq;
 *   y = (w · o / sqrt(mean(o²) + eps)) · silu(z), per value head.
 * Layouts (fp32, row-major): qkvz [T, C + Hv·Dv], ba [T, 2·Hv], conv_w [C, K], conv_pool [S, C, K−1],
 * dt_bias / A_log [Hv], norm_w [Dv], state_pool [S, Hv, Dk, Dv], slots int64 (distinct), y [T, Hv·Dv].
 *
 * The decode step updates each state row in two passes (read Sᵀk; then write S and read Sᵀq), each element
 * by the operations of the sequential recurrence (decay·s rounded, then one fma), so every ISA path gives
 * the same bits, and a sequence's result never depends on the batch or the thread count.
 *
 * The prefill runs the chunked (WY) form of blazr/model/delta_rule.py per (sequence, value head): chunks of
 * `chunk` tokens (cut also at the snapshot offsets of `saves`), the chunk's writes folded by one unit
 * lower-triangular solve, (I + L)[U | W] = [βv | βe^G k] with L_ij = β_i (k_i·k_j) e^{G_i − G_j}; then
 * v_new = U − W·S, o = e^G (q·S) + (q kᵀ ∘ Γ) v_new, S ← e^{G_last} S + Σ_j e^{G_last − G_j} k_j v_newⱼᵀ —
 * the [Dk, Dv] state is read twice per chunk instead of per token, in register-blocked products.
 * Work: conv, norms and gates per row (OpenMP over rows), then (sequence, head) tasks (dynamic schedule).
 */
#include "blazr_kernels.h"

#include "delta_rule.h"

#define DN_CONV_PARTS 16 /* a decode step's conv channels, split over the threads (B is often 1) */

typedef struct {
    int64_t Hk, Hv, Dk, Dv, K, C, ld, S;
    int tiled;
    float beta_scale, eps;
} dn_geom;

/* The k head value head h reads. */
BLZ_INLINE int64_t dn_khead(const dn_geom *g, int64_t h) { return g->tiled ? h % g->Hk : h / (g->Hv / g->Hk); }

/* q, k heads of one post-conv row u [C]: L2-normalised in place, q also · Dk^-½. */
static void dn_norm_qk(const dn_geom *g, float *u) {
    const float scale = 1.0f / sqrtf((float)g->Dk);
    for (int64_t j = 0; j < 2 * g->Hk; ++j) {
        float *x = u + j * g->Dk, ss = 0.0f;
        for (int64_t i = 0; i < g->Dk; ++i) ss = fmaf(x[i], x[i], ss);
        const float r = 1.0f / sqrtf(ss + DN_L2_EPS);
        if (j < g->Hk)
            for (int64_t i = 0; i < g->Dk; ++i) x[i] = (x[i] * r) * scale;
        else
            for (int64_t i = 0; i < g->Dk; ++i) x[i] *= r;
    }
}

/* The gates of one token: g (log-decay) and β per value head from its ba row. */
static void dn_gates(const dn_geom *g, const float *ba, const float *dt_bias, const float *A_log, float *gl,
                     float *beta) {
    for (int64_t h = 0; h < g->Hv; ++h) {
        gl[h] = -expf(A_log[h]) * dn_softplus(ba[g->Hv + h] + dt_bias[h]);
        beta[h] = g->beta_scale / (1.0f + expf(-ba[h]));
    }
}

#define DN_GATE_CHUNK 256 /* silu(z) values computed at a time, on the stack */

/* y[i] = (w[i] · (o[i] · r)) · silu(z[i]), r = 1 / sqrt(mean(o²) + eps), over one value head's Dv (silu by
 * blz_silu_rows: the same bits on every path). */
static void dn_gated_norm(const float *o, const float *z, const float *w, int64_t Dv, float eps, float *y) {
    float ss = 0.0f, g[DN_GATE_CHUNK];
    for (int64_t i = 0; i < Dv; ++i) ss = fmaf(o[i], o[i], ss);
    const float r = 1.0f / sqrtf(ss / (float)Dv + eps);
    for (int64_t i0 = 0; i0 < Dv; i0 += DN_GATE_CHUNK) {
        const int64_t n = blz_min(DN_GATE_CHUNK, Dv - i0);
        memcpy(g, z + i0, (size_t)n * sizeof(float));
        blz_silu_rows(g, n);
        for (int64_t i = 0; i < n; ++i) y[i0 + i] = (w[i0 + i] * (o[i0 + i] * r)) * g[i];
    }
}

/* One token of one value head: S [Dk, Dv] advanced, y [Dv] the gated-norm output. q, k [Dk], v, z [Dv];
 * work [2·Dv]. */
static void dn_head_step(float *S, const dn_geom *g, const float *q, const float *k, const float *v, float glog,
                         float beta, const float *z, const float *norm_w, float *work, float *y) {
    const int64_t Dk = g->Dk, Dv = g->Dv;
    const float decay = dn_exp(glog);
    float *delta = work, *o = work + Dv;
    dn_predict(S, Dk, Dv, decay, k, delta);
    for (int64_t i = 0; i < Dv; ++i) delta[i] = (v[i] - delta[i]) * beta;
    dn_update(S, Dk, Dv, decay, k, delta, q, o);
    dn_gated_norm(o, z, norm_w, Dv, g->eps, y);
}

static int dn_check(const dn_geom *g) {
    if (g->Hk <= 0 || g->Hv <= 0 || g->Hv % g->Hk || g->Dk <= 0 || g->Dv <= 0 || g->K < 2 || g->K > DN_MAX_K ||
        g->S < 0)
        return BLZ_EINVAL;
    return BLZ_OK;
}

BLZ_EXPORT int blz_deltanet_step(const float *qkvz, const float *ba, const int64_t *slots, int64_t B,
                                 const float *conv_w, float *conv_pool, int64_t K, const float *dt_bias,
                                 const float *A_log, const float *norm_w, float *state_pool, int64_t S, int64_t Hk,
                                 int64_t Hv, int64_t Dk, int64_t Dv, int tiled, float beta_scale, float eps,
                                 float *y, int nthreads) {
    const dn_geom g = {Hk, Hv, Dk, Dv, K, 2 * Hk * Dk + Hv * Dv, 2 * Hk * Dk + 2 * Hv * Dv, S, tiled, beta_scale, eps};
    if (B < 0 || dn_check(&g)) return BLZ_EINVAL;
    for (int64_t b = 0; b < B; ++b)
        if (slots[b] < 0 || slots[b] >= S) return BLZ_ERANGE;
    if (B == 0) return BLZ_OK;
    const int64_t C = g.C;
    /* per sequence: post-conv row [C], gates [2·Hv]; per (sequence, head) work [2·Dv] */
    float *u = blz_scratch((size_t)(B * (C + 2 * Hv) + B * Hv * 2 * Dv) * sizeof(float));
    if (!u) return BLZ_ENOMEM;
    float *gates = u + B * C, *work = gates + B * 2 * Hv;
    const int nt = blz_threads(nthreads, B * Hv * Dk * Dv, 1 << 14);
#pragma omp parallel num_threads(nt)
    {
        /* Rows that share a slot run in row order (a sequence's consecutive tokens as rows): the threads
         * split the channels (conv) and the value heads (delta rule), never the rows. */
#pragma omp for schedule(static)
        for (int64_t part = 0; part < DN_CONV_PARTS; ++part) {
            const int64_t c0 = C * part / DN_CONV_PARTS, c1 = C * (part + 1) / DN_CONV_PARTS;
            for (int64_t b = 0; b < B; ++b)
                dn_conv_step(qkvz + b * g.ld, conv_pool + slots[b] * C * (K - 1), u + b * C, conv_w, K, c0, c1);
        }
#pragma omp for schedule(static)
        for (int64_t b = 0; b < B; ++b) {
            dn_gates(&g, ba + b * 2 * Hv, dt_bias, A_log, gates + b * 2 * Hv, gates + b * 2 * Hv + Hv);
            dn_norm_qk(&g, u + b * C);
        }
#pragma omp for schedule(static)
        for (int64_t h = 0; h < Hv; ++h)
            for (int64_t b = 0; b < B; ++b) {
                const int64_t kh = dn_khead(&g, h), bh = b * Hv + h;
                const float *ur = u + b * C, *gt = gates + b * 2 * Hv;
                dn_head_step(state_pool + (slots[b] * Hv + h) * Dk * Dv, &g, ur + kh * Dk, ur + Hk * Dk + kh * Dk,
                             ur + 2 * Hk * Dk + h * Dv, gt[h], gt[Hv + h], qkvz + b * g.ld + C + h * Dv, norm_w,
                             work + bh * 2 * Dv, y + b * Hv * Dv + h * Dv);
            }
    }
    return BLZ_OK;
}

/* ------------------------------------------------------------------------------------------------ prefill */

/* The scratch of one (sequence, head) task for chunks of ≤ Cs tokens. */
typedef struct {
    float *G, *L, *QK, *W, *V, *O, *KT;
} dn_chunk_buf;

static size_t dn_chunk_floats(int64_t Cs, int64_t Dk, int64_t Dv) {
    return (size_t)(Cs + 2 * Cs * Cs + Cs * (Dv + Dk) + 2 * Cs * Dv + Dk * Cs);
}

static dn_chunk_buf dn_chunk_layout(float *p, int64_t Cs, int64_t Dk, int64_t Dv) {
    dn_chunk_buf c;
    c.G = p;
    c.L = c.G + Cs;
    c.QK = c.L + Cs * Cs;
    c.W = c.QK + Cs * Cs;
    c.V = c.W + Cs * (Dv + Dk);
    c.O = c.V + Cs * Dv;
    c.KT = c.O + Cs * Dv;
    return c;
}

/* One chunk of n tokens (rows r0 .. r0+n−1 of u / qkvz) of value head h, state S [Dk, Dv] in place, its
 * gated-norm output into y. u: post-conv rows (q, k normed); gl, beta: [T, Hv] gates. */
static void dn_chunk(const dn_geom *g, int64_t h, float *S, const float *u, const float *qkvz, const float *gl,
                     const float *beta, int64_t r0, int64_t n, const float *norm_w, dn_chunk_buf *c, float *y) {
    const int64_t Hv = g->Hv, Dk = g->Dk, Dv = g->Dv, C = g->C, kh = dn_khead(g, h), Wd = Dv + Dk;
    const float *q0 = u + r0 * C + kh * Dk, *k0 = u + r0 * C + g->Hk * Dk + kh * Dk;
    const float *v0 = u + r0 * C + 2 * g->Hk * Dk + h * Dv;
    float G = 0.0f;
    for (int64_t i = 0; i < n; ++i) c->G[i] = G += gl[(r0 + i) * Hv + h];
    /* the Gram matrices q·kᵀ and k·kᵀ [n, n] through kᵀ [Dk, n] (their upper triangles unused) */
    for (int64_t j = 0; j < n; ++j)
        for (int64_t d = 0; d < Dk; ++d) c->KT[d * n + j] = k0[j * C + d];
    dn_matmul(c->QK, n, NULL, 0, 0.0f, q0, C, n, Dk, c->KT, n, n);
    dn_matmul(c->L, n, NULL, 0, 0.0f, k0, C, n, Dk, c->KT, n, n);
    /* L_ij = β_i (k_i·k_j) Γ_ij (j < i); QK_ij = (q_i·k_j) Γ_ij (j ≤ i); rows of W: [β v | β e^G k] */
    for (int64_t i = 0; i < n; ++i) {
        const float *ki = k0 + i * C, bi = beta[(r0 + i) * Hv + h];
        for (int64_t j = 0; j <= i; ++j) {
            const float gam = dn_exp(c->G[i] - c->G[j]);
            c->QK[i * n + j] *= gam;
            if (j < i) c->L[i * n + j] = bi * c->L[i * n + j] * gam;
        }
        float *wi = c->W + i * Wd;
        const float *vi = v0 + i * C, eg = bi * dn_exp(c->G[i]);
        for (int64_t d = 0; d < Dv; ++d) wi[d] = bi * vi[d];
        for (int64_t d = 0; d < Dk; ++d) wi[Dv + d] = eg * ki[d];
        for (int64_t j = 0; j < i; ++j) dn_axpy(wi, c->L[i * n + j], c->W + j * Wd, Wd); /* forward substitution */
    }
    /* v_new = U − W_k·S;  O = q·S (scaled by e^G below) */
    dn_matmul(c->V, Dv, NULL, 0, 0.0f, c->W + Dv, Wd, n, Dk, S, Dv, Dv);
    for (int64_t i = 0; i < n; ++i)
        for (int64_t d = 0; d < Dv; ++d) c->V[i * Dv + d] = c->W[i * Wd + d] - c->V[i * Dv + d];
    dn_matmul(c->O, Dv, NULL, 0, 0.0f, q0, C, n, Dk, S, Dv, Dv);
    for (int64_t i = 0; i < n; ++i) {
        float *oi = c->O + i * Dv;
        const float eg = dn_exp(c->G[i]);
        for (int64_t d = 0; d < Dv; ++d) oi[d] *= eg;
        for (int64_t j = 0; j <= i; ++j) dn_axpy(oi, -c->QK[i * n + j], c->V + j * Dv, Dv);
        dn_gated_norm(oi, qkvz + (r0 + i) * g->ld + C + h * Dv, norm_w, Dv, g->eps, y + (r0 + i) * Hv * Dv + h * Dv);
    }
    /* S ← e^{G_last} S + K'ᵀ V_new, K'[j] = k_j e^{G_last − G_j} (kᵀ [Dk, n] scaled in place) */
    const float last = c->G[n - 1];
    for (int64_t j = 0; j < n; ++j) {
        const float e = dn_exp(last - c->G[j]);
        for (int64_t d = 0; d < Dk; ++d) c->KT[d * n + j] *= e;
    }
    dn_matmul(S, Dv, S, Dv, dn_exp(last), c->KT, n, Dk, n, c->V, Dv, Dv);
}

/* The prefill of one layer: n_b new tokens of each of B sequences.
 *
 * seqs [B, 4] int64, per sequence: (row0, n, slot, fresh): its tokens are rows row0 .. row0+n−1 of qkvz / ba
 * / y; its states live at `slot` of conv_pool / state_pool; fresh = 1 starts from zero states (the slot may
 * hold a previous owner's), 0 continues from them (a chunked prefill's later chunk). saves [ns, 3] int64:
 * (b, k, dst) — sequence b's conv and delta-rule states after its first k tokens (0 < k < n_b) are copied to
 * slot dst as well (prefix-cache snapshots; the chunks are cut there). Slots and save slots must be distinct.
 * chunk: tokens per chunk (≤ DN_MAX_CHUNK). Other arguments as blz_deltanet_step.
 */
BLZ_EXPORT int blz_deltanet_prefill(const float *qkvz, const float *ba, const int64_t *seqs, int64_t B,
                                    const int64_t *saves, int64_t ns, const float *conv_w, float *conv_pool,
                                    int64_t K, const float *dt_bias, const float *A_log, const float *norm_w,
                                    float *state_pool, int64_t S, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv,
                                    int tiled, int64_t chunk, float beta_scale, float eps, float *y, int nthreads) {
    const dn_geom g = {Hk, Hv, Dk, Dv, K, 2 * Hk * Dk + Hv * Dv, 2 * Hk * Dk + 2 * Hv * Dv, S, tiled, beta_scale, eps};
    if (B < 0 || ns < 0 || chunk < 1 || chunk > DN_MAX_CHUNK || dn_check(&g)) return BLZ_EINVAL;
    int64_t T;
    const int rc = dn_check_prefill(seqs, B, saves, ns, S, &T);
    if (rc != BLZ_OK) return rc;
    if (T == 0 && ns == 0) return BLZ_OK;
    const int64_t C = g.C;
    float *u = blz_scratch((size_t)(T * C + 2 * T * Hv + K * C) * sizeof(float)); /* post-conv, gates, taps */
    if (!u) return BLZ_ENOMEM;
    float *gl = u + T * C, *bt = gl + T * Hv, *wt = bt + T * Hv;
    for (int64_t c = 0; c < C; ++c)
        for (int64_t j = 0; j < K; ++j) wt[j * C + c] = conv_w[c * K + j];
    const int nt = blz_threads(nthreads, T * C * K + T * Hv * Dk * Dv, 1 << 14);
    int failed = 0;
#pragma omp parallel num_threads(nt)
    {
        for (int64_t b = 0; b < B; ++b) {
            const int64_t row0 = seqs[4 * b], n = seqs[4 * b + 1], fresh = seqs[4 * b + 3];
            const float *cs = conv_pool + seqs[4 * b + 2] * C * (K - 1);
            /* conv + SiLU: u[t, c] = silu(Σ_j w[c, j]·x(t − (K−1) + j, c)), x(r < 0) from the state */
#pragma omp for schedule(static)
            for (int64_t t = 0; t < n; ++t) {
                float *ur = u + (row0 + t) * C;
                blz_conv_row(qkvz + row0 * g.ld, g.ld, t, wt, NULL, fresh ? NULL : cs, C, K, ur);
                blz_silu_rows(ur, C);
                dn_norm_qk(&g, ur);
                dn_gates(&g, ba + (row0 + t) * 2 * Hv, dt_bias, A_log, gl + (row0 + t) * Hv, bt + (row0 + t) * Hv);
            }
            /* (implicit barrier) conv states: the snapshots', then the slot's — the K−1 inputs before the offset */
#pragma omp for schedule(static)
            for (int64_t c = 0; c < C; ++c) dn_conv_states(qkvz, g.ld, seqs + 4 * b, b, saves, ns, conv_pool, C, K, c);
        }
        const int64_t Cs = chunk;
        float *buf = blz_scratch_slot(1, dn_chunk_floats(Cs, Dk, Dv) * sizeof(float));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
        dn_chunk_buf cb = dn_chunk_layout(buf, Cs, Dk, Dv);
#pragma omp for schedule(dynamic, 1)
        for (int64_t bh = 0; bh < B * Hv; ++bh) {
            const int64_t b = bh / Hv, h = bh % Hv;
            const int64_t row0 = seqs[4 * b], n = seqs[4 * b + 1];
            float *st = state_pool + (seqs[4 * b + 2] * Hv + h) * Dk * Dv;
            if (seqs[4 * b + 3]) memset(st, 0, (size_t)(Dk * Dv) * sizeof(float));
            if (!buf) continue;
            int64_t cuts[DN_MAX_CUTS + 1], dsts[DN_MAX_CUTS + 1];
            const int64_t nc = dn_snapshot_cuts(saves, ns, b, n, cuts, dsts);
            int64_t done = 0;
            for (int64_t s = 0; s <= nc; ++s) {
                for (int64_t c0 = done; c0 < cuts[s]; c0 += Cs)
                    dn_chunk(&g, h, st, u, qkvz, gl, bt, row0 + c0, blz_min(Cs, cuts[s] - c0), norm_w, &cb, y);
                if (dsts[s] >= 0) memcpy(state_pool + (dsts[s] * Hv + h) * Dk * Dv, st, (size_t)(Dk * Dv) * sizeof(float));
                done = cuts[s];
            }
        }
    }
    return failed ? BLZ_ENOMEM : BLZ_OK;
}
