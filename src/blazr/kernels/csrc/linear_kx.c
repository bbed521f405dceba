/* blazr kernels — Q4_K, Q5_K and Q6_K re-laid in 16-row groups at load (BLZ_Q4_KX, Q5_KX, Q6_KX), so that every
 * row count, one activation row (decode) included, runs vpdpbusd across 16 weight rows.
 *
 * linear_k.c runs the K-quants as a GGUF stores them: one weight row's 256 quants of a super-block in the lanes
 * of a register, each sub-block's scale applied by a vpmaddubsw / vpmaddwd pair, the rows' partial sums
 * reduced across lanes — about 20 cycles per row and super-block, so a one-row call computes Q4_K at ~25 GB/s
 * of weight bytes a core (Zen 5), where packed Q4_0 runs ~90 and the memory ~25-35: decode waited on the
 * arithmetic (benchmarks/NOTES.md §56). linear_k_groups.c already re-lays 16 rows per prefill call for
 * vpdpbusd; this layout is the same idea kept compact, made once when the model loads — the same bytes as the
 * 16 rows' ggml super-blocks, moved. Per group g (rows 16g .. 16g+15) and super-block b, KX4 / KX5 / KX6_BYTES:
 *   Q4_K (2304 = 16 × 144): f16 d[16] | f16 dmin[16] | the 12-byte scale / min fields as 3 planes of 16 dwords
 *        (plane p, lane r = bytes 4p .. 4p+3 of row r's field) | 32 chunks of 64 B: chunk 8c + i, lane r =
 *        ggml's nibble bytes 32c + 4i .. 32c + 4i + 3 of row r (low nibbles: elements 64c + 4i .. of
 *        sub-block 2c, high: elements 64c + 32 + 4i .. of sub-block 2c + 1)
 *   Q5_K (2816 = 16 × 176): as Q4_K, with 8 chunks of the 32 fifth-bit bytes (chunk i, lane r = bytes 4i ..
 *        4i + 3 of row r's: bit j is sub-block j's) between the scale planes and the nibbles (at 768)
 *   Q6_K (3360 = 16 × 210): f16 d[16] | int8 sc[16 sub-blocks][16 rows] | ql chunks 16h + i (i < 16), lane r
 *        = ql bytes 64h + 4i .. + 3 of row r | qh chunks 8h + i (i < 8), lane r = qh bytes 32h + 4i .. + 3
 * A chunk holds 4 elements of all 16 rows: vpdpbusd against the activation's 4 matching bytes broadcast leaves
 * row r's partial dot in int32 lane r; a sub-block's chain (Q6_K's started at −32 · its activation sum) is
 * scaled by one vpmulld of the 16 rows' scales, the Q4_K mins by vpdpwssd of the rows' min pairs against the
 * activation's sums per 32. The integer sums are exact, so sumi and summ are linear_k.c's values, and the fp32
 * steps per super-block are its steps in its order:
 *   acc = fma((float)sumi, d·dx, acc);   Q4_K / Q5_K: acc = fma(−(float)summ, dmin·dx, acc)
 * — every output has linear_k.c's bits on the same weights, at any row count (tests/test_kquant_packed.py).
 * AVX2 builds without VNNI run the same layout as two halves of 8 rows in 256-bit registers, vpdpbusd's
 * int32 dots made by vpmaddubsw pairs summed in int16 over runs of chunks that cannot reach 2^15, widened by
 * the vpmaddwd that applies the scale: the same integers, so the same bits. There Q4_K's groups computed 1.4x
 * the stored kernel's GB/s hot (2 threads, Zen 3) and read 1.03-1.15x cold, 1.04-1.5x at 2-256 rows; Q6_K's,
 * whose quants take more unpacking than their dots save, 0.7-0.95x at 2-64 rows, so the loader re-lays only
 * Q4_K and Q5_K there (kernels/kquant_packed.py `packs_on`; NOTES §67). The scalar build unpacks the weight
 * and runs linear_k.c: the same bits. Activations: linear_k.c's Q8_K rows (blz_quantize_q8k_row).
 *
 * Parallel strategy: OpenMP splits the groups; a group runs its activation rows KX_MT at a time, each chunk
 * unpacked once for the tile; the first tile prefetches each super-block's lines KX_PF bytes ahead (the
 * groups are one linear stream a thread). On VNNI builds from KG_MIN rows a group is instead unpacked once
 * per call into linear_k_groups.c's layout (quants a byte each) and run by its tiles: 512-row prefill on this
 * layout's own tiles ran Q4_K at 0.89-0.95x and Q6_K at 0.64-0.69x of the stored kinds' groups (1B shapes,
 * Zen 5). AVX2 builds walk a one-row call's groups as weight streams (kx_streams, knob streams_kx; Zen 3 reads
 * best in 1-2), balanced between the threads as linear_q.c's q_streams.
 * SwiGLU: output group g takes gate group g and up group g + I/16 (I = N/2 a multiple of 16).
 */
