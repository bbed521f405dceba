/* blazr kernels — Multi-head Latent Attention for decode, over the latent cache (model/mla.py).
 *
 * Each cached token is one latent row [c_kv | k_rope] (L + R values) shared by all heads, in a pool
 * [S, L + R] of fp32, bf16 or f16 (BLZ_KV_*).
 *
 * blz_mla_cache_write: the new tokens' rows from the kv_a projection kv [T, L + R] (row stride ldkv):
 * c_kv = w · c / sqrt(mean(c²) + eps) (RMSNorm; no weight: copied as is), k_rope rotated (NeoX half split,
 * cos/sin rows pos[t] of tables [P, R/2], as blz_rope_neox), stored at pool row slots[t].
 *
 * blz_mla_decode, the absorbed form, one query per sequence: for sequence b and head h, with
 * q_lat[b, h] = q_nope[b, h] · W_UK[h] already made (blz_linear_heads over W_UKᵀ),
 *   s_t   = scale · (q_lat · c_kv_t + q_rope[b, h] · k_rope_t)       t < seq_lens[b], row kv_indices[b, t]
 *   o_lat = Σ_t softmax(s)_t · c_kv_t                                [L] → out [B, H, L]
 * and W_UV is applied to o_lat after (blz_linear_heads again), so the cache is never expanded per head.
 * q_lat [B, H, L] and q_rope [B, H, R] are strided views (row b at + b·ld, head h at + h·hs, features
 * contiguous). Split-K ("flash decoding"): a sequence's rows are cut into chunks (MLA_CHUNK rows, longer
 * for long sequences: at most MLA_MAX_CHUNKS), by its own length only, and the work items are the
 * (sequence, chunk) pairs, all heads at once — so every latent row is read from memory once per step,
 * whatever the head count. An item runs an online softmax over steps of
 * MLA_STEP rows (a 16-bit pool's rows widened once per step; scores and values in tiles of 2 heads × 4
 * rows, each row chunk loaded once for both heads) and leaves (max, sum, unnormalised output) per head; the
 * chunks of a sequence are then merged in order. A head's numbers depend on its sequence's rows only: not
 * on the batch, the thread count or which thread ran a chunk. fp32 throughout (libm expf).
 *
 * blz_linear_heads: out[b, h] = x[b, h] · W_hᵀ for every head h < H — the absorbed form's per-head
 * projections (W_UKᵀ [L, Dn] before the attention, W_UV [Dv, L] after). Head h's weight [N, K] starts at
 * w + h·w_stride bytes, in any weight format of the linear kernels (`code` as blz_moe_experts': a quantized
 * head streams its own quantized rows); x and out are strided views as above. Each head is one linear call
 * over its B rows (one read of its weights for the whole batch), so a row's result does not depend on the
 * batch. With at least as many heads as threads the heads are spread over the threads, each call on one;
 * else the heads run in turn, each call on all threads.
 *
 * Shapes: T tokens, B sequences, H heads, R rope dims, L = kv_lora_rank, S pool rows, P table rows;
 * linear_heads: K in, N out features per head.
 */
#include <stdlib.h>

#include "blazr_kernels.h"

#define MLA_CHUNK 64     /* latent rows per work item, at least */
#define MLA_MAX_CHUNKS 16 /* work items per sequence, at most (longer chunks beyond 1024 rows) */
#define MLA_STEP 32      /* rows per online-softmax step */

/* The rows of each work item of a sequence of n rows: a function of n alone. */
BLZ_INLINE int64_t chunk_rows(int64_t n) {
    return blz_max(MLA_CHUNK, blz_round_up((n + MLA_MAX_CHUNKS - 1) / MLA_MAX_CHUNKS, MLA_STEP));
}

BLZ_INLINE int64_t num_chunks(int64_t n) { return (n + chunk_rows(n) - 1) / chunk_rows(n); }

