/* blazr kernels — paged attention for decode (one query token per sequence), GQA, and the KV-cache write.
 *
 * out[b, h, :] = softmax_j(scale · q[b, h]·k_j) · v_j over the keys j of sequence b, where key j lives in
 * cache slot kv_indices[b, j]: k_j = k_pool[slot, h / G], v_j = v_pool[slot, h / G], G = H / Hkv.
 * Keys are j ∈ [L_b − window, L_b) with a sliding window, else [0, L_b) (L_b = seq_lens[b]); an empty
 * range gives zeros. With `softcap` c > 0 (0: none) each score s = scale · q·k_j becomes c · tanh(s / c)
 * before the softmax (Gemma 2; blz_softcap_rows / blz_softcap1: the same bits for a given s on every path).
 * With `sinks` (may be NULL, else [H] fp32) head h's softmax has one more term e^{sinks[h]} in its
 * denominator, with no value (GPT-OSS's attention sinks): it joins the merge of the chunks below, so the
 * chunks themselves do not change. Layouts: q [B, H, D] (row b at q + b·ldq, so q may be a view into a fused
 * qkv buffer), k_pool [S, Hkv, D], v_pool [S, Hkv, Dv] of one element type — fp32, bf16 or f16 (BLZ_KV_*),
 * widened exactly to fp32 on load, so 16-bit pools halve the cache bytes read — kv_indices [B, Lmax]
 * (row stride idx_stride), seq_lens [B], out [B, H, Dv] fp32; int64 indices.
 *
 * Work split (flash-decoding): items are (sequence, chunk of BLZ_CHUNK keys), all kv heads; a sequence's
 * chunks depend only on its own key range, never on the batch or the thread count, and a second pass
 * merges each head's chunks in order: out = Σ_c e^{m_c−M} acc_c / Σ_c e^{m_c−M} l_c. So a row's result
 * is the same bits whatever else shares the call and however many threads run it. Items go round-robin
 * to the threads; on AVX-512 each prefetches the K/V rows of its next item while it computes (paged slots
 * and the weights streamed between layers leave them out of cache otherwise).
 * Inner loop (AVX-512, D and Dv multiples of 16, G ≤ BLZ_MAX_GROUP), per item and kv head, three passes
 * over the chunk: scores — each K row widened once into registers feeds the G heads' dot products (q in
 * registers), and 16 keys' partial-sum vectors are reduced together by a transpose-add tree; softmax —
 * the whole chunk's scores are known, so m = max, p = e^{s−m} (polynomial exp), l = Σ p with no running
 * rescale; then acc = Σ p·v over the chunk with the G heads' accumulators in registers, each V slice
 * widened once per key. AVX2 builds (no AVX-512) run the same three passes on 8-lane vectors (D and Dv
 * multiples of 8; item_avx2) with the kv heads inside the key loop: an item reads each key's whole K row,
 * then its whole V row, in slot order — 2 KB at a time for 8 kv heads × 128 dims of f16 — where a kv head at
 * a time read 256 B of every row per pass, a pattern neither the hardware prefetcher nor a next-item
 * prefetch kept ahead of on Zen 3 (512 KB L2): Qwen3-0.6B's cache read at 4-6 GB/s cold, now 8-10
 * (benchmarks/NOTES.md §75). Scores 8/G keys at a time, so the G·(8/G) FMA chains of one step reduce in a
 * single hadd tree. Other shapes and builds run the scalar online-softmax loop (libm expf).
 */
#include "blazr_kernels.h"

#define BLZ_KEY_BLOCK 16  /* keys per score block (one transpose-add tree) */
#ifndef BLZ_CHUNK
#define BLZ_CHUNK 64 /* keys per work item (a multiple of BLZ_KEY_BLOCK) */
#endif
#define BLZ_MAX_GROUP 16  /* query heads per kv head handled by the block path */
#define BLZ_MAX_D 256     /* head dims handled by the block path */

/* The SIMD paths' instantiations: CALL(T, GG, DD, DV) per element type T × group size GG ≤ 8 × head dim 64 /
 * 128 (D = Dv), so that accumulators, key rows and partial sums live in registers; generic sizes otherwise.
 * Reads kv_type, G, D and Dv where it is expanded. */
#define BLZ_DISPATCH_G(CALL, T, GG)                                 \
    case GG:                                                        \
        if (D == 64 && Dv == 64) CALL(T, GG, 64, 64);               \
        else if (D == 128 && Dv == 128) CALL(T, GG, 128, 128);      \
        else CALL(T, GG, D, Dv);                                    \
        break;
#define BLZ_DISPATCH_T(CALL, T)                                                                    \
    switch (G) {                                                                                   \
        BLZ_DISPATCH_G(CALL, T, 1) BLZ_DISPATCH_G(CALL, T, 2) BLZ_DISPATCH_G(CALL, T, 3)           \
        BLZ_DISPATCH_G(CALL, T, 4) BLZ_DISPATCH_G(CALL, T, 5) BLZ_DISPATCH_G(CALL, T, 6)           \
        BLZ_DISPATCH_G(CALL, T, 7) BLZ_DISPATCH_G(CALL, T, 8)                                      \
        default:                                                                                   \
            CALL(T, G, D, Dv);                                                                     \
    }
