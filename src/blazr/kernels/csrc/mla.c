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
 * contiguous). Work items are (sequence, block of heads), the blocks as large as keeps every thread busy:
 * every latent row read feeds the block's heads. A head's numbers do not depend on its block, the batch or
 * the thread count. Scores and softmax in fp32 (libm expf); tiles of 2 heads × 4 latent rows (AVX2: 8 FMA
 * chains, each row chunk loaded once for both heads).
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
#ifdef _OPENMP
#include <omp.h>
#endif

#define BLZ_MLA_MAX_HEADS 16 /* heads per work item, at most */

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

BLZ_EXPORT int blz_mla_decode(const float *q_lat, int64_t ld_lat, int64_t hs_lat, const float *q_rope,
                              int64_t ld_rope, int64_t hs_rope, const void *pool, int kv_type, int64_t S,
                              const int64_t *kv_indices, int64_t idx_stride, const int64_t *seq_lens, int64_t B,
                              int64_t H, int64_t R, int64_t L, float scale, float *out, int nthreads) {
    if (B < 0 || H <= 0 || R <= 0 || L <= 0 || hs_lat < L || hs_rope < R || ld_lat < (H - 1) * hs_lat + L ||
        ld_rope < (H - 1) * hs_rope + R)
        return BLZ_EINVAL;
    if (kv_type < BLZ_KV_F32 || kv_type > BLZ_KV_F16) return BLZ_EINVAL;
    int64_t nmax = 1;
    for (int64_t b = 0; b < B; ++b) {
        if (seq_lens[b] < 0 || seq_lens[b] > idx_stride) return BLZ_ERANGE;
        for (int64_t t = 0; t < seq_lens[b]; ++t)
            if (kv_indices[b * idx_stride + t] < 0 || kv_indices[b * idx_stride + t] >= S) return BLZ_ERANGE;
        nmax = blz_max(nmax, seq_lens[b]);
    }
    /* heads per item: as many as keep every thread busy (a head's numbers do not depend on its block) */
    const int nt0 = nthreads > 0 ? nthreads : 1;
    const int64_t per_seq = blz_min(H, (nt0 + B - 1) / blz_max(B, 1));
    const int64_t HB = blz_min(BLZ_MLA_MAX_HEADS, (H + per_seq - 1) / per_seq), W = L + R;
    const int64_t blocks = (H + HB - 1) / HB, items = B * blocks;
    const int nt = blz_threads(nthreads, items * nmax * W * HB, 1 << 15);
    /* per thread: scores [HB][nmax], MLA_TR widened rows [W] */
    const int64_t per = blz_round_up(HB * nmax + MLA_TR * W, 16);
    float *scratch = blz_scratch((size_t)(per * nt) * sizeof(float));
    if (!scratch) return BLZ_ENOMEM;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t item = 0; item < items; ++item) {
#ifdef _OPENMP
        float *buf = scratch + per * omp_get_thread_num();
#else
        float *buf = scratch;
#endif
        const int64_t b = item / blocks, h0 = item % blocks * HB, nh = blz_min(HB, H - h0), n = seq_lens[b];
        float *s = buf, *wide = s + HB * nmax;
        const int64_t *idx = kv_indices + b * idx_stride;
        const float *ql = q_lat + b * ld_lat + h0 * hs_lat, *qr = q_rope + b * ld_rope + h0 * hs_rope;
        const float *rows[MLA_TR];
        for (int64_t t = 0; t < n;) { /* scores: each tile of rows read once for the block's heads */
            const int nr = n - t >= MLA_TR ? MLA_TR : 1;
            for (int i = 0; i < nr; ++i) rows[i] = latent_row(pool, idx[t + i], W, kv_type, wide + i * W);
            for (int64_t j = 0; j < nh;) {
                const int th = nh - j >= MLA_TH ? MLA_TH : 1;
                MLA_TILE_SWITCH(score_tile, th, nr, ql + j * hs_lat, hs_lat, qr + j * hs_rope, hs_rope, rows, L,
                                R, scale, s + j * nmax + t, nmax);
                j += th;
            }
            t += nr;
        }
        for (int64_t j = 0; j < nh; ++j) { /* softmax */
            float *sj = s + j * nmax, m = -INFINITY, sum = 0.0f;
            for (int64_t t = 0; t < n; ++t) m = sj[t] > m ? sj[t] : m;
            for (int64_t t = 0; t < n; ++t) sum += sj[t] = expf(sj[t] - m);
            for (int64_t t = 0; t < n; ++t) sj[t] /= sum;
        }
        float *o = out + (b * H + h0) * L; /* o_lat = Σ p · c_kv (zeros for an empty sequence) */
        memset(o, 0, (size_t)(nh * L) * sizeof(float));
        for (int64_t t = 0; t < n;) {
            const int nr = n - t >= MLA_TR ? MLA_TR : 1;
            for (int i = 0; i < nr; ++i) rows[i] = latent_row(pool, idx[t + i], W, kv_type, wide + i * W);
            for (int64_t j = 0; j < nh;) {
                const int th = nh - j >= MLA_TH ? MLA_TH : 1;
                MLA_TILE_SWITCH(value_tile, th, nr, s + j * nmax + t, nmax, rows, L, o + j * L);
                j += th;
            }
            t += nr;
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
