/* blazr kernels — linear layers with GGUF K-quant weights (ggml Q4_K, Q5_K, Q6_K), run as stored.
 *
 * Computes out[M, N] = x[M, K] · Wᵀ (+ bias[N]) (+ residual[M, N]), or in SwiGLU mode, for a fused
 * [gate; up] weight of N = 2·I rows, out[M, I] = silu(x·W_gateᵀ + b_gate) * (x·W_upᵀ + b_up). Reached through
 * blz_linear_q (kind codes BLZ_Q4_K, BLZ_Q5_K, BLZ_Q6_K).
 *
 * Weights are ggml's bytes as a GGUF file stores them, row after row (row_bytes = K/256 · block bytes), no
 * repacking — a view of an mmap'd file can be used in place. One super-block holds 256 weights:
 *   Q4_K (144 B): f16 d, f16 dmin, 12 B of 6-bit scales sc[8] and mins m[8], 128 B nibbles;
 *                 w = d·sc[j]·q − dmin·m[j] for the 32-weight sub-block j, q in 0..15; nibble byte 32c + l
 *                 holds element 64c + l (low) and 64c + 32 + l (high)
 *   Q5_K (176 B): as Q4_K plus qh[32] after the scales (bit j of qh[l] = the 5th bit of element 32j + l),
 *                 q in 0..31
 *   Q6_K (210 B): ql[128] low 4 bits, qh[64] high 2 bits, int8 sc[16], f16 d; w = d·sc[e/16]·(q − 32),
 *                 q in 0..63 (element layout: see unpack_q6k)
 *
 * Activations are quantized as ggml's quantize_row_q8_K_ref (Q8_K), per row and super-block of 256:
 * max = the first element of largest |x|, iscale = −127/max, q = round_half_even(iscale·x) (int8, ±127),
 * dx = 1/iscale (fp32, unrounded), bsums = sums of q per 16; all zero when max = 0.
 *
 * Per (output row n, activation row m, super-block b) the integer dot is exact in int32:
 *   Q4_K / Q5_K: sumi = Σ_j sc[j]·Σ_{32 e} q·qx,   summ = Σ_j m[j]·(bsums[2j] + bsums[2j+1])
 *   Q6_K:        sumi = Σ_j sc[j]·(Σ_{16 e} q·qx − 32·bsums[j])
 * (|sumi| < 2^29), then in fp32, super-blocks in order:
 *   acc = fma((float)sumi, d·dx, acc);   Q4_K / Q5_K: acc = fma(−(float)summ, dmin·dx, acc)
 * Every output is computed by exactly this sequence whatever M is and wherever its row falls in a tile,
 * so a row's result never depends on its batch; the AVX2 path (vpmaddubsw pair sums, which cannot
 * saturate: q ≤ 63, |qx| ≤ 127) and the portable scalar path (explicit fmaf) give the same bits.
 *
 * Parallel strategy: OpenMP splits the output rows in tiles of 8; a tile walks the super-blocks once per
 * group of up to 16 activation rows, unpacking each weight row's super-block into registers once for the
 * group. The AVX2 path keeps an 8-lane int32 partial sum per (weight row, activation row) and reduces 8 of
 * them at once with vphaddd into one vector whose lane r is row r's sumi, so the fp32 step is one 8-lane
 * fma per activation row and super-block, and a tile's 8 outputs of a row are contiguous. The 8 rows are 8
 * interleaved streams, which the hardware prefetcher follows poorly; the tile prefetches the rows after it
 * (one linear stream) as it goes (BLZ_K_PF). A group of one activation row (decode) has its own AVX2 path,
 * tile1_avx2: the same operations, but each weight row's quants and scale vectors are made next to their
 * use instead of all held for the group (16 registers' worth, spilled at one row), and the Q4_K / Q5_K
 * 6-bit scales are unpacked in SSE — 1.10-1.16x at M = 1 on a Zen 3 (in-process A/B, hot and cold). A
 * one-row call of Q6_K rows alone may instead walk each weight row across its super-blocks, then the next
 * (rows1_q6k, knob BLZ_TUNE_K6_ROWS: one linear read per stream, each output still its lane's steps in
 * order), which cold on Zen 3 reads 1.4-1.8x the tile walk's GB/s — AVX2 builds keep Q6_K as stored.
 * With AVX-512 the group path pairs sub-blocks 2i and 2i+1 in one 512-bit register, so an activation row
 * takes 4 vpmaddubsw / vpmaddwd steps instead of 8 (the same int32 partials, folded to 256 bits before the
 * reduction: the same bits) — 1.05-1.27x at 16-512 rows on Sapphire Rapids (1B shapes, NOTES §36).
 * On AVX-512 VNNI builds calls of KG_MIN rows and more take linear_k_groups.c instead: 16 weight rows re-laid
 * per call so that vpdpbusd runs their dots side by side (the same bits; 1.6-1.8x at 64-512 rows).
 * On those builds the loader re-lays K-quant linears once, at load, in that 16-row grouping kept compact
 * (linear_kx.c: the same bits at every row count, one-row calls 1.5-2.3x faster hot), on AVX2 builds Q4_K and
 * Q5_K only; this file then runs the kinds kept as stored, weights of odd row counts and the scalar build.
 */
#include "kquant.h"

#define KR 8 /* weight rows per tile (the fp32 lanes) */
/* acc + vpmaddwd(p, s), the exact int32 sums of pairs of int16 products: one vpdpwssd where AVX512_VNNI is
 * built (+ VL for 256 bits) — the same bits, a uop fewer per 32 products (Q4_K 1B shapes, 4-16 rows:
 * +4-12 %; NOTES §43) */
#if defined(BLZ_VNNI) && defined(__AVX512VL__)
#define MADD_ACC256(acc, p, s) _mm256_dpwssd_epi32(acc, p, s)
#define MADD_ACC512(acc, p, s) _mm512_dpwssd_epi32(acc, p, s)
#else
#define MADD_ACC256(acc, p, s) _mm256_add_epi32(acc, _mm256_madd_epi16(p, s))
#define MADD_ACC512(acc, p, s) _mm512_add_epi32(acc, _mm512_madd_epi16(p, s))
#endif
#ifndef KT
#define KT 16 /* activation rows per tile, at most (512-row prefill, 1 thread: 8 → 16 rows 74 → 80-91 GFLOP/s
               * Q4_K, 68 → 82-93 Q6_K; 24 and 32 slower) */
#endif
#ifndef BLZ_K_PF
/* Software prefetch: 1 = while a tile walks its 8 rows' super-blocks (8 interleaved streams, which the
 * hardware prefetcher follows poorly), fetch the bytes of the rows that follow in memory (the next tile's,
 * one linear stream) a super-block column at a time; 0 = none. */
#define BLZ_K_PF 1
#endif