#define BLZ_DISPATCH(CALL)                                                              \
    if (kv_type == BLZ_KV_F32) { BLZ_DISPATCH_T(CALL, BLZ_KV_F32) }                    \
    else if (kv_type == BLZ_KV_BF16) { BLZ_DISPATCH_T(CALL, BLZ_KV_BF16) }             \
    else { BLZ_DISPATCH_T(CALL, BLZ_KV_F16) }

/* Online-softmax state of one work item: acc [G][Dv], m [G], l [G]. */
typedef struct {
    float *acc, *m, *l;
} part_t;

/* Prefetch cursor over the K and V rows of the next work item this thread will run: each pf_next fetches
 * the whole rows of the next `per` keys into L2, so the next item's rows arrive while this one computes —
 * spread over its work, not in one burst that would fill the miss buffers. Paged slots defeat the hardware
 * prefetcher between cache blocks, and the weights streamed between two layers' attention calls evict the
 * cache, so without this every item would start cold. Invalid slots are skipped (the item reports them). */
typedef struct {
    const char *k_pool, *v_pool;
    const int64_t *idx; /* the next item's slots */
    int64_t n, S, kst, vst;
    int64_t t;          /* cursor: the next key to fetch */
    int per;            /* keys per call */
} prefetcher_t;

/* Prefetch the `bytes` of the row at r. */
BLZ_INLINE void pf_rows(const char *r, int64_t bytes) {
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(r + b, 0, 2);
}

static inline void pf_next(prefetcher_t *pf) {
    for (const int64_t t1 = blz_min(pf->n, pf->t + pf->per); pf->t < t1; ++pf->t) {
        const int64_t slot = pf->idx[pf->t];
        if (slot < 0 || slot >= pf->S) continue;
        pf_rows(pf->k_pool + slot * pf->kst, pf->kst);
        pf_rows(pf->v_pool + slot * pf->vst, pf->vst);
    }
}

#ifdef BLZ_AVX512
/* Horizontal sums of 16 vectors at once: lane t of the result = Σ lanes of v[t]. A transpose-add tree
 * (16 → 8 → 4 → 2 → 1 vectors, 45 shuffles/adds) instead of 16 separate reductions. */
BLZ_INLINE __m512 hsum16(const __m512 v[16]) {
    __m512 w[8], x[4], y[2];
    for (int i = 0; i < 8; ++i) /* w[i]: v[2i] partials in 128-bit units 0-1, v[2i+1] in units 2-3 */
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xee));
    for (int i = 0; i < 4; ++i) /* x[i]: unit u holds 4 partials of v[4i + u] */
        x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0xdd));
    for (int i = 0; i < 2; ++i) /* y[i]: unit u holds 2 partials each of v[8i + u], v[8i + 4 + u] */
        y[i] = _mm512_add_ps(_mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]),
                             _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]));
    /* z lane 4u + k = Σ v[u + 4k]; permute to natural order */
    const __m512d y0 = _mm512_castps_pd(y[0]), y1 = _mm512_castps_pd(y[1]);
    const __m512 z = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(y0, y1)),
                                   _mm512_castpd_ps(_mm512_unpackhi_pd(y0, y1)));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), z);
}

/* acc[g][d0 .. d0+16·SL) += Σ_t p[g·ldp + t] · v_t[d0 ..] for the nk keys vr[t] (G, SL constants after
 * inlining, so the G·SL accumulators stay in registers; each V slice is loaded and widened once per key).
 * pf (may be NULL) advances once per 16 keys. */
BLZ_INLINE void pv_slices(const int64_t G, const int SL, const float *p, const int64_t ldp, const char *const *vr,
                          const int nk, const int64_t d0, const int kv_type, float *acc_mem, const int64_t Dv,
                          prefetcher_t *pf) {
    __m512 acc[BLZ_MAX_GROUP][4];
    for (int64_t g = 0; g < G; ++g)
        for (int s = 0; s < SL; ++s) acc[g][s] = _mm512_loadu_ps(acc_mem + g * Dv + d0 + 16 * s);
    for (int t = 0; t < nk; ++t) {
        if (pf && t % BLZ_KEY_BLOCK == 0) pf_next(pf);
        __m512 v[4];
        for (int s = 0; s < SL; ++s) v[s] = blz_kv_load16(vr[t], d0 + 16 * s, kv_type);
        for (int64_t g = 0; g < G; ++g) {
            const __m512 pg = _mm512_set1_ps(p[g * ldp + t]);
            for (int s = 0; s < SL; ++s) acc[g][s] = _mm512_fmadd_ps(pg, v[s], acc[g][s]);
        }
    }
    for (int64_t g = 0; g < G; ++g)
        for (int s = 0; s < SL; ++s) _mm512_storeu_ps(acc_mem + g * Dv + d0 + 16 * s, acc[g][s]);
}

/* s[g·lds + t] = scale · q_g·k_t for the nk ≤ 16 keys kr[t] of one kv head and its G query heads q[G][D]:
 * each K row is widened once into registers and feeds the G dot products (one FMA chain each, D/16
 * long); the 16 keys' partial-sum vectors of a head are then reduced together by hsum16. */
