/* blazr kernels — linear layers with block-quantized weights (ggml Q4_0, Q4_1, Q8_0), packed by rows.
 *
 * Computes out[M, N] = x[M, K] · Wᵀ (+ bias[N]) (+ residual[M, N]), or in SwiGLU mode, for a fused
 * [gate; up] weight of N = 2·I rows, out[M, I] = silu(x·W_gateᵀ + b_gate) * (x·W_upᵀ + b_up).
 *
 * Weight values are ggml's (32 weights per block): Q4_0 w = d·(q − 8), Q4_1 w = d·q + m, Q8_0 w = d·q, with
 * f16 d and m. The bytes are blazr's "row-packed" layout (kernels/quant.py packs and unpacks it): the N rows
 * form G = ⌈N/16⌉ groups of 16 (the last padded with zero rows); a group is nb = K/32 tiles, one per block,
 * each holding that block of all 16 rows — the same bytes as 16 ggml blocks, rearranged:
 *   [16 × f16 d] [16 × f16 m, Q4_1 only] [quants]
 *   quants Q4_*: 4 chunks of 64 B; chunk p, bytes 4j..4j+3 = row j's nibble bytes 4p..4p+3 (low nibbles:
 *                elements 4p..4p+3, high nibbles: elements 16+4p..16+4p+3 — ggml's own nibble bytes)
 *   quants Q8_0: 8 chunks of 64 B; chunk c, bytes 4j..4j+3 = row j's elements 4c..4c+3, stored + 128 (u8)
 * So one 64-byte load gives 4 consecutive elements of each of the 16 rows: a vpdpbusd against the
 * activation's 4 matching bytes broadcast to all lanes leaves, in int32 lane j, row j's partial dot.
 *
 * Activations (as ggml's quantize_row_q8_0 / q8_1 on x86, bit for bit): per row and block of 32,
 * amax = max|x|, d = fp16(amax/127), q = round_half_even(x · (127/amax)) (0 when amax = 0), and for Q4_1's
 * offset term s = fp16(amax/127 · Σq). The integer block dot Σ qw·qx is exact in int32 (the weight offset,
 * 8 for Q4_0 and the +128 of Q8_0, is removed exactly by starting the sum at −offset·Σqx); then per block
 *     acc = fma((float)dot, dw·dx, acc)      [Q4_1: then acc = fma(m, s, acc)]
 * in fp32, blocks in order. Every output is computed by exactly this sequence whatever M is and wherever
 * its row falls in a tile, so a row's result never depends on its batch; the portable scalar path follows
 * the same sequence (explicit fmaf), and so does the AVX2 path (group_avx2: vpmaddubsw pair sums, exact),
 * so every build gives the same bits.
 *
 * Parallel strategy: OpenMP splits the row groups; inside, a tile of activation rows (up to 16 for a decode
 * batch, 8 for longer calls) shares each unpacked weight register, and each row keeps one 16-lane fp32
 * accumulator — no horizontal sums, no gathers, and 16 contiguous outputs per (row, group). A one-row call
 * (decode) instead walks each thread's groups as far-apart weight streams, balanced between the threads
 * (q_streams; blazr_kernels.h BLZ_STREAMS, host-tuned `streams_q`): a group is one run of bytes, and a core
 * reads faster with a few runs in flight (Zen 3, AVX2: Q4_0 16 → 22-24 GB/s in 4; NOTES §66).
 */
#include "blazr_kernels.h"

#define BLZ_RG 16 /* weight rows per packed group */
#ifndef BLZ_MT
#define BLZ_MT 16 /* activation rows per register tile, at most (≤ 16) */
#endif
/* Rows per tile: a decode batch of up to BLZ_MT rows is one tile (each weight register unpacked once:
 * 16 sequences' step 12.4 → 11.7 ms on SmolLM2); longer calls (prefill) take tiles of BLZ_MT_LONG = 8
 * (blazr_kernels.h), which keep the accumulators and the unpacked weights in registers (16-row tiles
 * prefilled 4% slower). */
#ifndef BLZ_PF_MT_AVX2
/* activation rows from which group_avx2 (no VNNI) prefetches as group_vnni does from 6: its dots take ~3× the
 * instructions, so its out-of-order window reaches fewer tiles ahead (Zen 3, cold 1B shapes, 2 threads, 2 / 3
 * / 4 rows: Q8_0 +11 / +22 / +34 %, Q4_0 +9 / +7 / +12 % against prefetching from 6; NOTES §66) */
#define BLZ_PF_MT_AVX2 2
#endif
#ifndef BLZ_PF_TILES
#define BLZ_PF_TILES 4 /* software prefetch distance of the weight stream, in tiles (0: none) */
#endif