BLZ_EXPORT int blz_mla_cache_write(const float *kv, int64_t ldkv, int64_t T, int64_t L, int64_t R,
                                   const float *norm_w, float eps, const int64_t *pos, const float *cos,
                                   const float *sin, int64_t P, const int64_t *slots, void *pool, int kv_type,
                                   int64_t S) {
    if (T < 0 || L <= 0 || R <= 0 || R % 2 || ldkv < L + R) return BLZ_EINVAL;
    if (kv_type < BLZ_KV_F32 || kv_type > BLZ_KV_F16) return BLZ_EINVAL;
    for (int64_t t = 0; t < T; ++t)
        if (slots[t] < 0 || slots[t] >= S || pos[t] < 0 || pos[t] >= P) return BLZ_ERANGE;
    const int64_t half = R / 2, es = blz_kv_elem_bytes(kv_type);
    for (int64_t t = 0; t < T; ++t) {
        const float *c = kv + t * ldkv, *kr = c + L, *ct = cos + pos[t] * half, *st = sin + pos[t] * half;
        char *row = (char *)pool + slots[t] * (L + R) * es;
        float r = 1.0f;
        if (norm_w) {
            float ss = 0.0f;
            for (int64_t i = 0; i < L; ++i) ss += c[i] * c[i];
            r = 1.0f / sqrtf(ss / (float)L + eps);
        }
        for (int64_t i = 0; i < L; ++i) blz_kv_store1(row, i, norm_w ? norm_w[i] * (c[i] * r) : c[i], kv_type);
        for (int64_t i = 0; i < half; ++i) {
            const float x1 = kr[i], x2 = kr[i + half];
            blz_kv_store1(row, L + i, x1 * ct[i] - x2 * st[i], kv_type);
            blz_kv_store1(row, L + half + i, x2 * ct[i] + x1 * st[i], kv_type);
        }
    }
    return BLZ_OK;
}

#define MLA_TH 2 /* heads per tile */
#define MLA_TR 4 /* latent rows per tile: 8 accumulators (scores) or 8 broadcast weights (values) */

/* s[j·ld + i] = scale · (q_lat_j · c_kv_i + q_rope_j · k_rope_i) for heads j < nh (q rows ql + j·hl, qr +
 * j·hr) and latent rows i < nr (rows[i], fp32, L + R wide). Each (head, row) pair is one FMA chain over
 * eight-lane chunks (c_kv, then k_rope), summed, plus the tails in order: the same bits in any tile. */
BLZ_INLINE void score_tile(const int nh, const int nr, const float *ql, int64_t hl, const float *qr, int64_t hr,
                           const float *const *rows, int64_t L, int64_t R, float scale, float *s, int64_t ld) {
    float tail[MLA_TH][MLA_TR] = {{0}};
    int64_t d0 = 0, e0 = 0;
#ifdef BLZ_AVX2
    __m256 acc[MLA_TH][MLA_TR];
    for (int j = 0; j < nh; ++j)
        for (int i = 0; i < nr; ++i) acc[j][i] = _mm256_setzero_ps();
    for (; d0 + 8 <= L; d0 += 8) {
        __m256 r[MLA_TR];
        for (int i = 0; i < nr; ++i) r[i] = _mm256_loadu_ps(rows[i] + d0);
        for (int j = 0; j < nh; ++j) {
            const __m256 q = _mm256_loadu_ps(ql + j * hl + d0);
            for (int i = 0; i < nr; ++i) acc[j][i] = _mm256_fmadd_ps(q, r[i], acc[j][i]);
        }
    }
    for (; e0 + 8 <= R; e0 += 8) {
        __m256 r[MLA_TR];
        for (int i = 0; i < nr; ++i) r[i] = _mm256_loadu_ps(rows[i] + L + e0);
        for (int j = 0; j < nh; ++j) {
            const __m256 q = _mm256_loadu_ps(qr + j * hr + e0);
            for (int i = 0; i < nr; ++i) acc[j][i] = _mm256_fmadd_ps(q, r[i], acc[j][i]);
        }
    }
    for (int j = 0; j < nh; ++j)
        for (int i = 0; i < nr; ++i) tail[j][i] = blz_hsum256(acc[j][i]);
#endif
    for (int j = 0; j < nh; ++j)
        for (int i = 0; i < nr; ++i) {
            float t = tail[j][i];
            for (int64_t d = d0; d < L; ++d) t += ql[j * hl + d] * rows[i][d];
            for (int64_t e = e0; e < R; ++e) t += qr[j * hr + e] * rows[i][L + e];
            s[j * ld + i] = scale * t;
        }
}

