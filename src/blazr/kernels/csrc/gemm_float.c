/* blazr kernels — the prefill GEMM of float weights (f32, f16, bf16) on fp32 FMAs: out[M, N] = x[M, K] · Wᵀ
 * (+ bias) (+ residual), or the SwiGLU form, for the many-row calls of linear_float.c and linear_f16.c
 * (prefill, large decode batches) on AVX2 hosts, AVX-512 ones included (fp32 FMAs on widened weights outran
 * vdpbf16ps there, below).
 *
 * An outer-product GEMM, as BLIS / GotoBLAS lay one out:
 * - x is packed once per call, k-major in groups of PANEL_MR rows per block of PANEL_KC columns
 *   (pack_x_group), so the micro-kernel reads x as one sequential stream;
 * - a panel of PANEL_NR weight rows × PANEL_KC columns is widened to fp32 once (F16C, a shift, or a copy),
 *   transposed in 8 × 8 register blocks (k-major, PANEL_NR floats per k), into an L1-sized scratch (AVX-512,
 *   f16 / bf16: 16 rows × 32 columns transposed while still 16-bit, then widened 16 lanes at a time);
 * - the micro-kernel walks the panel against PANEL_MR packed rows at a time — per k two panel loads, one
 *   broadcast of each x value, 2·PANEL_MR FMAs into as many registers (AVX-512: 32 outputs × 12 rows in 24
 *   of the 32 registers; AVX2: 16 × 6 in 12 of 16) —, carrying each output's sum through a
 *   [rows, PANEL_NR] buffer between column panels; a last group of a few rows runs a quarter, half or three
 *   quarters of the micro-kernel's rows, not all of them (16 rows on AVX-512: 12 + 4, not 12 + 12); the
 *   first micro-kernel call on a panel fetches the next panel's weights a line or two per k step (widening
 *   a panel from DRAM waited on 32 row streams the hardware prefetcher did not run ahead of);
 * - blocks of PANEL_NR outputs are split over the threads, each walking its blocks a group at a time
 *   (AVX2: 8 panels widened per column block, then each PANEL_MC-row block of x walked by the 8 in turn, so
 *   that an x block comes from the last-level cache once per group and then from L2 — BLIS's order; the
 *   AVX-512 form keeps one block over the whole pass, as measured there); the x rows go in passes of up to
 *   PANEL_XBYTES of packed x (a quarter of the last-level cache on a smaller one), which stay in the
 *   last-level cache while the weights stream past — passes of equal rows, one pass up to 1.25× that rather
 *   than a tail pass of a few rows, which widens (and decodes) every panel again for them (one pass for most
 *   prefill chunks). Zen 3, 1B shapes at 500 rows, f16: the groups level with one block at a time on a
 *   quiet host (best rounds 165-184 GFLOP/s both), +2-6 % in medians while other work loads the L3 (§73).
 * - on AVX-512, calls of 13-16 x rows (batched decode; f32z from 9) hold the x rows in a vector's lanes
 *   instead and the weight rows in the registers (`lanes_gemm`): no transposition of the weights; coded
 *   rows decoded a block at a time, the next block's bytes fetched during the walk. Zen 5, LFM2-350M's
 *   shapes cold, 16 rows against the panel: f32z 1.19-1.77x, bf16z 1.12-1.25x, f16 1.01-1.13x (NOTES §64).
 * - a block's outputs leave through blz_epilogue_row, a row's PANEL_NR outputs in vector steps (bias,
 *   residual, SwiGLU's silu · up: the decode epilogue's bits; one libm expf per output had cost ~10 % of a
 *   SwiGLU projection at 256-500 rows).
 * Every output is one sequential fp32 sum over k, FMA-rounded, from 0, whatever M, the pass, the group, the
 * form and the vector width: a row's result never depends on the other rows of the call, nor on the host's
 * ISA.
 *
 * Measured (2 threads, Llama-3.2-1B's shapes, warm weights): Zen 3, f16, 500 rows 150-175 GFLOP/s of a
 * ~190 FMA peak (the earlier unpacked version 115-155), 16 rows 80-100 (60-75). Sapphire Rapids, 512-bit
 * form: f16 / bf16 / f32 at 500 rows 280-340 GFLOP/s (torch's fp32 matmul 330-375; the 256-bit form 185-195),
 * 64 rows 250-270, 16 rows 135-165; f16 16 rows cold (a pass over 8 layers' weights) 7.9 → 9.5 GB/s of
 * weights with the quarter micro-kernels, the 16-bit transposition and the next panel fetched during the
 * micro-kernel (NOTES §39). A vdpbf16ps form (x and weights in bf16 pairs, half the k steps) was
 * tried for bf16 and ran 185-218 at 64-500 rows: on that core vdpbf16ps issues at one 16-lane instruction
 * per cycle, where fp32 FMAs issue two; a 128-column panel measured no different from 256.
 */
