/* blazr kernels — linear layers with block-quantized weights (ggml Q4_0, Q4_1, Q8_0).
 *
 * Computes out[M, N] = x[M, K] · Wᵀ (+ bias[N]) (+ residual[M, N]), or in SwiGLU mode, for a fused
 * [gate; up] weight of N = 2·I rows, out[M, I] = silu(x·W_gateᵀ + b_gate) * (x·W_upᵀ + b_up).
 *
 * Weight layout: W is N rows of K/32 ggml blocks, each row contiguous (row_bytes = K/32 · block_bytes):
 *   Q4_0 (18 B): f16 d, 16 B nibbles          w_i = d · (q_i − 8)
 *   Q4_1 (20 B): f16 d, f16 m, 16 B nibbles   w_i = d · q_i + m
 *   Q8_0 (34 B): f16 d, 32 × int8             w_i = d · q_i
 * Nibble byte j (0..15) holds element j in its low half and element j + 16 in its high half.
 *
 * Algorithm (as ggml's vec_dot with Q8_0/Q8_1 activations): each row of x is quantized once per call to
 * blocks of 32 int8 — dx = amax/127, qx = round_half_even(x / dx) — with the block sum
 * sx = dx · Σ qx kept for Q4_1's offset term. Then per block the integer dot product Σ qw·qx is exact in
 * int32 and the float result is Σ_blocks (dw·dx) · dot  [+ Σ_blocks m · sx for Q4_1].
 *
 * SIMD strategy (AVX512_VNNI): vpdpbusd (u8 × s8 → int32, 4 products per lane) with unsigned weights and
 * signed activations, per-lane int32 → float conversion, FMA with per-lane scales dw·dx.
 * - Q4_0 / Q4_1: four blocks per 512-bit register, block k's 16 nibble bytes broadcast into 128-bit lane
 *   k. Low nibbles (byte & 0x0F) and high nibbles kept in place (byte & 0xF0 = 16·q) meet the two halves
 *   of the activation blocks (stored pre-permuted to match); the ×16 comes off exactly with an arithmetic
 *   shift of the int32 sums, so no per-byte shifts are needed.
 * - Q8_0: two blocks per register; weights made unsigned with ^0x80.
 * The weight offsets (8 for Q4_0, 128 for Q8_0) are removed exactly by starting each int32 accumulator at
 * −offset · Σ qx of its activation bytes, precomputed once per call. The 16 fp16 scales (and Q4_1 mins)
 * of a chunk of 16 blocks come from one gather; a lane permutation spreads the per-block scale over the
 * lanes of each block. Up to 4 rows of x share each unpacked weight register (M tile), so a call streams
 * W once for any M; OpenMP splits the N output rows.
 */
#include "blazr_kernels.h"

BLZ_INLINE int64_t block_bytes(int kind) { return kind == BLZ_Q4_0 ? 18 : kind == BLZ_Q4_1 ? 20 : 34; }

/* Quantized activations of one call. Rows are padded with zeros to kp = nbp·32 elements, nbp a multiple
 * of 16 blocks, so SIMD loops never need a tail on the activation side. */
typedef struct {
    int8_t *q;    /* [M][kp]     int8 values (VNNI Q4 kinds: groups of 4 blocks in nibble order) */
    int32_t *off; /* [M][kp/4]   exact int32 correction for the weight offset (see act_arrange_vnni) */
    float *d;     /* [M][nbp]    block scale dx */
    float *s;     /* [M][nbp]    dx · (sum of the block's 32 values) */
    int64_t kp, nbp;
} act_t;

/* Quantize one row x[K] to 8-bit blocks in natural order (see the header comment); pads blocks
 * nb..nbp-1 with zeros. */