#ifdef BLZ_AVX2
/* One super-block of blz_quantize_q8k_row in AVX2: the same max (the first element of largest |x|: the
 * largest |x| by vmaxps, whose NaN rule skips NaNs as the scalar `>` does, then its first lane by a
 * compare), the same fp32 product rounded half to even by vroundps, clamped to ±127, and the same integer
 * sums. x without NaNs gives the scalar loop's bytes (test_kquant's exactness test runs both builds); a NaN
 * element, which the scalar loop converts out of range, becomes −127 here. Returns 0, writing nothing, where
 * every |x| is 0 (or NaN). 1.3-1.9 → 0.34-0.39 ns an element on Zen 3 (NOTES §68). */
static int q8k_block_avx2(const float *restrict xb, int8_t *restrict qb, float *restrict d, int16_t *restrict bs,
                          int16_t *restrict xs) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 am = _mm256_setzero_ps();
    for (int j = 0; j < QK_K; j += 8) am = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb + j), absmask), am);
    const float amax = blz_hmax256(am);
    if (amax == 0.0f) return 0;
    const __m256 av = _mm256_set1_ps(amax);
    int first = 0;
    for (int j = 0; j < QK_K; j += 8) {
        const __m256 ax = _mm256_and_ps(_mm256_loadu_ps(xb + j), absmask);
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(ax, av, _CMP_EQ_OQ));
        if (hit) {
            first = j + __builtin_ctz((unsigned)hit);
            break;
        }
    }
    const float iscale = -127.0f / xb[first];
    const __m256 is = _mm256_set1_ps(iscale), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    __m256i s16[16]; /* per 16 elements: 8 int32 partial sums */
    for (int j = 0; j < QK_K; j += 32) {
        __m256i v[4];
        for (int i = 0; i < 4; ++i) {
            const __m256 r = _mm256_round_ps(_mm256_mul_ps(is, _mm256_loadu_ps(xb + j + 8 * i)),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            v[i] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
        }
        s16[j / 16] = _mm256_add_epi32(v[0], v[1]);
        s16[j / 16 + 1] = _mm256_add_epi32(v[2], v[3]);
        _mm256_storeu_si256((__m256i *)(qb + j), blz_bytes32(v[0], v[1], v[2], v[3])); /* exact: |v| ≤ 127 */
    }
    for (int g = 0; g < 2; ++g) { /* lane r of the reduction: the sum of block 8g + r's 16 quants */
        const __m256i sums = blz_hsum8x8_epi32(s16 + 8 * g);
        const __m128i s8 = _mm_packs_epi32(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
        _mm_storeu_si128((__m128i *)(bs + 8 * g), s8);
    }
    for (int j = 0; j < 8; ++j) xs[j] = (int16_t)(bs[2 * j] + bs[2 * j + 1]);
    *d = 1.0f / iscale;
    return 1;
}
#endif

/* Quantize one row x[K] to Q8_K (see the header comment): AVX2 builds a super-block at a time in vectors
 * (q8k_block_avx2, the same bytes), the scalar build as written, the first-occurrence rule for the signed max
 * kept in both. */
void blz_quantize_q8k_row(const float *restrict x, int64_t nb, int8_t *restrict q, float *restrict d,
                          int16_t *restrict bs, int16_t *restrict xs) {
    for (int64_t b = 0; b < nb; ++b) {
        const float *xb = x + b * QK_K;
        int8_t *qb = q + b * QK_K;
#ifdef BLZ_AVX2
        if (q8k_block_avx2(xb, qb, d + b, bs + 16 * b, xs + 8 * b)) continue; /* else all zero: below */
#endif
        float amax = 0.0f, mx = 0.0f;
        for (int j = 0; j < QK_K; ++j) {
            const float ax = fabsf(xb[j]);
            if (ax > amax) {
                amax = ax;
                mx = xb[j];
            }
        }
        if (amax == 0.0f) {
            memset(qb, 0, QK_K);
            memset(bs + 16 * b, 0, 16 * sizeof(int16_t));
            memset(xs + 8 * b, 0, 8 * sizeof(int16_t));
            d[b] = 0.0f;
            continue;
        }
        const float iscale = -127.0f / mx;
        for (int j = 0; j < QK_K; ++j) {
            const float v = nearbyintf(iscale * xb[j]); /* round half to even, as ggml's nearest_int */
            qb[j] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
        }
        for (int j = 0; j < 16; ++j) {
            int s = 0;
            for (int i = 0; i < 16; ++i) s += qb[16 * j + i];
            bs[16 * b + j] = (int16_t)s;
        }
        for (int j = 0; j < 8; ++j) xs[8 * b + j] = (int16_t)(bs[16 * b + 2 * j] + bs[16 * b + 2 * j + 1]);
        d[b] = 1.0f / iscale;
    }
}

/* The unsigned quants u[256] of one super-block, in element order (Q6_K: q + 32 stored as 0..63). */
static void unpack_scalar(int kind, const uint8_t *restrict blk, uint8_t u[QK_K]) {
    if (kind == BLZ_Q6_K) {
        for (int h = 0; h < 2; ++h) {
            const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
            uint8_t *o = u + 128 * h;
            for (int l = 0; l < 32; ++l) {
                o[l] = (uint8_t)((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4));
                o[l + 32] = (uint8_t)((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4));
                o[l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
                o[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
            }
        }
        return;
    }
    const uint8_t *qs = blk + (kind == BLZ_Q4_K ? 16 : 48), *qh = blk + 16;
    for (int c = 0; c < 4; ++c)
        for (int l = 0; l < 32; ++l) {
            u[64 * c + l] = qs[32 * c + l] & 15;
            u[64 * c + 32 + l] = qs[32 * c + l] >> 4;
        }
    if (kind == BLZ_Q5_K)
        for (int j = 0; j < 8; ++j)
            for (int l = 0; l < 32; ++l) u[32 * j + l] |= (uint8_t)(((qh[l] >> j) & 1) << 4);
}

/* Portable path: acc[m][r] = the dot products of weight rows rows[0..nr-1] with activation rows
 * m0 .. m0+mt-1, by the operations of the header comment. */
__attribute__((unused)) static void tile_scalar(int kind, const uint8_t *const rows[KR], int nr,
                                                const actk_t *restrict a, int64_t m0, int mt, float acc[KT][KR]) {
    const int64_t bb = kblock_bytes(kind), nb = a->nb;
    for (int m = 0; m < mt; ++m)
        for (int r = 0; r < KR; ++r) acc[m][r] = 0.0f;
    uint8_t u[QK_K];
    for (int64_t b = 0; b < nb; ++b)
        for (int r = 0; r < nr; ++r) {
            const uint8_t *blk = rows[r] + b * bb;
            unpack_scalar(kind, blk, u);
            uint8_t sc[8], mn[8];
            float dw, dmin = 0.0f;
            if (kind == BLZ_Q6_K) {
                dw = f16_at(blk + 208);
            } else {
                uint32_t s4[2], m4[2];
                k4_scales(blk + 4, s4, m4);
                memcpy(sc, s4, 8);
                memcpy(mn, m4, 8);
                dw = f16_at(blk);
                dmin = f16_at(blk + 2);
            }
            for (int m = 0; m < mt; ++m) {
                const int64_t row = (m0 + m) * nb + b;
                const int8_t *xq = a->q + (m0 + m) * a->K + b * QK_K;
                int32_t sumi = 0, summ = 0;
                if (kind == BLZ_Q6_K) {
                    const int8_t *s6 = (const int8_t *)(blk + 192);
                    for (int j = 0; j < 16; ++j) {
                        int32_t dot = 0;
                        for (int e = 0; e < 16; ++e) dot += (int32_t)u[16 * j + e] * xq[16 * j + e];
                        sumi += s6[j] * (dot - 32 * a->bs[16 * row + j]);
                    }
                } else {
                    for (int j = 0; j < 8; ++j) {
                        int32_t dot = 0;
                        for (int e = 0; e < 32; ++e) dot += (int32_t)u[32 * j + e] * xq[32 * j + e];
                        sumi += sc[j] * dot;
                        summ += mn[j] * a->xs[8 * row + j];
                    }
                }
                const float dx = a->d[row];
                acc[m][r] = fmaf((float)sumi, dw * dx, acc[m][r]);
                if (has_mins(kind)) acc[m][r] = fmaf(-(float)summ, dmin * dx, acc[m][r]);
            }
        }
}

#ifdef BLZ_AVX2
/* vpshufb masks for Q6_K's int16 scales: [scale 2j'] in the low 128 bits, [scale 2j'+1] in the high. */
#define S2(a) a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1, a, a + 1
static const uint8_t k6_shuffle[4][32] __attribute__((aligned(32))) = {
    {S2(0), S2(2)}, {S2(4), S2(6)}, {S2(8), S2(10)}, {S2(12), S2(14)},
#undef S2
};

/* k4_scales in SSE: the first 16 bytes of a Q4_K / Q5_K super-block (f16 d, f16 dmin, the 12-byte field) →
 * the 8 scales in bytes 0-7 and the 8 mins in bytes 8-15. */
BLZ_INLINE __m128i k4_scales_sse(const uint8_t *blk) {
    const __m128i v = _mm_loadu_si128((const __m128i *)blk);
    /* t1 = [sc 0-3 | low-nibble bytes | mn 0-3 | low-nibble bytes], t2 = the bytes whose top 2 bits extend
     * scales 4-7 (lanes 4-7) and mins 4-7 (lanes 12-15) */
    const __m128i t1 = _mm_shuffle_epi8(v, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
    const __m128i t2 = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
    const __m128i lo = _mm_and_si128(t1, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(t1, 4), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
    const __m128i top = _mm_and_si128(_mm_srli_epi16(t2, 2), _mm_set1_epi8(0x30));
    return _mm_or_si128(_mm_or_si128(lo, hi), top);
}

/* vpshufb masks: byte j of each 128-bit lane zero-extended to all 16 int16 lanes (scale j as int16). */
static const uint8_t k4_bshuffle[8][32] __attribute__((aligned(32))) = {
#define B2(a) a, 0x80, a, 0x80, a, 0x80, a, 0x80, a, 0x80, a, 0x80, a, 0x80, a, 0x80
    {B2(0), B2(0)}, {B2(1), B2(1)}, {B2(2), B2(2)}, {B2(3), B2(3)},
    {B2(4), B2(4)}, {B2(5), B2(5)}, {B2(6), B2(6)}, {B2(7), B2(7)},
#undef B2
};

/* The mins of 8 rows, mn[r] = 8 int16 (4 pairs p of 32 bits each) → mp[p] with lane r = row r's pair p, so
 * that Σ_p vpmaddwd(mp[p], the activation's pair p broadcast) leaves row r's Σ_j m[j]·xs[j] in lane r. */
BLZ_INLINE void transpose_mins(const __m128i mn[KR], __m256i mp[4]) {
    __m256i y[4];
    for (int i = 0; i < 4; ++i) y[i] = _mm256_set_m128i(mn[i + 4], mn[i]); /* rows i | i + 4 */
    const __m256i t0 = _mm256_unpacklo_epi32(y[0], y[1]), t1 = _mm256_unpacklo_epi32(y[2], y[3]);
    const __m256i t2 = _mm256_unpackhi_epi32(y[0], y[1]), t3 = _mm256_unpackhi_epi32(y[2], y[3]);
    mp[0] = _mm256_unpacklo_epi64(t0, t1);
    mp[1] = _mm256_unpackhi_epi64(t0, t1);
    mp[2] = _mm256_unpacklo_epi64(t2, t3);
    mp[3] = _mm256_unpackhi_epi64(t2, t3);
}

/* AVX2 path of tile_scalar. Per super-block and weight row: the 256 quants unpacked to 8 registers of 32
 * unsigned bytes (sub-block j = elements 32j..32j+31) and 8 int16 scale vectors; per activation row,
 * Σ_j vpmaddwd(vpmaddubsw(W_j, X_j), S_j) — every partial an exact int32 — left in v[m][r] for the
 * reduction; Q6_K's −32·Σ sc·bsums joins the same vector, the Q4_K / Q5_K mins a 4-lane one. */
BLZ_INLINE void tile_avx2(const int kind, const uint8_t *const rows[2 * KR], const int listed,
                          const actk_t *restrict a, const int64_t m0, const int mt, float acc_out[KT][KR]) {
    const int64_t bb = kblock_bytes(kind), nb = a->nb;
    __m256 acc[KT];
    for (int m = 0; m < mt; ++m) acc[m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        __m256i v[KT][KR];
        __m128i mn[KR];
        uint16_t dh[KR], mh[KR]; /* f16 d and dmin of the 8 rows, widened together (F16C: exact) */
#if BLZ_K_PF
        if (m0 == 0) blz_prefetch_next_tile(rows, KR, listed, bb, b);
#endif
        for (int r = 0; r < KR; ++r) {
            const uint8_t *blk = rows[r] + b * bb;
            __m256i W[8], S[8], sc16 = _mm256_setzero_si256();
            if (kind == BLZ_Q6_K) {
                memcpy(&dh[r], blk + 208, 2);
                for (int h = 0; h < 2; ++h) q6k_quants(blk, h, W + 4 * h);
                sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
                const __m256i lo = _mm256_permute2x128_si256(sc16, sc16, 0x00);
                const __m256i hi = _mm256_permute2x128_si256(sc16, sc16, 0x11);
                for (int j = 0; j < 4; ++j) {
                    const __m256i sh = _mm256_load_si256((const __m256i *)k6_shuffle[j]);
                    S[j] = _mm256_shuffle_epi8(lo, sh);
                    S[j + 4] = _mm256_shuffle_epi8(hi, sh);
                }
            } else {
                memcpy(&dh[r], blk, 2);
                memcpy(&mh[r], blk + 2, 2);
                const __m128i sm = k4_scales_sse(blk);
                mn[r] = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
                const __m256i s2 = _mm256_set_m128i(sm, sm);
                for (int j = 0; j < 8; ++j) S[j] = _mm256_shuffle_epi8(s2, _mm256_load_si256((const __m256i *)k4_bshuffle[j]));
                const uint8_t *qs = blk + (kind == BLZ_Q4_K ? 16 : 48);
                const __m256i qh = kind == BLZ_Q5_K ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
                for (int c = 0; c < 4; ++c) k45_quants(kind, qs, qh, c, W + 2 * c);
            }
#ifdef BLZ_AVX512
            __m512i W2[4], S2[4]; /* sub-blocks 2i and 2i+1 side by side: half the steps per activation row */
            for (int i = 0; i < 4; ++i) {
                W2[i] = _mm512_inserti64x4(_mm512_castsi256_si512(W[2 * i]), W[2 * i + 1], 1);
                S2[i] = _mm512_inserti64x4(_mm512_castsi256_si512(S[2 * i]), S[2 * i + 1], 1);
            }
#endif
            for (int m = 0; m < mt; ++m) {
                const int64_t row = (m0 + m) * nb + b;
                const int8_t *xq = a->q + (m0 + m) * a->K + b * QK_K;
#ifdef BLZ_AVX512
                __m512i s2 = _mm512_setzero_si512();
                for (int i = 0; i < 4; ++i) {
                    const __m512i p = _mm512_maddubs_epi16(W2[i], _mm512_loadu_si512(xq + 64 * i));
                    s2 = MADD_ACC512(s2, p, S2[i]);
                }
                __m256i s = _mm256_add_epi32(_mm512_castsi512_si256(s2), _mm512_extracti64x4_epi64(s2, 1));
#else
                __m256i s = _mm256_setzero_si256();
                for (int j = 0; j < 8; ++j) {
                    const __m256i p = _mm256_maddubs_epi16(W[j], _mm256_loadu_si256((const __m256i *)(xq + 32 * j)));
                    s = MADD_ACC256(s, p, S[j]);
                }
#endif
                if (kind == BLZ_Q6_K) {
                    const __m256i bsv = _mm256_loadu_si256((const __m256i *)(a->bs + 16 * row));
                    s = _mm256_sub_epi32(s, _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsv), 5));
                }
                v[m][r] = s;
            }
        }
        const __m256 dwv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh));
        __m256 dmv = dwv;
        __m256i mp[4];
        if (has_mins(kind)) {
            dmv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)mh));
            transpose_mins(mn, mp);
        }
        for (int m = 0; m < mt; ++m) {
            const int64_t row = (m0 + m) * nb + b;
            const __m256 dx = _mm256_set1_ps(a->d[row]);
            acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(blz_hsum8x8_epi32(v[m])), _mm256_mul_ps(dwv, dx), acc[m]);
            if (has_mins(kind)) {
                const int16_t *xs = a->xs + 8 * row;
                __m256i summ = _mm256_madd_epi16(mp[0], blz_bcast4_256(xs));
                for (int p = 1; p < 4; ++p) summ = MADD_ACC256(summ, mp[p], blz_bcast4_256(xs + 2 * p));
                acc[m] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(summ), _mm256_mul_ps(dmv, dx), acc[m]);
            }
        }
    }
    for (int m = 0; m < mt; ++m) _mm256_storeu_ps(acc_out[m], acc[m]);
}
#endif