#include "blazr_kernels.h"

#include <unistd.h> /* sysconf: the L3 size */

#ifdef BLZ_AVX512
#define PANEL_NR 32            /* weight rows (outputs) per panel: two 16-lane vectors */
#define PANEL_MR 12            /* x rows per micro-kernel call: 24 accumulators of the 32 registers */
#define PANEL_KC 256           /* columns per panel: 32 KB of fp32, in the 48 KB L1 */
#else
#define PANEL_NR 16            /* weight rows (outputs) per panel: two 8-lane vectors */
#define PANEL_MR 6             /* x rows per micro-kernel call: 12 accumulators of the 16 registers */
#define PANEL_KC 256           /* columns per panel: 16 KB of fp32 */
#endif
#define PANEL_XBYTES (8 << 20) /* packed x per pass over the weights, at most (and a quarter of the L3) */
/* group_gemm's groups: PANEL_GROUP output blocks (SwiGLU: half as many, at least one, and their up rows) walk
 * each x block of PANEL_MC rows in turn */
#ifndef PANEL_GROUP
#ifdef BLZ_AVX512
#define PANEL_GROUP 1 /* one block at a time over the whole pass: the order measured on AVX-512 hosts (§39) */
#else
#define PANEL_GROUP 8
#endif
#endif
#define GROUP_PANELS (PANEL_GROUP > 1 ? PANEL_GROUP : 2) /* panels a group holds at most */
#ifndef PANEL_MC
#ifdef BLZ_AVX512
#define PANEL_MC (1 << 30) /* x rows per block of group_gemm's walk: the whole pass */
#else
#define PANEL_MC (16 * PANEL_MR) /* x rows per block of group_gemm's walk: 96 rows, 96 KB of x per column block */
#endif
#endif

#ifdef BLZ_AVX2
/* r[i] ← column i of the 8 × 8 matrix whose rows are r[0..7]. */
BLZ_INLINE void transpose8_ps(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

#endif

/* Pack group g of x's rows: xp[k0·Mp + g·kc·PANEL_MR + kk·PANEL_MR + m] = x[g·PANEL_MR + m][k0 + kk] for
 * each block of PANEL_KC columns from k0 (kc: that block's width), rows ≥ M zero; Mp = M rounded up to
 * PANEL_MR. */
static void pack_x_group(const float *restrict x, int64_t M, int64_t K, int64_t Mp,
                         int64_t g, float *restrict xp) {
    const int mv = (int)blz_min(PANEL_MR, M - g * PANEL_MR); /* rows of the group that exist */
    for (int64_t k0 = 0; k0 < K; k0 += PANEL_KC) {
        const int64_t kc = blz_min(PANEL_KC, K - k0);
        float *dst = xp + k0 * Mp + g * kc * PANEL_MR;
        const float *src = x + g * PANEL_MR * K + k0;
        int64_t kk = 0;
#ifdef BLZ_AVX2
        for (; kk + 8 <= kc; kk += 8)
            for (int s0 = 0; s0 < PANEL_MR; s0 += 8) { /* rows s0 .. s0+7 of the group */
                __m256 r[8];
                for (int m = 0; m < 8; ++m)
                    r[m] = s0 + m < mv ? _mm256_loadu_ps(src + (s0 + m) * K + kk) : _mm256_setzero_ps();
                transpose8_ps(r); /* r[i]: column kk + i of rows s0 .. s0+7 */
                const __m256i keep = blz_mask256(PANEL_MR - s0);
                for (int i = 0; i < 8; ++i) _mm256_maskstore_ps(dst + (kk + i) * PANEL_MR + s0, keep, r[i]);
            }
#endif
        for (; kk < kc; ++kk)
            for (int m = 0; m < PANEL_MR; ++m) dst[kk * PANEL_MR + m] = m < mv ? src[m * K + kk] : 0.0f;
    }
}

#ifdef BLZ_AVX512
/* 16 rows (src[0..15], NULL: a zero row) × 32 columns from k of 16-bit weights (f16, or bf16 when `bf16`)
 * → panel[(k + c)·PANEL_NR + j] (j < 16) as fp32. Transposed while still 16-bit — unpacks of words, dwords
 * and qwords within 128-bit lanes leave, per column offset i < 8, rows 0-7 and rows 8-15 of columns
 * k + 8L + i in lane L of two registers; a qword permute puts both halves of two columns side by side —
 * then widened 16 values at a time (half the shuffles of transposing fp32 8 × 8 blocks, and 16-lane
 * conversions). */
BLZ_INLINE void widen16x32(const uint8_t *const *src, int64_t k, const int bf16, float *restrict panel) {
    __m512i r[16], a[16];
    for (int j = 0; j < 16; ++j)
        r[j] = src[j] ? _mm512_loadu_si512((const uint16_t *)src[j] + k) : _mm512_setzero_si512();
    for (int j = 0; j < 16; j += 2) { /* per lane: rows j, j+1 interleaved, columns 0-3 | 4-7 */
        a[j] = _mm512_unpacklo_epi16(r[j], r[j + 1]);
        a[j + 1] = _mm512_unpackhi_epi16(r[j], r[j + 1]);
    }
    for (int j = 0; j < 16; j += 4) /* rows j .. j+3: columns 0, 1 | 2, 3 | 4, 5 | 6, 7 */
        for (int h = 0; h < 2; ++h) {
            r[j + 2 * h] = _mm512_unpacklo_epi32(a[j + h], a[j + 2 + h]);
            r[j + 2 * h + 1] = _mm512_unpackhi_epi32(a[j + h], a[j + 2 + h]);
        }
    for (int j = 0; j < 16; j += 8) /* rows j .. j+7: column 2q + e in a[j + 2q + e] */
        for (int q = 0; q < 4; ++q) {
            a[j + 2 * q] = _mm512_unpacklo_epi64(r[j + q], r[j + 4 + q]);
            a[j + 2 * q + 1] = _mm512_unpackhi_epi64(r[j + q], r[j + 4 + q]);
        }
    const __m512i lanes01 = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), lanes23 = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    for (int i = 0; i < 8; ++i) /* column offset i: a[i] rows 0-7, a[8 + i] rows 8-15, lane L column 8L + i */
        for (int h = 0; h < 2; ++h) {
            const __m512i v = _mm512_permutex2var_epi64(a[i], h ? lanes23 : lanes01, a[8 + i]);
            const __m256i c[2] = {_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)};
            for (int e = 0; e < 2; ++e) {
                const __m512 f = bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(c[e]), 16))
                                      : _mm512_cvtph_ps(c[e]);
                _mm512_storeu_ps(panel + (k + 8 * (2 * h + e) + i) * PANEL_NR, f);
            }
        }
}
#endif

