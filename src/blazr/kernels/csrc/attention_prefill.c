/* blazr kernels — causal attention of a prompt chunk (prefill) over the paged KV pools, GQA.
 *
 * One sequence per call: its n new query rows sit at absolute positions ctx .. ctx + n − 1 (ctx: the cached
 * tokens before the chunk; the chunk's own keys and values are already written to the pools), and query row
 * i of head h attends to the keys j ≤ ctx + i (with a sliding window W > 0 also j > ctx + i − W) of kv head
 * h / G, G = H / Hkv:
 *     out[i, h] = Σ_j softmax_j(s_ij) · v_j,   s_ij = scale · q[i, h]·k_j   (soft-capped: c · tanh(s / c))
 * with key j at cache slot idx[j] (k_pool [S, Hkv, D], v_pool [S, Hkv, Dv], fp32 / bf16 / f16 — BLZ_KV_* —,
 * widened exactly), and with `sinks` ([H] fp32, may be NULL) one more term e^{sinks[h]} in each head's
 * denominator (GPT-OSS). q row i at q + i·ldq (heads of D after each other: a fused qkv output's q part),
 * out row i at out + i·ldo (H · Dv fp32).
 *
 * Layout: the query rows of one kv head, r = i·G + g, are the vector lanes — NV vectors of VL = 16 (AVX-512),
 * 8 (AVX2) or 1 (scalar) lanes, TL rows per tile —, so every step of the softmax is lane-wise and no
 * horizontal sum is ever taken.
 * Per tile, keys in blocks of KB (block b: keys [b·KB, b·KB + KB), at absolute offsets):
 *   scores   s_j = Σ_d K_j[d] · Qᵀ[d]   (FMA chains over chunks of 32 dims, added in order; K_j[d] broadcast
 *            against the lanes' q[d]);
 *   mask     s_j = −∞ where key j is past a lane's position or before its window;
 *   softmax  m' = max(m, max_j s_j), α = 1 if m' = m else e^{m − m'}, p_j = e^{s_j − m'} (0 where masked),
 *            l = l·α + Σ_j p_j (j in order), Oᵀ[dv] = Oᵀ[dv]·α + Σ_j p_j · V_j[dv] (the block's FMA chain over
 *            j from zero, then one FMA into O);
 * and at the end out = Oᵀ / (l + e^{sink − m}). A block a lane does not see at all leaves its m, l and O
 * exactly as they were (α = 1, p = 0), and blocks sit at absolute key offsets, so a row's result never
 * depends on which rows share its tile: the same bits whole or chunked, whatever the tile, the thread count
 * or the build (each lane runs the same operations in every build: exp by blz_exp512 / blz_exp256 /
 * blz_exp_poly, the soft-cap by blz_softcap256 / blz_softcap1). Work items (kv head, up to TG neighbouring
 * tiles) are independent, dynamically scheduled (the causal tiles' costs differ). Cost per item and key block:
 * K and V rows widened into an fp32 block once for the item's tiles (on Zen 3's AVX2 the widening was a
 * quarter of a lone tile's time); 2·KB·(D + Dv) flops a lane.
 *
 * Shapes: n ≥ 0 rows, H = G·Hkv heads, D (keys, queries) and Dv (values) ≤ BLZ_PF_MAX_D, idx [ctx + n].
 */
#include "blazr_kernels.h"

#include <stdlib.h>

#define KB 32                 /* keys per block */
#define BLZ_PF_MAX_D 512      /* largest head dims */

