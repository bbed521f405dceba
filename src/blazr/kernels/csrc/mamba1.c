/* blazr kernels — Mamba1's selective scan (Mamba, Falcon-Mamba, Jamba), its SSM state advanced in place in a
 * pool: the dt / B / C split of x_proj's output (with Falcon-Mamba's and Jamba's RMS norms), and the scan
 * itself for a decode step (one new row for each of B sequences) or a prefill (n_b rows of each), one entry
 * point each (`blz_mamba1_dt_bc`, `blz_mamba1_scan`). The causal conv before them is causal_conv.c's, the
 * x_proj / dt_proj / out_proj linears the linear kernels'.
 *
 * Split, per row t of dbc [T, R + 2N] (x_proj's output, [dt | B | C]):
 *   dt_out[t] = norm(dbc[t, :R]; w_dt),  bc_out[t] = [norm(B; w_b) | norm(C; w_c)]
 * with norm(v; w) = w · v / sqrt(mean(v²) + eps) (w NULL: weightless, Falcon-Mamba), or a plain copy when
 * `norm` is 0 (Mamba).
 * Scan, per sequence b (state slot s), channel d < Di, new row t, with x = xc[t, d]:
 *   dt = softplus(dt_raw[t, d])                          (dt_proj's output, its bias included)
 *   ssm[s, d, n] = exp(dt·A[d, n])·ssm[s, d, n] + (dt·x)·B[t, n]       (A = −exp(A_log), given as A)
 *   y[t, d] = (Σ_n ssm[s, d, n]·C[t, n] + Dskip[d]·x) · silu(z[t, d])
 * Layouts (fp32, row-major, contiguous unless said): xc, dt_raw, y [T, Di]; bc [T, 2N]; z rows of stride ldz
 * (a column view of in_proj's output); A [Di, N]; Dskip [Di]; ssm pool [S, Di, N]. index: the decode step's
 * slots [B] (prefill = 0) or per sequence (row0, n, slot, fresh) [B, 4] (prefill = 1; fresh = 1 starts from
 * a zero state); slots distinct.
 *
 * Work: softplus(dt) and silu(z) of a block of channels vectorised over the channels (their exp / log1p by
 * polynomials: the same bits in the vector and scalar steps), then each channel's state row updated and
 * summed vectorised over n. A block of channels of one sequence runs all its rows in order (its state rows
 * stay in cache); OpenMP over (sequence, block). A sequence's results depend on its own rows and state only,
 * never on the batch or the thread count; the sum over n is a vector reduction (its order differs between
 * the AVX-512, AVX2 and scalar paths: fp32 rounding).
 */
#include "blazr_kernels.h"

#define M1_BLOCK 64 /* channels per work unit */

/* log1p(u) for u in [0, 1] (Cephes' logf polynomial around 1, or around 2 for u ≥ √2 − 1); ≈ 1 ulp. */
BLZ_INLINE float log1p_poly(float u) {
    const int big = u >= 0.41421356f;
    const float f = big ? (u - 1.0f) * 0.5f : u, e = big ? 1.0f : 0.0f, z = f * f;
    float p = 7.0376836292e-2f;
    p = fmaf(p, f, -1.1514610310e-1f);
    p = fmaf(p, f, 1.1676998740e-1f);
    p = fmaf(p, f, -1.2420140846e-1f);
    p = fmaf(p, f, 1.4249322787e-1f);
    p = fmaf(p, f, -1.6668057665e-1f);
    p = fmaf(p, f, 2.0000714765e-1f);
    p = fmaf(p, f, -2.4999993993e-1f);
    p = fmaf(p, f, 3.3333331174e-1f);
    float y = p * f * z;
    y = fmaf(e, -2.12194440e-4f, y);
    y = fmaf(-0.5f, z, y);
    return fmaf(e, 0.693359375f, f + y);
}

/* softplus(v) = log(1 + e^v), v itself above 20 (as torch); max(v, 0) + log1p(e^−|v|) below. */
BLZ_INLINE float softplus_poly(float v) {
    return v > 20.0f ? v : fmaxf(v, 0.0f) + log1p_poly(blz_exp_poly(0.0f - fabsf(v)));
}

BLZ_INLINE float silu_poly(float v) { return v / (1.0f + blz_exp_poly(0.0f - v)); }

#if defined(BLZ_AVX512)
BLZ_INLINE __m512 exp16(__m512 x) { return blz_exp512(_mm512_min_ps(x, _mm512_set1_ps(88.3f))); }

