/* blazr kernels — linear layers with float weights: fp32 and bf16 (f16: linear_f16.c).
 *
 * Computes out[M, N] = x[M, K] · Wᵀ (+ bias) (+ residual), or the SwiGLU form (see linear_q.c), with
 * W [N, K] row-major, fp32 or bf16 (raw uint16 bits); x and out are fp32.
 *
 * f32:  fp32 FMA, two independent accumulators per x row; 16 floats per vector (8 on AVX2), masked tail;
 *       tiles of up to 4 x rows per weight row, at every M for decode calls — a prefill call (BLZ_GEMM) of
 *       more than 8 rows takes gemm_float.c's panel GEMM on every AVX2 host (on Sapphire Rapids the tiles
 *       ran 500-row prefill GEMMs at 31 GFLOP/s, x streaming from L3 for every weight row; the panel 250-320;
 *       which float32 layers send prefill here is quantize.py's kernel_prefill_f32).
 * bf16: x is rounded once per call to bf16 (round-to-nearest-even, as torch's `x.to(bfloat16)`), into a
 *       zero-padded scratch copy; vdpbf16ps multiplies pairs of bf16 exactly and accumulates in fp32, so
 *       the result equals (bf16(x) · W) computed in fp32 up to summation order. Tiles of 4 weight rows ×
 *       4 x rows (16 accumulators: 8 loads per 16 vdpbf16ps) over x in chunks of 128 rows whose bf16 copy
 *       stays in L2, and the row walk (bf16_row) up to 8 rows, sum in one fixed order whatever the tile, so
 *       those rows' outputs never depend on the batch they are in. On AVX2 hosts more than BF16_PANEL_M
 *       rows take the panel GEMM on x rounded to bf16 values (fp32 FMAs on the widened weights); without
 *       vdpbf16ps (BF16_PANEL_M = 8) fewer rows widen 16 bf16 at a time to even / odd fp32 lanes by shifts
 *       (bf16x16_fma) and walk one weight row against up to two x rows per pass.
 * So f16 (linear_f16.c), bf16 and f32 prefill each have two paths, each giving a row the same bits whatever the
 * other rows of its call; the two agree to fp32 rounding, as a float32 model's GEMM and GEMV. Every path
 * splits the N output rows over OpenMP threads; scalar fallbacks compute the same sums in plain loops.
 */
#include "blazr_kernels.h"

/* fp32: dot products of weight row w[K] with x rows x[m·ldx], m < mt → res. */
BLZ_INLINE void f32_tile(const int mt, const float *restrict w, int64_t K, const float *restrict x,
                         int64_t ldx, float *restrict res) {
#ifdef BLZ_AVX512
    __m512 acc[4][2];
    for (int m = 0; m < 4; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        const __m512 w0 = _mm512_loadu_ps(w + k), w1 = _mm512_loadu_ps(w + k + 16);
        for (int m = 0; m < mt; ++m) {
            acc[m][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + m * ldx + k), acc[m][0]);
            acc[m][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + m * ldx + k + 16), acc[m][1]);
        }
    }
    for (; k < K; k += 16) {
        const __mmask16 mk = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1u);
        const __m512 w0 = _mm512_maskz_loadu_ps(mk, w + k);
        for (int m = 0; m < mt; ++m)
            acc[m][0] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(mk, x + m * ldx + k), acc[m][0]);
    }
    for (int m = 0; m < mt; ++m) res[m] = _mm512_reduce_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]));
#elif defined(BLZ_AVX2)
    __m256 acc[4][2];
    for (int m = 0; m < 4; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        const __m256 w0 = _mm256_loadu_ps(w + k), w1 = _mm256_loadu_ps(w + k + 8);
        for (int m = 0; m < mt; ++m) {
            acc[m][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + m * ldx + k), acc[m][0]);
            acc[m][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + m * ldx + k + 8), acc[m][1]);
        }
    }
    for (; k < K; k += 8) {
        const __m256i mk = blz_mask256(K - k);
        const __m256 w0 = _mm256_maskload_ps(w + k, mk);
        for (int m = 0; m < mt; ++m)
            acc[m][0] = _mm256_fmadd_ps(w0, _mm256_maskload_ps(x + m * ldx + k, mk), acc[m][0]);
    }
    for (int m = 0; m < mt; ++m) res[m] = blz_hsum256(_mm256_add_ps(acc[m][0], acc[m][1]));