/* o_j += Σ_i p[j·ld + i] · c_kv_i for heads j < nh (o rows o + j·L) and latent rows i < nr, each output
 * element updated by one FMA per row in row order: the same bits in any tile. */
BLZ_INLINE void value_tile(const int nh, const int nr, const float *p, int64_t ld, const float *const *rows,
                           int64_t L, float *o) {
    int64_t d0 = 0;
#ifdef BLZ_AVX2
    __m256 w[MLA_TH][MLA_TR];
    for (int j = 0; j < nh; ++j)
        for (int i = 0; i < nr; ++i) w[j][i] = _mm256_set1_ps(p[j * ld + i]);
    for (; d0 + 8 <= L; d0 += 8) {
        __m256 r[MLA_TR];
        for (int i = 0; i < nr; ++i) r[i] = _mm256_loadu_ps(rows[i] + d0);
        for (int j = 0; j < nh; ++j) {
            __m256 a = _mm256_loadu_ps(o + j * L + d0);
            for (int i = 0; i < nr; ++i) a = _mm256_fmadd_ps(w[j][i], r[i], a);
            _mm256_storeu_ps(o + j * L + d0, a);
        }
    }
#endif
    for (int j = 0; j < nh; ++j)
        for (int64_t d = d0; d < L; ++d) {
            float a = o[j * L + d];
            for (int i = 0; i < nr; ++i) a = fmaf(p[j * ld + i], rows[i][d], a);
            o[j * L + d] = a;
        }
}

#define MLA_TILE_SWITCH(FN, nh, nr, ...)                      \
    do {                                                      \
        if ((nh) == MLA_TH && (nr) == MLA_TR) FN(MLA_TH, MLA_TR, __VA_ARGS__); \
        else if ((nh) == MLA_TH) FN(MLA_TH, 1, __VA_ARGS__);  \
        else if ((nr) == MLA_TR) FN(1, MLA_TR, __VA_ARGS__);  \
        else FN(1, 1, __VA_ARGS__);                           \
    } while (0)

/* A latent row as fp32: the row itself for an fp32 pool, else widened into buf (exactly: vcvtph2ps for f16,
 * a 16-bit shift for bf16, eight at a time on AVX2). */
