/* blazr kernels — what the K-quant linear files share (linear_k.c, linear_k_groups.c): ggml's K-quant
 * super-block sizes and fields, the Q8_K activations of a call, the row segments of a weight, and the unpacking
 * of a super-block's quants. See linear_k.c's header comment for the formats and the arithmetic.
 */
#ifndef BLAZR_KQUANT_H
#define BLAZR_KQUANT_H

#include "blazr_kernels.h"

#define QK_K 256

BLZ_INLINE int64_t kblock_bytes(int kind) { return kind == BLZ_Q4_K ? 144 : kind == BLZ_Q5_K ? 176 : 210; }
BLZ_INLINE int has_mins(int kind) { return kind != BLZ_Q6_K; }

/* Q8_K activations of one call. */
typedef struct {
    int8_t *q;      /* [M][K] */
    int8_t *qz;     /* M = 1 with BLZ_TUNE_K1_ZMM: q in row1_sums512's order (linear_k.c), else NULL */
    float *d;       /* [M][nb] dx */
    int16_t *bs;    /* [M][nb][16] sums of q per 16 */
    int16_t *xs;    /* [M][nb][8] sums of q per 32 (bs[2j] + bs[2j+1]) */
    int64_t K, nb;
} actk_t;

/* One activation row x[K] → Q8_K (linear_k.c's header): q [K], d [nb], bs [nb][16] sums per 16, xs [nb][8] sums
 * per 32 — shared with linear_kx.c. */
void blz_quantize_q8k_row(const float *restrict x, int64_t nb, int8_t *restrict q, float *restrict d,
                          int16_t *restrict bs, int16_t *restrict xs);

/* Q4_K / Q5_K: the 12-byte field → 8 six-bit scales (bytes of sc[0..1]) and 8 six-bit mins (mn[0..1]),
 * four bytes at a time: bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7, bytes 4-7
 * the same for the mins, bytes 8-11 the low 4 bits of scales 4-7 (low nibbles) and mins 4-7 (high). */
BLZ_INLINE void k4_scales(const uint8_t *restrict p, uint32_t sc[2], uint32_t mn[2]) {
    uint32_t w[3];
    memcpy(w, p, 12);
    sc[0] = w[0] & 0x3f3f3f3fu;
    mn[0] = w[1] & 0x3f3f3f3fu;
    sc[1] = (w[2] & 0x0f0f0f0fu) | (((w[0] >> 6) & 0x03030303u) << 4);
    mn[1] = ((w[2] >> 4) & 0x0f0f0f0fu) | (((w[1] >> 6) & 0x03030303u) << 4);
}

BLZ_INLINE float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return blz_fp16_to_fp32(h);
}

#ifdef BLZ_AVX2
/* Q6_K: the unsigned quants (q + 32, 0..63) of half h of a super-block, sub-blocks 4h .. 4h+3 → w[0..3]
 * (32 bytes each, element order as unpack_scalar). */
BLZ_INLINE void q6k_quants(const uint8_t *restrict blk, const int h, __m256i w[4]) {
    const __m256i lo4 = _mm256_set1_epi8(0x0f), b30 = _mm256_set1_epi8(0x30);
    const __m256i l0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h));
    const __m256i l1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32));
    const __m256i hh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
    w[0] = _mm256_or_si256(_mm256_and_si256(l0, lo4), _mm256_and_si256(_mm256_slli_epi16(hh, 4), b30));
    w[1] = _mm256_or_si256(_mm256_and_si256(l1, lo4), _mm256_and_si256(_mm256_slli_epi16(hh, 2), b30));
    w[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), lo4), _mm256_and_si256(hh, b30));
    w[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), lo4),
                           _mm256_and_si256(_mm256_srli_epi16(hh, 2), b30));
}

/* Q4_K / Q5_K: the quants of sub-blocks 2c and 2c+1 (nibbles of the 32 bytes qs + 32c; Q5_K: bit 4 from
 * bit 2c / 2c+1 of qh, the super-block's 32 high-bit bytes) → w[0], w[1]. */