#else
    for (int m = 0; m < mt; ++m) {
        const float *xm = x + m * ldx;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t k = 0; k < K; ++k) acc += w[k] * xm[k];
        res[m] = acc;
    }
#endif
}

#if defined(BLZ_AVX512) && BLZ_STREAMS > 1
/* One x row (M = 1) against weight rows w[0..nr-1] (nr ≤ 4, a constant after inlining; one per stream):
 * res[r] by f32_tile's operations for row r. */
BLZ_INLINE void f32_rows1(const int nr, const float *const *w, int64_t K, const float *restrict x,
                          float *restrict res) {
    __m512 acc[4][2];
    for (int r = 0; r < nr; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        const __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
        for (int r = 0; r < nr; ++r) {
            acc[r][0] = _mm512_fmadd_ps(_mm512_loadu_ps(w[r] + k), x0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(_mm512_loadu_ps(w[r] + k + 16), x1, acc[r][1]);
        }
    }
    for (; k < K; k += 16) {
        const __mmask16 mk = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1u);
        const __m512 x0 = _mm512_maskz_loadu_ps(mk, x + k);
        for (int r = 0; r < nr; ++r) acc[r][0] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, w[r] + k), x0, acc[r][0]);
    }
    for (int r = 0; r < nr; ++r) res[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
}

static void f32_streams(const int nr, const int mt, const void *const *rows, int64_t K, const void *x, float *res) {
    (void)mt; /* one x row */
    BLZ_TILE_SWITCH(f32_rows1, nr, (const float *const *)rows, K, x, res);
}
#endif

/* bf16 tiles: BF16_NR weight rows × BF16_MR x rows, one fp32 accumulator per (row, x row) pair. */
#define BF16_NR 4         /* = the lanes of bf16_hsum4 */
#define BF16_MR 4         /* 16 accumulators; 5 or 6 measured no faster, 8 × 3 slower (Zen 4) */
#define BF16_MCHUNK 128   /* x rows per pass over the weights: their bf16 copy stays in L2 */
#define BF16_PF 4096      /* software prefetch distance of a weight row stream into L2, in weights (8 KB) */
#define BF16_ROWWISE_M 8  /* up to 8 x rows: weight rows one at a time (bf16_row) */
/* More x rows than this take gemm_float.c's panel GEMM (AVX2 hosts): without vdpbf16ps from 9 rows on; with
 * it the 4 × 4 vdpbf16ps tiles run up to 16 rows (Sapphire Rapids, Llama-3.2-1B's shapes: tiles 150-197
 * GFLOP/s at 12-16 rows against the panel's 134-157, the panel 196-272 at 24-48 rows against 184-211 and
 * ~310 at 500 rows against ~210 — vdpbf16ps issues at the rate of one 16-lane FMA, not two). */
#ifdef BLZ_BF16
#define BF16_PANEL_M 16
#else
#define BF16_PANEL_M BF16_ROWWISE_M
#endif

#if defined(BLZ_AVX2) && !defined(BLZ_BF16)
/* AVX2 bf16 (no vdpbf16ps): 16 bf16 of a row are one 256-bit load; shifting each 32-bit lane left by 16
 * gives the even elements as fp32, masking off its low half the odd ones (products of bf16 are exact in
 * fp32). A (weight row, x row) pair keeps four fp32 accumulators — even / odd elements of even-numbered
 * 16-element chunks, then of odd-numbered ones — so a single row runs four independent FMA chains (two
 * were latency-bound: ~20 GB/s hot on Zen 1); the tail of a weight row goes through a zero-padded copy (x
 * rows are zero-padded to ldx); the result is blz_hsum256((a0 + a1) + (a2 + a3)). The row and tile paths
 * both call bf16_rows_avx2, so a result depends on its own pair only, never on M or the tile. */
