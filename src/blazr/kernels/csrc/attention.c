/* blazr kernels — paged attention for decode (one query token per sequence), GQA, fp32.
 *
 * out[b, h, :] = softmax_j(scale · q[b, h]·k_j) · v_j over the keys j of sequence b, where key j lives in
 * cache slot kv_indices[b, j]: k_j = k_pool[slot, h / G], v_j = v_pool[slot, h / G], G = H / Hkv.
 * Keys are j ∈ [L_b − window, L_b) with a sliding window, else [0, L_b) (L_b = seq_lens[b]); an empty
 * range gives zeros. Layouts: q [B, H, D] (row b at q + b·ldq, so q may be a view into a fused qkv
 * buffer), k_pool [S, Hkv, D], v_pool [S, Hkv, Dv] (fp32, or bf16 when kv_bf16: widened exactly to fp32
 * on load, halving the cache bytes read), kv_indices [B, Lmax] (row stride idx_stride), seq_lens [B],
 * out [B, H, Dv] fp32; otherwise contiguous; int64 indices.
 *
 * Parallel strategy (flash-decoding): the work items are (b, kv head, key split); the G query heads of a
 * kv head share every K/V row load. A sequence is split into several key ranges when B·Hkv alone cannot
 * keep the threads busy; each item keeps an online softmax (running max m, sum l, unnormalised acc) in
 * fp32, and a second pass merges the splits: out = Σ_s e^{m_s−M} acc_s / Σ_s e^{m_s−M} l_s.
 * Inner loop (AVX-512, D and Dv multiples of 16): blocks of 16 keys, whose K/V rows are prefetched one
 * block ahead (paged slots defeat the hardware prefetcher). Per head: 16 partial-sum vectors (FMA over D)
 * reduced together by a transpose-add tree into 16 scores, a 16-lane masked online-softmax update with a
 * polynomial exp, then acc += P·V one 16-float slice at a time in a register. Other sizes and
 * non-AVX-512 builds use the scalar loop (libm expf).
 */
#include "blazr_kernels.h"

#define BLZ_KEY_BLOCK 16  /* keys per softmax block */
#define BLZ_MIN_SPLIT 64  /* fewest keys worth a split of their own */
#define BLZ_MAX_GROUP 64  /* query heads per kv head handled by the block path */

/* Online-softmax state of one work item: acc [G][Dv], m [G], l [G]. */
typedef struct {
    float *acc, *m, *l;
} part_t;

/* Prefetch the K and V rows of keys j0 .. j1-1 (slots are scattered by paging, so the hardware prefetcher
 * cannot follow them); invalid slots are skipped here and reported by the caller's loop. */
static inline void prefetch_rows(const char *kb, const char *vb, int64_t kst, int64_t vst,
                                 const int64_t *idx, int64_t j0, int64_t j1, int64_t S, int64_t kbytes,
                                 int64_t vbytes) {
    for (int64_t j = j0; j < j1; ++j) {
        const int64_t slot = idx[j];
        if (slot < 0 || slot >= S) continue;
        const char *k = kb + slot * kst, *v = vb + slot * vst;
        for (int64_t b = 0; b < kbytes; b += 64) __builtin_prefetch(k + b);
        for (int64_t b = 0; b < vbytes; b += 64) __builtin_prefetch(v + b);
    }
}

/* Element i of a cache row (fp32, or bf16 widened exactly). */
BLZ_INLINE float load1(const char *row, int64_t i, int bf16) {
    return bf16 ? blz_bf16_to_fp32(((const uint16_t *)row)[i]) : ((const float *)row)[i];
}

