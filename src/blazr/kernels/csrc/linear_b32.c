/* blazr kernels — linear layers with 32-value block weights run as a GGUF stores them whose values decode to
 * int8 under one scale per block: MXFP4 (kind BLZ_MXFP4, ggml's block_mxfp4; GPT-OSS's experts) and Q5_0
 * (kind BLZ_Q5_0, ggml's block_q5_0; llama.cpp's K-quant files keep it where a row is no multiple of 256).
 *
 * Computes out[M, N] = x[M, K] · Wᵀ (+ bias[N]) (+ residual[M, N]), or the SwiGLU form of linear_q8.c, reached
 * through blz_linear_q (kind codes BLZ_MXFP4 / BLZ_Q5_0), rows from w or through a row table (BLZ_ROWS).
 *
 * Weights are ggml's bytes, row after row, never repacked: a row is nb = K/32 blocks of
 *   MXFP4, 17 bytes: [e8m0 e][16 bytes of e2m1 codes: byte j holds element j in its low nibble, j + 16 in its
 *     high one]. As llama.cpp's ggml_vec_dot_mxfp4_q8_0, the codes are read as the doubled values
 *     kvalues_mxfp4 = {0, 1, 2, 3, 4, 6, 8, 12, 0, −1, … , −12} (int8) under the halved scale dw = 2^(e − 128)
 *     (GGML_E8M0_TO_FP32_HALF: exact, a subnormal for e < 2), so w = dw·kv = e2m1 · 2^(e − 127), the OCP value;
 *   Q5_0, 22 bytes: [f16 d][u32 qh: bit j = element j's fifth bit][16 bytes of low nibbles, as MXFP4's], the
 *     int8 value v = (nibble | bit << 4) − 16 in −16 … 15 under dw = d (ggml's ggml_vec_dot_q5_0_q8_0).
 * Activations as every 32-block kind's (linear_q.c's blz_quantize_act_row, ggml's quantize_row_q8_0): per
 * block dx = fp16(amax/127), qx = round_half_even(x·127/amax). Then per block, in order,
 *     acc = fma((float)Σ v·qx, dw·dx, acc)          (the integer dot exact: |v| ≤ 16, |qx| ≤ 127)
 * in fp32 — q8_0g's operations on the weight's int8 values v and the scale dw, so every build (scalar fmaf,
 * AVX2 vpmaddubsw, AVX-512 VNNI vpdpbusd) and every path below gives the same bits, and a row's result never
 * depends on its batch.
 *
 * Decoding to int8 in registers (decode_avx2): MXFP4's codes by one vpshufb against the 16-entry table (both
 * nibbles of a block's 16 bytes in one 256-bit register); Q5_0's nibbles the same way, its 32 fifth bits
 * spread to bytes (vpshufb of the broadcast word, or with a bit mask, compare), the −16 folded in as ggml
 * does (a clear bit sets the high nibble: v = nibble − 16 as int8). Then the dot is q8_0g's:
 * vpdpbusd(|v|, sign(qx, v)) (AVX2: vpmaddubsw + vpmaddwd).
 *
 * Paths: one activation row (M = 1, decode; AVX2 builds) walks the 8-row tiles as linear_q8.c's q8g_streams
 * walks its own — each thread's block of tiles cut into up to BLZ_STREAMS far-apart parts read together
 * (knob BLZ_TUNE_STREAMS_B32, chosen per host by kernels/tuning.py), balanced between the threads — with the
 * values decoded unsigned, u = v + c (Q5_0: the nibble and its fifth bit, c = 16; MXFP4: KV + 12), so the dot is
 * one vpdpbusd(u, qx) (AVX2: vpmaddubsw + vpmaddwd) and the exact integer correction −c·Σqx of the activation
 * block (blz_quantize_act_row's `off`), the block's scales widened 8 at a time (vcvtph2ps): the same integer
 * dots, so the same bits, in about a third of the instructions of the signed decode (tiles1_avx2). Other calls
 * with fewer than MX_PACK_MIN(kind) activation rows (decode batches) walk the output rows in tiles of QR = 8 — each
 * block of the 8 rows decoded once for up to QT activation rows, the 8 rows' dots reduced at once
 * (blz_hsum8x8_epi32), the next tile's rows prefetched as it goes. Longer calls (prefill) re-lay each 16-row output group as
 * linear_q.c's packed Q8_0 (values v, d = fp16(dw)) in the thread's scratch and run the packed kernel's group
 * (blz_q_group_run): the same integers and fmas, so the same bits, at the packed kernel's rate — where every
 * scale of the group is exact in fp16 (Q5_0's always; MXFP4's for e in 104 … 143, GPT-OSS's all); a group
 * with another scale runs the tiles.
 *
 * Shapes: M activation rows, K in features (a multiple of 32), N out features (SwiGLU: N = 2·I), nb = K/32.
 */