#define BF16_AVX2 1
BLZ_INLINE void bf16x16_fma(__m256i wv, __m256i xv, __m256 *ae, __m256 *ao) {
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    *ae = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(wv, 16)),
                          _mm256_castsi256_ps(_mm256_slli_epi32(xv, 16)), *ae);
    *ao = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(wv, hi)),
                          _mm256_castsi256_ps(_mm256_and_si256(xv, hi)), *ao);
}

/* The last K % 16 weights of a row, zero-padded to 16. */
BLZ_INLINE __m256i bf16_tail(const uint16_t *w, int64_t n) {
    uint16_t t[16] = {0};
    memcpy(t, w, (size_t)n * sizeof(uint16_t));
    return _mm256_loadu_si256((const __m256i *)t);
}

/* res[m] = weight row w · x row xr[m] for m < nx (1 or 2, a constant after inlining). pf: prefetch the
 * weight stream BF16_PF ahead. */
BLZ_INLINE void bf16_rows_avx2(const int nx, const uint16_t *restrict w, int64_t K, const uint16_t *const *xr,
                               float *res, const int pf) {
    __m256 a[2][4];
    for (int m = 0; m < 2; ++m)
        for (int i = 0; i < 4; ++i) a[m][i] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        if (pf) _mm_prefetch((const char *)(w + k + BF16_PF), _MM_HINT_T1);
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)(w + k));
        const __m256i w1 = _mm256_loadu_si256((const __m256i *)(w + k + 16));
        for (int m = 0; m < nx; ++m) {
            bf16x16_fma(w0, _mm256_loadu_si256((const __m256i *)(xr[m] + k)), &a[m][0], &a[m][1]);
            bf16x16_fma(w1, _mm256_loadu_si256((const __m256i *)(xr[m] + k + 16)), &a[m][2], &a[m][3]);
        }
    }
    for (; k < K; k += 16) { /* at most one full chunk (even-numbered) and the tail */
        const int h = (int)((k / 16) & 1) * 2;
        const __m256i wv = K - k >= 16 ? _mm256_loadu_si256((const __m256i *)(w + k)) : bf16_tail(w + k, K - k);
        for (int m = 0; m < nx; ++m)
            bf16x16_fma(wv, _mm256_loadu_si256((const __m256i *)(xr[m] + k)), &a[m][h], &a[m][h + 1]);
    }
    for (int m = 0; m < nx; ++m)
        res[m] = blz_hsum256(_mm256_add_ps(_mm256_add_ps(a[m][0], a[m][1]), _mm256_add_ps(a[m][2], a[m][3])));
}

/* res[m] for x rows xb + m·ldx, m < mt (≤ BF16_MR), two at a time. */
BLZ_INLINE void bf16_row_avx2(const int mt, const uint16_t *restrict w, int64_t K, const uint16_t *restrict xb,
                              int64_t ldx, float *res, const int pf) {
    for (int m = 0; m < mt; m += 2) {
        const uint16_t *xr[2] = {xb + m * ldx, xb + (m + 1) * ldx};
        if (m + 1 < mt) bf16_rows_avx2(2, w, K, xr, res + m, pf && m == 0);
        else bf16_rows_avx2(1, w, K, xr, res + m, pf && m == 0);
    }
}
#endif

#ifdef BLZ_BF16
/* The 16-lane sums of a, b, c, d → lanes 0..3, by one fixed tree: halves of 256, then of 128 bits (across
 * the four vectors at once), then within 128-bit lanes. Every tile shape reduces through it, so a result
 * depends only on its own row pair, never on its neighbours in the tile. */