#include <stdlib.h>

#include "kquant.h"

#ifndef KX_MT
#define KX_MT 4 /* activation rows per register tile */
#endif
#ifndef KX_PF
#define KX_PF 4608 /* software prefetch distance, bytes (cold 1B shapes, one thread: 2304 1.43x, 9216 1.48x) */
#endif

BLZ_INLINE int64_t kx_bytes(int kind) { return kx_group_bytes(kx_base(kind)); }

/* A stored kind's super-block fields in group order: first byte in the ggml block, units, unit bytes — each
 * field laid [units][16 rows][unit bytes] in the group (the header's layout; kernels/kquant_packed.py's FIELDS,
 * the same table, tied by the tests' byte comparison). */
typedef struct {
    int16_t at, units, size;
} kx_field_t;
static const kx_field_t KX_FIELDS[3][5] = {
    {{0, 1, 2}, {2, 1, 2}, {4, 3, 4}, {16, 32, 4}},               /* Q4_K: d, dmin, scale planes, nibbles */
    {{0, 1, 2}, {2, 1, 2}, {4, 3, 4}, {16, 8, 4}, {48, 32, 4}},   /* Q5_K: the same, fifth bits first */
    {{208, 1, 2}, {192, 16, 1}, {0, 32, 4}, {128, 16, 4}},        /* Q6_K: d, int8 scales, ql, qh */
};

/* Row r's super-block between its ggml block `blk` and the group's super-block `p`: into the group (`in`; blk
 * only read) or back out of it (p only read). */
BLZ_INLINE void kx_move(int base, uint8_t *blk, uint8_t *p, int r, int in) {
    const kx_field_t *fields = KX_FIELDS[base - BLZ_Q4_K];
    for (int f = 0; f < 5 && fields[f].units; ++f) {
        const int at = fields[f].at, units = fields[f].units, size = fields[f].size;
        for (int u = 0; u < units; ++u) {
            uint8_t *g = p + (u * 16 + r) * size, *s = blk + at + u * size;
            switch (size) { /* constant sizes: plain moves */
                case 4: in ? memcpy(g, s, 4) : memcpy(s, g, 4); break;
                case 2: in ? memcpy(g, s, 2) : memcpy(s, g, 2); break;
                default: in ? (void)(*g = *s) : (void)(*s = *g);
            }
        }
        p += units * 16 * size;
    }
}

/* Rows `rows[0..N-1]` (addresses of ggml rows of stored kind BLZ_Q4_K / Q5_K / Q6_K, K values each) → dst
 * [N/16][K/256][group bytes] (the header's layout). Plain byte moves, each thread a contiguous share of the
 * groups (its part of the output mapped first, `blz_populate`), a row read in order. */
BLZ_EXPORT int blz_pack_kx(int kind, const int64_t *rows, int64_t N, int64_t K, uint8_t *dst, int nthreads) {
    if (kind < BLZ_Q4_K || kind > BLZ_Q6_K || N < 0 || N % 16 || K <= 0 || K % QK_K) return BLZ_EINVAL;
    const int64_t nb = K / QK_K, bb = kblock_bytes(kind), gb = kx_group_bytes(kind);
#pragma omp parallel num_threads(nthreads > 0 ? nthreads : 1)
    {
        int64_t lo, hi;
        blz_thread_share(N / 16, &lo, &hi);
        blz_populate(dst + lo * nb * gb, (hi - lo) * nb * gb);
        for (int64_t g = lo; g < hi; ++g)
            for (int r = 0; r < 16; ++r) {
                uint8_t *blk = (uint8_t *)(intptr_t)rows[16 * g + r]; /* read only: kx_move into the group */
                for (int64_t b = 0; b < nb; ++b, blk += bb) kx_move(kind, blk, dst + (g * nb + b) * gb, r, 1);
            }
    }
    return BLZ_OK;
}

#ifdef BLZ_VNNI
/* Q4_K (five = 0) / Q5_K (five = 1): acc_out[m][r] = the dots of group `grp` (super-block 0) with activation
 * rows m0 .. m0+mt-1. Q5_K's fifth bits: bit j of a high-bit byte l belongs to sub-block j's element l. */