static void quantize_act_row(const float *restrict x, int64_t K, int8_t *restrict q, float *restrict d,
                             float *restrict s, int64_t nbp) {
    const int64_t nb = K / BLZ_QK;
    for (int64_t b = 0; b < nb; ++b) {
        const float *xb = x + b * BLZ_QK;
        int8_t *qb = q + b * BLZ_QK;
#ifdef BLZ_AVX512
        const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        const float db = amax / 127.0f;
        const float id = db != 0.0f ? 1.0f / db : 0.0f;
        const __m512i lim = _mm512_set1_epi32(127);
        __m512i i0 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v0, _mm512_set1_ps(id)),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512i i1 = _mm512_cvt_roundps_epi32(_mm512_mul_ps(v1, _mm512_set1_ps(id)),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        i0 = _mm512_max_epi32(_mm512_min_epi32(i0, lim), _mm512_sub_epi32(_mm512_setzero_si512(), lim));
        i1 = _mm512_max_epi32(_mm512_min_epi32(i1, lim), _mm512_sub_epi32(_mm512_setzero_si512(), lim));
        _mm_storeu_si128((__m128i *)qb, _mm512_cvtepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(qb + 16), _mm512_cvtepi32_epi8(i1));
        const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
#else
        float amax = 0.0f;
        for (int i = 0; i < BLZ_QK; ++i) amax = fmaxf(amax, fabsf(xb[i]));
        const float db = amax / 127.0f;
        const float id = db != 0.0f ? 1.0f / db : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < BLZ_QK; ++i) {
            float v = nearbyintf(xb[i] * id);
            v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
            qb[i] = (int8_t)v;
            sum += (int32_t)v;
        }
#endif
        d[b] = db;
        s[b] = db * (float)sum;
    }
    memset(q + nb * BLZ_QK, 0, (size_t)((nbp - nb) * BLZ_QK));
    for (int64_t b = nb; b < nbp; ++b) d[b] = s[b] = 0.0f;
}

#ifdef BLZ_VNNI
/* Arrange one quantized row (nbp blocks) for dot_tile_vnni and fill its int32 offset corrections:
 * - Q8_0 keeps natural order; off[g] = −128 · (sum of bytes 4g..4g+3), so that starting vpdpbusd at off
 *   cancels the +128 that makes the weights unsigned.
 * - Q4_0 / Q4_1: each group of 4 blocks (128 values) becomes [first halves of blocks 0-3 | second
 *   halves of blocks 0-3] (64 + 64 bytes), matching the low / high nibbles of 4 weight blocks placed in
 *   the four 128-bit lanes. For Q4_0, off[32·grp + j] (j < 16) = −8 · (sum of bytes 4j..4j+3 of both
 *   halves), the exact correction for the weight offset 8 of block 4·grp + j/4. */
static void act_arrange_vnni(int kind, int8_t *restrict q, int32_t *restrict off, int64_t nbp) {
    if (kind == BLZ_Q8_0) {
        for (int64_t g = 0; g < nbp * 8; ++g)
            off[g] = -128 * (q[4 * g] + q[4 * g + 1] + q[4 * g + 2] + q[4 * g + 3]);
        return;
    }
    for (int64_t grp = 0; grp < nbp / 4; ++grp) {
        int8_t *base = q + grp * 128, t[128];
        memcpy(t, base, 128);
        for (int k = 0; k < 4; ++k) {
            memcpy(base + 16 * k, t + 32 * k, 16);
            memcpy(base + 64 + 16 * k, t + 32 * k + 16, 16);
        }
        if (kind == BLZ_Q4_0)
            for (int j = 0; j < 16; ++j) {
                int32_t sum = 0;
                for (int i = 0; i < 4; ++i) sum += base[4 * j + i] + base[64 + 4 * j + i];
                off[grp * 32 + j] = -8 * sum; /* at block 4·grp's slot, where the kernel reads it */
            }
    }
}
#endif

/* Portable reference of the block dot product for one weight row and one activation row. */
static float dot_row_scalar(int kind, const uint8_t *restrict wrow, int64_t nb, const int8_t *restrict xq,
                            const float *restrict xd, const float *restrict xs) {
    const int64_t bs = block_bytes(kind);
    float acc = 0.0f, macc = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *blk = wrow + b * bs;
        const int8_t *qx = xq + b * BLZ_QK;
        uint16_t h;
        memcpy(&h, blk, 2);
        const float dw = blz_fp16_to_fp32(h);
        int32_t dot = 0;
        if (kind == BLZ_Q8_0) {
            const int8_t *qw = (const int8_t *)(blk + 2);
            for (int i = 0; i < BLZ_QK; ++i) dot += qw[i] * qx[i];
        } else {
            const int hdr = kind == BLZ_Q4_1 ? 4 : 2, bias = kind == BLZ_Q4_1 ? 0 : 8;
            const uint8_t *qs = blk + hdr;
            for (int i = 0; i < 16; ++i)
                dot += ((qs[i] & 15) - bias) * qx[i] + ((qs[i] >> 4) - bias) * qx[i + 16];
            if (kind == BLZ_Q4_1) {
                memcpy(&h, blk + 2, 2);
                macc += blz_fp16_to_fp32(h) * xs[b];
            }
        }
        acc += (dw * xd[b]) * (float)dot;
    }
    return acc + macc;
}