BLZ_INLINE __m128 bf16_hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
    const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
    __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
    s = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4E)); /* 128-bit lane q = sums of vector q */
    s = _mm512_add_ps(s, _mm512_permute_ps(s, 0xB1));
    return _mm512_castps512_ps128(_mm512_maskz_compress_ps(0x1111, s));
}
#endif

/* res[n][m] = Σ_k w[n·K + k] · xb[m·ldx + k] for n < nt (≤ BF16_NR), m < mt (≤ BF16_MR, a compile-time
 * constant at each call): weight rows bf16 bits, x rows bf16 zero-padded to ldx (a multiple of 32).
 * pf: prefetch the weight rows BF16_PF ahead (the first x tile of a pass, which reads them from memory;
 * M = 16 decode: 27-29 vs 41 ms for SmolLM2's linears).
 * Products are exact (vdpbf16ps), sums fp32 in a fixed order: 32-element chunks in sequence per lane,
 * then bf16_hsum4. The scalar fallback sums in plain loops. */
BLZ_INLINE void bf16_tile(const int mt, const int nt, const uint16_t *const *w, int64_t K,
                          const uint16_t *restrict xb, int64_t ldx, float res[BF16_NR][BF16_MR], const int pf) {
#ifdef BLZ_BF16
    const uint16_t *wr[BF16_NR];
    const int top = nt > 1 ? nt - 1 : 0;
    for (int n = 0; n < BF16_NR; ++n) wr[n] = w[n < top ? n : top]; /* spare rows (a copy of the last): discarded */
    __m512 acc[BF16_MR][BF16_NR];
    for (int m = 0; m < BF16_MR; ++m)
        for (int n = 0; n < BF16_NR; ++n) acc[m][n] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        __m512i wv[BF16_NR];
        for (int n = 0; n < BF16_NR; ++n) wv[n] = _mm512_loadu_si512(wr[n] + k);
        if (pf)
            for (int n = 0; n < BF16_NR; ++n) _mm_prefetch((const char *)(wr[n] + k + BF16_PF), _MM_HINT_T1);
        for (int m = 0; m < mt; ++m) {
            const __m512bh xv = (__m512bh)_mm512_loadu_si512(xb + m * ldx + k);
            for (int n = 0; n < BF16_NR; ++n) acc[m][n] = _mm512_dpbf16_ps(acc[m][n], xv, (__m512bh)wv[n]);
        }
    }
    if (k < K) {
        const __mmask32 mk = (__mmask32)((1u << (K - k)) - 1u);
        __m512i wv[BF16_NR];
        for (int n = 0; n < BF16_NR; ++n) wv[n] = _mm512_maskz_loadu_epi16(mk, wr[n] + k);
        for (int m = 0; m < mt; ++m) {
            const __m512bh xv = (__m512bh)_mm512_loadu_si512(xb + m * ldx + k);
            for (int n = 0; n < BF16_NR; ++n) acc[m][n] = _mm512_dpbf16_ps(acc[m][n], xv, (__m512bh)wv[n]);
        }
    }
    for (int m = 0; m < mt; ++m) {
        float s[BF16_NR];
        _mm_storeu_ps(s, bf16_hsum4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]));
        for (int n = 0; n < nt; ++n) res[n][m] = s[n];
    }
#elif defined(BF16_AVX2)
    for (int n = 0; n < nt; ++n) bf16_row_avx2(mt, w[n], K, xb, ldx, res[n], pf);
#else
    for (int n = 0; n < nt; ++n)
        for (int m = 0; m < mt; ++m) {
            const uint16_t *wn = w[n], *xm = xb + m * ldx;
            float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (int64_t k = 0; k < K; ++k) acc += blz_bf16_to_fp32(wn[k]) * blz_bf16_to_fp32(xm[k]);
            res[n][m] = acc;
        }
#endif
}