BLZ_INLINE void kx45_dots(const int five, const int mt, const uint8_t *restrict grp, const actk_t *restrict a,
                          const int64_t m0, float acc_out[KX_MT][16]) {
    const __m512i lo4 = _mm512_set1_epi8(0x0f), byte = _mm512_set1_epi32(0xff), one = _mm512_set1_epi8(0x01);
    const int64_t gb = five ? KX5_BYTES : KX4_BYTES, qs = five ? 768 : 256;
    __m512 acc[KX_MT];
    for (int m = 0; m < mt; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < a->nb; ++b) {
        const uint8_t *p = grp + b * gb;
        if (m0 == 0)
            for (int l = 0; l < gb; l += 64) _mm_prefetch((const char *)p + KX_PF + l, _MM_HINT_T0);
        __m512i sc[2], mn[2];
        kx4_scales(p, sc, mn);
        __m512i sumi[KX_MT];
        for (int m = 0; m < mt; ++m) sumi[m] = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {
            __m512i lo[8], hi[8];
            for (int i = 0; i < 8; ++i) {
                const __m512i v = _mm512_loadu_si512(p + qs + 64 * (8 * c + i));
                lo[i] = _mm512_and_si512(v, lo4);
                hi[i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
                if (five) { /* bits 2c and 2c + 1 of high-bit chunk i → bit 4 */
                    const __m512i h = _mm512_loadu_si512(p + 256 + 64 * i);
                    lo[i] = _mm512_or_si512(lo[i], _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(h, 2 * c), one), 4));
                    hi[i] = _mm512_or_si512(hi[i], _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(h, 2 * c + 1), one), 4));
                }
            }
            const __m512i s = sc[c / 2]; /* sub-blocks 2c, 2c+1: bytes 2(c%2), 2(c%2)+1 of each dword */
            const int sh = 16 * (c & 1);
            const __m512i s_lo = _mm512_and_si512(_mm512_srli_epi32(s, sh), byte);
            const __m512i s_hi = _mm512_and_si512(_mm512_srli_epi32(s, sh + 8), byte);
            for (int m = 0; m < mt; ++m) {
                const int8_t *x = a->q + (m0 + m) * a->K + b * QK_K + 64 * c;
                __m512i sl = _mm512_setzero_si512(), shv = _mm512_setzero_si512();
                for (int i = 0; i < 8; ++i) {
                    sl = _mm512_dpbusd_epi32(sl, lo[i], blz_bcast4_512(x + 4 * i));
                    shv = _mm512_dpbusd_epi32(shv, hi[i], blz_bcast4_512(x + 32 + 4 * i));
                }
                sumi[m] = _mm512_add_epi32(sumi[m], _mm512_add_epi32(_mm512_mullo_epi32(sl, s_lo),
                                                                     _mm512_mullo_epi32(shv, s_hi)));
            }
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)));
        __m512i mp[4];
        kx4_min_pairs(mn, mp);
        for (int m = 0; m < mt; ++m) {
            const int64_t row = (m0 + m) * a->nb + b;
            const int16_t *xs = a->xs + 8 * row;
            __m512i summ = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mp[0], blz_bcast4_512(xs));
            for (int q = 1; q < 4; ++q) summ = _mm512_dpwssd_epi32(summ, mp[q], blz_bcast4_512(xs + 2 * q));
            const __m512 dx = _mm512_set1_ps(a->d[row]);
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[m]), _mm512_mul_ps(dw, dx), acc[m]);
            acc[m] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(summ), _mm512_mul_ps(dm, dx), acc[m]);
        }
    }
    for (int m = 0; m < mt; ++m) _mm512_storeu_ps(acc_out[m], acc[m]);
}

/* Q6_K: kx4_dots for the Q6_K layout (sub-block (h, t, is): elements 128h + 32t + 16is .. + 15, scale and
 * activation sum 8h + 2t + is). */
BLZ_INLINE void kx6_dots(const int mt, const uint8_t *restrict grp, const actk_t *restrict a, const int64_t m0,
                         float acc_out[KX_MT][16]) {
    __m512 acc[KX_MT];
    for (int m = 0; m < mt; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < a->nb; ++b) {
        const uint8_t *p = grp + b * KX6_BYTES;
        if (m0 == 0)
            for (int l = 0; l < KX6_BYTES; l += 64) _mm_prefetch((const char *)p + KX_PF + l, _MM_HINT_T0);
        __m512i sumi[KX_MT];
        for (int m = 0; m < mt; ++m) sumi[m] = _mm512_setzero_si512();
        for (int h = 0; h < 2; ++h)
            for (int is = 0; is < 2; ++is) {
                __m512i ch[KX_MT][4];
                for (int m = 0; m < mt; ++m)
                    for (int t = 0; t < 4; ++t)
                        ch[m][t] = _mm512_set1_epi32(-32 * a->bs[16 * ((m0 + m) * a->nb + b) + 8 * h + 2 * t + is]);
                for (int i = 4 * is; i < 4 * is + 4; ++i) {
                    __m512i e[4];
                    kx6_quants(p, h, i, e);
                    for (int m = 0; m < mt; ++m) {
                        const int8_t *x = a->q + (m0 + m) * a->K + b * QK_K + 128 * h + 4 * i;
                        for (int t = 0; t < 4; ++t) ch[m][t] = _mm512_dpbusd_epi32(ch[m][t], e[t], blz_bcast4_512(x + 32 * t));
                    }
                }
                for (int t = 0; t < 4; ++t) {
                    const __m512i sc = _mm512_cvtepi8_epi32(
                        _mm_loadu_si128((const __m128i *)(p + 32 + 16 * (8 * h + 2 * t + is))));
                    for (int m = 0; m < mt; ++m) sumi[m] = _mm512_add_epi32(sumi[m], _mm512_mullo_epi32(ch[m][t], sc));
                }
            }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        for (int m = 0; m < mt; ++m) {
            const __m512 dx = _mm512_set1_ps(a->d[(m0 + m) * a->nb + b]);
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[m]), _mm512_mul_ps(dw, dx), acc[m]);
        }
    }
    for (int m = 0; m < mt; ++m) _mm512_storeu_ps(acc_out[m], acc[m]);
}