/* panel[k·16 + j] = row n0 + j of w at column k0 + k as fp32 (rows j ≥ nr: 0), k < kc. */
static void widen_panel(const void *w, const int64_t *tab, const int wk, int64_t n0, int nr, int64_t K, int64_t k0,
                        int64_t kc, float *restrict panel) {
    const int64_t esize = blz_kv_elem_bytes(wk);
    const uint8_t *src[PANEL_NR];
    for (int j = 0; j < PANEL_NR; ++j)
        src[j] = j < nr ? blz_weight_row((const uint8_t *)w, tab, n0 + j, esize * K) + esize * k0 : NULL;
    int64_t k = 0;
#ifdef BLZ_AVX512
    if (wk != BLZ_PANEL_F32)
        for (; k + 32 <= kc; k += 32)
            for (int j0 = 0; j0 < PANEL_NR; j0 += 16) widen16x32(src + j0, k, wk == BLZ_PANEL_BF16, panel + j0);
#endif
#ifdef BLZ_AVX2
    for (; k + 8 <= kc; k += 8)
        for (int j0 = 0; j0 < PANEL_NR; j0 += 8) {
            __m256 r[8];
            for (int j = 0; j < 8; ++j) r[j] = j0 + j < nr ? blz_kv_load8(src[j0 + j], k, wk) : _mm256_setzero_ps();
            transpose8_ps(r);
            for (int i = 0; i < 8; ++i) _mm256_storeu_ps(panel + (k + i) * PANEL_NR + j0, r[i]);
        }
#endif
    for (; k < kc; ++k)
        for (int j = 0; j < PANEL_NR; ++j) panel[k * PANEL_NR + j] = j < nr ? blz_kv_load1((const char *)src[j], k, wk) : 0.0f;
}

/* Where the micro-kernel fetches the next panel's weights while it runs (the panel after this one in the
 * same rows): `lines` cache lines, row_lines of each row in turn, per_k of them a k step. */
typedef struct {
    const char *rows[PANEL_NR];
    int64_t row_lines, lines, per_k;
} pf_t;

/* c[m][0..PANEL_NR-1] (+)= Σ_k xp[k][m] · panel[k][0..PANEL_NR-1] for m < mr ≤ PANEL_MR (xp: one packed
 * group): one fused multiply-add per (output, k) in k order, from 0 when `first`, else from c. */