/* bf16_tile for one weight row (nt = 1) walked alone: the same sums in the same order (bf16_hsum4 with
 * zero vectors beside), reading the weights as one sequential stream. Small M is bandwidth-bound, and
 * there the tile's four interleaved row streams prefetch badly (Zen 4, SmolLM2's linears at M = 1:
 * 14 GB/s in 4-row tiles, 25 GB/s row by row; M = 16: tiles 15% faster). From 2 rows on, the longer
 * work per weight row lets the hardware prefetcher fall behind: fetching 8 KB ahead into L2 measured
 * 1.8x faster at M = 4 (10.1 vs 18.5 ms for SmolLM2's linears) and no different at M = 1. */
BLZ_INLINE void bf16_row(const int mt, const uint16_t *restrict w, int64_t K, const uint16_t *restrict xb,
                         int64_t ldx, float *restrict res) {
#ifdef BLZ_BF16
    __m512 acc[BF16_MR];
    for (int m = 0; m < BF16_MR; ++m) acc[m] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        if (mt >= 2) _mm_prefetch((const char *)(w + k + BF16_PF), _MM_HINT_T1);
        const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + k);
        for (int m = 0; m < mt; ++m)
            acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)_mm512_loadu_si512(xb + m * ldx + k), wv);
    }
    if (k < K) {
        const __mmask32 mk = (__mmask32)((1u << (K - k)) - 1u);
        const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mk, w + k);
        for (int m = 0; m < mt; ++m)
            acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)_mm512_loadu_si512(xb + m * ldx + k), wv);
    }
    const __m512 z = _mm512_setzero_ps();
    for (int m = 0; m < mt; ++m) res[m] = _mm_cvtss_f32(bf16_hsum4(acc[m], z, z, z));
#elif defined(BF16_AVX2)
    bf16_row_avx2(mt, w, K, xb, ldx, res, mt >= 2);
#else
    float r[BF16_NR][BF16_MR];
    const uint16_t *wr[1] = {w};
    bf16_tile(mt, 1, wr, K, xb, ldx, r, 0);
    for (int m = 0; m < mt; ++m) res[m] = r[0][m];
#endif
}

#if defined(BLZ_BF16) && BLZ_STREAMS > 1
/* One x row (M = 1) against weight rows w[0..nr-1] (nr ≤ 4, a constant after inlining; one per stream):
 * res[r] by bf16_row's operations for row r (bf16_hsum4's lane r depends on vector r alone). */
BLZ_INLINE void bf16_rows1(const int nr, const uint16_t *const *w, int64_t K, const uint16_t *restrict xb,
                           float *restrict res) {
    __m512 acc[4];
    for (int r = 0; r < 4; ++r) acc[r] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        const __m512bh xv = (__m512bh)_mm512_loadu_si512(xb + k);
        for (int r = 0; r < nr; ++r) acc[r] = _mm512_dpbf16_ps(acc[r], xv, (__m512bh)_mm512_loadu_si512(w[r] + k));
    }
    if (k < K) {
        const __mmask32 mk = (__mmask32)((1u << (K - k)) - 1u);
        const __m512bh xv = (__m512bh)_mm512_loadu_si512(xb + k);
        for (int r = 0; r < nr; ++r)
            acc[r] = _mm512_dpbf16_ps(acc[r], xv, (__m512bh)_mm512_maskz_loadu_epi16(mk, w[r] + k));
    }
    float s[4];
    _mm_storeu_ps(s, bf16_hsum4(acc[0], acc[1], acc[2], acc[3]));
    for (int r = 0; r < nr; ++r) res[r] = s[r];
}

static void bf16_streams(const int nr, const int mt, const void *const *rows, int64_t K, const void *x, float *res) {
    (void)mt; /* one x row */
    BLZ_TILE_SWITCH(bf16_rows1, nr, (const uint16_t *const *)rows, K, x, res);
}
#endif

