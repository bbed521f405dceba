/* blazr kernels — K-quant linears over many activation rows (prefill) on AVX-512 VNNI: 16 weight rows
 * re-laid once per call so that vpdpbusd computes their integer dots side by side.
 *
 * linear_k.c runs the K-quants as stored: one weight row's 256 quants a super-block in the lanes of a
 * register, each sub-block's scale applied by a vpmaddubsw / vpmaddwd pair (3 instructions per 64 products)
 * and the rows' partial sums reduced across lanes. Here a group of 16 rows of one kind is first re-laid into
 * the calling thread's scratch, per super-block (KG_BYTES):
 *   float d[16], float dmin[16]                 the rows' f16 d and dmin, widened (exact)
 *   int32 sc[S][16]                             sub-block j's scale of row r at [j][r] (S = 8, Q6_K 16;
 *                                               Q6_K's int8 scales sign-extended)
 *   int16 mn[4][16][2]                          Q4_K / Q5_K: row r's mins 2p and 2p + 1 in pair p
 *   uint8 q[64][16][4]                          chunk c, lane r = row r's unsigned quants 4c .. 4c+3
 *                                               (Q4_K 0..15, Q5_K 0..31, Q6_K q + 32, 0..63)
 * so one 64-byte chunk holds 4 elements of all 16 rows: vpdpbusd against the activation's 4 matching bytes
 * broadcast leaves row r's partial dot in int32 lane r (64 products an instruction), a sub-block's dot is a
 * chain of E/4 of them (E = 32, Q6_K 16; Q6_K's chain starts at −32·bsums[j]), and one vpmulld by sc[j]
 * scales 16 rows' sub-block at once. The integer sums are exact, so sumi and summ are linear_k.c's values
 * whatever the order, and the fp32 steps per super-block are linear_k.c's, in its order:
 *   acc = fma((float)sumi, d·dx, acc);   Q4_K / Q5_K: acc = fma(−(float)summ, dmin·dx, acc)
 * — every output has the same bits as on the row path (decode), so a row's result does not depend on the
 * path its batch took. The re-laying costs about one pass over the group's weights per call, paid back by
 * every tile of KG_MT activation rows that reuses it; linear_k.c takes this path from KG_MIN rows.
 */
#include "kquant.h"

#ifdef BLZ_VNNI
#define KG_D 0         /* float d[16] */
#define KG_DMIN 64     /* float dmin[16] */
#define KG_SC 128      /* int32 sc[16][16] */
#define KG_MN 1152     /* int16 mn[4][16][2] */
#define KG_Q 1408      /* uint8 q[64][16][4] */
#define KG_BYTES 5504  /* one super-block of a group */
#ifndef KG_MT
/* Activation rows per register tile (1B shapes, 512 rows: 4 / 6 / 8 / 12 rows → Q4_K 530 / 550 / 465 / 475
 * GFLOP/s). */
#define KG_MT 6
#endif

/* u[r] (r = 0 .. 15): 8 dwords of row r → t[c] (c = 0 .. 7): dword c of row r in lane r. Rows r and r + 8
 * go side by side in one register, then an 8 × 8 dword transpose runs in each 256-bit half: unpacks of
 * dwords and of qwords leave dword i of rows 4q .. 4q+3 in a 128-bit lane, and one two-source qword
 * permute per output gathers the four lanes of rows 0-3, 4-7, 8-11, 12-15. */
BLZ_INLINE void transpose16x8(const __m256i *u, __m512i t[8]) {
    __m512i a[8], b[8];
    for (int r = 0; r < 8; ++r) a[r] = _mm512_inserti64x4(_mm512_castsi256_si512(u[r]), u[r + 8], 1);
    for (int r = 0; r < 8; r += 2) {
        b[r] = _mm512_unpacklo_epi32(a[r], a[r + 1]);     /* per 128 bits: r0 r1 r0 r1 (dwords 0, 1) */
        b[r + 1] = _mm512_unpackhi_epi32(a[r], a[r + 1]); /* dwords 2, 3 */
    }
    for (int r = 0; r < 8; r += 4)
        for (int h = 0; h < 2; ++h) {
            a[r + h] = _mm512_unpacklo_epi64(b[r + h], b[r + 2 + h]);     /* r0 r1 r2 r3: dword 2h */
            a[r + 2 + h] = _mm512_unpackhi_epi64(b[r + h], b[r + 2 + h]); /* dword 2h + 1 */
        }
    /* a[4q + k[i]], 128-bit lanes 0 | 1 | 2 | 3: dword i | 4 + i of rows 4q .. 4q+3, then of rows 8 + 4q .. */
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    const int k[4] = {0, 2, 1, 3};
    for (int i = 0; i < 4; ++i) {
        t[i] = _mm512_permutex2var_epi64(a[k[i]], lo, a[4 + k[i]]);
        t[i + 4] = _mm512_permutex2var_epi64(a[k[i]], hi, a[4 + k[i]]);
    }
}