#ifdef BLZ_AVX2
/* The int32 partial sums of one weight row's super-block `blk` with one activation row's quants xq (lanes
 * summing to sumi; Q6_K's −32·Σ sc·bsums included) for tile1_avx2: tile_avx2's operations, each sub-block's
 * quants and scale vector made next to their use. Sets the row's f16 d (and dmin, mins for Q4_K / Q5_K). */
BLZ_INLINE __m256i row1_sums(const int kind, const uint8_t *restrict blk, const int8_t *restrict xq,
                             const int16_t *restrict bs, uint16_t *dh, uint16_t *mh, __m128i *mn) {
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
#define XQ(j) _mm256_loadu_si256((const __m256i *)(xq + 32 * (j)))
#define SHUF(v, t, j) _mm256_shuffle_epi8(v, _mm256_load_si256((const __m256i *)t[j]))
    if (kind == BLZ_Q6_K) {
        memcpy(dh, blk + 208, 2);
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
        for (int h = 0; h < 2; ++h) {
            const __m256i sh = _mm256_permute2x128_si256(sc16, sc16, h ? 0x11 : 0x00);
            __m256i w[4];
            q6k_quants(blk, h, w);
            for (int i = 0; i < 4; i += 2) {
                s0 = MADD_ACC256(s0, _mm256_maddubs_epi16(w[i], XQ(4 * h + i)), SHUF(sh, k6_shuffle, i));
                s1 = MADD_ACC256(s1, _mm256_maddubs_epi16(w[i + 1], XQ(4 * h + i + 1)), SHUF(sh, k6_shuffle, i + 1));
            }
        }
        const __m256i bsv = _mm256_loadu_si256((const __m256i *)bs);
        return _mm256_sub_epi32(_mm256_add_epi32(s0, s1), _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsv), 5));
    }
    memcpy(dh, blk, 2);
    memcpy(mh, blk + 2, 2);
    const __m128i sm = k4_scales_sse(blk);
    *mn = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
    const __m256i s2 = _mm256_set_m128i(sm, sm);
    const uint8_t *qs = blk + (kind == BLZ_Q4_K ? 16 : 48);
    const __m256i qh = kind == BLZ_Q5_K ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
        __m256i w[2];
        k45_quants(kind, qs, qh, c, w);
        s0 = MADD_ACC256(s0, _mm256_maddubs_epi16(w[0], XQ(2 * c)), SHUF(s2, k4_bshuffle, 2 * c));
        s1 = MADD_ACC256(s1, _mm256_maddubs_epi16(w[1], XQ(2 * c + 1)), SHUF(s2, k4_bshuffle, 2 * c + 1));
    }