BLZ_INLINE void micro_rows(const int mr, const float *restrict panel, int64_t kc, const float *restrict xp,
                           float *restrict c, const int first, const pf_t *pf) {
#if defined(BLZ_AVX512) || defined(BLZ_AVX2)
    enum { H = PANEL_NR / 2 }; /* floats per vector */
    blz_vf acc[PANEL_MR][2];
    for (int m = 0; m < mr; ++m) {
        acc[m][0] = first ? BLZ_VF_ZERO() : BLZ_VF_LOAD(c + m * PANEL_NR);
        acc[m][1] = first ? BLZ_VF_ZERO() : BLZ_VF_LOAD(c + m * PANEL_NR + H);
    }
    for (int64_t k = 0; k < kc; ++k) {
        if (pf) /* line k of the next panel's weights (row after row), two on f32 rows */
            for (int64_t l = k * pf->per_k; l < (k + 1) * pf->per_k && l < pf->lines; ++l)
                _mm_prefetch(pf->rows[l / pf->row_lines] + 64 * (l % pf->row_lines), _MM_HINT_T0);
        const blz_vf p0 = BLZ_VF_LOAD(panel + k * PANEL_NR), p1 = BLZ_VF_LOAD(panel + k * PANEL_NR + H);
        for (int m = 0; m < mr; ++m) {
            const blz_vf xv = BLZ_VF_SET1(xp[k * PANEL_MR + m]);
            acc[m][0] = BLZ_VF_FMA(p0, xv, acc[m][0]);
            acc[m][1] = BLZ_VF_FMA(p1, xv, acc[m][1]);
        }
    }
    for (int m = 0; m < mr; ++m) {
        BLZ_VF_STORE(c + m * PANEL_NR, acc[m][0]);
        BLZ_VF_STORE(c + m * PANEL_NR + H, acc[m][1]);
    }
#else
    (void)pf;
    for (int m = 0; m < mr; ++m)
        for (int j = 0; j < PANEL_NR; ++j) {
            float v = first ? 0.0f : c[m * PANEL_NR + j];
            for (int64_t k = 0; k < kc; ++k) v = fmaf(panel[k * PANEL_NR + j], xp[k * PANEL_MR + m], v);
            c[m * PANEL_NR + j] = v;
        }
#endif
}

/* micro_rows for the rows of a group that exist (`real`), rounded up to a quarter of PANEL_MR: a last
 * group of a few rows does not pay for the padding (16 rows on AVX-512: 12 + 4, not 12 + 12). */
static void micro(int real, const float *restrict panel, int64_t kc, const float *restrict xp, float *restrict c,
                  const int first, const pf_t *pf) {
    enum { Q = PANEL_MR / 4 };
    switch ((blz_min(real, PANEL_MR) + Q - 1) / Q) {
        case 1: micro_rows(Q, panel, kc, xp, c, first, pf); return;
        case 2: micro_rows(2 * Q, panel, kc, xp, c, first, pf); return;
        case 3: micro_rows(3 * Q, panel, kc, xp, c, first, pf); return;
        default: micro_rows(PANEL_MR, panel, kc, xp, c, first, pf);
    }
}

/* The panels one thread widens together for a column block (`group_gemm`): the weight rows n0 .. n0+nr−1 of
 * `w` (kind wk, row table tab or NULL) — an output block's rows, or (SwiGLU) its up rows. */
typedef struct {
    const void *w;
    const int64_t *tab;
    int wk, nr;
    int64_t n0;
} gpanel_t;

/* c_p [m1 − m0, PANEL_NR] (+ p·cstride) = packed x rows m0 .. m1−1 (multiples of PANEL_MR; rows from M on are
 * padding) · the rows of panel p, for the np ≤ GROUP_PANELS panels (bp: GROUP_PANELS · PANEL_KC · PANEL_NR
 * floats of scratch). Per block of PANEL_KC columns the np panels are widened, then the x rows go in blocks of
 * PANEL_MC, each block walked by every panel in turn: an x block is read from the last-level cache once for
 * the group and then from L2 (np × 16 KB of panels and ~100 KB of x in Zen 3's 512 KB), where one panel at a
 * time had streamed all the pass's x rows past each panel (BLIS's loop order). Each output keeps its one
 * sequential sum over k: the column blocks go in order, every sum carried in c between them. */