#include "blazr_kernels.h"
#include "tile8.h"

#define QT 16  /* activation rows per tile, at most */
#define Q8B 34 /* bytes per Q8_0 block (the packed path's re-laid rows) */
#ifndef MX_PACK_MIN
/* Activation rows from which a call runs the packed Q8_0 kernel (as linear_q8.c's): Q5_0 from 16, MXFP4 from 28
 * (its 16-24-row calls ran 1.07-1.66× faster as tiles; Zen 5, LFM2-350M's shapes cold, NOTES §64). */
#define MX_PACK_MIN(kind) ((kind) == BLZ_MXFP4 ? 28 : 16)
#endif
#ifndef BLZ_MX_PF
#define BLZ_MX_PF 1 /* 1: prefetch the next tile's rows a block column at a time; 0: none */
#endif

/* Bytes per block of a kind: MXFP4 e8m0 e + 16 bytes of nibbles; Q5_0 f16 d + 4 bytes of fifth bits + 16. */
#define QB(kind) ((kind) == BLZ_MXFP4 ? 17 : 22)

/* The e2m1 codes' values doubled (ggml's kvalues_mxfp4): code = sign << 3 | exponent << 1 | mantissa. */
static const int8_t KV[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 2^(e − 128), ggml's GGML_E8M0_TO_FP32_HALF bit for bit (e < 2: the subnormals 2^−128, 2^−127). */
BLZ_INLINE float e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Block blk's scale dw in fp32 (MXFP4: 2^(e − 128); Q5_0: its f16 d widened, exact). */
BLZ_INLINE float block_scale(const int kind, const uint8_t *blk) {
    if (kind == BLZ_MXFP4) return e8m0_half(blk[0]);
    uint16_t h;
    memcpy(&h, blk, 2);
    return blz_fp16_to_fp32(h);
}

/* Whether block blk's scale is a float16 (normal or subnormal): then the packed Q8_0 kernel's fp16 scale
 * holds it (Q5_0's is one; MXFP4's 2^(e − 128) for e in 104 … 143). */
BLZ_INLINE int is_fp16_scale(const int kind, const uint8_t *blk) {
    return kind != BLZ_MXFP4 || (blk[0] >= 104 && blk[0] <= 143);
}

/* Block blk's 32 int8 values v, in element order. */
BLZ_INLINE void decode_scalar(const int kind, const uint8_t *blk, int8_t v[BLZ_QK]) {
    if (kind == BLZ_MXFP4) {
        for (int j = 0; j < BLZ_QK / 2; ++j) {
            v[j] = KV[blk[1 + j] & 15];
            v[j + 16] = KV[blk[1 + j] >> 4];
        }
        return;
    }
    uint32_t qh;
    memcpy(&qh, blk + 2, 4);
    for (int j = 0; j < BLZ_QK / 2; ++j) {
        v[j] = (int8_t)(((blk[6 + j] & 15) | ((qh >> j) & 1) << 4) - 16);
        v[j + 16] = (int8_t)(((blk[6 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16);
    }
}

/* Portable path: acc[m][r] = the dot products of weight rows rows[0..nr-1] with activation rows
 * m0 .. m0+mt-1, by the operations of the header comment. */
__attribute__((unused)) static void tile_scalar(const int kind, const uint8_t *const rows[QR], int nr,
                                                const blz_act_t *restrict a, int64_t m0, int mt, float acc[QT][QR]) {
    for (int m = 0; m < mt; ++m)
        for (int r = 0; r < QR; ++r) acc[m][r] = 0.0f;
    for (int64_t b = 0; b < a->nb; ++b)
        for (int r = 0; r < nr; ++r) {
            const uint8_t *blk = rows[r] + b * QB(kind);
            int8_t v[BLZ_QK];
            decode_scalar(kind, blk, v);
            blz_tile_block_scalar(v, block_scale(kind, blk), a, b, m0, mt, r, acc);
        }
}

#ifdef BLZ_AVX2
/* Block blk's 32 values v as int8 lanes in element order: low nibbles (elements 0-15) in the low half, high
 * nibbles (16-31) in the high half — MXFP4's looked up in `lut` (KV in both halves) by one vpshufb; Q5_0's
 * with the fifth bits: bit j spread to byte j (vpshufb of the broadcast word: byte j takes word byte j/8,
 * then or with a mask of all bits but j % 8, compare with 0xff), a clear bit setting the high nibble
 * (ggml's ggml_vec_dot_q5_0_q8_0): nibble − 16 as int8. */
BLZ_INLINE __m256i decode_avx2(const int kind, const uint8_t *blk, const __m256i lut) {
    const __m128i q = _mm_loadu_si128((const __m128i *)(blk + (kind == BLZ_MXFP4 ? 1 : 6)));
    const __m256i nib = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1),
                                         _mm256_set1_epi8(0x0f));
    if (kind == BLZ_MXFP4) return _mm256_shuffle_epi8(lut, nib);
    uint32_t qh;
    memcpy(&qh, blk + 2, 4);
    const __m256i spread = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202,
                                              0x0303030303030303);
    const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread);
    const __m256i bit = _mm256_cmpeq_epi8(_mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                                          _mm256_set1_epi8(-1));
    return _mm256_or_si256(nib, _mm256_andnot_si256(bit, _mm256_set1_epi8((char)0xf0)));
}