#undef XQ
#undef SHUF
    return _mm256_add_epi32(s0, s1);
}

#ifdef BLZ_AVX512
/* vpshufb masks per 128-bit lane for k4 scales in 512 bits: lanes 0-1 (the first 256 bits, one sub-block)
 * take scale byte a zero-extended to every int16, lanes 2-3 scale byte b. */
#define B4(a, b) B2(a), B2(a), B2(b), B2(b)
#define B2(a) a, 0x80, a, 0x80, a, 0x80, a, 0x80, a, 0x80, a, 0x80, a, 0x80, a, 0x80
static const uint8_t k4_zshuffle[4][64] __attribute__((aligned(64))) = {
    {B4(0, 2)}, {B4(1, 3)}, {B4(4, 6)}, {B4(5, 7)},
};
#undef B2
#undef B4
/* vpermw indices of Q6_K's 16 int16 scales for 512 bits of pair sums: 128-bit lane k of quarter q (elements
 * 64q .. 64q+63, 16 per lane) takes scale 4q + k. */
#define W8(a) a, a, a, a, a, a, a, a
static const uint16_t k6_zperm[4][32] __attribute__((aligned(64))) = {
    {W8(0), W8(1), W8(2), W8(3)}, {W8(4), W8(5), W8(6), W8(7)},
    {W8(8), W8(9), W8(10), W8(11)}, {W8(12), W8(13), W8(14), W8(15)},
};
#undef W8