static void group_gemm(const gpanel_t *gp, int np, int64_t K, const float *xp, int64_t M, int64_t Mp, int64_t m0,
                       int64_t m1, float *bp, float *c, int64_t cstride) {
    if (PANEL_GROUP == 1 && np > 1) { /* one block at a time (AVX-512): a SwiGLU block's gate rows over all their
                                       * columns, then its up rows — the order measured there */
        for (int p = 0; p < np; ++p) group_gemm(gp + p, 1, K, xp, M, Mp, m0, m1, bp, c + p * cstride, cstride);
        return;
    }
    for (int64_t k0 = 0; k0 < K; k0 += PANEL_KC) {
        const int64_t kc = blz_min(PANEL_KC, K - k0), kn = blz_min(PANEL_KC, K - k0 - kc);
        const int once = m1 - m0 <= PANEL_MC; /* one x block: each panel widened as its walk starts, in one buffer */
        for (int p = 0; p < np && !once; ++p)
            widen_panel(gp[p].w, gp[p].tab, gp[p].wk, gp[p].n0, gp[p].nr, K, k0, kc, bp + p * PANEL_KC * PANEL_NR);
        for (int64_t i0 = m0; i0 < m1; i0 += PANEL_MC) {
            const int64_t i1 = blz_min(m1, i0 + PANEL_MC);
            for (int p = 0; p < np; ++p) {
                pf_t pf; /* the first x block's first call fetches the panel's next columns */
                const int fetch = i0 == m0 && kn > 0;
                if (fetch) {
                    const int64_t esize = blz_kv_elem_bytes(gp[p].wk);
                    pf.row_lines = (esize * kn + 63) / 64;
                    pf.lines = gp[p].nr * pf.row_lines;
                    pf.per_k = (pf.lines + kc - 1) / kc;
                    for (int j = 0; j < gp[p].nr; ++j)
                        pf.rows[j] = (const char *)blz_weight_row((const uint8_t *)gp[p].w, gp[p].tab, gp[p].n0 + j,
                                                                  esize * K) + esize * (k0 + kc);
                }
                float *panel = bp + (once ? 0 : p * PANEL_KC * PANEL_NR);
                if (once) widen_panel(gp[p].w, gp[p].tab, gp[p].wk, gp[p].n0, gp[p].nr, K, k0, kc, panel);
                for (int64_t m = i0; m < i1; m += PANEL_MR)
                    micro((int)(M - m), panel, kc, xp + k0 * Mp + m * kc, c + p * cstride + (m - m0) * PANEL_NR,
                          k0 == 0, m == i0 && fetch ? &pf : NULL);
            }
        }
    }
}

#ifdef BLZ_AVX512
/* A few x rows (LANES_MIN .. 16: batched decode): the x rows in the lanes of one vector, the weight rows in
 * the registers, so the weights are never transposed (a 16-row call spent a quarter of its time transposing
 * 16-bit panels, and padded 16 rows to 12 + 4 row passes). A block of LANES_NR weight rows (SwiGLU: half
 * gate rows, half their up rows) is widened LANES_KC columns at a time, row-major, into an L1 scratch;
 * per k one aligned load of x's column k (xt: x transposed once per call) and one FMA per weight row with
 * its weight broadcast from the scratch (an embedded broadcast: a load, not a shuffle), while the next
 * columns' weights are fetched. The sums are the panel micro-kernel's — each output one sequential FMA
 * chain over k from 0 — so a row's result does not depend on which of the two ran. Cold f16 at the 1B
 * shapes, 2 threads (GB/s of weights, panel → lanes): 16 rows 11.8 → 13.2, 14 rows 12.1 → 13.1, 12 rows
 * 13.8 → 12.6 (12 rows fill the panel's micro-kernel; here 4 of 16 lanes idle), 9 rows 15.6 → 13.1. */
#define LANES_MIN 13  /* fewer x rows: the panel GEMM (above) */
#define LANES_MIN_F32Z 9 /* f32z rows from 9 (LFM2's shapes, 9-12 rows: 1.08-1.58x the panel; bf16z 0.91-1.10x) */
#define LANES_M 16    /* x rows: the 16 lanes */
#define LANES_NR 24   /* weight rows per block: 24 accumulators of the 32 registers */
#define LANES_KC 128  /* columns per step: 12 KB of fp32 weights and 8 KB of x columns in L1 (256: 3-8 % slower) */

/* xt[k·16 + m] = x[m][k] for k in [k0, k1) (k0 a multiple of 16), m < M ≤ 16, lanes ≥ M zero. */
static void pack_x_lanes(const float *restrict x, int64_t M, int64_t K, int64_t k0, int64_t k1, float *restrict xt) {
    int64_t k = k0;
    for (; k + 16 <= k1; k += 16) { /* a 16 × 16 transposition in registers */
        __m512 r[16], t[16];
        for (int m = 0; m < 16; ++m) r[m] = m < M ? _mm512_loadu_ps(x + m * K + k) : _mm512_setzero_ps();
        for (int m = 0; m < 16; m += 2) { /* rows m, m+1 interleaved in 2-column pieces */
            t[m] = _mm512_unpacklo_ps(r[m], r[m + 1]);
            t[m + 1] = _mm512_unpackhi_ps(r[m], r[m + 1]);
        }
        for (int m = 0; m < 16; m += 4) /* r[m + c]: rows m .. m+3 at columns c, c+4, c+8, c+12 */
            for (int h = 0; h < 2; ++h) {
                r[m + 2 * h] = _mm512_shuffle_ps(t[m + h], t[m + 2 + h], 0x44);
                r[m + 2 * h + 1] = _mm512_shuffle_ps(t[m + h], t[m + 2 + h], 0xEE);
            }
        for (int c = 0; c < 4; ++c) { /* gather the four 4-row pieces of each column */
            const __m512 a = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88), b = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
            const __m512 e = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88), f = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
            t[c] = _mm512_shuffle_f32x4(a, e, 0x88);
            t[8 + c] = _mm512_shuffle_f32x4(a, e, 0xDD);
            t[4 + c] = _mm512_shuffle_f32x4(b, f, 0x88);
            t[12 + c] = _mm512_shuffle_f32x4(b, f, 0xDD);
        }
        for (int c = 0; c < 16; ++c) _mm512_store_ps(xt + (k + c) * 16, t[c]);
    }
    for (; k < k1; ++k)
        for (int m = 0; m < 16; ++m) xt[k * 16 + m] = m < M ? x[m * K + k] : 0.0f;
}