#ifdef BLZ_VNNI
/* PAIR_LANES[p]: permutation picking, from 16 per-block scales, block 2p for lanes 0-7, 2p+1 for 8-15. */
#define BLZ_PL(p)                                                                          \
    {2 * (p),     2 * (p),     2 * (p),     2 * (p),     2 * (p),     2 * (p),     2 * (p), \
     2 * (p),     2 * (p) + 1, 2 * (p) + 1, 2 * (p) + 1, 2 * (p) + 1, 2 * (p) + 1, 2 * (p) + 1, \
     2 * (p) + 1, 2 * (p) + 1}
static const int32_t PAIR_LANES[8][16] __attribute__((aligned(64))) = {
    BLZ_PL(0), BLZ_PL(1), BLZ_PL(2), BLZ_PL(3), BLZ_PL(4), BLZ_PL(5), BLZ_PL(6), BLZ_PL(7)};
#undef BLZ_PL
/* QUAD_LANES[g]: lanes 4k..4k+3 take the scale of block 4g + k. */
#define BLZ_QL(g) {4 * (g),     4 * (g),     4 * (g),     4 * (g),     4 * (g) + 1, 4 * (g) + 1, \
                   4 * (g) + 1, 4 * (g) + 1, 4 * (g) + 2, 4 * (g) + 2, 4 * (g) + 2, 4 * (g) + 2, \
                   4 * (g) + 3, 4 * (g) + 3, 4 * (g) + 3, 4 * (g) + 3}
static const int32_t QUAD_LANES[4][16] __attribute__((aligned(64))) = {BLZ_QL(0), BLZ_QL(1), BLZ_QL(2),
                                                                         BLZ_QL(3)};
#undef BLZ_QL

/* Q4_0 / Q4_1: four weight blocks (4g .. 4g+3 of the chunk at cb; nbq ≤ 4 of them exist) against mt
 * activation rows, accumulated into acc[m][slot]. The 16 nibble bytes of block k go to 128-bit lane k;
 * the low nibbles (byte & 0x0F) meet the first halves of the activation blocks and the high nibbles,
 * kept in place as byte & 0xF0 = 16·q, meet the second halves; the ×16 is removed exactly with an
 * arithmetic shift of the int32 sums (they are multiples of 16). No per-byte shift, so port 0 only sees
 * the two vpdpbusd, the shift and the conversion per 4 blocks. */
BLZ_INLINE void quad_step(const int kind, const int mt, const uint8_t *cb, const int g, const int nbq,
                          const act_t *a, const int64_t m0, const int64_t c, const __m512 *sc,
                          __m512 acc[4][2], const int slot) {
    const int64_t bs = block_bytes(kind);
    const uint8_t *qs = cb + 4 * g * bs + (kind == BLZ_Q4_1 ? 4 : 2);
    __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)qs));
    if (nbq > 1) v = _mm512_mask_broadcast_i32x4(v, 0x00f0, _mm_loadu_si128((const __m128i *)(qs + bs)));
    if (nbq > 2) v = _mm512_mask_broadcast_i32x4(v, 0x0f00, _mm_loadu_si128((const __m128i *)(qs + 2 * bs)));
    if (nbq > 3) v = _mm512_mask_broadcast_i32x4(v, 0xf000, _mm_loadu_si128((const __m128i *)(qs + 3 * bs)));
    const __m512i wlo = _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
    const __m512i whi = _mm512_and_si512(v, _mm512_set1_epi8((char)0xf0));
    const __m512i lanes = _mm512_load_si512(QUAD_LANES[g]);
    for (int m = 0; m < mt; ++m) {
        const int64_t row = m0 + m, blk = c + 4 * g;
        const int8_t *xq = a->q + row * a->kp + blk * BLZ_QK;
        __m512i lo = kind == BLZ_Q4_0 ? _mm512_loadu_si512(a->off + row * (a->kp / 4) + blk * 8)
                                      : _mm512_setzero_si512();
        lo = _mm512_dpbusd_epi32(lo, wlo, _mm512_loadu_si512(xq));
        const __m512i hi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), whi, _mm512_loadu_si512(xq + 64));
        const __m512i dot = _mm512_add_epi32(lo, _mm512_srai_epi32(hi, 4));
        acc[m][slot] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(lanes, sc[m]), acc[m][slot]);
    }
}

/* Q8_0: one pair of weight blocks (2p, 2p+1 of the chunk at cb) against mt activation rows; accumulates
 * into acc[m][slot]. `has1` is false when the chunk ends after block 2p (its lanes then see zero
 * activations and zero scales). Weights are made unsigned with ^0x80; off cancels the +128. */