BLZ_INLINE int64_t block_bytes(int kind) { return kind == BLZ_Q4_0 ? 18 : kind == BLZ_Q4_1 ? 20 : 34; }
BLZ_INLINE int64_t tile_bytes(int kind) { return BLZ_RG * block_bytes(kind); }
BLZ_INLINE int64_t tile_header(int kind) { return kind == BLZ_Q4_1 ? 64 : 32; }
BLZ_INLINE int32_t weight_offset(int kind) { return kind == BLZ_Q4_0 ? 8 : kind == BLZ_Q8_0 ? 128 : 0; }

BLZ_INLINE float round_fp16(float f) { return blz_fp16_to_fp32(blz_fp32_to_fp16(f)); }

/* Quantize one row x[K] (see the header comment). */
void blz_quantize_act_row(const float *restrict x, int64_t K, int32_t offset, int8_t *restrict q,
                             float *restrict d, float *restrict s, int32_t *restrict off) {
    for (int64_t b = 0; b < K / BLZ_QK; ++b) {
        const float *xb = x + b * BLZ_QK;
        int8_t *qb = q + b * BLZ_QK;
        int32_t sum = 0;
#ifdef BLZ_AVX512
        const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const __m512 id = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
        const __m512i i0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v0, id),
                                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512i i1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v1, id),
                                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)qb, _mm512_cvtsepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(qb + 16), _mm512_cvtsepi32_epi8(i1));
        sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
#elif defined(BLZ_AVX2)
        const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        __m256 v[4];
        for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(xb + 8 * i);
        __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], absm), _mm256_and_ps(v[1], absm)),
                                  _mm256_max_ps(_mm256_and_ps(v[2], absm), _mm256_and_ps(v[3], absm)));
        const float amax = blz_hmax256(mx);
        const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
        __m256i iv[4]; /* round half to even: the default MXCSR mode, as nearbyintf */
        for (int i = 0; i < 4; ++i) iv[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));
        _mm256_storeu_si256((__m256i *)qb, blz_bytes32(iv[0], iv[1], iv[2], iv[3]));
        const __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(iv[0], iv[1]), _mm256_add_epi32(iv[2], iv[3]));
        sum = blz_hsum256_epi32(s8);
#else
        float amax = 0.0f;
        for (int i = 0; i < BLZ_QK; ++i) amax = fmaxf(amax, fabsf(xb[i]));
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        for (int i = 0; i < BLZ_QK; ++i) {
            const float v = nearbyintf(xb[i] * id); /* round half to even (default rounding mode) */
            qb[i] = (int8_t)(v > 127.0f ? 127.0f : v < -128.0f ? -128.0f : v);
            sum += (int32_t)v;
        }
#endif
        const float db = amax / 127.0f;
        d[b] = round_fp16(db);
        s[b] = round_fp16(db * (float)sum);
        off[b] = -offset * sum;
    }
}

/* The integer block dot of weight-group row j (tile t) with activation block xq, offset included. */
static int32_t block_dot_scalar(int kind, const uint8_t *restrict t, int j, const int8_t *restrict xq,
                                int32_t off) {
    const uint8_t *qs = t + tile_header(kind);
    int32_t dot = off;
    if (kind == BLZ_Q8_0) {
        for (int c = 0; c < 8; ++c)
            for (int i = 0; i < 4; ++i) dot += (int32_t)qs[64 * c + 4 * j + i] * xq[4 * c + i];
    } else {
        for (int p = 0; p < 4; ++p)
            for (int i = 0; i < 4; ++i) {
                const uint8_t byte = qs[64 * p + 4 * j + i];
                dot += (byte & 15) * xq[4 * p + i] + (byte >> 4) * xq[16 + 4 * p + i];
            }
    }
    return dot;
}

/* Portable path: acc[m][j] = the dot products of the 16 rows of group wg with activation rows
 * m0 .. m0+mt-1, by the same per-block operations as the SIMD path. */
static void group_scalar(int kind, int mt, const uint8_t *restrict wg, const blz_act_t *restrict a, int64_t m0,
                         float acc[BLZ_MT][BLZ_RG]) {
    const int64_t tb = tile_bytes(kind), nb = a->nb;
    for (int m = 0; m < mt; ++m)
        for (int j = 0; j < BLZ_RG; ++j) acc[m][j] = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *t = wg + b * tb;
        for (int m = 0; m < mt; ++m) {
            const int64_t r = (m0 + m) * nb + b;
            const int8_t *xq = a->q + (m0 + m) * a->K + b * BLZ_QK;
            for (int j = 0; j < BLZ_RG; ++j) {
                uint16_t h;
                memcpy(&h, t + 2 * j, 2);
                const float sc = blz_fp16_to_fp32(h) * a->d[r];
                const int32_t dot = block_dot_scalar(kind, t, j, xq, kind == BLZ_Q4_1 ? 0 : a->off[r]);
                acc[m][j] = fmaf((float)dot, sc, acc[m][j]);
                if (kind == BLZ_Q4_1) {
                    memcpy(&h, t + 32 + 2 * j, 2);
                    acc[m][j] = fmaf(blz_fp16_to_fp32(h), a->s[r], acc[m][j]);
                }
            }
        }
    }
}