/* Super-blocks 0 .. nb-1 of the 16 rows `rows` (of `kind`) → the re-laid group at pk (see the header). */
static void kgroup_pack(const int kind, const uint8_t *const rows[KG], const int64_t nb, uint8_t *restrict pk) {
    const int64_t bb = kblock_bytes(kind);
    for (int64_t b = 0; b < nb; ++b) {
        uint8_t *p = pk + b * KG_BYTES;
        float *d = (float *)(p + KG_D), *dmin = (float *)(p + KG_DMIN);
        int32_t *sc = (int32_t *)(p + KG_SC);
        int16_t *mn = (int16_t *)(p + KG_MN);
        __m256i u[8][KG]; /* u[j][r]: elements 32j .. 32j+31 of row r */
        for (int r = 0; r < KG; ++r) {
            const uint8_t *blk = rows[r] + b * bb;
            __m256i w[8];
            if (kind == BLZ_Q6_K) {
                d[r] = f16_at(blk + 208);
                for (int j = 0; j < 16; ++j) sc[KG * j + r] = ((const int8_t *)(blk + 192))[j];
                q6k_quants(blk, 0, w);
                q6k_quants(blk, 1, w + 4);
            } else {
                d[r] = f16_at(blk);
                dmin[r] = f16_at(blk + 2);
                uint32_t s4[2], m4[2];
                uint8_t s8[8], m8[8];
                k4_scales(blk + 4, s4, m4);
                memcpy(s8, s4, 8);
                memcpy(m8, m4, 8);
                for (int j = 0; j < 8; ++j) {
                    sc[KG * j + r] = s8[j];
                    mn[2 * (KG * (j / 2) + r) + j % 2] = m8[j];
                }
                const uint8_t *qs = blk + (kind == BLZ_Q4_K ? 16 : 48);
                const __m256i qh = kind == BLZ_Q5_K ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
                for (int c = 0; c < 4; ++c) k45_quants(kind, qs, qh, c, w + 2 * c);
            }
            for (int j = 0; j < 8; ++j) u[j][r] = w[j];
        }
        for (int j = 0; j < 8; ++j) {
            __m512i t[8];
            transpose16x8(u[j], t);
            for (int c = 0; c < 8; ++c) _mm512_store_si512(p + KG_Q + 64 * (8 * j + c), t[c]);
        }
    }
}

/* acc_out[m][r] = the dots of the group at pk (of `kind`) with activation rows m0 .. m0+mt-1 (see the header).
 * Per super-block, each sub-block's chunks are loaded once for the mt rows; each row runs its chain and
 * adds the scaled sub-block to its int32 sumi. */