BLZ_INLINE __m512 softplus16(__m512 v) {
    const __m512 one = _mm512_set1_ps(1.0f), u = exp16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(v)));
    const __mmask16 big = _mm512_cmp_ps_mask(u, _mm512_set1_ps(0.41421356f), _CMP_GE_OQ);
    const __m512 f = _mm512_mask_blend_ps(big, u, _mm512_mul_ps(_mm512_sub_ps(u, one), _mm512_set1_ps(0.5f)));
    const __m512 e = _mm512_maskz_mov_ps(big, one), z = _mm512_mul_ps(f, f);
    __m512 p = _mm512_set1_ps(7.0376836292e-2f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(-1.1514610310e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.1676998740e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(-1.2420140846e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.4249322787e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(-1.6668057665e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.0000714765e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(-2.4999993993e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(3.3333331174e-1f));
    __m512 y = _mm512_mul_ps(_mm512_mul_ps(p, f), z);
    y = _mm512_fmadd_ps(e, _mm512_set1_ps(-2.12194440e-4f), y);
    y = _mm512_fmadd_ps(_mm512_set1_ps(-0.5f), z, y);
    const __m512 l = _mm512_fmadd_ps(e, _mm512_set1_ps(0.693359375f), _mm512_add_ps(f, y));
    const __m512 r = _mm512_add_ps(_mm512_max_ps(v, _mm512_setzero_ps()), l);
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, _mm512_set1_ps(20.0f), _CMP_GT_OQ), r, v);
}

BLZ_INLINE __m512 silu16(__m512 v) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), v));
    return _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}
#elif defined(BLZ_AVX2)
BLZ_INLINE __m256 softplus8(__m256 v) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    const __m256 av = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v), u = blz_exp256(_mm256_sub_ps(zero, av));
    const __m256 big = _mm256_cmp_ps(u, _mm256_set1_ps(0.41421356f), _CMP_GE_OQ);
    const __m256 f = _mm256_blendv_ps(u, _mm256_mul_ps(_mm256_sub_ps(u, one), _mm256_set1_ps(0.5f)), big);
    const __m256 e = _mm256_and_ps(big, one), z = _mm256_mul_ps(f, f);
    __m256 p = _mm256_set1_ps(7.0376836292e-2f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(-1.1514610310e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.1676998740e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(-1.2420140846e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.4249322787e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(-1.6668057665e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.0000714765e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(-2.4999993993e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(3.3333331174e-1f));
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, f), z);
    y = _mm256_fmadd_ps(e, _mm256_set1_ps(-2.12194440e-4f), y);
    y = _mm256_fmadd_ps(_mm256_set1_ps(-0.5f), z, y);
    const __m256 l = _mm256_fmadd_ps(e, _mm256_set1_ps(0.693359375f), _mm256_add_ps(f, y));
    const __m256 r = _mm256_add_ps(_mm256_max_ps(v, zero), l);
    return _mm256_blendv_ps(r, v, _mm256_cmp_ps(v, _mm256_set1_ps(20.0f), _CMP_GT_OQ));
}
#endif

/* dt[i] ← softplus(dt_raw[i]), g[i] ← silu(z[i]) for i < n. */
static void gates(float *restrict dt, float *restrict g, const float *restrict dt_raw, const float *restrict z,
                  int64_t n) {
    int64_t i = 0;
#if defined(BLZ_AVX512)
    for (; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(dt + i, softplus16(_mm512_loadu_ps(dt_raw + i)));
        _mm512_storeu_ps(g + i, silu16(_mm512_loadu_ps(z + i)));
    }
#elif defined(BLZ_AVX2)
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(dt + i, softplus8(_mm256_loadu_ps(dt_raw + i)));
        _mm256_storeu_ps(g + i, blz_silu256(_mm256_loadu_ps(z + i)));
    }
#endif
    for (; i < n; ++i) {
        dt[i] = softplus_poly(dt_raw[i]);
        g[i] = silu_poly(z[i]);
    }
}

/* One channel's state row st[N] ← exp(dt·A)·st + (dt·x)·Bv; returns Σ_n st[n]·Cv[n]. */
static float state_row(float *restrict st, const float *restrict A, const float *restrict Bv,
                       const float *restrict Cv, float dt, float dx, int64_t N) {
    float acc = 0.0f;
    int64_t n = 0;
#if defined(BLZ_AVX512)
    const __m512 dtv = _mm512_set1_ps(dt), dxv = _mm512_set1_ps(dx);
    __m512 va = _mm512_setzero_ps();
    for (; n + 16 <= N; n += 16) {
        const __m512 a = exp16(_mm512_mul_ps(dtv, _mm512_loadu_ps(A + n)));
        const __m512 s = _mm512_fmadd_ps(a, _mm512_loadu_ps(st + n), _mm512_mul_ps(dxv, _mm512_loadu_ps(Bv + n)));
        _mm512_storeu_ps(st + n, s);
        va = _mm512_fmadd_ps(s, _mm512_loadu_ps(Cv + n), va);
    }
    acc = _mm512_reduce_add_ps(va);
#elif defined(BLZ_AVX2)
    const __m256 dtv = _mm256_set1_ps(dt), dxv = _mm256_set1_ps(dx);
    __m256 va = _mm256_setzero_ps();
    for (; n + 8 <= N; n += 8) {
        const __m256 a = blz_exp256(_mm256_mul_ps(dtv, _mm256_loadu_ps(A + n)));
        const __m256 s = _mm256_fmadd_ps(a, _mm256_loadu_ps(st + n), _mm256_mul_ps(dxv, _mm256_loadu_ps(Bv + n)));
        _mm256_storeu_ps(st + n, s);
        va = _mm256_fmadd_ps(s, _mm256_loadu_ps(Cv + n), va);
    }
    acc = blz_hsum256(va);
#endif
    for (; n < N; ++n) {
        const float s = fmaf(blz_exp_poly(dt * A[n]), st[n], dx * Bv[n]);
        st[n] = s;
        acc = fmaf(s, Cv[n], acc);
    }
    return acc;
}