#ifdef BLZ_VNNI
/* Block b of a group (its tile t) against activation rows m0 .. m0+mt-1: acc[m] + their step. Lane j of a
 * vector is row j of the group; the 8 weight chunks are loaded (and for Q4 split into low / high nibbles)
 * once for all mt rows; each row runs two chains of four vpdpbusd (elements 0-15, 16-31) against its
 * broadcast activation bytes. */
BLZ_INLINE void block_vnni(const int kind, const int mt, const uint8_t *restrict t, const blz_act_t *restrict a,
                           const int64_t m0, const int64_t b, __m512 *acc) {
    const int64_t hdr = tile_header(kind), nb = a->nb;
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)t));
    const __m512 mw = kind == BLZ_Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(t + 32))) : dw;
    __m512i w[8]; /* w[c]: elements 4c..4c+3 of the 16 rows */
    if (kind == BLZ_Q8_0) {
        for (int c = 0; c < 8; ++c) w[c] = _mm512_loadu_si512(t + hdr + 64 * c);
    } else {
        for (int p = 0; p < 4; ++p) {
            const __m512i v = _mm512_loadu_si512(t + hdr + 64 * p);
            w[p] = _mm512_and_si512(v, lo4);
            w[p + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
        }
    }
    for (int m = 0; m < mt; ++m) {
        const int64_t r = (m0 + m) * nb + b;
        const int8_t *xq = a->q + (m0 + m) * a->K + b * BLZ_QK;
        __m512i s0 = kind == BLZ_Q4_1 ? _mm512_setzero_si512() : _mm512_set1_epi32(a->off[r]);
        __m512i s1 = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {
            s0 = _mm512_dpbusd_epi32(s0, w[c], blz_bcast4_512(xq + 4 * c));
            s1 = _mm512_dpbusd_epi32(s1, w[c + 4], blz_bcast4_512(xq + 16 + 4 * c));
        }
        const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(a->d[r]));
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), sc, acc[m]);
        if (kind == BLZ_Q4_1) acc[m] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a->s[r]), acc[m]);
    }
}

/* SIMD path of group_scalar: block_vnni over the group's blocks in order. */
BLZ_INLINE void group_vnni(const int kind, const int mt, const uint8_t *restrict wg, const blz_act_t *restrict a,
                           const int64_t m0, float acc_out[BLZ_MT][BLZ_RG]) {
    const int64_t tb = tile_bytes(kind);
    __m512 acc[BLZ_MT];
    for (int m = 0; m < mt; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < a->nb; ++b) {
        const uint8_t *t = wg + b * tb;
        /* Weights stream from memory once per call. With ≥ 6 rows per tile the out-of-order window reaches
         * too few tiles ahead and a DRAM-resident weight stalls (2x slower measured at 8 rows), so fetch
         * BLZ_PF_TILES tiles ahead; with fewer rows the hardware keeps up and the prefetches only cost. */
        if (BLZ_PF_TILES && mt >= 6)
            for (int64_t o = 0; o < tb; o += 64) _mm_prefetch((const char *)t + BLZ_PF_TILES * tb + o, _MM_HINT_T0);
        block_vnni(kind, mt, t, a, m0, b, acc);
    }
    for (int m = 0; m < mt; ++m) _mm512_storeu_ps(acc_out[m], acc[m]);
}

#if BLZ_STREAMS > 1
/* One activation row (M = 1) against ns ≤ BLZ_STREAMS groups far apart (one per stream, blazr_kernels.h),
 * their blocks walked together: acc_out[s] = group wg[s]'s dots by group_vnni's operations. */
BLZ_INLINE void groups1_vnni(const int ns, const int kind, const uint8_t *const *wg, const blz_act_t *restrict a,
                             float acc_out[][BLZ_RG]) {
    const int64_t tb = tile_bytes(kind);
    __m512 acc[BLZ_STREAMS];
    for (int s = 0; s < ns; ++s) acc[s] = _mm512_setzero_ps();
    for (int64_t b = 0; b < a->nb; ++b)
        for (int s = 0; s < ns; ++s) block_vnni(kind, 1, wg[s] + b * tb, a, 0, b, acc + s);
    for (int s = 0; s < ns; ++s) _mm512_storeu_ps(acc_out[s], acc[s]);
}
#endif
#endif