/* One group's dots with kind and mt as constants for one row (decode) and full tiles. */
static void kx_tile(int kind, int mt, const uint8_t *grp, const actk_t *a, int64_t m0,
                    float acc[KX_MT][16]) {
    if (kind == BLZ_Q4_KX) {
        if (mt == 1) kx45_dots(0, 1, grp, a, m0, acc);
        else if (mt == KX_MT) kx45_dots(0, KX_MT, grp, a, m0, acc);
        else kx45_dots(0, mt, grp, a, m0, acc);
    } else if (kind == BLZ_Q5_KX) {
        if (mt == 1) kx45_dots(1, 1, grp, a, m0, acc);
        else if (mt == KX_MT) kx45_dots(1, KX_MT, grp, a, m0, acc);
        else kx45_dots(1, mt, grp, a, m0, acc);
    } else {
        if (mt == 1) kx6_dots(1, grp, a, m0, acc);
        else if (mt == KX_MT) kx6_dots(KX_MT, grp, a, m0, acc);
        else kx6_dots(mt, grp, a, m0, acc);
    }
}
#elif defined(BLZ_AVX2)
/* AVX2 without VNNI: a group's 16 rows as two halves of 8 (rows 8h .. 8h+7: bytes 32h .. 32h+31 of each 64-byte
 * unit of the layout), vpdpbusd's exact int32 dots made by vpmaddubsw — a weight byte times the activation byte,
 * pairs summed in int16 — summed in int16 over a run of chunks and widened by the vpmaddwd that applies the
 * sub-block's scale (each dword's two int16 times the row's scale). Every int16 sum stays below 2^15: a pair
 * is at most 2·q·127 (|qx| ≤ 127), Q4_K runs all 8 chunks of a sub-block (q ≤ 15: ≤ 30480), Q5_K 4 (q ≤ 31:
 * ≤ 31496), Q6_K scales each pair (q + 32 ≤ 63); so sumi and summ are the VNNI path's integers, and the fp32
 * steps its steps. */

/* vpshufb masks: byte q of each dword (8 rows' scales or mins of one sub-block) into both int16 of the dword,
 * zero-extended — vpmaddwd's factor for the dword's int16 pair. */
static const uint8_t kx_pair[4][32] __attribute__((aligned(32))) = {
#define P4(q) q, 0x80, q, 0x80, 4 + q, 0x80, 4 + q, 0x80, 8 + q, 0x80, 8 + q, 0x80, 12 + q, 0x80, 12 + q, 0x80
    {P4(0), P4(0)}, {P4(1), P4(1)}, {P4(2), P4(2)}, {P4(3), P4(3)},
#undef P4
};
/* vpshufb masks: bytes 0 and 1 (2 and 3) of each dword zero-extended to its two int16 — a pair of mins. */
static const uint8_t kx_mins[2][32] __attribute__((aligned(32))) = {
#define M4(q) q, 0x80, q + 1, 0x80, 4 + q, 0x80, 5 + q, 0x80, 8 + q, 0x80, 9 + q, 0x80, 12 + q, 0x80, 13 + q, 0x80
    {M4(0), M4(0)}, {M4(2), M4(2)},
#undef M4
};

/* Q4_K (five = 0) / Q5_K (five = 1), half h of super-block p (super-block b of the activations): acc[m] (8
 * rows' fp32 lanes) + the step of activation row m0 + m (kx45_dots' steps for 8 rows). */