/* The Q4_K / Q5_K activations of one super-block in the order the 512-bit nibble split leaves the quants:
 * per 128 elements [0-31, 64-95, 32-63, 96-127] (low nibbles of 64 quant bytes are sub-blocks 4i and 4i+2,
 * high nibbles 4i+1 and 4i+3). */
BLZ_INLINE void k4_permute_x(const int8_t *restrict xq, int8_t *restrict xz) {
    for (int i = 0; i < 2; ++i)
        for (int part = 0; part < 4; ++part) {
            static const int from[4] = {0, 64, 32, 96};
            memcpy(xz + 128 * i + 32 * part, xq + 128 * i + from[part], 32);
        }
}

/* row1_sums in 512-bit registers: the same exact int32 sumi (lanes of the returned vector summing to it),
 * half the multiply steps. xq: the super-block's activations, xz: the same in k4_permute_x's order (Q4_K /
 * Q5_K; unused for Q6_K, whose quants come out in element order). */
BLZ_INLINE __m256i row1_sums512(const int kind, const uint8_t *restrict blk, const int8_t *restrict xq,
                                const int8_t *restrict xz, const int16_t *restrict bs, uint16_t *dh, uint16_t *mh,
                                __m128i *mn) {
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    __m512i s = _mm512_setzero_si512();
    if (kind == BLZ_Q6_K) {
        memcpy(dh, blk + 208, 2);
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
        const __m512i scz = _mm512_castsi256_si512(sc16);
        const __m512i b30 = _mm512_set1_epi8(0x30);
        /* qh bytes 32h .. 32h+31 in both halves; bits 2t, 2t+1 of byte l are the top of element 128h + 32t + l */
        const __m512i lsh = _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4), rsh = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0);
        for (int h = 0; h < 2; ++h) {
            const __m512i l = _mm512_loadu_si512(blk + 64 * h);
            const __m512i hh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h)));
            /* elements 128h + 0..63 (t = 0, 1) and 128h + 64..127 (t = 2, 3) */
            const __m512i w01 = _mm512_or_si512(_mm512_and_si512(l, lo4), _mm512_and_si512(_mm512_sllv_epi64(hh, lsh), b30));
            const __m512i w23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), lo4),
                                                _mm512_and_si512(_mm512_srlv_epi64(hh, rsh), b30));
            const __m512i p01 = _mm512_maddubs_epi16(w01, _mm512_loadu_si512(xq + 128 * h));
            const __m512i p23 = _mm512_maddubs_epi16(w23, _mm512_loadu_si512(xq + 128 * h + 64));
            s = MADD_ACC512(s, p01, _mm512_permutexvar_epi16(_mm512_load_si512(k6_zperm[2 * h]), scz));
            s = MADD_ACC512(s, p23, _mm512_permutexvar_epi16(_mm512_load_si512(k6_zperm[2 * h + 1]), scz));
        }
        const __m256i t = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
        const __m256i bsv = _mm256_loadu_si256((const __m256i *)bs);
        return _mm256_sub_epi32(t, _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsv), 5));
    }
    memcpy(dh, blk, 2);
    memcpy(mh, blk + 2, 2);
    const __m128i sm = k4_scales_sse(blk);
    *mn = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
    const __m512i s4 = _mm512_broadcast_i32x4(sm);
    const uint8_t *qs = blk + (kind == BLZ_Q4_K ? 16 : 48);
    const __m512i qh = kind == BLZ_Q5_K ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)))
                                        : _mm512_setzero_si512();
    for (int i = 0; i < 2; ++i) {
        const __m512i q = _mm512_loadu_si512(qs + 64 * i);
        __m512i w[2] = {_mm512_and_si512(q, lo4), _mm512_and_si512(_mm512_srli_epi16(q, 4), lo4)};
        if (kind == BLZ_Q5_K) /* bit j of qh: the 5th bit of sub-block j; w[e] holds sub-blocks 4i + e, 4i + 2 + e */
            for (int e = 0; e < 2; ++e) {
                const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (4 * i + e))),
                                                       _mm256_set1_epi8((char)(1 << (4 * i + 2 + e))), 1);
                w[e] = _mm512_or_si512(w[e], _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(qh, bit), _mm512_set1_epi8(0x10)));
            }
        for (int e = 0; e < 2; ++e) {
            const __m512i p = _mm512_maddubs_epi16(w[e], _mm512_loadu_si512(xz + 128 * i + 64 * e));
            s = MADD_ACC512(s, p, _mm512_shuffle_epi8(s4, _mm512_load_si512(k4_zshuffle[2 * i + e])));
        }
    }
    return _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
}
#endif

/* Super-block b of one activation row (m0) against a tile's 8 rows: acc + their dots' step, tile_avx2's
 * operations (the 8 rows' sums made one row at a time from registers: the general tile keeps every row's
 * unpacked quants and scales live, which at one activation row costs spills instead of saving work). */
BLZ_INLINE __m256 block1_avx2(const int kind, const int zmm, const uint8_t *const *rows, const actk_t *restrict a,
                              const int64_t m0, const int64_t b, __m256 acc) {
    const int64_t bb = kblock_bytes(kind), row = m0 * a->nb + b;
    const int8_t *xq = a->q + m0 * a->K + b * QK_K;
    __m256i v[KR];
    __m128i mn[KR];
    uint16_t dh[KR], mh[KR];
#ifdef BLZ_AVX512
    if (zmm) {
        const int8_t *xz = a->qz + b * QK_K;
        for (int r = 0; r < KR; ++r)
            v[r] = row1_sums512(kind, rows[r] + b * bb, xq, xz, a->bs + 16 * row, &dh[r], &mh[r], &mn[r]);
    } else
#endif
    for (int r = 0; r < KR; ++r) v[r] = row1_sums(kind, rows[r] + b * bb, xq, a->bs + 16 * row, &dh[r], &mh[r], &mn[r]);
    (void)zmm;
    const __m256 dx = _mm256_set1_ps(a->d[row]);
    const __m256 dwv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(blz_hsum8x8_epi32(v)), _mm256_mul_ps(dwv, dx), acc);
    if (has_mins(kind)) {
        const __m256 dmv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)mh));
        __m256i mp[4];
        transpose_mins(mn, mp);
        const int16_t *xs = a->xs + 8 * row;
        __m256i summ = _mm256_madd_epi16(mp[0], blz_bcast4_256(xs));
        for (int p = 1; p < 4; ++p) summ = MADD_ACC256(summ, mp[p], blz_bcast4_256(xs + 2 * p));
        acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(summ), _mm256_mul_ps(dmv, dx), acc);
    }
    return acc;
}