BLZ_INLINE void qk16(const __m512 qv[BLZ_MAX_GROUP][BLZ_MAX_D / 16], const int64_t G, const char *const *kr,
                     const int nk, const int kv_type, const int64_t D, const float scale, float *s,
                     const int64_t lds) {
    __m512 part[BLZ_MAX_GROUP][BLZ_KEY_BLOCK];
    for (int t = 0; t < BLZ_KEY_BLOCK; ++t) {
        if (t < nk) {
            __m512 k[BLZ_MAX_D / 16];
            for (int64_t i = 0; i < D / 16; ++i) k[i] = blz_kv_load16(kr[t], 16 * i, kv_type);
            for (int64_t g = 0; g < G; ++g) {
                __m512 a = _mm512_setzero_ps();
                for (int64_t i = 0; i < D / 16; ++i) a = _mm512_fmadd_ps(qv[g][i], k[i], a);
                part[g][t] = a;
            }
        } else {
            for (int64_t g = 0; g < G; ++g) part[g][t] = _mm512_setzero_ps();
        }
    }
    for (int64_t g = 0; g < G; ++g)
        _mm512_storeu_ps(s + g * lds, _mm512_mul_ps(hsum16(part[g]), _mm512_set1_ps(scale)));
}

/* One kv head of a work item of n ≤ BLZ_CHUNK keys, in three passes over the chunk: all scores (qk16 per
 * 16 keys; soft-capped when cap > 0), then per head m = max, p = e^{s−m}, l = Σ p (no running rescale: the
 * whole chunk's scores are known), then acc = Σ_t p_t · v_t over all n keys with the G·SL accumulators in
 * registers. kr / vr: the keys' K / V values for this kv head; q [G][D]; acc [G][Dv], m [G], l [G] are written
 * (n = 0: zeros, m = −∞, l = 0, the empty state the merge skips). */
BLZ_INLINE void chunk_head(const float *restrict q, const int64_t G, const char *const *kr, const char *const *vr,
                           const int n, const int kv_type, const int64_t D, const int64_t Dv, const float scale,
                           const float cap, part_t pt, prefetcher_t *pf) {
    float p[BLZ_MAX_GROUP * BLZ_CHUNK] __attribute__((aligned(64))); /* scores, then probabilities */
    __m512 qv[BLZ_MAX_GROUP][BLZ_MAX_D / 16]; /* the G query rows, in registers where they fit */
    for (int64_t g = 0; g < G; ++g)
        for (int64_t i = 0; i < D / 16; ++i) qv[g][i] = _mm512_loadu_ps(q + g * D + 16 * i);
    for (int j = 0; j < n; j += BLZ_KEY_BLOCK) {
        pf_next(pf);
        qk16(qv, G, kr + j, (int)blz_min(BLZ_KEY_BLOCK, n - j), kv_type, D, scale, p + j, BLZ_CHUNK);
    }
    if (cap > 0.0f)
        for (int64_t g = 0; g < G; ++g) blz_softcap_rows(p + g * BLZ_CHUNK, n, cap);
    const int nb = (n + BLZ_KEY_BLOCK - 1) / BLZ_KEY_BLOCK, tail = n - (nb - 1) * BLZ_KEY_BLOCK;
    const __mmask16 mt = (__mmask16)((1u << tail) - 1u); /* valid lanes of the last block */
    /* the G heads side by side, so their reductions and exponentials overlap */
    __m512 mx[BLZ_MAX_GROUP], l[BLZ_MAX_GROUP];
    float m[BLZ_MAX_GROUP];
    for (int64_t g = 0; g < G; ++g) mx[g] = _mm512_set1_ps(-INFINITY);
    for (int b = 0; b < nb; ++b) {
        const __mmask16 mk = b == nb - 1 ? mt : (__mmask16)0xffff;
        for (int64_t g = 0; g < G; ++g)
            mx[g] = _mm512_mask_max_ps(mx[g], mk, mx[g], _mm512_load_ps(p + g * BLZ_CHUNK + b * BLZ_KEY_BLOCK));
    }
    for (int64_t g = 0; g < G; ++g) {
        m[g] = _mm512_reduce_max_ps(mx[g]);
        l[g] = _mm512_setzero_ps();
    }
    for (int b = 0; b < nb; ++b) {
        const __mmask16 mk = b == nb - 1 ? mt : (__mmask16)0xffff;
        for (int64_t g = 0; g < G; ++g) {
            float *pg = p + g * BLZ_CHUNK + b * BLZ_KEY_BLOCK;
            const __m512 x = _mm512_sub_ps(_mm512_load_ps(pg), _mm512_set1_ps(m[g]));
            const __m512 e = _mm512_maskz_mov_ps(mk, blz_exp512(x));
            _mm512_store_ps(pg, e);
            l[g] = _mm512_add_ps(l[g], e);
        }
    }
    for (int64_t g = 0; g < G; ++g) {
        pt.m[g] = m[g];
        pt.l[g] = _mm512_reduce_add_ps(l[g]);
    }
    memset(pt.acc, 0, (size_t)(G * Dv) * sizeof(float));
    /* SL 16-wide slices of Dv at a time: G·SL independent FMA chains, enough to hide the FMA latency */
    int64_t d0 = 0; /* the first call also walks the prefetcher */
    if (G <= 4)
        for (; d0 + 64 <= Dv; d0 += 64) pv_slices(G, 4, p, BLZ_CHUNK, vr, n, d0, kv_type, pt.acc, Dv, d0 ? 0 : pf);
    else
        for (; d0 + 32 <= Dv; d0 += 32) pv_slices(G, 2, p, BLZ_CHUNK, vr, n, d0, kv_type, pt.acc, Dv, d0 ? 0 : pf);
    for (; d0 < Dv; d0 += 16) pv_slices(G, 1, p, BLZ_CHUNK, vr, n, d0, kv_type, pt.acc, Dv, d0 ? 0 : pf);
}
#endif