BLZ_INLINE void k45_quants(const int kind, const uint8_t *restrict qs, const __m256i qh, const int c, __m256i w[2]) {
    const __m256i lo4 = _mm256_set1_epi8(0x0f);
    const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
    w[0] = _mm256_and_si256(q, lo4);
    w[1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), lo4);
    if (kind == BLZ_Q5_K)
        for (int i = 0; i < 2; ++i) {
            const __m256i bit = _mm256_set1_epi8((char)(1 << (2 * c + i)));
            w[i] = _mm256_or_si256(w[i], _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit),
                                                          _mm256_set1_epi8(0x10)));
        }
}

#endif

/* Row segments of a weight: one for a plain kind; for BLZ_KMIX (a fused weight whose parts are stored in
 * different K-quant kinds, e.g. q|k in Q4_K and v in Q6_K — llama.cpp's Q4_K_M mixes) the table at the start
 * of the bytes: int32 count n ≤ KSEG_MAX, int32 kinds[KSEG_MAX], int32 rows[KSEG_MAX] (64 bytes), then each
 * segment's rows in its own ggml layout, one after another. */
#define KSEG_MAX 7
typedef struct {
    int n;
    int kind[KSEG_MAX];
    int64_t row0[KSEG_MAX + 1]; /* first row of each segment; row0[n] = N */
    const uint8_t *base[KSEG_MAX];
    int64_t row_bytes[KSEG_MAX];
} ksegs_t;

/* The segment holding row n. */
BLZ_INLINE int kseg_of(const ksegs_t *sg, int64_t n) {
    int i = 0;
    while (n >= sg->row0[i + 1]) ++i;
    return i;
}

/* The address of row n (of the gate rows, or in SwiGLU mode n ≥ nout, the up rows): from the row table when
 * there is one, else in its segment. */
BLZ_INLINE const uint8_t *krow(const ksegs_t *sg, const int64_t *tab, int64_t n) {
    if (tab) return (const uint8_t *)(intptr_t)tab[n];
    const int s = kseg_of(sg, n);
    return sg->base[s] + (n - sg->row0[s]) * sg->row_bytes[s];
}

#define KX4_BYTES 2304 /* one super-block of a q4_kx 16-row group (linear_kx.c's header) */
#define KX5_BYTES 2816 /* of a q5_kx group */
#define KX6_BYTES 3360 /* of a q6_kx group */
/* The stored kind of a 16-row-group kind (BLZ_Q4_KX → BLZ_Q4_K …), and a group's super-block bytes by stored kind. */
BLZ_INLINE int kx_base(int kx) { return kx == BLZ_Q4_KX ? BLZ_Q4_K : kx == BLZ_Q5_KX ? BLZ_Q5_K : BLZ_Q6_K; }
BLZ_INLINE int64_t kx_group_bytes(int base) { return base == BLZ_Q4_K ? KX4_BYTES : base == BLZ_Q5_K ? KX5_BYTES : KX6_BYTES; }

#ifndef KG_MIN
#define KG_MIN 24 /* activation rows from which AVX-512 VNNI builds take linear_k_groups.c's path */
#endif

#ifdef BLZ_VNNI
#define KG 16 /* weight rows per group of linear_k_groups.c (the int32 / fp32 lanes) */
/* linear_k_groups.c: out rows m of outputs n0 .. n0+nn-1 (nn ≤ KG, one segment; SwiGLU: with their up rows)
 * for all M activation rows of `a`, by blz_linear_k's arguments — a group of KG rows re-laid in the calling
 * thread's scratch (slot 3), then run KG_MT activation rows at a time. */
int blz_kgroup_run(const ksegs_t *sg, const int64_t *tab, const actk_t *a, int64_t M, int64_t n0, int nn, int64_t N,
                   int64_t nout, const float *bias, const float *residual, float *out, int swiglu);