/* Round rows x[M, K] to bf16 into xb[M, ldx], zero-padding columns K .. ldx-1. */
static void x_to_bf16(const float *restrict x, int64_t K, uint16_t *restrict xb, int64_t ldx) {
    int64_t k = 0;
#ifdef BLZ_BF16
    for (; k + 32 <= K; k += 32) {
        const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + k + 16), _mm512_loadu_ps(x + k));
        _mm512_storeu_si512(xb + k, (__m512i)v);
    }
#endif
    for (; k < K; ++k) xb[k] = blz_fp32_to_bf16(x[k]);
    for (; k < ldx; ++k) xb[k] = 0;
}

#define F32_ROWWISE_M 8 /* AVX2 without AVX-512: more x rows take gemm_float.c's panel GEMM */

/* fp32 weights: x [M, K], w [N, K], bias [N] or NULL, residual [M, N] or NULL (may equal out); with
 * `gemm` (a prefill call) more than F32_ROWWISE_M rows run the panel GEMM on AVX2 hosts without AVX-512 —
 * otherwise every row the same tiles, whatever M (decode: batch-invariant bit for bit). */
int blz_linear_f32_gemm(const float *x, int64_t M, int64_t K, const float *w, int64_t N, const float *bias,
                        const float *residual, float *out, int swiglu, int nthreads, int gemm) {
    if (M < 0 || N < 0 || K <= 0 || (swiglu && (N % 2 || residual))) return BLZ_EINVAL;
    if (M == 0 || N == 0) return BLZ_OK;
    const int64_t nout = swiglu ? N / 2 : N;
    const int nt = blz_threads(nthreads, M * N * K, BLZ_LINEAR_PARALLEL_MIN);
    if (gemm && M > F32_ROWWISE_M)
        return blz_panel_gemm(w, NULL, BLZ_PANEL_F32, x, M, K, N, bias, residual, out, swiglu, nt);
#if defined(BLZ_AVX512) && BLZ_STREAMS > 1
    if (M == 1) {
        blz_team_t team;
        blz_team_init(&team, nt, nout, blz_gemv_parts(1, swiglu));
#pragma omp parallel num_threads(nt)
        blz_gemv_streams(f32_streams, (const uint8_t *)w, NULL, 4 * K, K, x, 1, N, bias, residual, out, swiglu, &team);
        return BLZ_OK;
    }
#endif
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t n = 0; n < nout; ++n) {
        for (int64_t m0 = 0; m0 < M; m0 += 4) {
            const int mt = (int)blz_min(4, M - m0);
            float r[4], g[4];
            BLZ_TILE_SWITCH(f32_tile, mt, w + n * K, K, x + m0 * K, K, r);
            if (swiglu) BLZ_TILE_SWITCH(f32_tile, mt, w + (n + nout) * K, K, x + m0 * K, K, g);
            blz_epilogue(r, g, mt, m0, n, N, nout, bias, residual, out, swiglu);
        }
    }
    return BLZ_OK;
}

BLZ_EXPORT int blz_linear_f32(const float *x, int64_t M, int64_t K, const float *w, int64_t N,
                              const float *bias, const float *residual, float *out, int swiglu,
                              int nthreads) {
    return blz_linear_f32_gemm(x, M, K, w, N, bias, residual, out, swiglu, nthreads, 0);
}

/* bf16 weights (uint16 bits): x [M, K] fp32, w [N, K] — or, with a row table `tab` (int64 [N], BLZ_ROWS),
 * row n at tab[n] —, otherwise as blz_linear_f32. */