BLZ_INLINE void kx45_block_avx2(const int five, const int mt, const uint8_t *restrict p, const int h,
                                const actk_t *restrict a, const int64_t m0, const int64_t b, __m256 *acc) {
    const __m256i lo4 = _mm256_set1_epi8(0x0f), m3f = _mm256_set1_epi8(0x3f), m03 = _mm256_set1_epi8(0x03);
    const __m256i one = _mm256_set1_epi8(0x01);
    const uint8_t *ph = p + 32 * h, *qs = ph + (five ? 768 : 256);
    const __m256i w0 = _mm256_loadu_si256((const __m256i *)(ph + 64));
    const __m256i w1 = _mm256_loadu_si256((const __m256i *)(ph + 128));
    const __m256i w2 = _mm256_loadu_si256((const __m256i *)(ph + 192));
    __m256i sc[2], mn[2]; /* kx4_scales on 8 rows */
    sc[0] = _mm256_and_si256(w0, m3f);
    mn[0] = _mm256_and_si256(w1, m3f);
    sc[1] = _mm256_or_si256(_mm256_and_si256(w2, lo4), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w0, 6), m03), 4));
    mn[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w2, 4), lo4),
                            _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w1, 6), m03), 4));
    const int run = five ? 4 : 8; /* chunks summed in int16 before the scale */
    __m256i sumi[KX_MT];
    for (int m = 0; m < mt; ++m) sumi[m] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
        for (int i0 = 0; i0 < 8; i0 += run) {
            __m256i sl[KX_MT], sh[KX_MT];
            for (int m = 0; m < mt; ++m) sl[m] = sh[m] = _mm256_setzero_si256();
            for (int i = i0; i < i0 + run; ++i) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 64 * (8 * c + i)));
                __m256i lo = _mm256_and_si256(v, lo4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
                if (five) { /* bits 2c and 2c + 1 of high-bit chunk i → bit 4 */
                    const __m256i hb = _mm256_loadu_si256((const __m256i *)(ph + 256 + 64 * i));
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * c), one), 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * c + 1), one), 4));
                }
                for (int m = 0; m < mt; ++m) {
                    const int8_t *x = a->q + (m0 + m) * a->K + b * QK_K + 64 * c;
                    sl[m] = _mm256_add_epi16(sl[m], _mm256_maddubs_epi16(lo, blz_bcast4_256(x + 4 * i)));
                    sh[m] = _mm256_add_epi16(sh[m], _mm256_maddubs_epi16(hi, blz_bcast4_256(x + 32 + 4 * i)));
                }
            }
            /* sub-blocks 2c, 2c + 1: bytes 2(c % 2), 2(c % 2) + 1 of each dword of sc[c / 2] */
            const __m256i s_lo = _mm256_shuffle_epi8(sc[c / 2], _mm256_load_si256((const __m256i *)kx_pair[2 * (c & 1)]));
            const __m256i s_hi = _mm256_shuffle_epi8(sc[c / 2], _mm256_load_si256((const __m256i *)kx_pair[2 * (c & 1) + 1]));
            for (int m = 0; m < mt; ++m)
                sumi[m] = _mm256_add_epi32(sumi[m], _mm256_add_epi32(_mm256_madd_epi16(sl[m], s_lo), _mm256_madd_epi16(sh[m], s_hi)));
        }
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * h)));
    const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 32 + 16 * h)));
    __m256i mp[4]; /* kx4_min_pairs: lane r = row r's mins 2q, 2q + 1 */
    for (int q = 0; q < 4; ++q) mp[q] = _mm256_shuffle_epi8(mn[q / 2], _mm256_load_si256((const __m256i *)kx_mins[q % 2]));
    for (int m = 0; m < mt; ++m) {
        const int64_t row = (m0 + m) * a->nb + b;
        const int16_t *xs = a->xs + 8 * row;
        __m256i summ = _mm256_madd_epi16(mp[0], blz_bcast4_256(xs));
        for (int q = 1; q < 4; ++q) summ = _mm256_add_epi32(summ, _mm256_madd_epi16(mp[q], blz_bcast4_256(xs + 2 * q)));
        const __m256 dx = _mm256_set1_ps(a->d[row]);
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[m]), _mm256_mul_ps(dw, dx), acc[m]);
        acc[m] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(summ), _mm256_mul_ps(dm, dx), acc[m]);
    }
}

/* Q6_K, half h of super-block p: kx6_dots' steps for 8 rows. Per sub-block j (h', t, is): its int8 scales of
 * the 8 rows as int16 pairs (sign-extended, the low half copied up), its 4 chunks' vpmaddubsw pairs summed two
 * at a time in int16 (≤ 2·2·63·127) and scaled by vpmaddwd; sumi = Σ_j sc·dot_j − 32·Σ_j sc·bs_j, the integer
 * of the VNNI chain started at −32·bs. A sub-block's chunk of quants is one of kx6_quants' four (element
 * 128h' + 32t + 4i: ql chunk 16h' + 8(t & 1) + i, nibble t >> 1; qh chunk 8h' + i, bits 2t .. 2t + 1). */