/* acc + the sums of each dword's four products u·s (u ≤ 16 unsigned, s signed ≥ −127: exact either way) —
 * one vpdpbusd with AVX512-VNNI, else vpmaddubsw widened by vpmaddwd (linear_q8.c's dot_u8s8). */
BLZ_INLINE __m256i dot_u8s8(const __m256i acc, const __m256i u, const __m256i s, const __m256i ones) {
#ifdef BLZ_VNNI
    (void)ones;
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones));
#endif
}

/* AVX2 path of tile_scalar; all QR rows are read (a short tile repeats its last). Each block of the 8 rows is
 * decoded once, then per activation row the 8 rows' dots (dot_u8s8(|v|, sign(qx, v))) reduced at once into
 * lane r = row r's dot. */
BLZ_INLINE void tile_avx2(const int kind, const uint8_t *const rows[2 * QR], const int listed,
                          const blz_act_t *restrict a, const int64_t m0, const int mt, float acc_out[QT][QR]) {
    const int64_t nb = a->nb;
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)KV));
    __m256 acc[QT];
    for (int m = 0; m < mt; ++m) acc[m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        if (BLZ_MX_PF && m0 == 0) blz_prefetch_next_tile(rows, QR, listed, QB(kind), b);
        __m256i w[QR], aw[QR];
        float dh[QR];
        for (int r = 0; r < QR; ++r) {
            const uint8_t *blk = rows[r] + b * QB(kind);
            w[r] = decode_avx2(kind, blk, lut);
            aw[r] = _mm256_abs_epi8(w[r]);
            dh[r] = block_scale(kind, blk);
        }
        const __m256 dw = _mm256_loadu_ps(dh);
        for (int m = 0; m < mt; ++m) {
            const int64_t row = (m0 + m) * nb + b;
            const __m256i x = _mm256_loadu_si256((const __m256i *)(a->q + (m0 + m) * a->K + b * BLZ_QK));
            __m256i v[QR];
            for (int r = 0; r < QR; ++r) v[r] = dot_u8s8(_mm256_setzero_si256(), aw[r], _mm256_sign_epi8(x, w[r]), ones);
            const __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(a->d[row]));
            acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(blz_hsum8x8_epi32(v)), sc, acc[m]);
        }
    }
    for (int m = 0; m < mt; ++m) _mm256_storeu_ps(acc_out[m], acc[m]);
}
#endif

/* The offset c of the unsigned values u = v + c that the one-row path multiplies (0 ≤ u ≤ 31 / 24). */
BLZ_INLINE int32_t u_offset(const int kind) { return kind == BLZ_MXFP4 ? 12 : 16; }

#ifdef BLZ_AVX2
/* Block blk's 32 values as unsigned u = v + c in int8 lanes, element order (decode_avx2's lanes): MXFP4's codes
 * looked up in `lut` (KV + 12, both halves); Q5_0's nibbles (one broadcast 16-byte load, the high half shifted
 * by 4) with 16 added where the fifth bit is set — AVX-512: a byte mask loaded from the 32 bits (vpaddb under
 * it); AVX2: the bits spread to bytes as decode_avx2 spreads them. */