/* dst[k] = the weights from src on, as fp32, k < kc. */
static void widen_row(const uint8_t *src, const int wk, int64_t kc, float *restrict dst) {
    int64_t k = 0;
    for (; k + 16 <= kc; k += 16) _mm512_store_ps(dst + k, blz_kv_load16(src, k, wk));
    for (; k < kc; ++k) dst[k] = blz_kv_load1((const char *)src, k, wk);
}

/* acc[j] (+)= Σ_k buf[j][k] · xt[k] (16 lanes) for j < LANES_NR, k < kc, in k order; meanwhile the weights
 * the next step reads (pf: row after row) are fetched into L1, pf->per_k lines a k step. */
BLZ_INLINE void lanes_micro(const float *restrict buf, const float *restrict xt, int64_t kc, __m512 *acc,
                            const pf_t *pf) {
    __m512 a[LANES_NR];
#pragma GCC unroll 24
    for (int j = 0; j < LANES_NR; ++j) a[j] = acc[j];
    int64_t row = 0, line = 0, lines = pf->lines; /* the next line to fetch */
    for (int64_t k = 0; k < kc; ++k) {
        for (int64_t l = 0; l < pf->per_k && lines > 0; ++l, --lines) {
            _mm_prefetch(pf->rows[row] + 64 * line, _MM_HINT_T0);
            if (++line == pf->row_lines) line = 0, ++row;
        }
        const __m512 xv = _mm512_load_ps(xt + k * 16);
#pragma GCC unroll 24
        for (int j = 0; j < LANES_NR; ++j) a[j] = _mm512_fmadd_ps(_mm512_set1_ps(buf[j * LANES_KC + k]), xv, a[j]);
    }
#pragma GCC unroll 24
    for (int j = 0; j < LANES_NR; ++j) acc[j] = a[j];
}

/* Row j of block b's weight rows (SwiGLU: gate rows then their up rows; rows past the last output repeat
 * it — their sums are computed and dropped). */
BLZ_INLINE const uint8_t *lanes_row(const void *w, const int64_t *tab, int64_t b, int j, int64_t per, int64_t nout,
                                    int64_t row_bytes) {
    const int64_t n = blz_min(b * per + j % per, nout - 1) + (j >= per ? nout : 0);
    return blz_weight_row((const uint8_t *)w, tab, n, row_bytes);
}

/* blz_panel_gemm for LANES_MIN ≤ M ≤ LANES_M. Coded rows (BLZ_PANEL_BF16Z / F32Z) are decoded to fp32 a block
 * at a time into the thread's scratch (L2) and walked from there, while the walk fetches the next block's
 * coded bytes (decoding a block had waited on memory as long as its walk ran: 34 % and 33 % of a 16-row f32z
 * call's time). */