BLZ_INLINE void kx6_block_avx2(const int mt, const uint8_t *restrict p, const int h, const actk_t *restrict a,
                               const int64_t m0, const int64_t b, __m256i *sumi) {
    const __m256i lo4 = _mm256_set1_epi8(0x0f), b30 = _mm256_set1_epi8(0x30);
    const uint8_t *ph = p + 32 * h;
    __m256i sb[KX_MT];
    for (int m = 0; m < mt; ++m) sumi[m] = sb[m] = _mm256_setzero_si256();
    for (int j = 0; j < 16; ++j) {
        const int hh = j >> 3, t = (j >> 1) & 3, is = j & 1;
        const __m256i s32 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 32 + 16 * j + 8 * h)));
        const __m256i S = _mm256_blend_epi16(s32, _mm256_slli_epi32(s32, 16), 0xAA);
        for (int m = 0; m < mt; ++m) {
            const uint16_t bs = (uint16_t)a->bs[16 * ((m0 + m) * a->nb + b) + j];
            sb[m] = _mm256_add_epi32(sb[m], _mm256_madd_epi16(S, _mm256_set1_epi32(bs)));
        }
        const uint8_t *ql = ph + 288 + 64 * (16 * hh + 8 * (t & 1)), *qh = ph + 2336 + 64 * 8 * hh;
        for (int i = 4 * is; i < 4 * is + 4; i += 2) {
            __m256i e[2];
            for (int u = 0; u < 2; ++u) {
                const __m256i L = _mm256_loadu_si256((const __m256i *)(ql + 64 * (i + u)));
                const __m256i H = _mm256_loadu_si256((const __m256i *)(qh + 64 * (i + u)));
                const __m256i lo = t >> 1 ? _mm256_srli_epi16(L, 4) : L;
                const __m256i hi = t == 0 ? _mm256_slli_epi16(H, 4) : t == 1 ? _mm256_slli_epi16(H, 2)
                                 : t == 2 ? H : _mm256_srli_epi16(H, 2);
                e[u] = _mm256_or_si256(_mm256_and_si256(lo, lo4), _mm256_and_si256(hi, b30));
            }
            for (int m = 0; m < mt; ++m) {
                const int8_t *x = a->q + (m0 + m) * a->K + b * QK_K + 128 * hh + 32 * t + 4 * i;
                const __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(e[0], blz_bcast4_256(x)),
                                                     _mm256_maddubs_epi16(e[1], blz_bcast4_256(x + 4)));
                sumi[m] = _mm256_add_epi32(sumi[m], _mm256_madd_epi16(p16, S));
            }
        }
    }
    for (int m = 0; m < mt; ++m) sumi[m] = _mm256_sub_epi32(sumi[m], _mm256_slli_epi32(sb[m], 5));
}

/* kx6_block_avx2's integers → acc[m] + the fp32 step. */
BLZ_INLINE void kx6_step_avx2(const int mt, const uint8_t *restrict p, const int h, const actk_t *restrict a,
                              const int64_t m0, const int64_t b, __m256 *acc) {
    __m256i sumi[KX_MT];
    kx6_block_avx2(mt, p, h, a, m0, b, sumi);
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * h)));
    for (int m = 0; m < mt; ++m) {
        const __m256 dx = _mm256_set1_ps(a->d[(m0 + m) * a->nb + b]);
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[m]), _mm256_mul_ps(dw, dx), acc[m]);
    }
}

/* Half h of super-block p, by kind. */
BLZ_INLINE void kx_block_avx2(const int kind, const int mt, const uint8_t *restrict p, const int h,
                              const actk_t *restrict a, const int64_t m0, const int64_t b, __m256 *acc) {
    if (kind == BLZ_Q6_KX) kx6_step_avx2(mt, p, h, a, m0, b, acc);
    else kx45_block_avx2(kind == BLZ_Q5_KX, mt, p, h, a, m0, b, acc);
}

/* One group's dots (acc_out[m][r], r < 16) with activation rows m0 .. m0+mt-1: both halves of a super-block
 * after each other, so that the group is read as one stream. */
BLZ_INLINE void kx_dots_avx2(const int kind, const int mt, const uint8_t *restrict grp, const actk_t *restrict a,
                             const int64_t m0, float acc_out[KX_MT][16]) {
    const int64_t gb = kx_bytes(kind);
    __m256 acc[2][KX_MT];
    for (int m = 0; m < mt; ++m) acc[0][m] = acc[1][m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < a->nb; ++b) {
        const uint8_t *p = grp + b * gb;
        if (m0 == 0)
            for (int l = 0; l < gb; l += 64) _mm_prefetch((const char *)p + KX_PF + l, _MM_HINT_T0);
        kx_block_avx2(kind, mt, p, 0, a, m0, b, acc[0]);
        kx_block_avx2(kind, mt, p, 1, a, m0, b, acc[1]);
    }
    for (int m = 0; m < mt; ++m) {
        _mm256_storeu_ps(acc_out[m], acc[0][m]);
        _mm256_storeu_ps(acc_out[m] + 8, acc[1][m]);
    }
}