#if defined(BLZ_AVX2) && !defined(BLZ_AVX512)
#define BLZ_ROWPF 2        /* keys ahead whose whole K / V rows item_avx2 prefetches */
#define BLZ_PV_KEYS 16     /* keys per block of item_avx2's value pass */
#define BLZ_ITEM_HEADS 64  /* query heads per item_avx2 call (its scores on the stack: 16 KB) */

/* acc[g][d0 .. d0+8·SL) += Σ_{t < nk} p[g·BLZ_CHUNK + t] · v_t[d0 ..] (as pv_slices, 8 lanes): the G·SL
 * accumulators in registers, each V slice widened once per key. */
BLZ_INLINE void pv_slices8(const int64_t G, const int SL, const float *p, const char *const *vr, const int nk,
                           const int64_t d0, const int kv_type, float *acc_mem, const int64_t Dv) {
    __m256 acc[BLZ_MAX_GROUP][4];
    for (int64_t g = 0; g < G; ++g)
        for (int s = 0; s < SL; ++s) acc[g][s] = _mm256_loadu_ps(acc_mem + g * Dv + d0 + 8 * s);
    for (int t = 0; t < nk; ++t) {
        __m256 v[4];
        for (int s = 0; s < SL; ++s) v[s] = blz_kv_load8(vr[t], d0 + 8 * s, kv_type);
        for (int64_t g = 0; g < G; ++g) {
            const __m256 pg = _mm256_set1_ps(p[g * BLZ_CHUNK + t]);
            for (int s = 0; s < SL; ++s) acc[g][s] = _mm256_fmadd_ps(pg, v[s], acc[g][s]);
        }
    }
    for (int64_t g = 0; g < G; ++g)
        for (int s = 0; s < SL; ++s) _mm256_storeu_ps(acc_mem + g * Dv + d0 + 8 * s, acc[g][s]);
}

/* Lane i of the result = Σ lanes of v[i], for 8 vectors (7 hadds and one add). */
BLZ_INLINE __m256 hsum8x8(const __m256 v[8]) {
    const __m256 h01 = _mm256_hadd_ps(v[0], v[1]), h23 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 h45 = _mm256_hadd_ps(v[4], v[5]), h67 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 a = _mm256_hadd_ps(h01, h23), b = _mm256_hadd_ps(h45, h67); /* per 128-bit half: v0..v3 */
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

/* s[g·BLZ_CHUNK + j] = scale · q_g·k_j for one kv head's G ≤ 8 query rows q [G][D] and the nk ≤ KB = 8 / G keys
 * at kr[j] + off: the G·KB dot products side by side — D walked 8 lanes at a time, q_g's lanes loaded once for
 * the KB keys and each key's lanes widened once for the G heads, one FMA chain per (head, key) — then the 8
 * chains reduced together (hsum8x8). Keys past nk repeat the last; their sums are not stored. */
BLZ_INLINE void qk_block8(const float *restrict q, const int64_t G, const int KB, const char *const *kr,
                          const int64_t off, const int nk, const int kv_type, const int64_t D, const float scale,
                          float *s) {
    __m256 a[8];
    const char *rows[8];
    for (int j = 0; j < KB; ++j) rows[j] = kr[j < nk ? j : nk - 1] + off;
    for (int c = 0; c < 8; ++c) a[c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < D / 8; ++i) {
        __m256 k[8];
        for (int j = 0; j < KB; ++j) k[j] = blz_kv_load8(rows[j], 8 * i, kv_type);
        for (int64_t g = 0; g < G; ++g) {
            const __m256 qg = _mm256_loadu_ps(q + g * D + 8 * i);
            for (int j = 0; j < KB; ++j) a[g * KB + j] = _mm256_fmadd_ps(qg, k[j], a[g * KB + j]);
        }
    }
    float r[8] __attribute__((aligned(32)));
    _mm256_store_ps(r, _mm256_mul_ps(hsum8x8(a), _mm256_set1_ps(scale)));
    for (int64_t g = 0; g < G; ++g)
        for (int j = 0; j < nk; ++j) s[g * BLZ_CHUNK + j] = r[g * KB + j];
}

/* qk_block8 for one key and G > 8 heads: the row widened once into registers, two FMA chains per head over
 * alternate 8-lane slices, one horizontal sum each. */
BLZ_INLINE void qk_one8(const float *restrict q, const int64_t G, const char *kr, const int kv_type,
                        const int64_t D, const float scale, float *s) {
    __m256 k[BLZ_MAX_D / 8];
    for (int64_t i = 0; i < D / 8; ++i) k[i] = blz_kv_load8(kr, 8 * i, kv_type);
    for (int64_t g = 0; g < G; ++g) {
        const float *qg = q + g * D;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 2 <= D / 8; i += 2) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qg + 8 * i), k[i], a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qg + 8 * i + 8), k[i + 1], a1);
        }
        if (i < D / 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qg + 8 * i), k[i], a0);
        s[g * BLZ_CHUNK] = blz_hsum256(_mm256_add_ps(a0, a1)) * scale;
    }
}