static int lanes_gemm(const void *w, const int64_t *tab, const int wk, const float *x, int64_t M, int64_t K, int64_t N,
                      const float *bias, const float *residual, float *out, int swiglu, int nt) {
    const int64_t nout = swiglu ? N / 2 : N, per = swiglu ? LANES_NR / 2 : LANES_NR;
    const int coded = wk == BLZ_PANEL_BF16Z || wk == BLZ_PANEL_F32Z, f32z = wk == BLZ_PANEL_F32Z;
    const int rk = coded ? BLZ_PANEL_F32 : wk; /* the kind of the rows walked */
    const int64_t nblocks = (nout + per - 1) / per, esize = blz_kv_elem_bytes(rk);
    const int64_t rb = coded ? blz_bz_row_bytes(K, f32z) : esize * K; /* bytes of a stored row */
    float *xt = blz_scratch_slot(2, (size_t)(K * 16) * sizeof(float)); /* 64-byte aligned */
    if (!xt) return BLZ_ENOMEM;
    int failed = 0;
#pragma omp parallel num_threads(nt)
    {
        int64_t lo, hi;
        blz_thread_share((K + 15) / 16, &lo, &hi);
        pack_x_lanes(x, M, K, 16 * lo, blz_min(K, 16 * hi), xt);
        float *buf = blz_scratch((size_t)(LANES_NR * LANES_KC + 2 * LANES_NR * 16) * sizeof(float));
        float *dec = coded ? blz_scratch_slot(3, (size_t)(LANES_NR * K) * sizeof(float)) : NULL;
        if (!buf || (coded && !dec)) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t b = 0; b < nblocks; ++b) {
            if (failed) continue;
            const int nr = (int)blz_min(per, nout - b * per);
            const uint8_t *src[LANES_NR];
            if (coded) { /* gate (or plain) rows, then up rows; past the last output the last row again */
                blz_bz_decode_rows_f32(w, K, b * per, nr, dec, f32z);
                if (swiglu) blz_bz_decode_rows_f32(w, K, nout + b * per, nr, dec + per * K, f32z);
                for (int j = 0; j < LANES_NR; ++j)
                    src[j] = (const uint8_t *)(dec + ((j >= per ? per : 0) + blz_min(j % per, nr - 1)) * K);
            } else
                for (int j = 0; j < LANES_NR; ++j) src[j] = lanes_row(w, tab, b, j, per, nout, rb);
            __m512 acc[LANES_NR];
            for (int j = 0; j < LANES_NR; ++j) acc[j] = _mm512_setzero_ps();
            for (int64_t k0 = 0; k0 < K; k0 += LANES_KC) {
                const int64_t kc = blz_min(LANES_KC, K - k0), kn = blz_min(LANES_KC, K - k0 - kc);
                pf_t pf;
                if (coded) { /* this chunk's share of the next block's coded rows */
                    const int64_t at = k0 * rb / K;
                    pf.row_lines = (kc * rb / K + 63) / 64 + 1;
                    pf.lines = b + 1 < nblocks ? LANES_NR * pf.row_lines : 0;
                    for (int j = 0; j < LANES_NR; ++j)
                        pf.rows[j] = (const char *)lanes_row(w, tab, b + 1, j, per, nout, rb) + blz_min(at, rb - 64);
                } else { /* the next columns, or the next block's first ones */
                    pf.row_lines = (esize * (kn ? kn : blz_min(LANES_KC, K)) + 63) / 64;
                    pf.lines = LANES_NR * pf.row_lines;
                    for (int j = 0; j < LANES_NR; ++j)
                        pf.rows[j] = (const char *)(kn ? src[j] + esize * (k0 + kc)
                                                       : lanes_row(w, tab, b + 1, j, per, nout, rb));
                }
                pf.per_k = (pf.lines + kc - 1) / kc;
                for (int j = 0; j < LANES_NR; ++j) widen_row(src[j] + esize * k0, rk, kc, buf + j * LANES_KC);
                lanes_micro(buf, xt + k0 * 16, kc, acc, &pf);
            }
            float *c = buf + LANES_NR * LANES_KC, *ct = c + LANES_NR * 16; /* [j][m], then [m][j] */
            for (int j = 0; j < LANES_NR; ++j) _mm512_store_ps(c + 16 * j, acc[j]);
            for (int64_t m = 0; m < M; ++m) /* a row's outputs side by side, for the epilogue's vector steps */
                for (int j = 0; j < LANES_NR; ++j) ct[m * LANES_NR + j] = c[16 * j + m];
            for (int64_t m = 0; m < M; ++m)
                blz_epilogue_row(ct + m * LANES_NR, ct + m * LANES_NR + per, m, b * per, nr, N, nout, bias, residual,
                                 out, swiglu);
        }
    }
    return failed ? BLZ_ENOMEM : BLZ_OK;
}
#endif

/* Bytes of packed x per pass: PANEL_XBYTES, or a quarter of the last-level cache where that is smaller. The
 * pass was 4 MB (Zen 3, §35), a tail pass of a few rows as long as any; on Zen 5 (2 MB L2, 32 MB L3) the
 * equal passes of up to 8 MB ran the 1B down projection (K = 8192) 1.06-1.12× faster at 128-500 rows, 6 MB
 * measured the same, 12 MB 0.86-0.95× at 1000-2048 rows (x streamed from a shared L3; NOTES §63). */
static int64_t pass_bytes(void) {
    static int64_t cached; /* 0: not yet read (callers racing to read it store the same value) */
    int64_t bytes = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (!bytes) {
        const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
        bytes = l3 > 0 ? blz_min(PANEL_XBYTES, l3 / 4) : PANEL_XBYTES;
        __atomic_store_n(&cached, bytes, __ATOMIC_RELAXED);
    }
    return bytes;
}