BLZ_INLINE __m256i decode_u_avx2(const int kind, const uint8_t *blk, const __m256i lut) {
    const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + (kind == BLZ_MXFP4 ? 1 : 6))));
    const __m256i nib = _mm256_and_si256(_mm256_srlv_epi32(q, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)),
                                         _mm256_set1_epi8(0x0f));
    if (kind == BLZ_MXFP4) return _mm256_shuffle_epi8(lut, nib);
    uint32_t qh;
    memcpy(&qh, blk + 2, 4);
#ifdef BLZ_AVX512
    return _mm256_mask_add_epi8(nib, (__mmask32)qh, nib, _mm256_set1_epi8(0x10));
#else
    const __m256i spread = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202,
                                              0x0303030303030303);
    const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread);
    const __m256i bit = _mm256_cmpeq_epi8(_mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                                          _mm256_set1_epi8(-1));
    return _mm256_or_si256(nib, _mm256_and_si256(bit, _mm256_set1_epi8(0x10)));
#endif
}

/* The 8 rows' block scales dw of block b as fp32 lanes (Q5_0: the f16 d widened by vcvtph2ps, exact). */
BLZ_INLINE __m256 scales8(const int kind, const uint8_t *const rows[QR], const int64_t b) {
    if (kind == BLZ_MXFP4) {
        float dh[QR];
        for (int r = 0; r < QR; ++r) dh[r] = e8m0_half(rows[r][b * QB(kind)]);
        return _mm256_loadu_ps(dh);
    }
    uint16_t dh[QR];
    for (int r = 0; r < QR; ++r) memcpy(&dh[r], rows[r] + b * QB(kind), 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh));
}

/* One activation row (M = 1, quantized with offset u_offset(kind): a->off[b] = −c·Σqx) against ns ≤ 2·BLZ_STREAMS
 * tiles (one per stream), their blocks walked together: acc_out[s] lane r = tile s's row r, each by tile_avx2's
 * integers Σ v·qx = Σ u·qx − c·Σqx and its fmas, each tile prefetching its successor as it goes. */
BLZ_INLINE void tiles1_avx2(const int kind, const int ns, const uint8_t *const *const rows, const int *apart,
                            const blz_act_t *restrict a, float acc_out[][QR]) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i lut = _mm256_add_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)KV)),
                                        _mm256_set1_epi8(12));
    __m256 acc[2 * BLZ_STREAMS];
    for (int s = 0; s < ns; ++s) acc[s] = _mm256_setzero_ps();
    for (int64_t b = 0; b < a->nb; ++b) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(a->q + b * BLZ_QK));
        const __m256i off = _mm256_set1_epi32(a->off[b]);
        const __m256 dx = _mm256_set1_ps(a->d[b]);
        for (int s = 0; s < ns; ++s) {
            const uint8_t *const *tr = rows + 2 * QR * s;
            if (BLZ_MX_PF) blz_prefetch_next_tile(tr, QR, apart[s], QB(kind), b);
            __m256i v[QR];
            for (int r = 0; r < QR; ++r)
                v[r] = dot_u8s8(_mm256_setzero_si256(), decode_u_avx2(kind, tr[r] + b * QB(kind), lut), x, ones);
            const __m256i dot = _mm256_add_epi32(blz_hsum8x8_epi32(v), off);
            const __m256 sc = _mm256_mul_ps(scales8(kind, tr, b), dx);
            acc[s] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sc, acc[s]);
        }
    }
    for (int s = 0; s < ns; ++s) _mm256_storeu_ps(acc_out[s], acc[s]);
}

/* tiles1_avx2 with the stream count c first, for BLZ_TILE_SWITCH (c ≤ BLZ_STREAMS: SwiGLU halves the parts) */
#define TILES1(c, kind, ...) tiles1_avx2(kind, c, __VA_ARGS__)

/* blz_linear_b32 at M = 1 (activations quantized in a with offset u_offset(kind)): this thread's block of tiles
 * cut into S parts (SwiGLU: half as many, each read with its up rows), tile i of every part run together; the
 * steps walked balanced between the threads (blz_walk_t). linear_q8.c's q8g_streams, for the 32-block kinds. */