/* Kv heads kv0 .. kv0 + nkv − 1 of a work item of n ≥ 1 keys on AVX2 (G ≤ BLZ_MAX_GROUP, nkv·G ≤ BLZ_ITEM_HEADS;
 * D and Dv multiples of 8), in three passes over the chunk, the kv heads inside each key step: every key's K
 * row, then its V row, is read whole and in slot order — a stream the hardware prefetcher follows, with the
 * rows BLZ_ROWPF keys ahead prefetched — where a head-by-head walk would read 1/Hkv of every row per pass.
 * Scores (qk_block8, or qk_one8 for G > 8; soft-capped when cap > 0); per head m = max, p = e^{s−m}
 * (blz_exp256, lanes past n zeroed), l = Σ p; then acc = Σ_t p_t · v_t, BLZ_PV_KEYS keys at a time in registers
 * (pv_slices8) and back to the item's acc, each accumulator taking its keys in order. krow / vrow: the keys'
 * whole rows; q [H][D]; partial: the item's acc [H][Dv], m [H], l [H] (H = Hkv·G). */
BLZ_INLINE void item_avx2(const float *restrict q, const int64_t Hkv, const int64_t kv0, const int64_t nkv,
                          const int64_t G, const char *const *krow, const char *const *vrow, const int n,
                          const int kv_type, const int64_t D, const int64_t Dv, const float scale, const float cap,
                          float *partial) {
    const int64_t H = Hkv * G, es = blz_kv_elem_bytes(kv_type), kst = Hkv * D * es, vst = Hkv * Dv * es;
    float p[BLZ_ITEM_HEADS * BLZ_CHUNK] __attribute__((aligned(32))); /* [head − kv0·G][key]: scores, then weights */
    const int KB = G <= 8 ? (int)(8 / G) : 1;
    for (int t = 0; t < n; t += KB) {
        for (int j = t + BLZ_ROWPF; j < blz_min(n, t + BLZ_ROWPF + KB); ++j) pf_rows(krow[j], kst);
        for (int64_t c = 0; c < nkv; ++c) {
            const float *qc = q + (kv0 + c) * G * D;
            float *pc = p + c * G * BLZ_CHUNK + t;
            if (G <= 8)
                qk_block8(qc, G, KB, krow + t, (kv0 + c) * D * es, (int)blz_min(KB, n - t), kv_type, D, scale, pc);
            else
                qk_one8(qc, G, krow[t] + (kv0 + c) * D * es, kv_type, D, scale, pc);
        }
    }
    const int64_t nh = nkv * G;
    if (cap > 0.0f)
        for (int64_t h = 0; h < nh; ++h) blz_softcap_rows(p + h * BLZ_CHUNK, n, cap);
    const int nv = (n + 7) / 8;
    const __m256i tail = blz_mask256(n - 8 * (nv - 1)); /* valid lanes of the last vector */
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int64_t h = 0; h < nh; ++h) {
        float *ph = p + h * BLZ_CHUNK;
        __m256 mv = ninf;
        for (int b = 0; b < nv; ++b)
            mv = _mm256_max_ps(mv, _mm256_blendv_ps(ninf, _mm256_load_ps(ph + 8 * b),
                                                    _mm256_castsi256_ps(b == nv - 1 ? tail : _mm256_set1_epi32(-1))));
        const __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
        const __m128 m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        const float m = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
        __m256 l = _mm256_setzero_ps();
        for (int b = 0; b < nv; ++b) {
            __m256 e = blz_exp256(_mm256_sub_ps(_mm256_load_ps(ph + 8 * b), _mm256_set1_ps(m)));
            if (b == nv - 1) e = _mm256_and_ps(e, _mm256_castsi256_ps(tail));
            _mm256_store_ps(ph + 8 * b, e);
            l = _mm256_add_ps(l, e);
        }
        partial[H * Dv + kv0 * G + h] = m;
        partial[H * Dv + H + kv0 * G + h] = blz_hsum256(l);
    }
    float *acc0 = partial + kv0 * G * Dv;
    memset(acc0, 0, (size_t)(nh * Dv) * sizeof(float));
    const char *vr[BLZ_PV_KEYS];
    for (int t0 = 0; t0 < n; t0 += BLZ_PV_KEYS) {
        const int nk = (int)blz_min(BLZ_PV_KEYS, n - t0);
        for (int j = t0 + BLZ_ROWPF; j < blz_min(n, t0 + BLZ_ROWPF + nk); ++j) pf_rows(vrow[j], vst);
        for (int64_t c = 0; c < nkv; ++c) {
            for (int t = 0; t < nk; ++t) vr[t] = vrow[t0 + t] + (kv0 + c) * Dv * es;
            const float *pc = p + c * G * BLZ_CHUNK + t0;
            float *acc = acc0 + c * G * Dv;
            int64_t d0 = 0; /* SL slices of 8 at a time: G·SL accumulators, enough chains to hide the FMA latency */
            if (G <= 2)
                for (; d0 + 32 <= Dv; d0 += 32) pv_slices8(G, 4, pc, vr, nk, d0, kv_type, acc, Dv);
            else if (G <= 4)
                for (; d0 + 16 <= Dv; d0 += 16) pv_slices8(G, 2, pc, vr, nk, d0, kv_type, acc, Dv);
            for (; d0 < Dv; d0 += 8) pv_slices8(G, 1, pc, vr, nk, d0, kv_type, acc, Dv);
        }
    }
}