#if defined(BLZ_AVX2) && !defined(BLZ_VNNI)
/* Lane j (int32) = Σ of the 4 products u8 × s8 of bytes 4j..4j+3. vpmaddubsw sums pairs into int16 with
 * saturation, so the caller keeps every pair sum within ±32767 (see group_avx2). */
BLZ_INLINE __m256i maddubs_pairs(__m256i u, __m256i s) { return _mm256_maddubs_epi16(u, s); }

/* Block b of a group (its tile t) against activation row m0, both halves of the group in one pass, each
 * activation broadcast feeding both: acc[0] (rows 0-7) and acc[1] (rows 8-15) + their step — the same integer
 * dots and fmas as group_avx2's two passes, so the same bits. */
BLZ_INLINE void block1_avx2(const int kind, const uint8_t *restrict t, const blz_act_t *restrict a, const int64_t m0,
                            const int64_t b, __m256 acc[2]) {
    const __m256i lo4 = _mm256_set1_epi8(0x0f), flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    const uint8_t *qs = t + tile_header(kind);
    const int64_t r = m0 * a->nb + b;
    const int8_t *xq = a->q + m0 * a->K + b * BLZ_QK;
    __m256i d0, d1;
    if (kind == BLZ_Q8_0) {
        d0 = d1 = _mm256_setzero_si256();
        for (int c = 0; c < 8; ++c) {
            const __m256i xb = blz_bcast4_256(xq + 4 * c);
            const __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(qs + 64 * c)), flip);
            const __m256i w1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(qs + 64 * c + 32)), flip);
            d0 = _mm256_add_epi32(d0, _mm256_madd_epi16(maddubs_pairs(_mm256_abs_epi8(w0), _mm256_sign_epi8(xb, w0)), ones));
            d1 = _mm256_add_epi32(d1, _mm256_madd_epi16(maddubs_pairs(_mm256_abs_epi8(w1), _mm256_sign_epi8(xb, w1)), ones));
        }
    } else {
        __m256i p0 = _mm256_setzero_si256(), p1 = _mm256_setzero_si256();
        for (int p = 0; p < 4; ++p) {
            const __m256i xl = blz_bcast4_256(xq + 4 * p), xh = blz_bcast4_256(xq + 16 + 4 * p);
            const __m256i v0 = _mm256_loadu_si256((const __m256i *)(qs + 64 * p));
            const __m256i v1 = _mm256_loadu_si256((const __m256i *)(qs + 64 * p + 32));
            p0 = _mm256_add_epi16(p0, maddubs_pairs(_mm256_and_si256(v0, lo4), xl));
            p1 = _mm256_add_epi16(p1, maddubs_pairs(_mm256_and_si256(v1, lo4), xl));
            p0 = _mm256_add_epi16(p0, maddubs_pairs(_mm256_and_si256(_mm256_srli_epi16(v0, 4), lo4), xh));
            p1 = _mm256_add_epi16(p1, maddubs_pairs(_mm256_and_si256(_mm256_srli_epi16(v1, 4), lo4), xh));
        }
        d0 = _mm256_madd_epi16(p0, ones);
        d1 = _mm256_madd_epi16(p1, ones);
        if (kind == BLZ_Q4_0) {
            d0 = _mm256_add_epi32(d0, _mm256_set1_epi32(a->off[r]));
            d1 = _mm256_add_epi32(d1, _mm256_set1_epi32(a->off[r]));
        }
    }
    const __m256 dx = _mm256_set1_ps(a->d[r]);
    const __m256 sc0 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)t)), dx);
    const __m256 sc1 = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(t + 16))), dx);
    acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), sc0, acc[0]);
    acc[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), sc1, acc[1]);
    if (kind == BLZ_Q4_1) {
        const __m256 sx = _mm256_set1_ps(a->s[r]);
        acc[0] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(t + 32))), sx, acc[0]);
        acc[1] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(t + 48))), sx, acc[1]);
    }
}