static void b32_streams(const int kind, const uint8_t *w, const int64_t *tab, int64_t row_bytes, int64_t N,
                        int64_t nout, const blz_act_t *a, const float *bias, const float *residual, float *out,
                        int swiglu, blz_team_t *team) {
    const int S = team->S;
    blz_walk_t wk;
    blz_walk_begin(&wk, team);
    for (int64_t i; blz_walk_step(&wk, &i);) {
        const uint8_t *rows[2 * BLZ_STREAMS][2 * QR];
        int apart[2 * BLZ_STREAMS], nn[BLZ_STREAMS];
        int64_t t[BLZ_STREAMS];
        const int ns = blz_stream_tiles(w, tab, row_bytes, nout, swiglu, &wk, S, i, rows, apart, nn, t);
        float r[2 * BLZ_STREAMS][QR];
        if (kind == BLZ_MXFP4) {
            BLZ_TILE_SWITCH(TILES1, swiglu ? 2 * ns : ns, BLZ_MXFP4, &rows[0][0], apart, a, r);
        } else {
            BLZ_TILE_SWITCH(TILES1, swiglu ? 2 * ns : ns, BLZ_Q5_0, &rows[0][0], apart, a, r);
        }
        blz_stream_epilogue(ns, r, t, nn, N, nout, bias, residual, out, swiglu);
    }
}
#endif

/* acc[m][r] = dot products of weight rows rows[0..QR-1] (the first nr real, the rest repeats) with
 * activation rows m0 .. m0+mt-1. Each kind (and one activation row, decode) compiled on its own. */
static void tile_dots(const int kind, const uint8_t *const rows[2 * QR], int listed, int nr, const blz_act_t *a,
                      int64_t m0, int mt, float acc[QT][QR]) {
#ifdef BLZ_AVX2
    (void)nr;
    if (kind == BLZ_MXFP4) {
        if (mt == 1) tile_avx2(BLZ_MXFP4, rows, listed, a, m0, 1, acc);
        else tile_avx2(BLZ_MXFP4, rows, listed, a, m0, mt, acc);
    } else {
        if (mt == 1) tile_avx2(BLZ_Q5_0, rows, listed, a, m0, 1, acc);
        else tile_avx2(BLZ_Q5_0, rows, listed, a, m0, mt, acc);
    }
#else
    (void)listed;
    if (kind == BLZ_MXFP4) tile_scalar(BLZ_MXFP4, rows, nr, a, m0, mt, acc);
    else tile_scalar(BLZ_Q5_0, rows, nr, a, m0, mt, acc);
#endif
}

/* Output rows n0 .. n0+nn-1 for all M activation rows by the tiles (nn ≤ 16: one packed group's rows). */
static void rows_by_tiles(int kind, const uint8_t *w, const int64_t *tab, int64_t row_bytes, int64_t n0, int64_t nn,
                          int64_t M, int64_t N, int64_t nout, const blz_act_t *a, const float *bias,
                          const float *residual, float *out, int swiglu) {
    for (int64_t t0 = n0; t0 < n0 + nn; t0 += QR) {
        float r[QT][QR] __attribute__((aligned(32))), u[QT][QR] __attribute__((aligned(32)));
        const int n = (int)blz_min(QR, n0 + nn - t0);
        const uint8_t *gate[2 * QR], *up[2 * QR];
        int apart[2];
        blz_tile_rows(w, tab, row_bytes, t0, n, nout, swiglu, gate, up, apart);
        for (int64_t m0 = 0; m0 < M; m0 += QT) {
            const int mt = (int)blz_min(QT, M - m0);
            tile_dots(kind, gate, apart[0], n, a, m0, mt, r);
            if (swiglu) tile_dots(kind, up, apart[1], n, a, m0, mt, u);
            for (int m = 0; m < mt; ++m)
                blz_epilogue_row(r[m], u[m], m0 + m, t0, n, N, nout, bias, residual, out, swiglu);
        }
    }
}

/* Row src (nb blocks of `kind`) as Q8_0 blocks [f16 fp16(dw)][32 int8 v] in dst; 0 (dst partly written) when
 * a scale is not a float16. */
static int row_as_q8_0(int kind, const uint8_t *src, int64_t nb, uint8_t *dst) {
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *blk = src + b * QB(kind);
        if (!is_fp16_scale(kind, blk)) return 0;
        const uint16_t h = blz_fp32_to_fp16(block_scale(kind, blk));
        memcpy(dst + b * Q8B, &h, 2);
        decode_scalar(kind, blk, (int8_t *)(dst + b * Q8B + 2));
    }
    return 1;
}

/* One 16-row output group (gate rows n0 .. n0+nn-1, SwiGLU up rows nout + n0 …) re-laid as packed Q8_0 into
 * buf (and buf + gbytes) through the row buffer rowbuf; 0 when a scale is not a float16. */