BLZ_INLINE const float *latent_row(const char *pool, int64_t slot, int64_t W, int kv_type, float *buf) {
    if (kv_type == BLZ_KV_F32) return (const float *)pool + slot * W;
    const uint16_t *row = (const uint16_t *)(pool + slot * W * 2);
    int64_t i = 0;
#ifdef BLZ_AVX2
    for (; i + 8 <= W; i += 8) {
        const __m128i h = _mm_loadu_si128((const __m128i *)(row + i));
        _mm256_storeu_ps(buf + i, kv_type == BLZ_KV_F16
                                      ? _mm256_cvtph_ps(h)
                                      : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
    }
#endif
    for (; i < W; ++i) buf[i] = blz_kv_load1((const char *)row, i, kv_type);
    return buf;
}

/* One work item: rows [t0, t1) of sequence b for all H heads → per head its running max m[h], sum l[h] and
 * unnormalised output o[h·L ..] (Σ e^{s−m} · c_kv). buf: MLA_STEP widened rows [W] and scores [H][MLA_STEP]. */
static void mla_chunk(const float *ql, int64_t hl, const float *qr, int64_t hr, const char *pool, int kv_type,
                      const int64_t *idx, int64_t t0, int64_t t1, int64_t H, int64_t R, int64_t L, float scale,
                      float *m, float *l, float *o, float *buf) {
    const int64_t W = L + R;
    float *wide = buf, *s = wide + MLA_STEP * W;
    for (int64_t h = 0; h < H; ++h) m[h] = -INFINITY, l[h] = 0.0f;
    memset(o, 0, (size_t)(H * L) * sizeof(float));
    const float *rows[MLA_STEP];
    for (int64_t t = t0; t < t1; t += MLA_STEP) {
        const int64_t n = blz_min(MLA_STEP, t1 - t);
        for (int64_t i = 0; i < n; ++i) rows[i] = latent_row(pool, idx[t + i], W, kv_type, wide + i * W);
        for (int64_t i = 0; i < n;) { /* scores s[h·MLA_STEP + i] */
            const int nr = n - i >= MLA_TR ? MLA_TR : 1;
            for (int64_t j = 0; j < H;) {
                const int th = H - j >= MLA_TH ? MLA_TH : 1;
                MLA_TILE_SWITCH(score_tile, th, nr, ql + j * hl, hl, qr + j * hr, hr, rows + i, L, R, scale,
                                s + j * MLA_STEP + i, MLA_STEP);
                j += th;
            }
            i += nr;
        }
        for (int64_t h = 0; h < H; ++h) { /* online softmax: rescale what came before to the new max */
            float *sh = s + h * MLA_STEP, mx = m[h];
            for (int64_t i = 0; i < n; ++i) mx = sh[i] > mx ? sh[i] : mx;
            if (mx > m[h]) {
                const float c = m[h] == -INFINITY ? 0.0f : expf(m[h] - mx);
                l[h] *= c;
                for (int64_t d = 0; d < L; ++d) o[h * L + d] *= c;
                m[h] = mx;
            }
            for (int64_t i = 0; i < n; ++i) l[h] += sh[i] = expf(sh[i] - mx);
        }
        for (int64_t i = 0; i < n;) { /* o += Σ p · c_kv */
            const int nr = n - i >= MLA_TR ? MLA_TR : 1;
            for (int64_t j = 0; j < H;) {
                const int th = H - j >= MLA_TH ? MLA_TH : 1;
                MLA_TILE_SWITCH(value_tile, th, nr, s + j * MLA_STEP + i, MLA_STEP, rows + i, L, o + j * L);
                j += th;
            }
            i += nr;
        }
    }
}

BLZ_EXPORT int blz_mla_decode(const float *q_lat, int64_t ld_lat, int64_t hs_lat, const float *q_rope,
                              int64_t ld_rope, int64_t hs_rope, const void *pool, int kv_type, int64_t S,
                              const int64_t *kv_indices, int64_t idx_stride, const int64_t *seq_lens, int64_t B,
                              int64_t H, int64_t R, int64_t L, float scale, float *out, int nthreads) {
    if (B < 0 || H <= 0 || R <= 0 || L <= 0 || hs_lat < L || hs_rope < R || ld_lat < (H - 1) * hs_lat + L ||
        ld_rope < (H - 1) * hs_rope + R)
        return BLZ_EINVAL;
    if (kv_type < BLZ_KV_F32 || kv_type > BLZ_KV_F16) return BLZ_EINVAL;
    int64_t items = 0, rows = 0;
    for (int64_t b = 0; b < B; ++b) {
        if (seq_lens[b] < 0 || seq_lens[b] > idx_stride) return BLZ_ERANGE;
        for (int64_t t = 0; t < seq_lens[b]; ++t)
            if (kv_indices[b * idx_stride + t] < 0 || kv_indices[b * idx_stride + t] >= S) return BLZ_ERANGE;
        items += num_chunks(seq_lens[b]);
        rows += seq_lens[b];
    }
    if (B == 0) return BLZ_OK;
    /* scratch: the item table [items] (sequence, first row), each sequence's first item [B + 1]; per item
     * m [H], l [H], o [H·L]; per thread MLA_STEP widened rows and scores [H][MLA_STEP] */
    const int64_t W = L + R, part = H * (L + 2), per = blz_round_up(MLA_STEP * (W + H), 16);
    const int nt = blz_threads(nthreads, rows * W * H, 1 << 15);
    const int64_t ibytes = blz_round_up((2 * items + B + 1) * (int64_t)sizeof(int64_t), 64);
    char *sc = blz_scratch((size_t)ibytes + (size_t)(items * part + nt * per) * sizeof(float));
    if (!sc) return BLZ_ENOMEM;
    int64_t *item_b = (int64_t *)sc, *item_t = item_b + items, *first = item_t + items;
    float *parts = (float *)(sc + ibytes), *bufs = parts + items * part;
    first[0] = 0;
    for (int64_t b = 0, k = 0; b < B; ++b) {
        for (int64_t t = 0; t < seq_lens[b]; t += chunk_rows(seq_lens[b]), ++k) item_b[k] = b, item_t[k] = t;
        first[b + 1] = k;
    }
#pragma omp parallel num_threads(nt)
    {
#ifdef _OPENMP
        float *buf = bufs + per * omp_get_thread_num();
#else
        float *buf = bufs;
#endif
#pragma omp for schedule(dynamic, 1)
        for (int64_t k = 0; k < items; ++k) {
            const int64_t b = item_b[k], t0 = item_t[k], t1 = blz_min(seq_lens[b], t0 + chunk_rows(seq_lens[b]));
            float *p = parts + k * part;
            mla_chunk(q_lat + b * ld_lat, hs_lat, q_rope + b * ld_rope, hs_rope, (const char *)pool, kv_type,
                      kv_indices + b * idx_stride, t0, t1, H, R, L, scale, p, p + H, p + 2 * H, buf);
        }
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < B * H; ++bh) { /* merge each sequence's chunks, in order */
            const int64_t b = bh / H, h = bh % H, k0 = first[b], nc = first[b + 1] - k0;
            float *o = out + (b * H + h) * L, mx = -INFINITY, den = 0.0f;
            memset(o, 0, (size_t)L * sizeof(float)); /* zeros for an empty sequence */
            for (int64_t c = 0; c < nc; ++c) mx = fmaxf(mx, parts[(k0 + c) * part + h]);
            for (int64_t c = 0; c < nc; ++c) {
                const float *p = parts + (k0 + c) * part, w = expf(p[h] - mx);
                den += w * p[H + h];
                for (int64_t d = 0; d < L; ++d) o[d] += w * p[2 * H + h * L + d];
            }
            if (nc)
                for (int64_t d = 0; d < L; ++d) o[d] /= den;
        }
    }
    return BLZ_OK;
}