#if BLZ_STREAMS > 1
/* One activation row against ns groups grp[s] (SwiGLU: gate groups, then their up groups), their super-blocks
 * walked together: acc_out[s] = group s's dots by kx_dots_avx2's operations. */
BLZ_INLINE void kx_groups1_avx2(const int kind, const int ns, const uint8_t *const *grp, const actk_t *restrict a,
                                float acc_out[][16]) {
    const int64_t gb = kx_bytes(kind);
    __m256 acc[BLZ_STREAMS][2][1];
    for (int s = 0; s < ns; ++s) acc[s][0][0] = acc[s][1][0] = _mm256_setzero_ps();
    for (int64_t b = 0; b < a->nb; ++b)
        for (int s = 0; s < ns; ++s) {
            const uint8_t *p = grp[s] + b * gb;
            for (int l = 0; l < gb; l += 64) _mm_prefetch((const char *)p + KX_PF + l, _MM_HINT_T0);
            kx_block_avx2(kind, 1, p, 0, a, 0, b, acc[s][0]);
            kx_block_avx2(kind, 1, p, 1, a, 0, b, acc[s][1]);
        }
    for (int s = 0; s < ns; ++s) {
        _mm256_storeu_ps(acc_out[s], acc[s][0][0]);
        _mm256_storeu_ps(acc_out[s] + 8, acc[s][1][0]);
    }
}

#define KX_GROUPS1(ns, kind, ...) kx_groups1_avx2(kind, ns, __VA_ARGS__)
/* blz_linear_kx at M = 1 (activations quantized in a): this thread's block of groups cut into S parts (the
 * `streams_kx` knob; SwiGLU: half as many, each read with its up group), group i of every part run together,
 * the steps walked balanced between the threads (blz_walk_t) — linear_q.c's q_streams for this layout. */
static void kx_streams(int kind, const uint8_t *w, int64_t gbytes, int64_t ngroups, int64_t N, int64_t nout,
                       const actk_t *a, const float *bias, const float *residual, float *out, int swiglu,
                       blz_team_t *team) {
    blz_walk_t wk;
    blz_walk_begin(&wk, team);
    for (int64_t i; blz_walk_step(&wk, &i);) {
        const uint8_t *wg[BLZ_STREAMS];
        int64_t g[BLZ_STREAMS];
        const int ns = blz_stream_step(wk.lo, wk.hi, wk.q, team->S, i, g);
        for (int s = 0; s < ns; ++s) {
            wg[s] = w + g[s] * gbytes;
            if (swiglu) wg[ns + s] = w + (ngroups + g[s]) * gbytes;
        }
        float r[BLZ_STREAMS][16] __attribute__((aligned(64)));
        const int nr = swiglu ? 2 * ns : ns;
        if (kind == BLZ_Q4_KX)
            BLZ_TILE_SWITCH(KX_GROUPS1, nr, BLZ_Q4_KX, wg, a, r)
        else if (kind == BLZ_Q5_KX)
            BLZ_TILE_SWITCH(KX_GROUPS1, nr, BLZ_Q5_KX, wg, a, r)
        else
            BLZ_TILE_SWITCH(KX_GROUPS1, nr, BLZ_Q6_KX, wg, a, r)
        for (int s = 0; s < ns; ++s)
            blz_epilogue_row(r[s], r[swiglu ? ns + s : s], 0, 16 * g[s], 16, N, nout, bias, residual, out, swiglu);
    }
}
#undef KX_GROUPS1
#endif

/* One group's dots with mt as a constant for one row (decode) and full tiles. */
#define KX_DOTS(mt, kind, ...) kx_dots_avx2(kind, mt, __VA_ARGS__)
static void kx_tile(int kind, int mt, const uint8_t *grp, const actk_t *a, int64_t m0, float acc[KX_MT][16]) {
    if (kind == BLZ_Q4_KX)
        BLZ_TILE_SWITCH(KX_DOTS, mt, BLZ_Q4_KX, grp, a, m0, acc)
    else if (kind == BLZ_Q5_KX)
        BLZ_TILE_SWITCH(KX_DOTS, mt, BLZ_Q5_KX, grp, a, m0, acc)
    else
        BLZ_TILE_SWITCH(KX_DOTS, mt, BLZ_Q6_KX, grp, a, m0, acc)
}
#undef KX_DOTS
#endif