BLZ_INLINE void pair_step(const int mt, const uint8_t *cb, const int p, const int has1, const act_t *a,
                          const int64_t m0, const int64_t c, const __m512 *sc, __m512 acc[4][2],
                          const int slot) {
    const int64_t bs = 34;
    const uint8_t *b0 = cb + 2 * p * bs;
    const __m256i lo = _mm256_loadu_si256((const __m256i *)(b0 + 2));
    const __m256i hi = has1 ? _mm256_loadu_si256((const __m256i *)(b0 + bs + 2)) : _mm256_setzero_si256();
    const __m512i w =
        _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), _mm512_set1_epi8((char)0x80));
    const __m512i lanes = _mm512_load_si512(PAIR_LANES[p]);
    for (int m = 0; m < mt; ++m) {
        const int64_t row = m0 + m, blk = c + 2 * p;
        __m512i dot = _mm512_loadu_si512(a->off + row * (a->kp / 4) + blk * 8);
        dot = _mm512_dpbusd_epi32(dot, w, _mm512_loadu_si512(a->q + row * a->kp + blk * BLZ_QK));
        acc[m][slot] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(lanes, sc[m]), acc[m][slot]);
    }
}

/* Dot products of one weight row with activation rows m0 .. m0+mt-1 (mt ≤ 4) → res[0..mt). */
BLZ_INLINE void dot_tile_vnni(const int kind, const int mt, const uint8_t *restrict wrow, const int64_t nb,
                              const act_t *a, const int64_t m0, float *restrict res) {
    const int64_t bs = block_bytes(kind);
    __m512 acc[4][2], macc[4];
    for (int m = 0; m < 4; ++m) acc[m][0] = acc[m][1] = macc[m] = _mm512_setzero_ps();
    const __m512i gidx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32((int)bs));
    for (int64_t c = 0; c < nb; c += 16) {
        const int nbc = (int)blz_min(16, nb - c);
        const __mmask16 gm = (__mmask16)((1u << nbc) - 1u);
        const uint8_t *cb = wrow + c * bs;
        /* one dword per block: low half = d, high half = m (Q4_1) */
        const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), gm, gidx, cb, 1);
        const __m512 wd = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
        __m512 sc[4];
        for (int m = 0; m < mt; ++m)
            sc[m] = _mm512_mul_ps(wd, _mm512_loadu_ps(a->d + (m0 + m) * a->nbp + c));
        if (kind == BLZ_Q4_1) {
            const __m512 wm = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16)));
            for (int m = 0; m < mt; ++m)
                macc[m] = _mm512_fmadd_ps(wm, _mm512_loadu_ps(a->s + (m0 + m) * a->nbp + c), macc[m]);
        }
        if (kind == BLZ_Q8_0) {
            const int npairs = (nbc + 1) / 2;
            int p = 0;
            for (; p + 1 < npairs; p += 2) {
                pair_step(mt, cb, p, 1, a, m0, c, sc, acc, 0);
                pair_step(mt, cb, p + 1, 2 * p + 3 < nbc, a, m0, c, sc, acc, 1);
            }
            if (p < npairs) pair_step(mt, cb, p, 2 * p + 1 < nbc, a, m0, c, sc, acc, 0);
        } else {
            const int nquads = (nbc + 3) / 4;
            int g = 0;
            for (; g + 1 < nquads; g += 2) {
                quad_step(kind, mt, cb, g, 4, a, m0, c, sc, acc, 0);
                quad_step(kind, mt, cb, g + 1, (int)blz_min(4, nbc - 4 * g - 4), a, m0, c, sc, acc, 1);
            }
            if (g < nquads) quad_step(kind, mt, cb, g, (int)blz_min(4, nbc - 4 * g), a, m0, c, sc, acc, 0);
        }
    }
    for (int m = 0; m < mt; ++m) {
        float r = _mm512_reduce_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]));
        if (kind == BLZ_Q4_1) r += _mm512_reduce_add_ps(macc[m]);
        res[m] = r;
    }
}
#endif