/* The same for outputs n0 .. n0+15 of a q4_kx / q5_kx / q6_kx weight (linear_kx.c): its group `gate` (SwiGLU:
 * and `up`) re-laid from the 16-row-group layout instead of from ggml rows. */
int blz_kgroup_run_kx(int kind, const uint8_t *gate, const uint8_t *up, const actk_t *a, int64_t M, int64_t n0,
                      int64_t N, int64_t nout, const float *bias, const float *residual, float *out, int swiglu);

/* A q4_kx / q5_kx super-block's scale / min fields (at p + 64) decoded for its 16 rows: bytes 0-3 of each dword of
 * sc[0] / mn[0] are the row's scales / mins 0-3, of sc[1] / mn[1] 4-7 (k4_scales on 16 rows at once). */
BLZ_INLINE void kx4_scales(const uint8_t *p, __m512i sc[2], __m512i mn[2]) {
    const __m512i lo4 = _mm512_set1_epi8(0x0f), m3f = _mm512_set1_epi8(0x3f), m03 = _mm512_set1_epi8(0x03);
    const __m512i w0 = _mm512_loadu_si512(p + 64), w1 = _mm512_loadu_si512(p + 128), w2 = _mm512_loadu_si512(p + 192);
    sc[0] = _mm512_and_si512(w0, m3f);
    mn[0] = _mm512_and_si512(w1, m3f);
    sc[1] = _mm512_or_si512(_mm512_and_si512(w2, lo4), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w0, 6), m03), 4));
    mn[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w2, 4), lo4),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w1, 6), m03), 4));
}

/* kx4_scales' mins as int16 pairs: mp[q], lane r = row r's mins 2q and 2q + 1, so that Σ_q vpdpwssd(mp[q], the
 * activation's sums per 32, pair q broadcast) leaves row r's Σ_j m[j]·xs[j] in lane r (linear_k_groups.c's KG_MN). */
BLZ_INLINE void kx4_min_pairs(const __m512i mn[2], __m512i mp[4]) {
    /* per dword: bytes 0 and 1 (pair 2q), or 2 and 3 (pair 2q + 1), zero-extended: one vpshufb each */
    const __m512i lo = _mm512_set4_epi32(0x800d800c, 0x80098008, 0x80058004, 0x80018000);
    const __m512i hi = _mm512_set4_epi32(0x800f800e, 0x800b800a, 0x80078006, 0x80038002);
    for (int q = 0; q < 4; ++q) mp[q] = _mm512_shuffle_epi8(mn[q / 2], q % 2 ? hi : lo);
}

/* A q6_kx super-block's unsigned quants (q + 32) of half h, chunk column i (i < 8) for its 16 rows: e[t] holds
 * elements 128h + 32t + 4i .. + 3 of each row (q6k_quants' operations on the group's ql / qh chunks). */
BLZ_INLINE void kx6_quants(const uint8_t *p, const int h, const int i, __m512i e[4]) {
    const __m512i lo4 = _mm512_set1_epi8(0x0f), b30 = _mm512_set1_epi8(0x30);
    const __m512i A = _mm512_loadu_si512(p + 288 + 64 * (16 * h + i));
    const __m512i B = _mm512_loadu_si512(p + 288 + 64 * (16 * h + 8 + i));
    const __m512i H = _mm512_loadu_si512(p + 2336 + 64 * (8 * h + i));
    e[0] = _mm512_or_si512(_mm512_and_si512(A, lo4), _mm512_and_si512(_mm512_slli_epi16(H, 4), b30));
    e[1] = _mm512_or_si512(_mm512_and_si512(B, lo4), _mm512_and_si512(_mm512_slli_epi16(H, 2), b30));
    e[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(A, 4), lo4), _mm512_and_si512(H, b30));
    e[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(B, 4), lo4), _mm512_and_si512(_mm512_srli_epi16(H, 2), b30));
}
#endif

#endif