/* attend_item's AVX2 form (see item_avx2): the kv heads in groups of at most BLZ_ITEM_HEADS query heads
 * (BLZ_DISPATCH's instantiations). Returns 0 where the shape is not handled (the caller runs the portable loop). */
static int item_heads_avx2(const float *q, int64_t Hkv, int64_t G, const char *const *krow, const char *const *vrow,
                           int n, int kv_type, int64_t D, int64_t Dv, float scale, float cap, float *partial) {
    if (D % 8 || Dv % 8 || D > BLZ_MAX_D || G > BLZ_MAX_GROUP || n <= 0) return 0;
    const int64_t per = blz_max(1, BLZ_ITEM_HEADS / G);
    for (int64_t kv0 = 0; kv0 < Hkv; kv0 += per) {
        const int64_t nkv = blz_min(per, Hkv - kv0);
#define BLZ_CALL(T, GG, DD, DV) item_avx2(q, Hkv, kv0, nkv, GG, krow, vrow, n, T, DD, DV, scale, cap, partial)
        BLZ_DISPATCH(BLZ_CALL)
#undef BLZ_CALL
    }
    return 1;
}
#endif

/* Portable block step: the same online-softmax update, one key at a time (libm expf). */
static void block_scalar(const float *restrict q, int64_t G, const char *const *kr, const char *const *vr,
                         int nk, int kv_type, int64_t D, int64_t Dv, float scale, float cap, part_t pt) {
    for (int t = 0; t < nk; ++t)
        for (int64_t g = 0; g < G; ++g) {
            const float *qg = q + g * D;
            float s = 0.0f;
            for (int64_t d = 0; d < D; ++d) s += qg[d] * blz_kv_load1(kr[t], d, kv_type);
            s *= scale;
            if (cap > 0.0f) s = blz_softcap1(s, cap);
            const float mold = pt.m[g], mnew = fmaxf(mold, s);
            const float corr = mold == -INFINITY ? 0.0f : expf(mold - mnew), e = expf(s - mnew);
            pt.l[g] = pt.l[g] * corr + e;
            pt.m[g] = mnew;
            float *acc = pt.acc + g * Dv;
            for (int64_t d = 0; d < Dv; ++d) acc[d] = acc[d] * corr + e * blz_kv_load1(vr[t], d, kv_type);
        }
}

/* One kv head of a work item (n keys): the AVX-512 chunk pass (BLZ_DISPATCH's instantiations); the portable
 * one-key-at-a-time update for other shapes and builds. */
static void head_step(const float *q, int64_t G, const char *const *kr, const char *const *vr, int n,
                      int kv_type, int64_t D, int64_t Dv, float scale, float cap, part_t pt, prefetcher_t *pf) {
#ifdef BLZ_AVX512
    if (D % 16 == 0 && Dv % 16 == 0 && D <= BLZ_MAX_D && G <= BLZ_MAX_GROUP) {
#define BLZ_CALL(T, GG, DD, DV) chunk_head(q, GG, kr, vr, n, T, DD, DV, scale, cap, pt, pf)
        BLZ_DISPATCH(BLZ_CALL)
#undef BLZ_CALL
        return;
    }
#endif
    (void)pf;
    for (int64_t g = 0; g < G; ++g) {
        pt.m[g] = -INFINITY;
        pt.l[g] = 0.0f;
    }
    memset(pt.acc, 0, (size_t)(G * Dv) * sizeof(float));
    block_scalar(q, G, kr, vr, n, kv_type, D, Dv, scale, cap, pt);
}

/* One work item: keys j0 .. j1-1 (at most BLZ_CHUNK) of a sequence, all Hkv kv heads, one kv head after
 * the other; writes its states (acc, m, l per head; empty for no keys). q [H][D]; idx the sequence's
 * slots. Sets *err on an out-of-range slot (which then reads slot 0). pf walks the next item's rows. */