#if defined(BLZ_AVX512)
#define VL 16
typedef __m512 vf;
typedef __mmask16 vm;
BLZ_INLINE vf v_set1(float a) { return _mm512_set1_ps(a); }
BLZ_INLINE vf v_load(const float *p) { return _mm512_load_ps(p); }
BLZ_INLINE void v_store(float *p, vf a) { _mm512_store_ps(p, a); }
BLZ_INLINE vf v_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
BLZ_INLINE vf v_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
BLZ_INLINE vf v_add(vf a, vf b) { return _mm512_add_ps(a, b); }
BLZ_INLINE vf v_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
BLZ_INLINE vf v_max(vf a, vf b) { return _mm512_max_ps(a, b); }
BLZ_INLINE vf v_exp(vf a) { return blz_exp512(a); }
BLZ_INLINE vm v_le(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_LE_OQ); }
BLZ_INLINE vm v_gt(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
BLZ_INLINE vm v_eq(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
BLZ_INLINE vm m_and(vm a, vm b) { return (vm)(a & b); }
BLZ_INLINE vf v_sel(vm m, vf if_true, vf if_false) { return _mm512_mask_blend_ps(m, if_false, if_true); }
BLZ_INLINE vf v_softcap(vf s, float cap) {
    const __m256 c = _mm256_set1_ps(cap);
    const __m256 lo = blz_softcap256(_mm512_castps512_ps256(s), c), hi = blz_softcap256(_mm512_extractf32x8_ps(s, 1), c);
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}
#elif defined(BLZ_AVX2)
#define VL 8
typedef __m256 vf;
typedef __m256 vm;
BLZ_INLINE vf v_set1(float a) { return _mm256_set1_ps(a); }
BLZ_INLINE vf v_load(const float *p) { return _mm256_load_ps(p); }
BLZ_INLINE void v_store(float *p, vf a) { _mm256_store_ps(p, a); }
BLZ_INLINE vf v_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
BLZ_INLINE vf v_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
BLZ_INLINE vf v_add(vf a, vf b) { return _mm256_add_ps(a, b); }
BLZ_INLINE vf v_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
BLZ_INLINE vf v_max(vf a, vf b) { return _mm256_max_ps(a, b); }
BLZ_INLINE vf v_exp(vf a) { return blz_exp256(a); }
BLZ_INLINE vm v_le(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_LE_OQ); }
BLZ_INLINE vm v_gt(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
BLZ_INLINE vm v_eq(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
BLZ_INLINE vm m_and(vm a, vm b) { return _mm256_and_ps(a, b); }
BLZ_INLINE vf v_sel(vm m, vf if_true, vf if_false) { return _mm256_blendv_ps(if_false, if_true, m); }
BLZ_INLINE vf v_softcap(vf s, float cap) { return blz_softcap256(s, _mm256_set1_ps(cap)); }
#else
#define VL 1
typedef float vf;
typedef int vm;
BLZ_INLINE vf v_set1(float a) { return a; }
BLZ_INLINE vf v_load(const float *p) { return *p; }
BLZ_INLINE void v_store(float *p, vf a) { *p = a; }
BLZ_INLINE vf v_fma(vf a, vf b, vf c) { return fmaf(a, b, c); }
BLZ_INLINE vf v_mul(vf a, vf b) { return a * b; }
BLZ_INLINE vf v_add(vf a, vf b) { return a + b; }
BLZ_INLINE vf v_sub(vf a, vf b) { return a - b; }
BLZ_INLINE vf v_max(vf a, vf b) { return a > b ? a : b; } /* as maxps: the second operand unless a > b */
BLZ_INLINE vf v_exp(vf a) { return blz_exp_poly(a); }
BLZ_INLINE vm v_le(vf a, vf b) { return a <= b; }
BLZ_INLINE vm v_gt(vf a, vf b) { return a > b; }
BLZ_INLINE vm v_eq(vf a, vf b) { return a == b; }
BLZ_INLINE vm m_and(vm a, vm b) { return a && b; }
BLZ_INLINE vf v_sel(vm m, vf if_true, vf if_false) { return m ? if_true : if_false; }
BLZ_INLINE vf v_softcap(vf s, float cap) { return blz_softcap1(s, cap); }
#endif

/* Vectors of lanes per tile (each K and V element broadcast once against NV vectors), keys per score step
 * and value columns per value step: KS·NV and VS·NV accumulators. AVX-512 (32 registers) holds 8 keys × 3
 * accumulators: Zen 5, 2 threads, 512-8192 tokens, 230-290 GFLOP/s at 1 vector, 290-380 at 2, 300-400 at 3.
 * AVX2's 16 registers hold 6 × 2: Zen 3, 2 threads, 2048 tokens of Qwen3-0.6B's heads, 71-79 GFLOP/s where
 * 8 × 1 read 38-40 (a tile's K and V widening is shared by twice the lanes; 4 × 2 56-61, 4 × 3 73, 12 × 1 32).
 * A row's bits do not depend on them: each (key, lane) dot is its own chain. */
#ifdef BLZ_AVX512
#define NV 3
#define KS 8
#define VS 8
#elif defined(BLZ_AVX2)
#define NV 2
#define KS 6
#define VS 6
#else
#define NV 1
#define KS 8
#define VS 8
#endif
#define TL (NV * VL) /* lanes (query rows) per tile */
#define TG 4 /* tiles per work item at most, sharing each block's widening */

/* A thread's buffers: its TG tiles' Qᵀ [D][TL] and Oᵀ [Dv][TL] (one after the other, tile by tile), the
 * block's scores / weights P [KB][TL], its keys and values widened Kb [KB][D], Vb [KB][Dv]. */
typedef struct {
    float *qo, *p, *kb, *vb;
} bufs_t;

/* Key rows [j0, j0 + nk) of kv head hk widened into Kb / Vb — zeros for keys before jlo, which no lane of the
 * tile sees (a sliding window's slot there may be any held slot: its values are never read) —; 0, or
 * BLZ_EINVAL for a slot outside the pools. */
static int widen_block(const char *k_pool, const char *v_pool, int kv_type, int64_t S, const int64_t *idx, int64_t j0,
                       int nk, int64_t jlo, int64_t Hkv, int64_t hk, int64_t D, int64_t Dv, float *kb, float *vb) {
    const int64_t es = blz_kv_elem_bytes(kv_type);
    for (int j = 0; j < nk; ++j) {
        if (j0 + j < jlo) {
            for (int64_t d = 0; d < D; ++d) kb[j * D + d] = 0.0f;
            for (int64_t d = 0; d < Dv; ++d) vb[j * Dv + d] = 0.0f;
            continue;
        }
        const int64_t slot = idx[j0 + j];
        if (slot < 0 || slot >= S) return BLZ_EINVAL;
        const char *kr = k_pool + (slot * Hkv + hk) * D * es, *vr = v_pool + (slot * Hkv + hk) * Dv * es;
        int64_t d = 0;
#ifdef BLZ_AVX2
        for (; d + 8 <= D; d += 8) _mm256_storeu_ps(kb + j * D + d, blz_kv_load8(kr, d, kv_type));
#endif
        for (; d < D; ++d) kb[j * D + d] = blz_kv_load1(kr, d, kv_type);
        d = 0;
#ifdef BLZ_AVX2
        for (; d + 8 <= Dv; d += 8) _mm256_storeu_ps(vb + j * Dv + d, blz_kv_load8(vr, d, kv_type));
#endif
        for (; d < Dv; ++d) vb[j * Dv + d] = blz_kv_load1(vr, d, kv_type);
    }
    return BLZ_OK;
}

/* Scores of keys [0, nk) of the block against the tile's lanes, into P (unscaled dots): KS keys × NV vectors of
 * lanes at a time, each K element broadcast once against the NV vectors. Each dot is summed in chunks of SC
 * dims — an FMA chain within a chunk, the chunks added in order —, not one chain over all D: with D = 256
 * (Gemma 3) one chain left the softmax 10-15x further from float64 than torch's SDPA, chunks of 32 do not. */
#define SC 32
static void block_scores(const float *restrict qt, const float *restrict kb, int nk, int64_t D, float *restrict p) {
    int j = 0;
    for (; j + KS <= nk; j += KS) {
        const float *k = kb + j * D;
        for (int64_t d0 = 0; d0 < D; d0 += SC) {
            vf a[KS][NV];
            for (int u = 0; u < KS; ++u)
                for (int v = 0; v < NV; ++v) a[u][v] = v_set1(0.0f);
            for (int64_t d = d0; d < blz_min(D, d0 + SC); ++d) {
                vf q[NV];
                for (int v = 0; v < NV; ++v) q[v] = v_load(qt + d * TL + v * VL);
                for (int u = 0; u < KS; ++u) {
                    const vf kk = v_set1(k[u * D + d]);
                    for (int v = 0; v < NV; ++v) a[u][v] = v_fma(kk, q[v], a[u][v]);
                }
            }
            for (int u = 0; u < KS; ++u)
                for (int v = 0; v < NV; ++v) {
                    float *pp = p + (j + u) * TL + v * VL;
                    v_store(pp, d0 ? v_add(v_load(pp), a[u][v]) : a[u][v]);
                }
        }
    }
    for (; j < nk; ++j)
        for (int64_t d0 = 0; d0 < D; d0 += SC) {
            vf a[NV];
            for (int v = 0; v < NV; ++v) a[v] = v_set1(0.0f);
            for (int64_t d = d0; d < blz_min(D, d0 + SC); ++d) {
                const vf kk = v_set1(kb[j * D + d]);
                for (int v = 0; v < NV; ++v) a[v] = v_fma(kk, v_load(qt + d * TL + v * VL), a[v]);
            }
            for (int v = 0; v < NV; ++v) {
                float *pp = p + j * TL + v * VL;
                v_store(pp, d0 ? v_add(v_load(pp), a[v]) : a[v]);
            }
        }
}

/* Oᵀ[dv] = Oᵀ[dv]·α + Σ_{j < nk} P[j] · Vb[j][dv] — the block's sum from zero, then one FMA into O (so O sums
 * a prompt's keys block by block, not in one chain) —: VS value columns × NV vectors of lanes at a time. */
static void block_values(float *restrict ot, const float *restrict p, const float *restrict vb, int nk, int64_t Dv,
                         const vf alpha[NV]) {
    int64_t e = 0;
    for (; e + VS <= Dv; e += VS) {
        float *o = ot + e * TL;
        vf a[VS][NV];
        for (int u = 0; u < VS; ++u)
            for (int v = 0; v < NV; ++v) a[u][v] = v_set1(0.0f);
        for (int j = 0; j < nk; ++j) {
            vf w[NV];
            for (int v = 0; v < NV; ++v) w[v] = v_load(p + j * TL + v * VL);
            const float *vr = vb + j * Dv + e;
            for (int u = 0; u < VS; ++u) {
                const vf vv = v_set1(vr[u]);
                for (int v = 0; v < NV; ++v) a[u][v] = v_fma(w[v], vv, a[u][v]);
            }
        }
        for (int u = 0; u < VS; ++u)
            for (int v = 0; v < NV; ++v) {
                float *oo = o + u * TL + v * VL;
                v_store(oo, v_fma(v_load(oo), alpha[v], a[u][v]));
            }
    }
    for (; e < Dv; ++e)
        for (int v = 0; v < NV; ++v) {
            vf a = v_set1(0.0f);
            for (int j = 0; j < nk; ++j) a = v_fma(v_load(p + j * TL + v * VL), v_set1(vb[j * Dv + e]), a);
            float *oo = ot + e * TL + v * VL;
            v_store(oo, v_fma(v_load(oo), alpha[v], a));
        }
}

/* One tile's state: its lanes' rows (r = i·G + g from r0; rows past n·G repeat the last), positions and window
 * starts, Qᵀ and Oᵀ (its own), the running m and l, and the keys it sees: [jlo, pmax]. */
typedef struct {
    int64_t r0, row_i[TL], head[TL], jlo, pmax;
    float *qt, *ot;
    vf p_lane[NV], lo_lane[NV], m[NV], lsum[NV];
} tile_t;

static void tile_begin(tile_t *t, const float *q, int64_t ldq, int64_t n, int64_t ctx, int64_t G, int64_t hk,
                       int64_t D, int64_t Dv, int64_t window, int64_t r0) {
    const int64_t rows = n * G;
    float pos[TL] __attribute__((aligned(64)));
    t->r0 = r0;
    for (int l = 0; l < TL; ++l) {
        const int64_t r = blz_min(r0 + l, rows - 1);
        t->row_i[l] = r / G, t->head[l] = hk * G + r % G, pos[l] = (float)(ctx + r / G);
        const float *qr = q + t->row_i[l] * ldq + t->head[l] * D;
        for (int64_t d = 0; d < D; ++d) t->qt[d * TL + l] = qr[d];
    }
    for (int64_t e = 0; e < Dv * TL; ++e) t->ot[e] = 0.0f;
    const int64_t pmin = ctx + t->row_i[0];
    t->pmax = ctx + t->row_i[TL - 1];
    t->jlo = window > 0 ? blz_max(0, pmin - window + 1) : 0;
    const float span = window > 0 ? (float)window : (float)(ctx + n + 1);
    for (int v = 0; v < NV; ++v) {
        t->p_lane[v] = v_load(pos + v * VL), t->lo_lane[v] = v_sub(t->p_lane[v], v_set1(span));
        t->m[v] = v_set1(-INFINITY), t->lsum[v] = v_set1(0.0f);
    }
}

/* Keys [j0, j0 + nk) of the block (widened in kb / vb) into tile t: scores, mask, the online softmax's step,
 * the values. p: the block's scores / weights [KB][TL]. */
static void tile_block(tile_t *t, const float *kb, const float *vb, float *p, int64_t j0, int nk, int64_t D,
                       int64_t Dv, float scale, float softcap) {
    const vf ninf = v_set1(-INFINITY), vscale = v_set1(scale), zero = v_set1(0.0f), one = v_set1(1.0f);
    block_scores(t->qt, kb, nk, D, p);
    vf mb[NV], alpha[NV], psum[NV];
    for (int v = 0; v < NV; ++v) mb[v] = ninf, psum[v] = zero;
    for (int j = 0; j < nk; ++j) { /* scale, soft-cap, mask */
        const vf jf = v_set1((float)(j0 + j));
        for (int v = 0; v < NV; ++v) {
            vf s = v_mul(v_load(p + j * TL + v * VL), vscale);
            if (softcap > 0.0f) s = v_softcap(s, softcap);
            s = v_sel(m_and(v_le(jf, t->p_lane[v]), v_gt(jf, t->lo_lane[v])), s, ninf);
            v_store(p + j * TL + v * VL, s);
            mb[v] = v_max(mb[v], s);
        }
    }
    for (int v = 0; v < NV; ++v) {
        const vf m2 = v_max(t->m[v], mb[v]);
        alpha[v] = v_sel(v_eq(m2, t->m[v]), one, v_exp(v_sub(t->m[v], m2)));
        t->m[v] = m2;
    }
    for (int j = 0; j < nk; ++j)
        for (int v = 0; v < NV; ++v) {
            const vf s = v_load(p + j * TL + v * VL);
            const vf e = v_sel(v_eq(s, ninf), zero, v_exp(v_sub(s, t->m[v])));
            v_store(p + j * TL + v * VL, e);
            psum[v] = v_add(psum[v], e);
        }
    for (int v = 0; v < NV; ++v) t->lsum[v] = v_add(v_mul(t->lsum[v], alpha[v]), psum[v]);
    block_values(t->ot, p, vb, nk, Dv, alpha);
}

static void tile_end(const tile_t *t, int64_t rows, int64_t Dv, const float *sinks, float *out, int64_t ldo) {
    float mf[TL] __attribute__((aligned(64))), lf[TL] __attribute__((aligned(64)));
    for (int v = 0; v < NV; ++v) v_store(mf + v * VL, t->m[v]), v_store(lf + v * VL, t->lsum[v]);
    for (int l = 0; l < TL && t->r0 + l < rows; ++l) {
        const float den = lf[l] + (sinks ? blz_exp_poly(sinks[t->head[l]] - mf[l]) : 0.0f);
        float *o = out + t->row_i[l] * ldo + t->head[l] * Dv;
        for (int64_t e = 0; e < Dv; ++e) o[e] = t->ot[e * TL + l] / den;
    }
}

/* One work item: kv head hk, the nt ≤ TG tiles of lanes from rows r0, r0 + TL, …: each block of keys is widened
 * once for all of them (the block spans the keys any of them sees; each tile then runs the keys it sees, so
 * its result is the lone tile's), then every tile that sees it takes it. */
static int tiles(const float *q, int64_t ldq, const char *k_pool, const char *v_pool, int kv_type, int64_t S,
                 const int64_t *idx, int64_t n, int64_t ctx, int64_t G, int64_t Hkv, int64_t hk, int64_t D, int64_t Dv,
                 float scale, int64_t window, const float *sinks, float softcap, float *out, int64_t ldo, int64_t r0,
                 int nt, const bufs_t *b) {
    tile_t t[TG];
    int64_t jlo = INT64_MAX, pmax = -1;
    for (int i = 0; i < nt; ++i) {
        t[i].qt = b->qo + i * (D + Dv) * TL, t[i].ot = t[i].qt + D * TL;
        tile_begin(&t[i], q, ldq, n, ctx, G, hk, D, Dv, window, r0 + i * TL);
        jlo = blz_min(jlo, t[i].jlo), pmax = blz_max(pmax, t[i].pmax);
    }
    for (int64_t j0 = jlo / KB * KB; j0 <= pmax; j0 += KB) {
        const int nk = (int)blz_min(KB, pmax + 1 - j0);
        if (widen_block(k_pool, v_pool, kv_type, S, idx, j0, nk, jlo, Hkv, hk, D, Dv, b->kb, b->vb)) return BLZ_EINVAL;
        for (int i = 0; i < nt; ++i)
            if (j0 >= t[i].jlo / KB * KB && j0 <= t[i].pmax)
                tile_block(&t[i], b->kb, b->vb, b->p, j0, (int)blz_min(KB, t[i].pmax + 1 - j0), D, Dv, scale,
                           softcap);
    }
    for (int i = 0; i < nt; ++i) tile_end(&t[i], n * G, Dv, sinks, out, ldo);
    return BLZ_OK;
}

/* See the file header. Returns BLZ_EINVAL for bad sizes or a slot outside [0, S), BLZ_ENOMEM. */
int blz_attention_prefill(const float *q, int64_t ldq, const void *k_pool, const void *v_pool, int kv_type,
                          int64_t S, const int64_t *idx, int64_t n, int64_t ctx, int64_t H, int64_t Hkv, int64_t D,
                          int64_t Dv, float scale, int64_t window, const float *sinks, float softcap, float *out,
                          int64_t ldo, int nthreads) {
    if (n < 0 || ctx < 0 || H <= 0 || Hkv <= 0 || H % Hkv || D <= 0 || Dv <= 0 || D > BLZ_PF_MAX_D ||
        Dv > BLZ_PF_MAX_D || window < 0 || ldq < H * D || ldo < H * Dv || softcap < 0.0f ||
        (kv_type != BLZ_KV_F32 && kv_type != BLZ_KV_BF16 && kv_type != BLZ_KV_F16))
        return BLZ_EINVAL;
    if (n == 0) return BLZ_OK;
    const int64_t G = H / Hkv, ntiles = (n * G + TL - 1) / TL;
    const size_t floats = (size_t)(TG * (D + Dv) * TL + KB * TL + KB * D + KB * Dv);
    const int nt = blz_threads(nthreads, Hkv * ntiles * (ctx + n) * (D + Dv) * TL, BLZ_LINEAR_PARALLEL_MIN);
    /* tiles per item: up to TG while every thread still gets 4 items or more (the grouping changes no bit) */
    const int64_t tg = blz_max(1, blz_min(TG, Hkv * ntiles / (4 * nt))), groups = (ntiles + tg - 1) / tg;
    const int64_t items = Hkv * groups;
    int rc = BLZ_OK;
#pragma omp parallel num_threads(nt)
    {
        float *mem = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
        if (!mem) {
#pragma omp atomic write
            rc = BLZ_ENOMEM;
        }
        float *blk = mem + TG * (D + Dv) * TL;
        const bufs_t b = {mem, blk, blk + KB * TL, blk + KB * TL + KB * D};
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; ++it) {
            if (!mem) continue;
            /* head by head (the threads share one kv head's keys in cache), the longest (last) tiles first */
            const int64_t hk = it / groups, t0 = (groups - 1 - it % groups) * tg;
            if (tiles(q, ldq, k_pool, v_pool, kv_type, S, idx, n, ctx, G, Hkv, hk, D, Dv, scale, window, sinks,
                      softcap, out, ldo, t0 * TL, (int)blz_min(tg, ntiles - t0), &b)) {
#pragma omp atomic write
                rc = BLZ_EINVAL;
            }
        }
        free(mem);
    }
    return rc;
}