/* AVX2 path of group_scalar (no VNNI): the 64-byte chunks hold rows 0-7 in their first 32 bytes and rows
 * 8-15 in the last 32, so each half of the group is one pass of 8-lane accumulators (the second pass
 * reads the group from L1/L2). The integer block dot is exact, as in the scalar path, and then the same
 * two fmas per block, so the bits equal the scalar and VNNI builds':
 *   Q4_*: weights are nibbles 0..15 and activations −127..127, so a vpmaddubsw pair sum is at most
 *         2·15·127 in magnitude and the 8 of a block (one per chunk half) add up to < 2^15 in int16;
 *         one vpmaddwd against ones then widens to int32.
 *   Q8_0: the stored byte is q + 128; with the signed weight q (byte ^ 0x80) the product is taken as
 *         |q| · (x · sign q) (vpsignb), whose pair sums stay within 2·128·127; widened per chunk. The
 *         −128·Σx offset term is then not needed (the dot starts at 0). */
BLZ_INLINE void group_avx2(const int kind, const int mt, const uint8_t *restrict wg, const blz_act_t *restrict a,
                           const int64_t m0, float acc_out[BLZ_MT][BLZ_RG]) {
    const int64_t tb = tile_bytes(kind), hdr = tile_header(kind), nb = a->nb;
    const __m256i lo4 = _mm256_set1_epi8(0x0f), flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    if (mt == 1) { /* one row (single-sequence decode): both halves in one pass (block1_avx2) */
        __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int64_t b = 0; b < nb; ++b) block1_avx2(kind, wg + b * tb, a, m0, b, acc);
        _mm256_storeu_ps(acc_out[0], acc[0]);
        _mm256_storeu_ps(acc_out[0] + 8, acc[1]);
        return;
    }
    for (int h = 0; h < 2; ++h) {
        __m256 acc[BLZ_MT];
        for (int m = 0; m < mt; ++m) acc[m] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t *t = wg + b * tb;
            if (BLZ_PF_TILES && mt >= BLZ_PF_MT_AVX2 && h == 0)
                for (int64_t o = 0; o < tb; o += 64) _mm_prefetch((const char *)t + BLZ_PF_TILES * tb + o, _MM_HINT_T0);
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(t + 16 * h)));
            const __m256 mw =
                kind == BLZ_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(t + 32 + 16 * h))) : dw;
            __m256i w[8]; /* w[c]: elements 4c..4c+3 of the 8 rows of this half */
            if (kind == BLZ_Q8_0) {
                for (int c = 0; c < 8; ++c)
                    w[c] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(t + hdr + 64 * c + 32 * h)), flip);
            } else {
                for (int p = 0; p < 4; ++p) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(t + hdr + 64 * p + 32 * h));
                    w[p] = _mm256_and_si256(v, lo4);
                    w[p + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
                }
            }
            for (int m = 0; m < mt; ++m) {
                const int64_t r = (m0 + m) * nb + b;
                const int8_t *xq = a->q + (m0 + m) * a->K + b * BLZ_QK;
                __m256i dot;
                if (kind == BLZ_Q8_0) {
                    dot = _mm256_setzero_si256();
                    for (int c = 0; c < 8; ++c) {
                        const __m256i xs = _mm256_sign_epi8(blz_bcast4_256(xq + 4 * c), w[c]);
                        dot = _mm256_add_epi32(dot, _mm256_madd_epi16(maddubs_pairs(_mm256_abs_epi8(w[c]), xs), ones));
                    }
                } else {
                    __m256i p16 = maddubs_pairs(w[0], blz_bcast4_256(xq));
                    p16 = _mm256_add_epi16(p16, maddubs_pairs(w[4], blz_bcast4_256(xq + 16)));
                    for (int c = 1; c < 4; ++c) {
                        p16 = _mm256_add_epi16(p16, maddubs_pairs(w[c], blz_bcast4_256(xq + 4 * c)));
                        p16 = _mm256_add_epi16(p16, maddubs_pairs(w[c + 4], blz_bcast4_256(xq + 16 + 4 * c)));
                    }
                    dot = _mm256_madd_epi16(p16, ones);
                    if (kind == BLZ_Q4_0) dot = _mm256_add_epi32(dot, _mm256_set1_epi32(a->off[r]));
                }
                const __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(a->d[r]));
                acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sc, acc[m]);
                if (kind == BLZ_Q4_1) acc[m] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a->s[r]), acc[m]);
            }
        }
        for (int m = 0; m < mt; ++m) _mm256_storeu_ps(acc_out[m] + 8 * h, acc[m]);
    }
}
#endif