static void attend_item(const float *q, int64_t Hkv, int64_t G, const char *k_pool, const char *v_pool,
                        int kv_type, const int64_t *idx, int64_t j0, int64_t j1, int64_t S, int64_t D,
                        int64_t Dv, float scale, float cap, float *partial, int *err, prefetcher_t *pf) {
    const int64_t es = blz_kv_elem_bytes(kv_type), kst = Hkv * D * es, vst = Hkv * Dv * es;
    const int64_t H = Hkv * G;
    const int n = (int)(j1 - j0); /* 0 for an empty sequence: each head_step then writes the empty state */
    const char *krow[BLZ_CHUNK], *vrow[BLZ_CHUNK], *kr[BLZ_CHUNK], *vr[BLZ_CHUNK];
    for (int t = 0; t < n; ++t) {
        int64_t slot = idx[j0 + t];
        if (slot < 0 || slot >= S) {
            *err = 1;
            slot = 0;
        }
        krow[t] = k_pool + slot * kst;
        vrow[t] = v_pool + slot * vst;
    }
#if defined(BLZ_AVX2) && !defined(BLZ_AVX512)
    if (item_heads_avx2(q, Hkv, G, krow, vrow, n, kv_type, D, Dv, scale, cap, partial)) return;
#endif
    /* one prefetch call per 16 keys of each pass (QK, PV) of each kv head: enough keys per call to cover the
     * next item once */
    const int64_t calls = blz_max(1, 2 * Hkv * ((n + BLZ_KEY_BLOCK - 1) / BLZ_KEY_BLOCK));
    pf->per = (int)((pf->n + calls - 1) / calls);
    for (int64_t kvh = 0; kvh < Hkv; ++kvh) {
        for (int t = 0; t < n; ++t) {
            kr[t] = krow[t] + kvh * D * es;
            vr[t] = vrow[t] + kvh * Dv * es;
        }
        const part_t pt = {partial + kvh * G * Dv, partial + H * Dv + kvh * G, partial + H * Dv + H + kvh * G};
        head_step(q + kvh * G * D, G, kr, vr, n, kv_type, D, Dv, scale, cap, pt, pf);
    }
}

/* Work item i: its sequence b and key range [j0, j1) (item_off: first item of each sequence; start: the
 * sequence's first key). */
static void item_keys(int64_t i, int64_t B, const int64_t *item_off, const int64_t *start, const int64_t *seq_lens,
                      int64_t *b, int64_t *j0, int64_t *j1) {
    int64_t lo = 0, hi = B; /* find b with item_off[b] ≤ i < item_off[b+1] */
    while (hi - lo > 1) {
        const int64_t mid = (lo + hi) / 2;
        if (item_off[mid] <= i) lo = mid;
        else hi = mid;
    }
    *b = lo;
    *j0 = start[lo] + (i - item_off[lo]) * BLZ_CHUNK;
    *j1 = blz_min(seq_lens[lo], *j0 + BLZ_CHUNK);
}

/* Store n fp32 values as 16-bit (kv_type BLZ_KV_BF16 / F16) with the same rounding as store1, 16 at a
 * time on AVX-512: f16 by vcvtps2ph (round to nearest even, IEEE subnormals, overflow to inf), bf16 by
 * blz_fp32_to_bf16's integer rounding (NaN kept quiet); the tail by store1. */
static void store_row16(char *dst, const float *src, int64_t n, int kv_type) {
    int64_t i = 0;
#ifdef BLZ_AVX512
    uint16_t *d = (uint16_t *)dst;
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(src + i);
        __m256i h;
        if (kv_type == BLZ_KV_F16) {
            h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        } else {
            const __m512i u = _mm512_castps_si512(x);
            const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
            const __m512i bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff));
            __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
            const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                          _mm512_set1_epi32(0x7f800000));
            r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
            h = _mm512_cvtepi32_epi16(r);
        }
        _mm256_storeu_si256((__m256i *)(d + i), h);
    }
#endif
    for (; i < n; ++i) blz_kv_store1(dst, i, src[i], kv_type);
}

/* kv_write: store the new tokens' keys and values in their cache slots: k_pool[slots[t]] = k[t],
 * v_pool[slots[t]] = v[t] (rows of Hkv·D / Hkv·Dv values; k row t at k + t·ldk, so k and v may be views
 * into a fused qkv output). 16-bit pools round to nearest even, as torch's casts do. A slot outside
 * [0, S) returns BLZ_ERANGE before anything is written. */
BLZ_EXPORT int blz_kv_write(const float *k, int64_t ldk, const float *v, int64_t ldv, const int64_t *slots,
                            int64_t T, int64_t Hkv, int64_t D, int64_t Dv, void *k_pool, void *v_pool,
                            int kv_type, int64_t S) {
    if (T < 0 || Hkv <= 0 || D <= 0 || Dv <= 0 || ldk < Hkv * D || ldv < Hkv * Dv) return BLZ_EINVAL;
    if (kv_type < BLZ_KV_F32 || kv_type > BLZ_KV_F16) return BLZ_EINVAL;
    for (int64_t t = 0; t < T; ++t)
        if (slots[t] < 0 || slots[t] >= S) return BLZ_ERANGE;
    const int64_t nk = Hkv * D, nv = Hkv * Dv, es = blz_kv_elem_bytes(kv_type);
    for (int64_t t = 0; t < T; ++t) {
        const float *kr = k + t * ldk, *vr = v + t * ldv;
        char *kd = (char *)k_pool + slots[t] * nk * es, *vd = (char *)v_pool + slots[t] * nv * es;
        if (kv_type == BLZ_KV_F32) {
            memcpy(kd, kr, (size_t)nk * sizeof(float));
            memcpy(vd, vr, (size_t)nv * sizeof(float));
        } else {
            store_row16(kd, kr, nk, kv_type);
            store_row16(vd, vr, nv, kv_type);
        }
    }
    return BLZ_OK;
}