/* Head h of blz_linear_heads, its linear call on `nt` threads. */
static int head_linear(int64_t h, const float *x, int64_t ldx, int64_t hsx, int64_t B, int64_t K, int code,
                       const void *w, int64_t w_stride, int64_t N, float *out, int64_t ldo, int64_t hso, int nt) {
    const float *xh = x + h * hsx;
    const void *wh = (const char *)w + h * w_stride;
    float *oh = out + h * hso;
    if (B == 1) return blz_linear_by_code(code, xh, 1, K, wh, N, oh, 0, nt);
    /* the head's rows gathered: the linear kernels read and write contiguous [B, K] / [B, N] rows */
    float *xs = blz_scratch_slot(1, (size_t)(B * (K + N)) * sizeof(float)), *os = xs + B * K;
    if (!xs) return BLZ_ENOMEM;
    for (int64_t b = 0; b < B; ++b) memcpy(xs + b * K, xh + b * ldx, (size_t)K * sizeof(float));
    const int rc = blz_linear_by_code(code, xs, B, K, wh, N, os, 0, nt);
    for (int64_t b = 0; rc == BLZ_OK && b < B; ++b) memcpy(oh + b * ldo, os + b * N, (size_t)N * sizeof(float));
    return rc;
}

BLZ_EXPORT int blz_linear_heads(const float *x, int64_t ldx, int64_t hsx, int64_t B, int64_t H, int64_t K,
                                int code, const void *w, int64_t w_stride, int64_t N, float *out, int64_t ldo,
                                int64_t hso, int nthreads) {
    if (B < 0 || H <= 0 || K <= 0 || N <= 0 || w_stride <= 0 || hsx < K || hso < N ||
        (B > 1 && (ldx < (H - 1) * hsx + K || ldo < (H - 1) * hso + N)))
        return BLZ_EINVAL;
    if (B == 0) return BLZ_OK;
    const int nt = nthreads > 0 ? nthreads : 1;
    int err = BLZ_OK;
    if (nt > 1 && H >= nt) { /* heads over the threads, each call on one */
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t h = 0; h < H; ++h) {
            const int rc = head_linear(h, x, ldx, hsx, B, K, code, w, w_stride, N, out, ldo, hso, 1);
            if (rc != BLZ_OK) {
#pragma omp atomic write
                err = rc;
            }
        }
        return err;
    }
    for (int64_t h = 0; h < H && err == BLZ_OK; ++h) /* the heads in turn, each call on all threads */
        err = head_linear(h, x, ldx, hsx, B, K, code, w, w_stride, N, out, ldo, hso, nt);
    return err;
}