/* Rows of packed x per pass (a multiple of PANEL_MR): the passes of about pass_bytes() each, equal. */
static int64_t pass_rows(int64_t Mp, int64_t K) {
    const int64_t budget = pass_bytes() * 5 / 4, bytes = 4 * K * Mp;
    const int64_t passes = blz_max(1, (bytes + budget - 1) / budget);
    const int64_t mc = blz_round_up((Mp + passes - 1) / passes, PANEL_MR);
    return blz_min(Mp, blz_max(8 * PANEL_MR, mc));
}

int blz_panel_gemm(const void *w, const int64_t *tab, const int wk, const float *x, int64_t M, int64_t K, int64_t N,
                   const float *bias, const float *residual, float *out, int swiglu, int nt) {
#ifdef BLZ_AVX512
    if (M >= (wk == BLZ_PANEL_F32Z ? LANES_MIN_F32Z : LANES_MIN) && M <= LANES_M)
        return lanes_gemm(w, tab, wk, x, M, K, N, bias, residual, out, swiglu, nt);
#endif
    const int64_t nout = swiglu ? N / 2 : N, nblocks = (nout + PANEL_NR - 1) / PANEL_NR;
    const int64_t Mp = blz_round_up(M, PANEL_MR);
    const int64_t mc = pass_rows(Mp, K);
    float *xp = blz_scratch_slot(2, (size_t)(Mp * K + 8) * sizeof(float));
    if (!xp) return BLZ_ENOMEM;
    const int per = swiglu ? 2 : 1, gblocks = blz_max(1, PANEL_GROUP / per); /* panels a block, blocks a group */
    const size_t scratch = (size_t)GROUP_PANELS * PANEL_NR * (PANEL_KC + mc) * sizeof(float);
    const int coded = wk == BLZ_PANEL_BF16Z || wk == BLZ_PANEL_F32Z; /* rows decoded a group at a time … */
    const int dk = wk == BLZ_PANEL_F32Z ? BLZ_PANEL_F32 : BLZ_PANEL_BF16; /* … to this kind */
    const int64_t drow = PANEL_NR * K * blz_kv_elem_bytes(dk); /* a panel's decoded bytes */
    int failed = 0;
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(static)
        for (int64_t g = 0; g < Mp / PANEL_MR; ++g) pack_x_group(x, M, K, Mp, g, xp);
        float *bp = blz_scratch(scratch);
        if (!bp) {
#pragma omp atomic write
            failed = 1;
        }
        float *c = bp + GROUP_PANELS * PANEL_KC * PANEL_NR; /* panel p's sums at c + p·mc·PANEL_NR */
        int64_t lo, hi; /* this thread's output blocks: the static schedule's share, walked a group at a time */
        blz_thread_share(nblocks, &lo, &hi);
        for (int64_t m0 = 0; m0 < Mp && bp; m0 += mc) {
            const int64_t m1 = blz_min(Mp, m0 + mc);
            for (int64_t b0 = lo; b0 < hi; b0 += gblocks) {
                const int nb = (int)blz_min(gblocks, hi - b0);
                gpanel_t gp[GROUP_PANELS];
                uint8_t *dec = NULL; /* coded rows: the group's rows decoded, panel after panel */
                if (coded) {
                    dec = blz_scratch_slot(3, (size_t)(per * nb * drow));
                    if (!dec) {
#pragma omp atomic write
                        failed = 1;
                        break;
                    }
                }
                for (int i = 0; i < nb * per; ++i) {
                    const int64_t n0 = (b0 + i / per) * PANEL_NR + (i % per ? nout : 0);
                    const int nr = (int)blz_min(PANEL_NR, nout - (b0 + i / per) * PANEL_NR);
                    if (coded) {
                        blz_bz_decode_rows(w, K, n0, nr, dec + i * drow, wk == BLZ_PANEL_F32Z);
                        gp[i] = (gpanel_t){.w = dec, .tab = NULL, .wk = dk, .nr = nr, .n0 = (int64_t)i * PANEL_NR};
                    } else
                        gp[i] = (gpanel_t){.w = w, .tab = tab, .wk = wk, .nr = nr, .n0 = n0};
                }
                group_gemm(gp, nb * per, K, xp, M, Mp, m0, m1, bp, c, mc * PANEL_NR);
                for (int i = 0; i < nb; ++i) {
                    const float *cg = c + (int64_t)i * per * mc * PANEL_NR, *cu = cg + mc * PANEL_NR;
                    for (int64_t m = m0; m < blz_min(M, m1); ++m)
                        blz_epilogue_row(cg + (m - m0) * PANEL_NR, cu + (m - m0) * PANEL_NR, m, (b0 + i) * PANEL_NR,
                                         gp[i * per].nr, N, nout, bias, residual, out, swiglu);
                }
            }
        }
    }
    return failed ? BLZ_ENOMEM : BLZ_OK;
}