/* Dot products of weight row `wrow` with activation rows m0 .. m0+mt-1 → res. */
static void dot_tile(int kind, int mt, const uint8_t *wrow, int64_t nb, const act_t *a, int64_t m0,
                     float *res) {
#ifdef BLZ_VNNI
#define BLZ_CASE(K, MT)                                  \
    case (K) * 4 + (MT) - 1:                             \
        dot_tile_vnni((K), (MT), wrow, nb, a, m0, res); \
        return;
    switch (kind * 4 + mt - 1) {
        BLZ_CASE(BLZ_Q4_0, 1) BLZ_CASE(BLZ_Q4_0, 2) BLZ_CASE(BLZ_Q4_0, 3) BLZ_CASE(BLZ_Q4_0, 4)
        BLZ_CASE(BLZ_Q4_1, 1) BLZ_CASE(BLZ_Q4_1, 2) BLZ_CASE(BLZ_Q4_1, 3) BLZ_CASE(BLZ_Q4_1, 4)
        BLZ_CASE(BLZ_Q8_0, 1) BLZ_CASE(BLZ_Q8_0, 2) BLZ_CASE(BLZ_Q8_0, 3) BLZ_CASE(BLZ_Q8_0, 4)
    }
#undef BLZ_CASE
#endif
    for (int m = 0; m < mt; ++m) {
        const int64_t row = m0 + m;
        res[m] = dot_row_scalar(kind, wrow, nb, a->q + row * a->kp, a->d + row * a->nbp, a->s + row * a->nbp);
    }
}

/* Lay out the activation buffers of an M×K call in the calling thread's scratch. */
static int act_alloc(act_t *a, int64_t M, int64_t K) {
    const int64_t nb = K / BLZ_QK;
    a->nbp = blz_round_up(nb > 0 ? nb : 1, 16);
    a->kp = a->nbp * BLZ_QK;
    const size_t qb = (size_t)(M * a->kp), fb = (size_t)(M * a->nbp) * sizeof(float);
    uint8_t *buf = blz_scratch(2 * qb + 2 * fb);
    if (!buf) return BLZ_ENOMEM;
    a->q = (int8_t *)buf;
    a->off = (int32_t *)(buf + qb);
    a->d = (float *)(buf + 2 * qb);
    a->s = (float *)(buf + 2 * qb + fb);
    return BLZ_OK;
}

/* out = x·Wᵀ (+bias) (+residual) or the SwiGLU form; see the file header. x [M, K], w [N, row_bytes],
 * bias [N] or NULL, residual [M, N] or NULL (may equal out), out [M, N] (SwiGLU: [M, N/2]). */
BLZ_EXPORT int blz_linear_q(int kind, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N,
                            const float *bias, const float *residual, float *out, int swiglu, int nthreads) {
    if (kind < BLZ_Q4_0 || kind > BLZ_Q8_0 || M < 0 || N < 0 || K <= 0 || K % BLZ_QK)
        return BLZ_EINVAL;
    if (swiglu && (N % 2 || residual)) return BLZ_EINVAL;
    if (M == 0 || N == 0) return BLZ_OK;
    act_t a;
    if (act_alloc(&a, M, K)) return BLZ_ENOMEM;
    const int64_t nb = K / BLZ_QK, rb = nb * block_bytes(kind), nout = swiglu ? N / 2 : N;
    const int nt = blz_threads(nthreads, M * N * K, BLZ_LINEAR_PARALLEL_MIN);
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; ++m) {
            quantize_act_row(x + m * K, K, a.q + m * a.kp, a.d + m * a.nbp, a.s + m * a.nbp, a.nbp);
#ifdef BLZ_VNNI
            act_arrange_vnni(kind, a.q + m * a.kp, a.off + m * (a.kp / 4), a.nbp);
#endif
        }
#pragma omp for schedule(static)
        for (int64_t n = 0; n < nout; ++n) {
            for (int64_t m0 = 0; m0 < M; m0 += 4) {
                const int mt = (int)blz_min(4, M - m0);
                float r[4], g[4];
                dot_tile(kind, mt, w + n * rb, nb, &a, m0, r);
                if (swiglu) dot_tile(kind, mt, w + (n + nout) * rb, nb, &a, m0, g);
                blz_epilogue(r, g, mt, m0, n, N, nout, bias, residual, out, swiglu);
            }
        }
    }
    return BLZ_OK;
}

/* The activation quantization of blz_linear_q on its own (for tests): q [M, K] int8, d and s [M, K/32]
 * (s = d · Σ q per block). */
BLZ_EXPORT int blz_quantize_act(const float *x, int64_t M, int64_t K, int8_t *q, float *d, float *s) {
    if (M < 0 || K <= 0 || K % BLZ_QK) return BLZ_EINVAL;
    act_t a;
    if (M == 0) return BLZ_OK;
    if (act_alloc(&a, 1, K)) return BLZ_ENOMEM;
    const int64_t nb = K / BLZ_QK;
    for (int64_t m = 0; m < M; ++m) {
        quantize_act_row(x + m * K, K, a.q, a.d, a.s, a.nbp);
        memcpy(q + m * K, a.q, (size_t)K);
        memcpy(d + m * nb, a.d, (size_t)nb * sizeof(float));
        memcpy(s + m * nb, a.s, (size_t)nb * sizeof(float));
    }
    return BLZ_OK;
}