/* One activation row (decode: mt = 1): tile_avx2's result by the same operations, block1_avx2 per
 * super-block. */
BLZ_INLINE void tile1_avx2(const int kind, const uint8_t *const rows[2 * KR], const int listed,
                           const actk_t *restrict a, const int64_t m0, float acc_out[KT][KR]) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < a->nb; ++b) {
#if BLZ_K_PF
        if (m0 == 0) blz_prefetch_next_tile(rows, KR, listed, kblock_bytes(kind), b);
#endif
        acc = block1_avx2(kind, 0, rows, a, m0, b, acc);
    }
    _mm256_storeu_ps(acc_out[0], acc);
}

#if BLZ_STREAMS > 1
/* One activation row (M = 1) against ns ≤ BLZ_STREAMS tiles far apart (one per stream, blazr_kernels.h) of
 * kinds kinds[s], their super-blocks walked together: acc_out[s] = tile s's dots by tile1_avx2's operations
 * (zmm: the integer sums in 512-bit registers, BLZ_TUNE_K1_ZMM — the same bits), each tile prefetching its
 * successor as it goes. */
BLZ_INLINE void tiles1_any(const int zmm, const int ns, const int *kinds, const uint8_t *const *rows,
                           const int *apart, const actk_t *restrict a, float acc_out[][KR]) {
    __m256 acc[BLZ_STREAMS];
    for (int s = 0; s < ns; ++s) acc[s] = _mm256_setzero_ps();
    for (int64_t b = 0; b < a->nb; ++b)
        for (int s = 0; s < ns; ++s) {
            const uint8_t *const *tr = rows + 2 * KR * s;
#if BLZ_K_PF
            blz_prefetch_next_tile(tr, KR, apart[s], kblock_bytes(kinds[s]), b);
#endif
            switch (kinds[s]) {
                case BLZ_Q4_K: acc[s] = block1_avx2(BLZ_Q4_K, zmm, tr, a, 0, b, acc[s]); break;
                case BLZ_Q5_K: acc[s] = block1_avx2(BLZ_Q5_K, zmm, tr, a, 0, b, acc[s]); break;
                default: acc[s] = block1_avx2(BLZ_Q6_K, zmm, tr, a, 0, b, acc[s]);
            }
        }
    for (int s = 0; s < ns; ++s) _mm256_storeu_ps(acc_out[s], acc[s]);
}

static void tiles1_avx2(const int ns, const int *kinds, const uint8_t *const *rows, const int *apart,
                        const actk_t *restrict a, float acc_out[][KR]) {
    tiles1_any(0, ns, kinds, rows, apart, a, acc_out);
}

#ifdef BLZ_AVX512
static void tiles1_avx512(const int ns, const int *kinds, const uint8_t *const *rows, const int *apart,
                          const actk_t *restrict a, float acc_out[][KR]) {
    tiles1_any(1, ns, kinds, rows, apart, a, acc_out);
}
#endif

#ifndef K6_PF_ROWS
#define K6_PF_ROWS 2 /* the row walk's prefetch distance in weight rows (Zen 3, 1B shapes: 2 and 4 level) */
#endif

/* tiles1_avx2 for ns Q6_K tiles walked a weight row at a time (BLZ_TUNE_K6_ROWS): row r of every tile across
 * all its super-blocks, then row r + 1 — each stream one linear read where the tile walk reads its 8 rows
 * side by side. Row r's output is lane r of tile1_avx2's: the same integer sums (row1_sums), and its fp32
 * steps, the super-blocks in order, one scalar fma each — so the same bits. Each step prefetches the
 * super-block K6_PF_ROWS rows on (past the tile's last row, the next tile's first). Zen 3, cold 1B shapes, 2
 * threads: 1.24-1.47x the tile walk's GB/s, both in one stream; in 2 streams 1.41-1.78x the tiles in their
 * best, one. From L3 (a weight read again at once) it computes 0.8-0.9x the tiles' rate: host tuning measures
 * cold weights, as a decode step reads them (NOTES §74). */
static void rows1_q6k(const int ns, const uint8_t *const *rows, const actk_t *restrict a, float acc_out[][KR]) {
    const int64_t bb = kblock_bytes(BLZ_Q6_K);
    for (int r = 0; r < KR; ++r) {
        float acc[BLZ_STREAMS] = {0};
        for (int64_t b = 0; b < a->nb; ++b) {
            const float dx = a->d[b];
            for (int s = 0; s < ns; ++s) {
                const uint8_t *const *tr = rows + 2 * KR * s;
                for (int64_t o = 0; o < bb; o += 64)
                    _mm_prefetch((const char *)(tr[r + K6_PF_ROWS] + b * bb + o), _MM_HINT_T0);
                uint16_t dh, mh;
                __m128i mn;
                const __m256i v = row1_sums(BLZ_Q6_K, tr[r] + b * bb, a->q + b * QK_K, a->bs + 16 * b, &dh, &mh, &mn);
                acc[s] = fmaf((float)blz_hsum256_epi32(v), _cvtsh_ss(dh) * dx, acc[s]);
            }
        }
        for (int s = 0; s < ns; ++s) acc_out[s][r] = acc[s];
    }
}
#endif
#endif

/* acc[m][r] = dot products of weight rows rows[0..KR-1] (the first nr real, the rest repeats) with
 * activation rows m0 .. m0+mt-1. */
static void tile_dots(int kind, const uint8_t *const rows[2 * KR], int listed, int nr, const actk_t *a,
                      int64_t m0, int mt, float acc[KT][KR]) {
#ifdef BLZ_AVX2
    (void)nr;
    switch (kind * 2 + (mt == 1)) { /* one activation row (decode) compiled on its own */
        case BLZ_Q4_K * 2 + 1:
            tile1_avx2(BLZ_Q4_K, rows, listed, a, m0, acc);
            return;
        case BLZ_Q4_K * 2:
            tile_avx2(BLZ_Q4_K, rows, listed, a, m0, mt, acc);
            return;
        case BLZ_Q5_K * 2 + 1:
            tile1_avx2(BLZ_Q5_K, rows, listed, a, m0, acc);
            return;
        case BLZ_Q5_K * 2:
            tile_avx2(BLZ_Q5_K, rows, listed, a, m0, mt, acc);
            return;
        case BLZ_Q6_K * 2 + 1:
            tile1_avx2(BLZ_Q6_K, rows, listed, a, m0, acc);
            return;
        default:
            tile_avx2(BLZ_Q6_K, rows, listed, a, m0, mt, acc);
            return;
    }
#else
    (void)listed;
    tile_scalar(kind, rows, nr, a, m0, mt, acc);
#endif
}