/* Rows row0 .. row0+n-1 of one sequence over channels [d0, d1) of state st ([Di, N], zeroed first when
 * fresh). */
static void scan_block(const float *xc, const float *dt_raw, const float *bc, const float *z, int64_t ldz,
                       const float *A, const float *dskip, float *st, int64_t Di, int64_t N, int64_t row0,
                       int64_t n, int fresh, int64_t d0, int64_t d1, float *y) {
    float dts[M1_BLOCK], g[M1_BLOCK];
    if (fresh) memset(st + d0 * N, 0, (size_t)((d1 - d0) * N) * sizeof(float));
    for (int64_t t = row0; t < row0 + n; ++t) {
        const float *xr = xc + t * Di, *Bv = bc + t * 2 * N, *Cv = Bv + N;
        gates(dts, g, dt_raw + t * Di + d0, z + t * ldz + d0, d1 - d0);
        for (int64_t d = d0; d < d1; ++d) {
            const float dt = dts[d - d0], x = xr[d];
            const float acc = state_row(st + d * N, A + d * N, Bv, Cv, dt, dt * x, N);
            y[t * Di + d] = fmaf(dskip[d], x, acc) * g[d - d0];
        }
    }
}

BLZ_EXPORT int blz_mamba1_scan(const float *xc, const float *dt_raw, const float *bc, const float *z, int64_t ldz,
                               const int64_t *index, int64_t B, int prefill, const float *A, const float *dskip,
                               float *ssm, int64_t S, int64_t Di, int64_t N, float *y, int nthreads) {
    if (B < 0 || Di <= 0 || N <= 0 || S < 0 || ldz < Di) return BLZ_EINVAL;
    int64_t T;
    const int rc = blz_recurrent_rows(index, B, prefill, S, &T);
    if (rc != BLZ_OK || T == 0) return rc;
    const int64_t nblk = (Di + M1_BLOCK - 1) / M1_BLOCK;
    const int nt = blz_threads(nthreads, T * Di * N, 1 << 14);
    if (!prefill) { /* rows that share a slot run in row order (a sequence's consecutive tokens): blocks split */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
        for (int64_t blk = 0; blk < nblk; ++blk) {
            const int64_t d0 = blk * M1_BLOCK, d1 = blz_min(Di, d0 + M1_BLOCK);
            for (int64_t b = 0; b < B; ++b)
                scan_block(xc, dt_raw, bc, z, ldz, A, dskip, ssm + index[b] * Di * N, Di, N, b, 1, 0, d0, d1, y);
        }
        return BLZ_OK;
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (int64_t u = 0; u < B * nblk; ++u) {
        const int64_t b = u / nblk, d0 = u % nblk * M1_BLOCK, d1 = blz_min(Di, d0 + M1_BLOCK);
        const int64_t slot = prefill ? index[4 * b + 2] : index[b];
        const int64_t row0 = prefill ? index[4 * b] : b, n = prefill ? index[4 * b + 1] : 1;
        const int fresh = prefill ? (int)index[4 * b + 3] : 0;
        scan_block(xc, dt_raw, bc, z, ldz, A, dskip, ssm + slot * Di * N, Di, N, row0, n, fresh, d0, d1, y);
    }
    return BLZ_OK;
}

/* out[i] = w[i]·v[i]/sqrt(mean(v²) + eps) (w NULL: 1) for i < n, or a copy when !norm. */
static void norm_part(float *restrict out, const float *restrict v, const float *w, int64_t n, int norm, float eps) {
    if (!norm) {
        memcpy(out, v, (size_t)n * sizeof(float));
        return;
    }
    float ss = 0.0f;
    for (int64_t i = 0; i < n; ++i) ss += v[i] * v[i];
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; ++i) out[i] = w ? w[i] * (v[i] * r) : v[i] * r;
}

BLZ_EXPORT int blz_mamba1_dt_bc(const float *dbc, int64_t T, int64_t R, int64_t N, const float *w_dt,
                                const float *w_b, const float *w_c, int norm, float eps, float *dt_out,
                                float *bc_out) {
    if (T < 0 || R <= 0 || N <= 0) return BLZ_EINVAL;
    for (int64_t t = 0; t < T; ++t) {
        const float *row = dbc + t * (R + 2 * N);
        norm_part(dt_out + t * R, row, w_dt, R, norm, eps);
        norm_part(bc_out + t * 2 * N, row + R, w_b, N, norm, eps);
        norm_part(bc_out + t * 2 * N + N, row + R + N, w_c, N, norm, eps);
    }
    return BLZ_OK;
}