#ifdef BLZ_AVX512
/* Elements i .. i+15 of a cache row as fp32 (bf16: zero-extend to 32 bits and shift into the high half). */
BLZ_INLINE __m512 load16(const char *row, int64_t i, int bf16) {
    if (!bf16) return _mm512_loadu_ps((const float *)row + i);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

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
#endif

/* Attend query heads q[G][D] to keys j0 .. j1-1 of one (sequence, kv head); kb / vb point at the kv
 * head's row of slot 0, kst / vst are the pool row strides in bytes, bf16 the pools' element type.
 * Sets *err on an out-of-range slot. */
BLZ_INLINE void attend_range(const float *restrict q, int64_t G, const char *kb, const char *vb, int64_t kst,
                             int64_t vst, const int bf16, const int64_t *idx, int64_t j0, int64_t j1,
                             int64_t S, int64_t D, int64_t Dv, float scale, part_t pt, int *err) {
    const int64_t es = bf16 ? 2 : 4; /* bytes per cache element */
    for (int64_t g = 0; g < G; ++g) {
        pt.m[g] = -INFINITY;
        pt.l[g] = 0.0f;
    }
    memset(pt.acc, 0, (size_t)(G * Dv) * sizeof(float));
#ifdef BLZ_AVX512
    if (D % 16 == 0 && Dv % 16 == 0 && G <= BLZ_MAX_GROUP) {
        float sc[BLZ_MAX_GROUP * BLZ_KEY_BLOCK] __attribute__((aligned(64)));
        prefetch_rows(kb, vb, kst, vst, idx, j0, blz_min(j0 + BLZ_KEY_BLOCK, j1), S, D * es, Dv * es);
        for (int64_t j = j0; j < j1; j += BLZ_KEY_BLOCK) {
            const int nk = (int)blz_min(BLZ_KEY_BLOCK, j1 - j);
            prefetch_rows(kb, vb, kst, vst, idx, j + BLZ_KEY_BLOCK, blz_min(j + 2 * BLZ_KEY_BLOCK, j1), S,
                          D * es, Dv * es);
            const __mmask16 mk = (__mmask16)((1u << nk) - 1u);
            const char *kr[BLZ_KEY_BLOCK], *vr[BLZ_KEY_BLOCK];
            for (int t = 0; t < nk; ++t) {
                int64_t slot = idx[j + t];
                if (slot < 0 || slot >= S) {
                    *err = 1;
                    slot = 0;
                }
                kr[t] = kb + slot * kst;
                vr[t] = vb + slot * vst;
            }
            /* scores: for each head, 16 partial-sum vectors (one per key), reduced together */
            for (int64_t g = 0; g < G; ++g) {
                __m512 part[BLZ_KEY_BLOCK];
                for (int t = 0; t < BLZ_KEY_BLOCK; ++t) {
                    __m512 a = _mm512_setzero_ps();
                    if (t < nk)
                        for (int64_t d = 0; d < D; d += 16)
                            a = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * D + d), load16(kr[t], d, bf16), a);
                    part[t] = a;
                }
                _mm512_store_ps(sc + g * BLZ_KEY_BLOCK, hsum16(part));
            }
            /* online softmax update per head; sc becomes the probabilities p */
            for (int64_t g = 0; g < G; ++g) {
                const __m512 s = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, sc + g * BLZ_KEY_BLOCK),
                                               _mm512_set1_ps(scale));
                const float mold = pt.m[g], mnew = fmaxf(mold, _mm512_mask_reduce_max_ps(mk, s));
                const __m512 p =
                    _mm512_maskz_mov_ps(mk, blz_exp512(_mm512_sub_ps(s, _mm512_set1_ps(mnew))));
                _mm512_store_ps(sc + g * BLZ_KEY_BLOCK, p);
                const float corr = mold == -INFINITY ? 0.0f : expf(mold - mnew);
                pt.l[g] = pt.l[g] * corr + _mm512_reduce_add_ps(p);
                pt.m[g] = mnew;
                if (corr != 1.0f) {
                    float *acc = pt.acc + g * Dv;
                    for (int64_t d = 0; d < Dv; d += 16)
                        _mm512_storeu_ps(acc + d,
                                         _mm512_mul_ps(_mm512_loadu_ps(acc + d), _mm512_set1_ps(corr)));
                }
            }
            /* acc_g += Σ_t p[g][t] · v_t, one 16-float slice at a time in a register */
            for (int64_t g = 0; g < G; ++g) {
                float *acc = pt.acc + g * Dv;
                const float *pg = sc + g * BLZ_KEY_BLOCK;
                for (int64_t d = 0; d < Dv; d += 16) {
                    __m512 a = _mm512_loadu_ps(acc + d);
                    for (int t = 0; t < nk; ++t)
                        a = _mm512_fmadd_ps(_mm512_set1_ps(pg[t]), load16(vr[t], d, bf16), a);
                    _mm512_storeu_ps(acc + d, a);
                }
            }
        }
        return;
    }