static int pack_group(int kind, const uint8_t *w, const int64_t *tab, int64_t row_bytes, int64_t nb, int64_t n0,
                      int64_t nn, int64_t nout, int swiglu, uint8_t *rowbuf, uint8_t *buf, int64_t gbytes) {
    for (int half = 0; half < (swiglu ? 2 : 1); ++half)
        for (int j = 0; j < 16; ++j) {
            const uint8_t *src = NULL;
            if (j < nn) {
                if (!row_as_q8_0(kind, blz_weight_row(w, tab, half * nout + n0 + j, row_bytes), nb, rowbuf)) return 0;
                src = rowbuf;
            }
            blz_pack_row(src, nb, Q8B, 2, 0x80808080u, j, buf + half * gbytes);
        }
    return 1;
}

/* out = x·Wᵀ (+bias) (+residual) or the SwiGLU form; see the file header. kind BLZ_MXFP4 or BLZ_Q5_0, x [M, K],
 * w [N][nb · QB] in ggml's layout — or, with a row table `tab` (int64 [N], BLZ_ROWS), each row where tab[n]
 * says —, bias [N] or NULL, residual [M, N] or NULL (may equal out), out [M, N] (SwiGLU: [M, N/2]). */
int blz_linear_b32(int kind, const float *x, int64_t M, int64_t K, const uint8_t *w, const int64_t *tab, int64_t N,
                   const float *bias, const float *residual, float *out, int swiglu, int nthreads) {
    if ((kind != BLZ_MXFP4 && kind != BLZ_Q5_0) || M < 0 || N < 0 || K <= 0 || K % BLZ_QK) return BLZ_EINVAL;
    if (swiglu && (N % 2 || residual)) return BLZ_EINVAL;
    if (M == 0 || N == 0) return BLZ_OK;
    blz_act_t a;
    if (blz_act_alloc(&a, M, K)) return BLZ_ENOMEM;
    const int64_t row_bytes = a.nb * QB(kind), nout = swiglu ? N / 2 : N;
    const int nt = blz_threads(nthreads, M * N * K, BLZ_LINEAR_PARALLEL_MIN);
#ifdef BLZ_AVX2
    if (M == 1) {
        blz_quantize_act_row(x, K, u_offset(kind), a.q, a.d, a.s, a.off);
        blz_team_t team;
        blz_team_init(&team, nt, (nout + QR - 1) / QR, blz_gemv_parts(BLZ_TUNE_STREAMS_B32, 1, swiglu));
#pragma omp parallel num_threads(nt)
        b32_streams(kind, w, tab, row_bytes, N, nout, &a, bias, residual, out, swiglu, &team);
        return BLZ_OK;
    }
#endif
    const int is_packed = M >= MX_PACK_MIN(kind);
    const int64_t rows_per = is_packed ? 16 : QR, nunits = (nout + rows_per - 1) / rows_per;
    const int64_t gbytes = a.nb * 16 * Q8B;
    int rc = BLZ_OK;
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; ++m) /* offset 128: the packed Q8_0's quants are stored + 128 (the tiles
                                           read only q and d, the same either way) */
            blz_quantize_act_row(x + m * K, K, 128, a.q + m * K, a.d + m * a.nb, a.s + m * a.nb, a.off + m * a.nb);
        uint8_t *buf = NULL;
        if (is_packed) { /* this thread's packed group(s), then its row buffer */
            buf = blz_scratch_slot(3, (size_t)((swiglu ? 2 : 1) * gbytes + a.nb * Q8B));
            if (!buf) {
#pragma omp atomic write
                rc = BLZ_ENOMEM;
            }
        }
#pragma omp for schedule(static)
        for (int64_t g = 0; g < nunits; ++g) {
            const int64_t n0 = g * rows_per, nn = blz_min(rows_per, nout - n0);
            if (is_packed && !buf) continue;
            if (is_packed && pack_group(kind, w, tab, row_bytes, a.nb, n0, nn, nout, swiglu,
                                        buf + (swiglu ? 2 : 1) * gbytes, buf, gbytes))
                blz_q_group_run(BLZ_Q8_0, &a, M, BLZ_MT_LONG, buf, buf + gbytes, NULL, 0, n0, nn, N, nout, bias,
                                residual, out, swiglu);
            else
                rows_by_tiles(kind, w, tab, row_bytes, n0, nn, M, N, nout, &a, bias, residual, out, swiglu);
        }
    }
    return rc;
}