static int ksegs_parse(int kind, const uint8_t *w, int64_t N, int64_t nb, ksegs_t *sg) {
    if (kind != BLZ_KMIX) {
        *sg = (ksegs_t){.n = 1, .kind = {kind}, .row0 = {0, N}, .base = {w}, .row_bytes = {nb * kblock_bytes(kind)}};
        return BLZ_OK;
    }
    int32_t hdr[1 + 2 * KSEG_MAX];
    memcpy(hdr, w, sizeof(hdr));
    sg->n = hdr[0];
    if (sg->n < 1 || sg->n > KSEG_MAX) return BLZ_EINVAL;
    const uint8_t *p = w + 64;
    sg->row0[0] = 0;
    for (int i = 0; i < sg->n; ++i) {
        const int k = hdr[1 + i];
        const int64_t rows = hdr[1 + KSEG_MAX + i];
        if (k < BLZ_Q4_K || k > BLZ_Q6_K || rows < 0) return BLZ_EINVAL;
        sg->kind[i] = k;
        sg->base[i] = p;
        sg->row_bytes[i] = nb * kblock_bytes(k);
        sg->row0[i + 1] = sg->row0[i] + rows;
        p += rows * sg->row_bytes[i];
    }
    return sg->row0[sg->n] == N ? BLZ_OK : BLZ_EINVAL;
}

/* Tiles of output rows [start, start + len), len ≤ size, none crossing a segment boundary — of the gate rows
 * or, in SwiGLU mode, of the up rows (boundaries shifted by nout). Returns the count, tiles in `t` (2 each). */
static int64_t ktiles(const ksegs_t *sg, int64_t nout, int swiglu, int64_t size, int64_t *t) {
    int64_t count = 0, n = 0;
    while (n < nout) {
        int64_t end = blz_min(n + size, nout);
        for (int i = 1; i < sg->n; ++i) {
            const int64_t b = sg->row0[i], bu = b - nout; /* a gate-row and an up-row boundary */
            if (b > n && b < end) end = b;
            if (swiglu && bu > n && bu < end) end = bu;
        }
        t[2 * count] = n;
        t[2 * count + 1] = end - n;
        ++count;
        n = end;
    }
    return count;
}

/* The activation buffers of an M×K call and room for `ntiles` tiles, in the calling thread's scratch. */
static int actk_alloc(actk_t *a, int64_t M, int64_t K, int64_t ntiles, int64_t **tiles) {
    a->K = K;
    a->nb = K / QK_K;
    a->qz = NULL;
    const size_t qb = (size_t)blz_round_up(M * K, 64) * (M == 1 ? 2 : 1), /* M = 1: room for qz */ db = (size_t)blz_round_up(M * a->nb * 4, 64);
    const size_t sb = (size_t)blz_round_up(M * a->nb * 32, 64), xb = (size_t)blz_round_up(M * a->nb * 16, 64);
    const size_t tb = (size_t)blz_round_up(ntiles * 16, 64);
    uint8_t *buf = blz_scratch(qb + db + sb + xb + tb);
    if (!buf) return BLZ_ENOMEM;
    a->q = (int8_t *)buf;
    a->d = (float *)(buf + qb);
    a->bs = (int16_t *)(buf + qb + db);
    a->xs = (int16_t *)(buf + qb + db + sb);
    *tiles = (int64_t *)(buf + qb + db + sb + xb);
    return BLZ_OK;
}

/* Tile (n0, nn)'s gate rows (and SwiGLU up rows): its nn ≤ KR rows padded with the last, then the next
 * tile's rows (prefetched only: for a plain weight the bytes after the tile, past the end too); kinds[2]:
 * the gate and up rows' kinds, apart[2]: whether their next rows lie apart (a row table's). */
static void ktile_rows(const ksegs_t *sg, const int64_t *tab, int64_t nout, int swiglu, int64_t n0, int nn,
                       const uint8_t *gate[2 * KR], const uint8_t *up[2 * KR], int kinds[2], int apart[2]) {
    const int gs = kseg_of(sg, n0), us = swiglu ? kseg_of(sg, nout + n0) : 0;
    const int64_t rbg = sg->row_bytes[gs], rbu = sg->row_bytes[us];
    for (int i = 0; i < 2 * KR; ++i) {
        const int64_t n = i < KR ? n0 + blz_min(i, nn - 1) : blz_min(n0 + i, nout - 1); /* pad: last row */
        if (tab) {
            gate[i] = (const uint8_t *)(intptr_t)tab[n];
            up[i] = swiglu ? (const uint8_t *)(intptr_t)tab[nout + n] : gate[i];
        } else if (i < KR) {
            gate[i] = sg->base[gs] + (n - sg->row0[gs]) * rbg;
            up[i] = sg->base[us] + (nout + n - sg->row0[us]) * rbu;
        } else { /* the bytes after the tile (prefetched only; past the end of the last tile too) */
            gate[i] = gate[0] + i * rbg;
            up[i] = up[0] + i * rbu;
        }
    }
    kinds[0] = sg->kind[gs];
    kinds[1] = sg->kind[us];
    apart[0] = !blz_rows_follow(gate + KR, KR, rbg);
    apart[1] = !blz_rows_follow(up + KR, KR, rbu);
}

#if defined(BLZ_AVX2) && BLZ_STREAMS > 1
/* blz_linear_k at M = 1 (activations quantized in a): this thread's block of tiles cut into team->S parts
 * (SwiGLU: half as many, each read with its up rows), tile i of every part run together — a super-block of
 * the 8 rows at a time, or (q6_rows) a row at a time (rows1_q6k); the steps walked balanced between the
 * threads (blz_walk_t). */
static void k_streams(const ksegs_t *sg, const int64_t *tab, const int64_t *tiles, int64_t N,
                      int64_t nout, const actk_t *a, const float *bias, const float *residual, float *out,
                      int swiglu, int q6_rows, blz_team_t *team) {
    const int S = team->S;
    blz_walk_t wk;
    blz_walk_begin(&wk, team);
    for (int64_t i; blz_walk_step(&wk, &i);) {
        const uint8_t *rows[BLZ_STREAMS][2 * KR], *up[BLZ_STREAMS][2 * KR];
        int kinds[BLZ_STREAMS], apart[BLZ_STREAMS], up_kind[BLZ_STREAMS], up_apart[BLZ_STREAMS], nn[BLZ_STREAMS];
        int64_t t[BLZ_STREAMS], n0[BLZ_STREAMS];
        const int ns = blz_stream_step(wk.lo, wk.hi, wk.q, S, i, t);
        for (int s = 0; s < ns; ++s) {
            int k2[2], ap[2];
            n0[s] = tiles[2 * t[s]];
            nn[s] = (int)tiles[2 * t[s] + 1];
            ktile_rows(sg, tab, nout, swiglu, n0[s], nn[s], rows[s], up[s], k2, ap);
            kinds[s] = k2[0];
            apart[s] = ap[0];
            up_kind[s] = k2[1];
            up_apart[s] = ap[1];
        }
        for (int s = 0; swiglu && s < ns; ++s) { /* the up tiles: streams ns .. 2·ns − 1 */
            memcpy(rows[ns + s], up[s], sizeof(up[s]));
            kinds[ns + s] = up_kind[s];
            apart[ns + s] = up_apart[s];
        }
        float r[BLZ_STREAMS][KR];
        if (q6_rows)
            rows1_q6k(swiglu ? 2 * ns : ns, &rows[0][0], a, r);
        else
#ifdef BLZ_AVX512
        if (a->qz)
            tiles1_avx512(swiglu ? 2 * ns : ns, kinds, &rows[0][0], apart, a, r);
        else
#endif
            tiles1_avx2(swiglu ? 2 * ns : ns, kinds, &rows[0][0], apart, a, r);
        for (int s = 0; s < ns; ++s)
            for (int j = 0; j < nn[s]; ++j)
                blz_epilogue(&r[s][j], swiglu ? &r[ns + s][j] : NULL, 1, 0, n0[s] + j, N, nout, bias, residual, out,
                             swiglu);
    }
}
#endif