#endif
    for (int64_t j = j0; j < j1; ++j) {
        if ((j - j0) % BLZ_KEY_BLOCK == 0)
            prefetch_rows(kb, vb, kst, vst, idx, j + BLZ_KEY_BLOCK, blz_min(j + 2 * BLZ_KEY_BLOCK, j1), S,
                          D * es, Dv * es);
        int64_t slot = idx[j];
        if (slot < 0 || slot >= S) {
            *err = 1;
            slot = 0;
        }
        const char *k = kb + slot * kst, *v = vb + slot * vst;
        for (int64_t g = 0; g < G; ++g) {
            const float *qg = q + g * D;
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int64_t d = 0; d < D; ++d) s += qg[d] * load1(k, d, bf16);
            s *= scale;
            const float mold = pt.m[g], mnew = fmaxf(mold, s);
            const float corr = mold == -INFINITY ? 0.0f : expf(mold - mnew), p = expf(s - mnew);
            pt.l[g] = pt.l[g] * corr + p;
            pt.m[g] = mnew;
            float *acc = pt.acc + g * Dv;
#pragma omp simd
            for (int64_t d = 0; d < Dv; ++d) acc[d] = acc[d] * corr + p * load1(v, d, bf16);
        }
    }
}

/* attend_range specialised for each cache element type. */
static void attend_f32(const float *q, int64_t G, const char *kb, const char *vb, int64_t kst, int64_t vst,
                       const int64_t *idx, int64_t j0, int64_t j1, int64_t S, int64_t D, int64_t Dv,
                       float scale, part_t pt, int *err) {
    attend_range(q, G, kb, vb, kst, vst, 0, idx, j0, j1, S, D, Dv, scale, pt, err);
}
static void attend_bf16(const float *q, int64_t G, const char *kb, const char *vb, int64_t kst, int64_t vst,
                        const int64_t *idx, int64_t j0, int64_t j1, int64_t S, int64_t D, int64_t Dv,
                        float scale, part_t pt, int *err) {
    attend_range(q, G, kb, vb, kst, vst, 1, idx, j0, j1, S, D, Dv, scale, pt, err);
}

/* kv_write: store the new tokens' keys and values in their cache slots: k_pool[slots[t]] = k[t],
 * v_pool[slots[t]] = v[t] (rows of Hkv·D / Hkv·Dv values; k row t at k + t·ldk, so k and v may be views
 * into a fused qkv output). bf16 pools round to nearest even, as torch's copy does. A slot outside
 * [0, S) returns BLZ_ERANGE before anything is written. */
BLZ_EXPORT int blz_kv_write(const float *k, int64_t ldk, const float *v, int64_t ldv, const int64_t *slots,
                            int64_t T, int64_t Hkv, int64_t D, int64_t Dv, void *k_pool, void *v_pool,
                            int kv_bf16, int64_t S) {
    if (T < 0 || Hkv <= 0 || D <= 0 || Dv <= 0 || ldk < Hkv * D || ldv < Hkv * Dv) return BLZ_EINVAL;
    for (int64_t t = 0; t < T; ++t)
        if (slots[t] < 0 || slots[t] >= S) return BLZ_ERANGE;
    const int64_t nk = Hkv * D, nv = Hkv * Dv;
    for (int64_t t = 0; t < T; ++t) {
        const float *kr = k + t * ldk, *vr = v + t * ldv;
        if (kv_bf16) {
            uint16_t *kd = (uint16_t *)k_pool + slots[t] * nk, *vd = (uint16_t *)v_pool + slots[t] * nv;
            for (int64_t i = 0; i < nk; ++i) kd[i] = blz_fp32_to_bf16(kr[i]);
            for (int64_t i = 0; i < nv; ++i) vd[i] = blz_fp32_to_bf16(vr[i]);
        } else {
            memcpy((float *)k_pool + slots[t] * nk, kr, (size_t)nk * sizeof(float));
            memcpy((float *)v_pool + slots[t] * nv, vr, (size_t)nv * sizeof(float));
        }
    }
    return BLZ_OK;
}

/* Number of key ranges for a sequence of length L: enough to give each ≥ BLZ_MIN_SPLIT keys, ≤ per_bh. */
static int64_t num_splits(int64_t L, int64_t window, int64_t per_bh) {
    const int64_t n = window > 0 ? blz_min(L, window) : L;
    return blz_max(1, blz_min(per_bh, (n + BLZ_MIN_SPLIT - 1) / BLZ_MIN_SPLIT));
}