BLZ_INLINE void kgroup_dots(const int kind, const int mt, const uint8_t *restrict pk, const actk_t *restrict a,
                            const int64_t m0, float acc_out[KG_MT][KG]) {
    const int S = kind == BLZ_Q6_K ? 16 : 8, C = 64 / S; /* sub-blocks, and chunks per sub-block */
    __m512 acc[KG_MT];
    for (int m = 0; m < mt; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < a->nb; ++b) {
        const uint8_t *p = pk + b * KG_BYTES;
        __m512i sumi[KG_MT];
        for (int m = 0; m < mt; ++m) sumi[m] = _mm512_setzero_si512();
        for (int j = 0; j < S; ++j) {
            __m512i w[8];
            for (int c = 0; c < C; ++c) w[c] = _mm512_load_si512(p + KG_Q + 64 * (C * j + c));
            const __m512i sc = _mm512_load_si512(p + KG_SC + 64 * j);
            for (int m = 0; m < mt; ++m) {
                const int64_t row = (m0 + m) * a->nb + b;
                const int8_t *xq = a->q + (m0 + m) * a->K + b * QK_K + 4 * C * j;
                __m512i ch = kind == BLZ_Q6_K ? _mm512_set1_epi32(-32 * a->bs[16 * row + j]) : _mm512_setzero_si512();
                for (int c = 0; c < C; ++c) ch = _mm512_dpbusd_epi32(ch, w[c], blz_bcast4_512(xq + 4 * c));
                sumi[m] = _mm512_add_epi32(sumi[m], _mm512_mullo_epi32(ch, sc));
            }
        }
        const __m512 dw = _mm512_load_ps(p + KG_D), dm = _mm512_load_ps(p + KG_DMIN);
        for (int m = 0; m < mt; ++m) {
            const int64_t row = (m0 + m) * a->nb + b;
            const __m512 dx = _mm512_set1_ps(a->d[row]);
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[m]), _mm512_mul_ps(dw, dx), acc[m]);
            if (has_mins(kind)) {
                const int16_t *xs = a->xs + 8 * row;
                __m512i summ = _mm512_setzero_si512();
                for (int i = 0; i < 4; ++i)
                    summ = _mm512_dpwssd_epi32(summ, _mm512_load_si512(p + KG_MN + 64 * i), blz_bcast4_512(xs + 2 * i));
                acc[m] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(summ), _mm512_mul_ps(dm, dx), acc[m]);
            }
        }
    }
    for (int m = 0; m < mt; ++m) _mm512_storeu_ps(acc_out[m], acc[m]);
}

/* kgroup_dots with kind and (for full tiles) mt as constants. */
static void kgroup_tile(int kind, int mt, const uint8_t *pk, const actk_t *a, int64_t m0, float acc[KG_MT][KG]) {
#define KG_DOTS(k) (mt == KG_MT ? kgroup_dots(k, KG_MT, pk, a, m0, acc) : kgroup_dots(k, mt, pk, a, m0, acc))
    switch (kind) {
        case BLZ_Q4_K: KG_DOTS(BLZ_Q4_K); return;
        case BLZ_Q5_K: KG_DOTS(BLZ_Q5_K); return;
        default: KG_DOTS(BLZ_Q6_K);
    }
#undef KG_DOTS
}

/* The re-laid group at pk (SwiGLU: its up rows' at pk + half) against all M activation rows, KG_MT at a time,
 * then the epilogue of outputs n0 .. n0+nn-1. */
static void kgroup_tiles(int gkind, int ukind, const uint8_t *pk, int64_t half, const actk_t *a, int64_t M,
                         int64_t n0, int nn, int64_t N, int64_t nout, const float *bias, const float *residual,
                         float *out, int swiglu) {
    for (int64_t m0 = 0; m0 < M; m0 += KG_MT) {
        const int mt = (int)blz_min(KG_MT, M - m0);
        float r[KG_MT][KG] __attribute__((aligned(64))), u[KG_MT][KG] __attribute__((aligned(64)));
        kgroup_tile(gkind, mt, pk, a, m0, r);
        if (swiglu) kgroup_tile(ukind, mt, pk + half, a, m0, u);
        for (int m = 0; m < mt; ++m)
            blz_epilogue_row(r[m], u[m], m0 + m, n0, nn, N, nout, bias, residual, out, swiglu);
    }
}

int blz_kgroup_run(const ksegs_t *sg, const int64_t *tab, const actk_t *a, int64_t M, int64_t n0, int nn, int64_t N,
                   int64_t nout, const float *bias, const float *residual, float *out, int swiglu) {
    const int64_t half = a->nb * KG_BYTES;
    uint8_t *pk = blz_scratch_slot(3, (size_t)(swiglu ? 2 * half : half));
    if (!pk) return BLZ_ENOMEM;
    const uint8_t *gate[KG], *up[KG];
    for (int i = 0; i < KG; ++i) {
        const int64_t n = n0 + blz_min(i, nn - 1); /* padding rows repeat the last (outputs unused) */
        gate[i] = krow(sg, tab, n);
        up[i] = swiglu ? krow(sg, tab, nout + n) : NULL;
    }
    const int gkind = sg->kind[kseg_of(sg, n0)], ukind = swiglu ? sg->kind[kseg_of(sg, nout + n0)] : 0;
    kgroup_pack(gkind, gate, a->nb, pk);
    if (swiglu) kgroup_pack(ukind, up, a->nb, pk + half);
    kgroup_tiles(gkind, ukind, pk, half, a, M, n0, nn, N, nout, bias, residual, out, swiglu);
    return BLZ_OK;
}