/* out = x·Wᵀ (+bias) (+residual) or the SwiGLU form (blz_linear_q's contract). x [M, K], w [N/16][K/256]
 * [group bytes] of kind BLZ_Q4_KX / Q5_KX / Q6_KX, bias [N] or NULL, residual [M, N] or NULL (may equal out),
 * out [M, N] (SwiGLU: [M, N/2], N/2 a multiple of 16). */
int blz_linear_kx(int kind, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, const float *bias,
                  const float *residual, float *out, int swiglu, int nthreads) {
    if (!blz_is_kx(kind) || M < 0 || N < 0 || N % 16 || K <= 0 || K % QK_K)
        return BLZ_EINVAL;
    if (swiglu && (N % 32 || residual)) return BLZ_EINVAL;
    if (M == 0 || N == 0) return BLZ_OK;
    const int64_t nb = K / QK_K;
    const int nt = blz_threads(nthreads, M * N * K, BLZ_LINEAR_PARALLEL_MIN);
#if defined(BLZ_VNNI) || defined(BLZ_AVX2)
    const int64_t gbytes = nb * kx_bytes(kind), nout = swiglu ? N / 2 : N;
    actk_t a = {.K = K, .nb = nb, .qz = NULL};
    const size_t qb = (size_t)blz_round_up(M * K, 64), db = (size_t)blz_round_up(M * nb * 4, 64);
    const size_t sb = (size_t)blz_round_up(M * nb * 32, 64), xb = (size_t)blz_round_up(M * nb * 16, 64);
    uint8_t *buf = blz_scratch(qb + db + sb + xb);
    if (!buf) return BLZ_ENOMEM;
    a.q = (int8_t *)buf;
    a.d = (float *)(buf + qb);
    a.bs = (int16_t *)(buf + qb + db);
    a.xs = (int16_t *)(buf + qb + db + sb);
    const int64_t ngroups = nout / 16, up = swiglu ? nout / 16 : 0;
#if !defined(BLZ_VNNI) && BLZ_STREAMS > 1
    if (M == 1) {
        blz_quantize_q8k_row(x, nb, a.q, a.d, a.bs, a.xs);
        blz_team_t team;
        blz_team_init(&team, nt, ngroups, blz_gemv_parts(BLZ_TUNE_STREAMS_KX, 1, swiglu));
#pragma omp parallel num_threads(nt)
        kx_streams(kind, w, gbytes, ngroups, N, nout, &a, bias, residual, out, swiglu, &team);
        return BLZ_OK;
    }
#endif
    int rc = BLZ_OK;
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; ++m)
            blz_quantize_q8k_row(x + m * K, nb, a.q + m * K, a.d + m * nb, a.bs + m * nb * 16, a.xs + m * nb * 8);
#pragma omp for schedule(static)
        for (int64_t g = 0; g < ngroups; ++g) {
#ifdef BLZ_VNNI
            if (M >= KG_MIN) { /* long calls: the group re-laid once for linear_k_groups.c's tiles */
                if (blz_kgroup_run_kx(kind, w + g * gbytes, swiglu ? w + (g + up) * gbytes : NULL, &a, M, 16 * g, N,
                                      nout, bias, residual, out, swiglu)) {
#pragma omp atomic write
                    rc = BLZ_ENOMEM;
                }
                continue;
            }
#endif
            for (int64_t m0 = 0; m0 < M; m0 += KX_MT) {
                const int mt = (int)blz_min(KX_MT, M - m0);
                float r[KX_MT][16] __attribute__((aligned(64))), u[KX_MT][16] __attribute__((aligned(64)));
                kx_tile(kind, mt, w + g * gbytes, &a, m0, r);
                if (swiglu) kx_tile(kind, mt, w + (g + up) * gbytes, &a, m0, u);
                for (int m = 0; m < mt; ++m)
                    blz_epilogue_row(r[m], u[m], m0 + m, 16 * g, 16, N, nout, bias, residual, out, swiglu);
            }
        }
    }
    return rc;
#else
    /* the scalar build: the ggml rows back (the loader never packs there; this keeps every build's bits) */
    const int base = kx_base(kind);
    const int64_t bb = kblock_bytes(base), gb = kx_bytes(kind);
    uint8_t *rows = malloc((size_t)(N * nb * bb));
    if (!rows) return BLZ_ENOMEM;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t n = 0; n < N; ++n) /* w is read only: kx_move out of the group */
        for (int64_t b = 0; b < nb; ++b)
            kx_move(base, rows + (n * nb + b) * bb, (uint8_t *)(intptr_t)(w + (n / 16 * nb + b) * gb), (int)(n % 16), 0);
    const int rc = blz_linear_k(base, x, M, K, rows, NULL, N, bias, residual, out, swiglu, nthreads);
    free(rows);
    return rc;
#endif
}