BLZ_EXPORT int blz_paged_attention_decode(const float *q, int64_t ldq, const void *k_pool,
                                          const void *v_pool, int kv_bf16, int64_t S,
                                          const int64_t *kv_indices, int64_t idx_stride,
                                          const int64_t *seq_lens, int64_t B, int64_t H, int64_t Hkv,
                                          int64_t D, int64_t Dv, float scale, int64_t window, float *out,
                                          int nthreads) {
    if (B < 0 || H <= 0 || Hkv <= 0 || H % Hkv || D <= 0 || Dv <= 0 || S < 0 || ldq < H * D)
        return BLZ_EINVAL;
    if (B == 0) return BLZ_OK;
    const int64_t G = H / Hkv;
    const int nt = nthreads > 0 ? nthreads : 1;
    for (int64_t b = 0; b < B; ++b)
        if (seq_lens[b] < 0 || seq_lens[b] > idx_stride) return BLZ_ERANGE;
    /* split each sequence into ns[b] key ranges so that there are ≥ 4·threads items when possible */
    const int64_t per_bh = blz_max(1, (4 * nt + B * Hkv - 1) / (B * Hkv));
    int64_t total = 0;
    for (int64_t b = 0; b < B; ++b) total += Hkv * num_splits(seq_lens[b], window, per_bh);
    /* scratch: item_off [B+1], ns [B], start [B] (int64), then the partial states [total][G·(Dv+2)] */
    const int64_t mbytes = blz_round_up((3 * B + 1) * (int64_t)sizeof(int64_t), 64);
    uint8_t *buf = blz_scratch((size_t)(mbytes + total * G * (Dv + 2) * (int64_t)sizeof(float)));
    if (!buf) return BLZ_ENOMEM;
    int64_t *item_off = (int64_t *)buf, *ns = item_off + B + 1, *start = ns + B;
    float *partial = (float *)(buf + mbytes);
    item_off[0] = 0;
    for (int64_t b = 0; b < B; ++b) {
        start[b] = window > 0 ? blz_max(0, seq_lens[b] - window) : 0;
        ns[b] = num_splits(seq_lens[b], window, per_bh);
        item_off[b + 1] = item_off[b] + Hkv * ns[b];
    }
    int err = 0;
    const int64_t es = kv_bf16 ? 2 : 4, kst = Hkv * D * es, vst = Hkv * Dv * es, psz = G * (Dv + 2);
#pragma omp parallel num_threads(nt)
    {
        int my_err = 0;
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < total; ++i) {
            int64_t lo = 0, hi = B; /* find b with item_off[b] ≤ i < item_off[b+1] */
            while (hi - lo > 1) {
                const int64_t mid = (lo + hi) / 2;
                if (item_off[mid] <= i) lo = mid;
                else hi = mid;
            }
            const int64_t b = lo, r = i - item_off[b], kvh = r / ns[b], sp = r % ns[b];
            const int64_t n = seq_lens[b] - start[b];
            const int64_t j0 = start[b] + n * sp / ns[b], j1 = start[b] + n * (sp + 1) / ns[b];
            float *pp = partial + i * psz;
            const part_t pt = {pp, pp + G * Dv, pp + G * Dv + G};
            const char *kb = (const char *)k_pool + kvh * D * es, *vb = (const char *)v_pool + kvh * Dv * es;
            (kv_bf16 ? attend_bf16 : attend_f32)(q + b * ldq + kvh * G * D, G, kb, vb, kst, vst,
                                                 kv_indices + b * idx_stride, j0, j1, S, D, Dv, scale, pt,
                                                 &my_err);
        }
        if (my_err) {
#pragma omp atomic write
            err = 1;
        }
        /* merge the splits of each (b, h) */
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < B * H; ++bh) {
            const int64_t b = bh / H, h = bh % H, kvh = h / G, g = h % G;
            float *o = out + bh * Dv;
            float mx = -INFINITY;
            for (int64_t sp = 0; sp < ns[b]; ++sp) {
                const float *pp = partial + (item_off[b] + kvh * ns[b] + sp) * psz;
                mx = fmaxf(mx, pp[G * Dv + g]);
            }
            for (int64_t d = 0; d < Dv; ++d) o[d] = 0.0f;
            if (mx == -INFINITY) continue; /* no keys */
            float l = 0.0f;
            for (int64_t sp = 0; sp < ns[b]; ++sp) {
                const float *pp = partial + (item_off[b] + kvh * ns[b] + sp) * psz;
                const float ms = pp[G * Dv + g];
                if (ms == -INFINITY) continue;
                const float wgt = expf(ms - mx);
                l += wgt * pp[G * Dv + G + g];
                const float *acc = pp + g * Dv;
#pragma omp simd
                for (int64_t d = 0; d < Dv; ++d) o[d] += wgt * acc[d];
            }
            const float inv = 1.0f / l;
#pragma omp simd
            for (int64_t d = 0; d < Dv; ++d) o[d] *= inv;
        }
    }
    return err ? BLZ_ERANGE : BLZ_OK;
}