/* Super-blocks 0 .. nb-1 of a q4_kx / q5_kx / q6_kx group at g (linear_kx.c's layout) → the re-laid group at
 * pk: the quants a byte each (the nibbles split, Q5_K's fifth bits and Q6_K's ql / qh joined), the scales and
 * the f16 d widened. */
static void kgroup_from_kx(const int kind, const uint8_t *restrict g, const int64_t nb, uint8_t *restrict pk) {
    const __m512i lo4 = _mm512_set1_epi8(0x0f), byte = _mm512_set1_epi32(0xff), one = _mm512_set1_epi8(0x01);
    const int five = kind == BLZ_Q5_KX;
    for (int64_t b = 0; b < nb; ++b) {
        uint8_t *o = pk + b * KG_BYTES;
        if (kind != BLZ_Q6_KX) {
            const uint8_t *p = g + b * (five ? KX5_BYTES : KX4_BYTES);
            _mm512_store_ps(o + KG_D, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)));
            _mm512_store_ps(o + KG_DMIN, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32))));
            __m512i sc[2], mn[2];
            kx4_scales(p, sc, mn);
            for (int j = 0; j < 8; ++j)
                _mm512_store_si512(o + KG_SC + 64 * j, _mm512_and_si512(_mm512_srli_epi32(sc[j / 4], 8 * (j % 4)), byte));
            __m512i mp[4];
            kx4_min_pairs(mn, mp);
            for (int q = 0; q < 4; ++q) _mm512_store_si512(o + KG_MN + 64 * q, mp[q]);
            for (int c = 0; c < 32; ++c) { /* chunk 8c' + i: sub-blocks 2c' (low nibbles), 2c' + 1 (high) */
                const int j = 2 * (c / 8), i = c % 8;
                const __m512i v = _mm512_loadu_si512(p + (five ? 768 : 256) + 64 * c);
                __m512i lo = _mm512_and_si512(v, lo4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
                if (five) { /* bits j, j + 1 of high-bit chunk i → bit 4 */
                    const __m512i h = _mm512_loadu_si512(p + 256 + 64 * i);
                    lo = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(h, j), one), 4));
                    hi = _mm512_or_si512(hi, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(h, j + 1), one), 4));
                }
                _mm512_store_si512(o + KG_Q + 64 * (8 * j + i), lo);
                _mm512_store_si512(o + KG_Q + 64 * (8 * j + 8 + i), hi);
            }
        } else {
            const uint8_t *p = g + b * KX6_BYTES;
            _mm512_store_ps(o + KG_D, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)));
            for (int j = 0; j < 16; ++j)
                _mm512_store_si512(o + KG_SC + 64 * j, _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 32 + 16 * j))));
            for (int h = 0; h < 2; ++h)
                for (int i = 0; i < 8; ++i) {
                    __m512i e[4];
                    kx6_quants(p, h, i, e);
                    for (int t = 0; t < 4; ++t) _mm512_store_si512(o + KG_Q + 64 * (32 * h + 8 * t + i), e[t]);
                }
        }
    }
}

int blz_kgroup_run_kx(int kind, const uint8_t *gate, const uint8_t *up, const actk_t *a, int64_t M, int64_t n0,
                      int64_t N, int64_t nout, const float *bias, const float *residual, float *out, int swiglu) {
    const int64_t half = a->nb * KG_BYTES;
    uint8_t *pk = blz_scratch_slot(3, (size_t)(swiglu ? 2 * half : half));
    if (!pk) return BLZ_ENOMEM;
    kgroup_from_kx(kind, gate, a->nb, pk);
    if (swiglu) kgroup_from_kx(kind, up, a->nb, pk + half);
    const int bk = kx_base(kind);
    kgroup_tiles(bk, bk, pk, half, a, M, n0, KG, N, nout, bias, residual, out, swiglu);
    return BLZ_OK;
}
#endif