int blz_linear_bf16_rows(const float *x, int64_t M, int64_t K, const uint16_t *w, const int64_t *tab, int64_t N,
                         const float *bias, const float *residual, float *out, int swiglu, int nthreads) {
    if (M < 0 || N < 0 || K <= 0 || (swiglu && (N % 2 || residual))) return BLZ_EINVAL;
    if (M == 0 || N == 0) return BLZ_OK;
    const int64_t ldx = blz_round_up(K, 32), nout = swiglu ? N / 2 : N;
    const int nt = blz_threads(nthreads, M * N * K, BLZ_LINEAR_PARALLEL_MIN);
#if defined(BLZ_AVX2)
    if (M > BF16_PANEL_M) { /* prefill: the panel GEMM on x rounded to bf16 values */
        return blz_panel_gemm(w, tab, BLZ_PANEL_BF16, x, M, K, N, bias, residual, out, swiglu, nt);
    }
#endif
    uint16_t *xb = blz_scratch((size_t)(M * ldx) * sizeof(uint16_t));
    if (!xb) return BLZ_ENOMEM;
    const int64_t nblocks = (nout + BF16_NR - 1) / BF16_NR;
#if defined(BLZ_BF16) && BLZ_STREAMS > 1
    blz_team_t team;
    blz_team_init(&team, nt, nout, blz_gemv_parts(1, swiglu));
#endif
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; ++m) x_to_bf16(x + m * K, K, xb + m * ldx, ldx);
#if defined(BLZ_BF16) && BLZ_STREAMS > 1
        if (M == 1)
            blz_gemv_streams(bf16_streams, (const uint8_t *)w, tab, 2 * K, K, xb, 1, N, bias, residual, out, swiglu,
                             &team);
        else
#endif
        for (int64_t mc = 0; mc < M; mc += BF16_MCHUNK) {
            const int64_t mend = blz_min(M, mc + BF16_MCHUNK);
            if (M <= BF16_ROWWISE_M) {
#pragma omp for schedule(static)
                for (int64_t n = 0; n < nout; ++n)
                    for (int64_t m0 = mc; m0 < mend; m0 += BF16_MR) {
                        const int mt = (int)blz_min(BF16_MR, mend - m0);
                        float r[BF16_MR], g[BF16_MR];
                        BLZ_TILE_SWITCH(bf16_row, mt, blz_weight_row16(w, tab, n, K), K, xb + m0 * ldx, ldx, r);
                        if (swiglu)
                            BLZ_TILE_SWITCH(bf16_row, mt, blz_weight_row16(w, tab, n + nout, K), K, xb + m0 * ldx, ldx, g);
                        blz_epilogue(r, g, mt, m0, n, N, nout, bias, residual, out, swiglu);
                    }
                continue;
            }
#pragma omp for schedule(static)
            for (int64_t b = 0; b < nblocks; ++b) {
                const int64_t n0 = b * BF16_NR;
                const int nn = (int)blz_min(BF16_NR, nout - n0);
                for (int64_t m0 = mc; m0 < mend; m0 += BF16_MR) {
                    const int mt = (int)blz_min(BF16_MR, mend - m0);
                    float r[BF16_NR][BF16_MR], g[BF16_NR][BF16_MR];
                    const uint16_t *xt = xb + m0 * ldx, *wr[BF16_NR], *wu[BF16_NR];
                    for (int n = 0; n < nn; ++n) {
                        wr[n] = blz_weight_row16(w, tab, n0 + n, K);
                        wu[n] = swiglu ? blz_weight_row16(w, tab, n0 + nout + n, K) : NULL;
                    }
                    BLZ_TILE_SWITCH(bf16_tile, mt, nn, wr, K, xt, ldx, r, m0 == mc);
                    if (swiglu) BLZ_TILE_SWITCH(bf16_tile, mt, nn, wu, K, xt, ldx, g, m0 == mc);
                    for (int n = 0; n < nn; ++n)
                        blz_epilogue(r[n], g[n], mt, m0, n0 + n, N, nout, bias, residual, out, swiglu);
                }
            }
        }
    }
    return BLZ_OK;
}

/* blz_linear_bf16_rows on a weight whose rows follow each other from w. */
BLZ_EXPORT int blz_linear_bf16(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N,
                               const float *bias, const float *residual, float *out, int swiglu,
                               int nthreads) {
    return blz_linear_bf16_rows(x, M, K, w, NULL, N, bias, residual, out, swiglu, nthreads);
}