/* acc[m][j] = dot products of group wg's 16 rows with activation rows m0 .. m0+mt-1 (mt ≤ BLZ_MT). */
static void group_dots(int kind, int mt, const uint8_t *wg, const blz_act_t *a, int64_t m0,
                       float acc[BLZ_MT][BLZ_RG]) {
#if defined(BLZ_VNNI) || defined(BLZ_AVX2)
#ifdef BLZ_VNNI
#define BLZ_GROUP group_vnni
#else
#define BLZ_GROUP group_avx2
#endif
#define BLZ_CASE(K, MT)                          \
    case (K) * 16 + (MT) - 1:                    \
        BLZ_GROUP((K), (MT), wg, a, m0, acc);    \
        return;
#if BLZ_MT > 8
#define BLZ_KIND_HI(K) \
    BLZ_CASE(K, 9) BLZ_CASE(K, 10) BLZ_CASE(K, 11) BLZ_CASE(K, 12) BLZ_CASE(K, 13) BLZ_CASE(K, 14) BLZ_CASE(K, 15) BLZ_CASE(K, 16)
#else
#define BLZ_KIND_HI(K)
#endif
#define BLZ_KIND(K) \
    BLZ_CASE(K, 1) BLZ_CASE(K, 2) BLZ_CASE(K, 3) BLZ_CASE(K, 4) BLZ_CASE(K, 5) BLZ_CASE(K, 6) BLZ_CASE(K, 7) BLZ_CASE(K, 8) \
    BLZ_KIND_HI(K)
    switch (kind * 16 + mt - 1) {
        BLZ_KIND(BLZ_Q4_0)
        BLZ_KIND(BLZ_Q4_1)
        BLZ_KIND(BLZ_Q8_0)
    }
#undef BLZ_KIND
#undef BLZ_KIND_HI
#undef BLZ_CASE
#undef BLZ_GROUP
#endif
    group_scalar(kind, mt, wg, a, m0, acc);
}

/* Lay out the activation buffers of an M×K call in the calling thread's scratch. */
int blz_act_alloc(blz_act_t *a, int64_t M, int64_t K) {
    a->K = K;
    a->nb = K / BLZ_QK;
    const size_t qb = (size_t)blz_round_up(M * K, 64), fb = (size_t)blz_round_up(M * a->nb * 4, 64);
    uint8_t *buf = blz_scratch(qb + 3 * fb);
    if (!buf) return BLZ_ENOMEM;
    a->q = (int8_t *)buf;
    a->d = (float *)(buf + qb);
    a->s = (float *)(buf + qb + fb);
    a->off = (int32_t *)(buf + qb + 2 * fb);
    return BLZ_OK;
}

#if defined(BLZ_AVX2) && BLZ_STREAMS > 1
#ifdef BLZ_VNNI
#define GROUPS1 groups1_vnni
#else
#define GROUPS1 groups1_avx2
/* One activation row (M = 1) against ns ≤ BLZ_STREAMS groups far apart (one per stream, blazr_kernels.h),
 * their blocks walked together: acc_out[s] = group wg[s]'s dots by group_avx2's one-row operations. */
BLZ_INLINE void groups1_avx2(const int ns, const int kind, const uint8_t *const *wg, const blz_act_t *restrict a,
                             float acc_out[][BLZ_RG]) {
    const int64_t tb = tile_bytes(kind);
    __m256 acc[BLZ_STREAMS][2];
    for (int s = 0; s < ns; ++s) acc[s][0] = acc[s][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < a->nb; ++b)
        for (int s = 0; s < ns; ++s) block1_avx2(kind, wg[s] + b * tb, a, 0, b, acc[s]);
    for (int s = 0; s < ns; ++s) {
        _mm256_storeu_ps(acc_out[s], acc[s][0]);
        _mm256_storeu_ps(acc_out[s] + 8, acc[s][1]);
    }
}
#endif

/* groups1_vnni / groups1_avx2 with ns and kind as constants. */
static void groups1(int kind, int ns, const uint8_t *const *wg, const blz_act_t *a, float acc[][BLZ_RG]) {
    if (kind == BLZ_Q4_0)
        BLZ_TILE_SWITCH(GROUPS1, ns, BLZ_Q4_0, wg, a, acc)
    else if (kind == BLZ_Q4_1)
        BLZ_TILE_SWITCH(GROUPS1, ns, BLZ_Q4_1, wg, a, acc)
    else
        BLZ_TILE_SWITCH(GROUPS1, ns, BLZ_Q8_0, wg, a, acc)
}
#undef GROUPS1

/* blz_linear_q at M = 1 (activations quantized in a; SwiGLU only with I a multiple of 16, so that an output
 * group's up rows are one packed group): this thread's block of groups cut into BLZ_STREAMS parts (SwiGLU:
 * half as many, each read with its up group), group i of every part run together; the
 * steps walked balanced between the threads (blz_walk_t). */