/* out = x·Wᵀ (+bias) (+residual) or the SwiGLU form; see the file header. x [M, K], w [N][row_bytes] in
 * ggml's layout (BLZ_KMIX: the segment table, then the segments; with a row table `tab`, int64 [N] from
 * BLZ_ROWS, row n at tab[n] and w unused), bias [N] or NULL, residual [M, N] or NULL
 * (may equal out), out [M, N] (SwiGLU: [M, N/2]). */
int blz_linear_k(int kind, const float *x, int64_t M, int64_t K, const uint8_t *w, const int64_t *tab, int64_t N,
                 const float *bias, const float *residual, float *out, int swiglu, int nthreads) {
    if (kind < BLZ_Q4_K || kind > BLZ_KMIX || M < 0 || N < 0 || K <= 0 || K % QK_K) return BLZ_EINVAL;
    if (tab && kind == BLZ_KMIX) return BLZ_EINVAL; /* a row table lists rows of one kind */
    if (swiglu && (N % 2 || residual)) return BLZ_EINVAL;
    if (M == 0 || N == 0) return BLZ_OK;
    ksegs_t sg;
    if (ksegs_parse(kind, w, N, K / QK_K, &sg)) return BLZ_EINVAL;
    const int64_t nout = swiglu ? N / 2 : N;
    actk_t a;
    int64_t *tiles;
    if (actk_alloc(&a, M, K, nout / KR + 2 * KSEG_MAX + 1, &tiles)) return BLZ_ENOMEM;
    const int nt = blz_threads(nthreads, M * N * K, BLZ_LINEAR_PARALLEL_MIN);
#ifdef BLZ_VNNI
    if (M >= KG_MIN) {
        const int64_t ngroups = ktiles(&sg, nout, swiglu, KG, tiles);
        int rc = BLZ_OK;
#pragma omp parallel num_threads(nt)
        {
#pragma omp for schedule(static)
            for (int64_t m = 0; m < M; ++m)
                blz_quantize_q8k_row(x + m * K, a.nb, a.q + m * K, a.d + m * a.nb, a.bs + m * a.nb * 16, a.xs + m * a.nb * 8);
#pragma omp for schedule(static)
            for (int64_t g = 0; g < ngroups; ++g)
                if (blz_kgroup_run(&sg, tab, &a, M, tiles[2 * g], (int)tiles[2 * g + 1], N, nout, bias, residual, out,
                                   swiglu)) {
#pragma omp atomic write
                    rc = BLZ_ENOMEM;
                }
        }
        return rc;
    }
#endif
    const int64_t ntiles = ktiles(&sg, nout, swiglu, KR, tiles);
#if defined(BLZ_AVX2) && BLZ_STREAMS > 1
    if (M == 1) {
        blz_quantize_q8k_row(x, a.nb, a.q, a.d, a.bs, a.xs);
        int q6_rows = blz_tune[BLZ_TUNE_K6_ROWS] > 0; /* Q6_K rows alone: walked a row at a time */
        for (int i = 0; i < sg.n; ++i) q6_rows &= sg.kind[i] == BLZ_Q6_K;
#ifdef BLZ_AVX512
        if (!q6_rows && blz_tune[BLZ_TUNE_K1_ZMM]) { /* the 512-bit sums' activation order (Q6_K reads a.q) */
            a.qz = a.q + blz_round_up(K, 64);
            for (int64_t b = 0; b < a.nb; ++b) k4_permute_x(a.q + b * QK_K, a.qz + b * QK_K);
        }
#endif
        blz_team_t team;
        blz_team_init(&team, nt, ntiles, blz_gemv_parts(q6_rows ? BLZ_TUNE_K6_ROWS : BLZ_TUNE_STREAMS_K, 1, swiglu));
#pragma omp parallel num_threads(nt)
        k_streams(&sg, tab, tiles, N, nout, &a, bias, residual, out, swiglu, q6_rows, &team);
        return BLZ_OK;
    }
#endif
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; ++m)
            blz_quantize_q8k_row(x + m * K, a.nb, a.q + m * K, a.d + m * a.nb, a.bs + m * a.nb * 16, a.xs + m * a.nb * 8);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < ntiles; ++t) {
            float r[KT][KR] __attribute__((aligned(32))), u[KT][KR] __attribute__((aligned(32)));
            const int64_t n0 = tiles[2 * t];
            const int nn = (int)tiles[2 * t + 1];
            const uint8_t *gate[2 * KR], *up[2 * KR]; /* this tile's rows, then the next tile's (prefetch) */
            int kinds[2], apart[2];
            ktile_rows(&sg, tab, nout, swiglu, n0, nn, gate, up, kinds, apart);
            for (int64_t m0 = 0; m0 < M; m0 += KT) {
                const int mt = (int)blz_min(KT, M - m0);
                tile_dots(kinds[0], gate, apart[0], nn, &a, m0, mt, r);
                if (swiglu) tile_dots(kinds[1], up, apart[1], nn, &a, m0, mt, u);
                for (int m = 0; m < mt; ++m)
                    blz_epilogue_row(r[m], u[m], m0 + m, n0, nn, N, nout, bias, residual, out, swiglu);
            }
        }
    }
    return BLZ_OK;
}

/* The Q8_K activation quantization of blz_linear_k on its own (for tests): q [M, K] int8, d [M, K/256],
 * bsums [M, K/16] int16. */
BLZ_EXPORT int blz_quantize_q8k(const float *x, int64_t M, int64_t K, int8_t *q, float *d, int16_t *bsums) {
    if (M < 0 || K <= 0 || K % QK_K) return BLZ_EINVAL;
    const int64_t nb = K / QK_K;
    int16_t *xs = blz_scratch((size_t)nb * 8 * sizeof(int16_t));
    if (!xs) return BLZ_ENOMEM;
    for (int64_t m = 0; m < M; ++m) blz_quantize_q8k_row(x + m * K, nb, q + m * K, d + m * nb, bsums + m * nb * 16, xs);
    return BLZ_OK;
}