BLZ_EXPORT int blz_paged_attention_decode(const float *q, int64_t ldq, const void *k_pool,
                                          const void *v_pool, int kv_type, int64_t S,
                                          const int64_t *kv_indices, int64_t idx_stride,
                                          const int64_t *seq_lens, int64_t B, int64_t H, int64_t Hkv,
                                          int64_t D, int64_t Dv, float scale, int64_t window, float *out,
                                          int nthreads, const float *sinks, float softcap) {
    if (B < 0 || H <= 0 || Hkv <= 0 || H % Hkv || D <= 0 || Dv <= 0 || S < 0 || ldq < H * D)
        return BLZ_EINVAL;
    if (!(softcap >= 0.0f)) return BLZ_EINVAL; /* negative or NaN */
    if (kv_type < BLZ_KV_F32 || kv_type > BLZ_KV_F16) return BLZ_EINVAL;
    if (B == 0) return BLZ_OK;
    const int64_t G = H / Hkv, es = blz_kv_elem_bytes(kv_type);
    for (int64_t b = 0; b < B; ++b)
        if (seq_lens[b] < 0 || seq_lens[b] > idx_stride) return BLZ_ERANGE;
    /* scratch: item_off [B+1], ns [B], start [B] (int64), then the partial states [total][H·(Dv+2)] */
    const int64_t mbytes = blz_round_up((3 * B + 1) * (int64_t)sizeof(int64_t), 64);
    int64_t total = 0;
    for (int64_t b = 0; b < B; ++b) {
        const int64_t n = window > 0 ? blz_min(seq_lens[b], window) : seq_lens[b];
        total += blz_max(1, (n + BLZ_CHUNK - 1) / BLZ_CHUNK);
    }
    const int64_t psz = H * (Dv + 2);
    uint8_t *buf = blz_scratch((size_t)(mbytes + total * psz * (int64_t)sizeof(float)));
    if (!buf) return BLZ_ENOMEM;
    int64_t *item_off = (int64_t *)buf, *ns = item_off + B + 1, *start = ns + B;
    float *partial = (float *)(buf + mbytes);
    item_off[0] = 0;
    for (int64_t b = 0; b < B; ++b) {
        start[b] = window > 0 ? blz_max(0, seq_lens[b] - window) : 0;
        ns[b] = blz_max(1, (seq_lens[b] - start[b] + BLZ_CHUNK - 1) / BLZ_CHUNK);
        item_off[b + 1] = item_off[b] + ns[b];
    }
    int err = 0;
    const int nt = (int)blz_max(1, blz_min(nthreads, total));
#pragma omp parallel num_threads(nt)
    {
        int my_err = 0;
        /* items round-robin (static, 1), so each thread knows the next item it runs and prefetches it */
#ifdef _OPENMP
        const int64_t step = omp_get_num_threads();
#else
        const int64_t step = 1;
#endif
#pragma omp for schedule(static, 1)
        for (int64_t i = 0; i < total; ++i) {
            int64_t b, j0, j1;
            item_keys(i, B, item_off, start, seq_lens, &b, &j0, &j1);
            prefetcher_t pf = {(const char *)k_pool, (const char *)v_pool, NULL, 0, S, Hkv * D * es, Hkv * Dv * es,
                               0, 0};
            if (i + step < total) {
                int64_t bn, j0n, j1n;
                item_keys(i + step, B, item_off, start, seq_lens, &bn, &j0n, &j1n);
                pf.idx = kv_indices + bn * idx_stride + j0n;
                pf.n = j1n - j0n;
            }
            attend_item(q + b * ldq, Hkv, G, (const char *)k_pool, (const char *)v_pool, kv_type,
                        kv_indices + b * idx_stride, j0, j1, S, D, Dv, scale, softcap, partial + i * psz, &my_err,
                        &pf);
        }
        if (my_err) {
#pragma omp atomic write
            err = 1;
        }
        /* merge the chunks of each (b, h), in chunk order */
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < B * H; ++bh) {
            const int64_t b = bh / H, h = bh % H;
            float *o = out + bh * Dv;
            float mx = -INFINITY;
            for (int64_t c = 0; c < ns[b]; ++c) mx = fmaxf(mx, partial[(item_off[b] + c) * psz + H * Dv + h]);
            for (int64_t d = 0; d < Dv; ++d) o[d] = 0.0f;
            if (mx == -INFINITY) continue; /* no keys */
            if (sinks) mx = fmaxf(mx, sinks[h]);
            float l = sinks ? expf(sinks[h] - mx) : 0.0f; /* the sink: in the denominator, no value */
            for (int64_t c = 0; c < ns[b]; ++c) {
                const float *pp = partial + (item_off[b] + c) * psz;
                const float mc = pp[H * Dv + h];
                if (mc == -INFINITY) continue;
                const float wgt = expf(mc - mx);
                l += wgt * pp[H * Dv + H + h];
                const float *acc = pp + h * Dv;
                for (int64_t d = 0; d < Dv; ++d) o[d] += wgt * acc[d];
            }
            const float inv = 1.0f / l;
            for (int64_t d = 0; d < Dv; ++d) o[d] *= inv;
        }
    }
    return err ? BLZ_ERANGE : BLZ_OK;
}