static void q_streams(int kind, const uint8_t *w, int64_t group_bytes, int64_t ngroups, int64_t N, int64_t nout,
                      const blz_act_t *a, const float *bias, const float *residual, float *out, int swiglu,
                      blz_team_t *team) {
    const int S = team->S;
    blz_walk_t wk;
    blz_walk_begin(&wk, team);
    for (int64_t i; blz_walk_step(&wk, &i);) {
        const uint8_t *wg[BLZ_STREAMS];
        int64_t g[BLZ_STREAMS];
        const int ns = blz_stream_step(wk.lo, wk.hi, wk.q, S, i, g);
        for (int s = 0; s < ns; ++s) {
            wg[s] = w + g[s] * group_bytes;
            if (swiglu) wg[ns + s] = w + (nout / BLZ_RG + g[s]) * group_bytes;
        }
        float r[BLZ_STREAMS][BLZ_RG] __attribute__((aligned(64)));
        groups1(kind, swiglu ? 2 * ns : ns, wg, a, r);
        for (int s = 0; s < ns; ++s) {
            const int64_t n0 = g[s] * BLZ_RG;
#ifdef BLZ_VNNI
            const __m512 uv = swiglu ? _mm512_load_ps(r[ns + s]) : _mm512_setzero_ps();
            blz_epilogue16(_mm512_load_ps(r[s]), uv, 0, n0, (int)blz_min(BLZ_RG, nout - n0), N, nout, bias,
                           residual, out, swiglu);
#else /* blz_q_group_run's epilogue */
            blz_epilogue_row(r[s], r[swiglu ? ns + s : s], 0, n0, blz_min(BLZ_RG, nout - n0), N, nout, bias,
                             residual, out, swiglu);
#endif
        }
    }
}
#endif

/* Output group n0 .. n0+nn-1 (nn ≤ 16) for all M activation rows of `a`: the dots of packed group wg (and, in
 * SwiGLU mode, of the up rows' packed groups uw0 / uw1, the outputs' up values starting at row `shift` of
 * uw0 and running on into uw1, which may be NULL when they do not), then the epilogue. Activation rows in
 * tiles of `tile`. */
void blz_q_group_run(int kind, const blz_act_t *a, int64_t M, int64_t tile, const uint8_t *wg, const uint8_t *uw0,
                     const uint8_t *uw1, int64_t shift, int64_t n0, int64_t nn, int64_t N, int64_t nout,
                     const float *bias, const float *residual, float *out, int swiglu) {
    float r[BLZ_MT][BLZ_RG] __attribute__((aligned(64)));
    float u[2][BLZ_MT][BLZ_RG] __attribute__((aligned(64)));
    for (int64_t m0 = 0; m0 < M; m0 += tile) {
        const int mt = (int)blz_min(tile, M - m0);
        group_dots(kind, mt, wg, a, m0, r);
        if (swiglu) {
            group_dots(kind, mt, uw0, a, m0, u[0]);
            if (shift + nn > BLZ_RG && uw1) group_dots(kind, mt, uw1, a, m0, u[1]);
        }
        for (int m = 0; m < mt; ++m) {
            float up[2 * BLZ_RG]; /* this row's up values for the group's outputs start at up[shift] */
            if (swiglu) {
                memcpy(up, u[0][m], sizeof(u[0][m]));
                if (shift + nn > BLZ_RG) memcpy(up + BLZ_RG, u[1][m], sizeof(u[1][m]));
            }
            blz_epilogue_row(r[m], up + shift, m0 + m, n0, nn, N, nout, bias, residual, out, swiglu);
        }
    }
}

/* out = x·Wᵀ (+bias) (+residual) or the SwiGLU form; see the file header. x [M, K], w packed [⌈N/16⌉
 * groups], bias [N] or NULL, residual [M, N] or NULL (may equal out), out [M, N] (SwiGLU: [M, N/2]).
 * SwiGLU: output group g takes gate rows 16g.. and up rows I + 16g.. (I = N/2); when I is not a multiple
 * of 16 those up rows straddle two packed groups, and both are computed. */
BLZ_EXPORT int blz_linear_q(int kind, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N,
                            const float *bias, const float *residual, float *out, int swiglu, int nthreads) {
    const int64_t *tab = kind & BLZ_ROWS ? (const int64_t *)w : NULL; /* w is a row table */
    if (kind & BLZ_XF32) /* fp32 activations: Q8_0 as stored only (linear_q8xf.c) */
        return (kind & ~(BLZ_ROWS | BLZ_XF32)) == BLZ_Q8_0G
                   ? blz_linear_q8g_xf(x, M, K, tab ? NULL : w, tab, N, bias, residual, out, swiglu, nthreads)
                   : BLZ_EINVAL;
    kind &= ~BLZ_ROWS;
    if (kind >= BLZ_Q4_K && kind <= BLZ_Q6_K) /* GGUF K-quants: linear_k.c */
        return blz_linear_k(kind, x, M, K, tab ? NULL : w, tab, N, bias, residual, out, swiglu, nthreads);
    if (blz_is_kx(kind) && !tab) /* K-quants in 16-row groups */
        return blz_linear_kx(kind, x, M, K, w, N, bias, residual, out, swiglu, nthreads);
    if ((kind == BLZ_BF16Z || kind == BLZ_F32Z) && !tab) /* bf16 / f32 with coded exponents: linear_coded.c */
        return blz_linear_coded(kind == BLZ_F32Z, x, M, K, w, N, bias, residual, out, swiglu, nthreads);
    if (kind == BLZ_KMIX && !tab) /* a fused weight's segments of different kinds: linear_mix.c */
        return blz_linear_mix(x, M, K, w, N, bias, residual, out, swiglu, nthreads);
    if (kind == BLZ_Q8_0G) /* Q8_0 as a GGUF stores it: linear_q8.c */
        return blz_linear_q8g(x, M, K, tab ? NULL : w, tab, N, bias, residual, out, swiglu, nthreads);
    if (kind == BLZ_MXFP4 || kind == BLZ_Q5_0) /* MXFP4 / Q5_0 as a GGUF stores them: linear_b32.c */
        return blz_linear_b32(kind, x, M, K, tab ? NULL : w, tab, N, bias, residual, out, swiglu, nthreads);
    if (tab) return BLZ_EINVAL; /* packed kinds are never listed by row */
    if (kind < BLZ_Q4_0 || kind > BLZ_Q8_0 || M < 0 || N < 0 || K <= 0 || K % BLZ_QK) return BLZ_EINVAL;
    if (swiglu && (N % 2 || residual)) return BLZ_EINVAL;
    if (M == 0 || N == 0) return BLZ_OK;
    blz_act_t a;
    if (blz_act_alloc(&a, M, K)) return BLZ_ENOMEM;
    const int64_t group_bytes = a.nb * tile_bytes(kind), nout = swiglu ? N / 2 : N;
    const int64_t ngroups = (nout + BLZ_RG - 1) / BLZ_RG, nall = (N + BLZ_RG - 1) / BLZ_RG;
    const int nt = blz_threads(nthreads, M * N * K, BLZ_LINEAR_PARALLEL_MIN);
    const int64_t tile = M <= BLZ_MT ? BLZ_MT : BLZ_MT_LONG;
#if defined(BLZ_AVX2) && BLZ_STREAMS > 1
    if (M == 1 && (!swiglu || nout % BLZ_RG == 0)) {
        blz_quantize_act_row(x, K, weight_offset(kind), a.q, a.d, a.s, a.off);
        blz_team_t team;
        blz_team_init(&team, nt, ngroups, blz_gemv_parts(BLZ_TUNE_STREAMS_Q, 1, swiglu));
#pragma omp parallel num_threads(nt)
        q_streams(kind, w, group_bytes, ngroups, N, nout, &a, bias, residual, out, swiglu, &team);
        return BLZ_OK;
    }
#endif
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; ++m)
            blz_quantize_act_row(x + m * K, K, weight_offset(kind), a.q + m * K, a.d + m * a.nb,
                             a.s + m * a.nb, a.off + m * a.nb);
#pragma omp for schedule(static)
        for (int64_t g = 0; g < ngroups; ++g) {
            const int64_t n0 = g * BLZ_RG, nn = blz_min(BLZ_RG, nout - n0);
            const int64_t ug = (nout + n0) / BLZ_RG, shift = (nout + n0) % BLZ_RG; /* SwiGLU up rows */
            blz_q_group_run(kind, &a, M, tile, w + g * group_bytes, w + ug * group_bytes,
                            ug + 1 < nall ? w + (ug + 1) * group_bytes : NULL, shift, n0, nn, N, nout, bias,
                            residual, out, swiglu);
        }
    }
    return BLZ_OK;
}

/* The activation quantization of blz_linear_q on its own (for tests): q [M, K] int8, d and s [M, K/32]. */
BLZ_EXPORT int blz_quantize_act(const float *x, int64_t M, int64_t K, int8_t *q, float *d, float *s) {
    if (M < 0 || K <= 0 || K % BLZ_QK) return BLZ_EINVAL;
    if (M == 0) return BLZ_OK;
    int32_t *off = blz_scratch((size_t)(K / BLZ_QK) * sizeof(int32_t));
    if (!off) return BLZ_ENOMEM;
    for (int64_t m = 0; m < M; ++m)
        blz_quantize_act_row(x + m * K, K, 0, q + m * K, d + m * (K / BLZ_QK), s + m * (K / BLZ_QK), off);
    return BLZ_OK;
}
