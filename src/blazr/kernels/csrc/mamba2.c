/* blazr kernels — Mamba2 (SSD) with the conv and SSM states advanced in place in their pools: the decode
 * step (one new token for each of B sequences of one layer) and the prefill scan (n new tokens of each of
 * B sequences, `blz_mamba2_prefill` below).
 *
 * Per sequence b (state slot s = slots[b]), conv channel c < Cd (Cd = H·P + 2·G·N), kernel width K:
 *   conv_c = bias_c + Σ_{k<K-1} w[c,k]·conv[s,c,k] + w[c,K-1]·xbc[b,c];  conv[s,c,:] shifts left and
 *   takes xbc[b,c];  u_c = silu(conv_c), read as u = [x (H·P) | B (G·N) | C (G·N)];
 * per head h (its group g = h / (H/G)):
 *   dt = clamp(softplus(dt_raw[b,h] + dt_bias[h]), dt_min, dt_max)  (softplus(v) = v above 20, as torch)
 *   a = exp(dt·A)  with A = −exp(A_log[h]) (negative)
 *   per p < P:  ssm[s,h,p,:] = a·ssm[s,h,p,:] + (dt·x[h,p])·B_g;   y[b,h,p] = ssm[s,h,p,:]·C_g + Dskip[h]·x[h,p]
 * Layouts (fp32, row-major, contiguous unless said): xbc [B, Cd] and dt_raw [B, H] with row strides ld
 * (both may be column views of one in_proj output), conv_w [Cd, K], conv_b [Cd] or NULL, conv_pool
 * [S, Cd, K-1], dt_bias / A_log / Dskip [H], ssm_pool [S, H, P, N], slots [B] int64 (distinct), y [B, H·P].
 *
 * Every SSM state row is read and written once, in place (the torch path gathers the states, builds
 * full-size temporaries and scatters them back). Work: the conv of every sequence first (OpenMP over
 * CONV_PARTS parts of each sequence's channels: a decode batch is often one sequence), then OpenMP over
 * (sequence, head) pairs. A sequence's results depend on its own inputs and state only, never on the batch
 * or the thread count. The state update is a·s + d·B by one fma each (the torch reference rounds the
 * product a·s and the sum separately: differences at fp32 rounding).
 */
#include "blazr_kernels.h"

/* st[P][N] ← a·st + (dt·x[p])·Bv; y[p] = st[p]·Cv + dskip·x[p]. */
static void head_step(float *restrict st, const float *restrict x, const float *restrict Bv,
                      const float *restrict Cv, float a, float dt, float dskip, int64_t P, int64_t N,
                      float *restrict y) {
    for (int64_t p = 0; p < P; ++p) {
        float *s = st + p * N;
        const float xd = dt * x[p];
        float acc = 0.0f;
        int64_t n = 0;
#if defined(BLZ_AVX512)
        __m512 va = _mm512_setzero_ps();
        const __m512 av = _mm512_set1_ps(a), xv = _mm512_set1_ps(xd);
        for (; n + 16 <= N; n += 16) {
            const __m512 v = _mm512_fmadd_ps(av, _mm512_loadu_ps(s + n), _mm512_mul_ps(xv, _mm512_loadu_ps(Bv + n)));
            _mm512_storeu_ps(s + n, v);
            va = _mm512_fmadd_ps(v, _mm512_loadu_ps(Cv + n), va);
        }
        acc = _mm512_reduce_add_ps(va);
#elif defined(BLZ_AVX2)
        __m256 va = _mm256_setzero_ps(), vb = _mm256_setzero_ps();
        const __m256 av = _mm256_set1_ps(a), xv = _mm256_set1_ps(xd);
        for (; n + 16 <= N; n += 16) {
            const __m256 v0 = _mm256_fmadd_ps(av, _mm256_loadu_ps(s + n), _mm256_mul_ps(xv, _mm256_loadu_ps(Bv + n)));
            const __m256 v1 =
                _mm256_fmadd_ps(av, _mm256_loadu_ps(s + n + 8), _mm256_mul_ps(xv, _mm256_loadu_ps(Bv + n + 8)));
            _mm256_storeu_ps(s + n, v0);
            _mm256_storeu_ps(s + n + 8, v1);
            va = _mm256_fmadd_ps(v0, _mm256_loadu_ps(Cv + n), va);
            vb = _mm256_fmadd_ps(v1, _mm256_loadu_ps(Cv + n + 8), vb);
        }
        acc = blz_hsum256(_mm256_add_ps(va, vb));
#endif
        for (; n < N; ++n) {
            const float v = fmaf(a, s[n], xd * Bv[n]);
            s[n] = v;
            acc = fmaf(v, Cv[n], acc);
        }
        y[p] = fmaf(dskip, x[p], acc);
    }
}

/* One head's scan over n consecutive tokens: head_step for each token in turn, with the same bits, but the
 * state row held in registers across a tile of SCAN_TT tokens, a piece of SCAN_PIECE columns at a time
 * (head_step token by token reads and writes the whole [P, N] state once a token: on Zen 3 the prefill
 * scan waited on those loads and stores). Each output's sum over n keeps head_step's order — AVX2: the
 * 16-column chunks' even halves in one accumulator and odd halves in another, chunk after chunk, both
 * carried between pieces; AVX-512: one accumulator — so a token's y is what a decode step gives it.
 * u rows [n, Cd] (x at xo, B at bo, C at co of each), a[i] = exp(dt_i·A), dt[i]; y rows at stride Di.
 * N a multiple of 16 (else head_step per token). */
#define SCAN_TT 16 /* tokens per tile: their B and C rows (2·N floats each) stay in L1 */
#if defined(BLZ_AVX512)
#define SCAN_PIECE 128 /* state columns in registers: 8 vectors */
#elif defined(BLZ_AVX2)
#define SCAN_PIECE 64 /* 8 vectors, beside two accumulators and two broadcasts in AVX2's 16 registers */
#endif

#ifdef SCAN_PIECE
enum { SCAN_NACC = 16 / BLZ_VW }; /* vectors per 16-column chunk = accumulators per output: head_step's va (vb) */

/* Columns c0 .. c0 + 16·J − 1 of state row p over tokens i < tt: s ← a_i·s + (dt_i·x_i[p])·B_i, and the
 * partial sums acc[i] (+)= s·C_i in head_step's chunk order (from zero when `first`). */
BLZ_INLINE void scan_piece(const int J, float *restrict srow, const float *u, int64_t Cd, int64_t xo, int64_t bo,
                           int64_t co, int64_t p, int64_t c0, const float *a, const float *dt, int tt,
                           float *restrict acc, const int first) {
    blz_vf st[SCAN_PIECE / BLZ_VW];
#pragma GCC unroll 8
    for (int j = 0; j < J * SCAN_NACC; ++j) st[j] = BLZ_VF_LOAD(srow + c0 + j * BLZ_VW);
    for (int i = 0; i < tt; ++i) {
        const float *ur = u + i * Cd, *Bv = ur + bo + c0, *Cv = ur + co + c0;
        __asm__("" : "+r"(Bv), "+r"(Cv)); /* two base registers: GCC had kept each load's offset in a spill slot */
        const blz_vf av = BLZ_VF_SET1(a[i]), xv = BLZ_VF_SET1(dt[i] * ur[xo + p]);
        blz_vf va[SCAN_NACC];
        for (int k = 0; k < SCAN_NACC; ++k)
            va[k] = first ? BLZ_VF_ZERO() : BLZ_VF_LOAD(acc + (i * SCAN_NACC + k) * BLZ_VW);
#pragma GCC unroll 8
        for (int j = 0; j < J * SCAN_NACC; ++j) {
            st[j] = BLZ_VF_FMA(av, st[j], BLZ_VF_MUL(xv, BLZ_VF_LOAD(Bv + j * BLZ_VW)));
            va[j % SCAN_NACC] = BLZ_VF_FMA(st[j], BLZ_VF_LOAD(Cv + j * BLZ_VW), va[j % SCAN_NACC]);
        }
        for (int k = 0; k < SCAN_NACC; ++k) BLZ_VF_STORE(acc + (i * SCAN_NACC + k) * BLZ_VW, va[k]);
    }
#pragma GCC unroll 8
    for (int j = 0; j < J * SCAN_NACC; ++j) BLZ_VF_STORE(srow + c0 + j * BLZ_VW, st[j]);
}

static void head_scan(float *restrict st, const float *u, int64_t Cd, int64_t xo, int64_t bo, int64_t co,
                      const float *dts, int64_t H, float A, float dskip, int64_t P, int64_t N, int64_t n,
                      float *y, int64_t Di) {
    enum { JMAX = SCAN_PIECE / 16 };
    float acc[SCAN_TT * SCAN_NACC * BLZ_VW] __attribute__((aligned(64)));
    float a[SCAN_TT], dt[SCAN_TT];
    for (int64_t t0 = 0; t0 < n; t0 += SCAN_TT) {
        const int tt = (int)blz_min(SCAN_TT, n - t0);
        const float *ut = u + t0 * Cd;
        for (int i = 0; i < tt; ++i) {
            dt[i] = dts[(t0 + i) * H];
            a[i] = expf(dt[i] * A);
        }
        for (int64_t p = 0; p < P; ++p) {
            float *srow = st + p * N;
            for (int64_t c0 = 0; c0 < N; c0 += SCAN_PIECE) {
                const int J = (int)blz_min(JMAX, (N - c0) / 16), first = c0 == 0;
                if (J == JMAX)
                    scan_piece(JMAX, srow, ut, Cd, xo, bo, co, p, c0, a, dt, tt, acc, first);
                else
                    for (int j = 0; j < J; ++j) /* the last piece a chunk at a time */
                        scan_piece(1, srow, ut, Cd, xo, bo, co, p, c0 + 16 * j, a, dt, tt, acc, first && j == 0);
            }
            for (int i = 0; i < tt; ++i) {
                const float *av = acc + i * SCAN_NACC * BLZ_VW;
#if defined(BLZ_AVX512)
                const float sum = _mm512_reduce_add_ps(_mm512_load_ps(av));
#else
                const float sum = blz_hsum256(_mm256_add_ps(_mm256_load_ps(av), _mm256_load_ps(av + 8)));
#endif
                y[(t0 + i) * Di + p] = fmaf(dskip, ut[i * Cd + xo + p], sum);
            }
        }
    }
}
#endif

#define CONV_PARTS 16 /* a decode step's conv channels, split over the threads (B is often 1) */

BLZ_INLINE float softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

BLZ_EXPORT int blz_mamba2_step(const float *xbc, const float *dt_raw, int64_t ld, const int64_t *slots, int64_t B,
                               const float *conv_w, const float *conv_b, float *conv_pool, int64_t K,
                               const float *dt_bias, const float *A_log, const float *dskip, float *ssm_pool, int64_t S,
                               int64_t H, int64_t P, int64_t G, int64_t N, float dt_min, float dt_max, float *y,
                               int nthreads) {
    if (B < 0 || K < 2 || H <= 0 || P <= 0 || G <= 0 || N <= 0 || H % G || S < 0) return BLZ_EINVAL;
    const int64_t Di = H * P, Cd = Di + 2 * G * N;
    if (ld < Cd) return BLZ_EINVAL;
    for (int64_t b = 0; b < B; ++b)
        if (slots[b] < 0 || slots[b] >= S) return BLZ_ERANGE;
    if (B == 0) return BLZ_OK;
    float *u = blz_scratch((size_t)(B * Cd + B * H) * sizeof(float)); /* post-conv rows, then dt */
    if (!u) return BLZ_ENOMEM;
    float *dts = u + B * Cd;
    const int nt = blz_threads(nthreads, B * H * P * N, 1 << 14);
#pragma omp parallel num_threads(nt)
    {
        /* Rows that share a slot run in row order (each row's conv window and state update follow the rows
         * before it): a sequence may bring several consecutive tokens as rows. So the threads split the
         * channels (conv) and the heads (scan), never the rows. */
#pragma omp for schedule(static)
        for (int64_t part = 0; part < CONV_PARTS; ++part) {
            const int64_t c0 = Cd * part / CONV_PARTS, c1 = Cd * (part + 1) / CONV_PARTS;
            for (int64_t b = 0; b < B; ++b) {
                const float *xr = xbc + b * ld;
                float *cs = conv_pool + slots[b] * Cd * (K - 1), *ur = u + b * Cd;
                for (int64_t c = c0; c < c1; ++c) {
                    const float *w = conv_w + c * K;
                    float *st = cs + c * (K - 1);
                    float acc = conv_b ? conv_b[c] : 0.0f;
                    for (int64_t k = 0; k < K - 1; ++k) acc = fmaf(w[k], st[k], acc);
                    acc = fmaf(w[K - 1], xr[c], acc);
                    for (int64_t k = 0; k < K - 2; ++k) st[k] = st[k + 1];
                    st[K - 2] = xr[c];
                    ur[c] = blz_silu(acc);
                }
            }
        }
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < B * H; ++bh) {
            const int64_t b = bh / H, h = bh % H;
            const float dt = softplus(dt_raw[b * ld + h] + dt_bias[h]);
            dts[bh] = fminf(fmaxf(dt, dt_min), dt_max);
        }
#pragma omp for schedule(static)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t b = 0; b < B; ++b) {
                const int64_t g = h / (H / G);
                const float *ur = u + b * Cd;
                const float dt = dts[b * H + h];
                head_step(ssm_pool + (slots[b] * H + h) * P * N, ur + h * P, ur + Di + g * N,
                          ur + Di + G * N + g * N, expf(dt * -expf(A_log[h])), dt, dskip[h], P, N, y + b * Di + h * P);
            }
    }
    return BLZ_OK;
}

/* The prefill of one layer: n_b new tokens of each of B sequences, the same math as n_b decode steps in a row
 * (conv + SiLU, dt, state update, D skip per token, in fp32), computed as a sequential scan.
 *
 * seqs [B, 4] int64, per sequence: (row0, n, slot, fresh): its tokens are rows row0 .. row0+n-1 of xbc /
 * dt_raw (row stride ld, column views of one in_proj output as in the decode step) and of y [T, H·P]; its
 * states live at `slot` of conv_pool [S, Cd, K-1] and ssm_pool [S, H, P, N]; fresh = 1 starts from zero
 * states (a new sequence: the slot may hold a previous owner's), 0 continues from them (a chunked prefill's
 * later chunk). Slots must be distinct. Other arguments as blz_mamba2_step.
 *
 * Why a scan and not the chunked SSD form: per token and head the recurrence does P·N multiply-adds for the
 * state and P·N for the output, while the chunked form adds a Q×Q quadratic piece per head (Q = 256: ~4×
 * the flops) built from memory-bound elementwise passes. One head's state ([P, N] fp32, 16-32 KiB) stays
 * in L1/L2 for all of its tokens. Work: the conv (OpenMP over the rows of each sequence, vectorised over
 * channels with the taps transposed to [K, Cd]; the SiLU 8 lanes at a time), then the scan (OpenMP over
 * (sequence, head) pairs; head_scan: a tile of tokens per pass over the state, in registers). A
 * sequence's results depend on its own rows and state only, never on the batch or the thread count, and
 * are the decode step's bits token by token. Zen 3, 256 tokens, one call at mamba2-130m's / granite-4.0-h-
 * 350m's head shapes, 2 threads (in-process A/B, medians of 15): 7.6 / 8.5 → 4.7 / 5.1 ms (NOTES §72).
 */
#define BLZ_MAMBA2_MAX_K 16

BLZ_EXPORT int blz_mamba2_prefill(const float *xbc, const float *dt_raw, int64_t ld, const int64_t *seqs,
                                  int64_t B, const float *conv_w, const float *conv_b, float *conv_pool,
                                  int64_t K, const float *dt_bias, const float *A_log, const float *dskip,
                                  float *ssm_pool, int64_t S, int64_t H, int64_t P, int64_t G, int64_t N,
                                  float dt_min, float dt_max, float *y, int nthreads) {
    if (B < 0 || K < 2 || K > BLZ_MAMBA2_MAX_K || H <= 0 || P <= 0 || G <= 0 || N <= 0 || H % G || S < 0)
        return BLZ_EINVAL;
    const int64_t Di = H * P, Cd = Di + 2 * G * N;
    if (ld < Cd) return BLZ_EINVAL;
    int64_t T = 0;
    for (int64_t b = 0; b < B; ++b) {
        const int64_t *q = seqs + 4 * b;
        if (q[0] < 0 || q[1] < 0) return BLZ_EINVAL;
        if (q[2] < 0 || q[2] >= S) return BLZ_ERANGE;
        for (int64_t c = 0; c < b; ++c)
            if (seqs[4 * c + 2] == q[2]) return BLZ_EINVAL;
        T = blz_max(T, q[0] + q[1]);
    }
    if (T == 0) return BLZ_OK;
    float *u = blz_scratch((size_t)(T * Cd + T * H + K * Cd) * sizeof(float)); /* post-conv, dt, taps */
    if (!u) return BLZ_ENOMEM;
    float *dts = u + T * Cd, *wt = dts + T * H;
    for (int64_t c = 0; c < Cd; ++c)
        for (int64_t k = 0; k < K; ++k) wt[k * Cd + c] = conv_w[c * K + k];
    const int nt = blz_threads(nthreads, T * Cd * K + T * H * P * N, 1 << 14);
#pragma omp parallel num_threads(nt)
    {
        for (int64_t b = 0; b < B; ++b) {
            const int64_t row0 = seqs[4 * b], n = seqs[4 * b + 1], fresh = seqs[4 * b + 3];
            const float *cs = conv_pool + seqs[4 * b + 2] * Cd * (K - 1);
            /* conv + SiLU: u[t, c] = silu(bias_c + Σ_k w[c,k]·v(t - (K-1) + k, c)), v(r < 0) from the state */
#pragma omp for schedule(static)
            for (int64_t t = 0; t < n; ++t) {
                float *ur = u + (row0 + t) * Cd;
                blz_conv_row(xbc + row0 * ld, ld, t, wt, conv_b, fresh ? NULL : cs, Cd, K, ur);
                blz_silu_rows(ur, Cd); /* blz_silu's bits, 8 lanes at a time (the scalar one was ~2/3 of the conv) */
                const float *dr = dt_raw + (row0 + t) * ld;
                for (int64_t h = 0; h < H; ++h) {
                    const float dt = softplus(dr[h] + dt_bias[h]);
                    dts[(row0 + t) * H + h] = fminf(fmaxf(dt, dt_min), dt_max);
                }
            }
            /* (implicit barrier) the conv state: the last K-1 inputs, reaching into the old state when n < K-1 */
#pragma omp for schedule(static)
            for (int64_t c = 0; c < Cd; ++c) {
                float *st = conv_pool + seqs[4 * b + 2] * Cd * (K - 1) + c * (K - 1), next[BLZ_MAMBA2_MAX_K];
                for (int64_t j = 0; j < K - 1; ++j) {
                    const int64_t r = n - (K - 1) + j;
                    next[j] = r >= 0 ? xbc[(row0 + r) * ld + c] : fresh ? 0.0f : st[(K - 1) + r];
                }
                memcpy(st, next, (size_t)(K - 1) * sizeof(float));
            }
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t bh = 0; bh < B * H; ++bh) {
            const int64_t b = bh / H, h = bh % H, g = h / (H / G);
            const int64_t row0 = seqs[4 * b], n = seqs[4 * b + 1];
            float *st = ssm_pool + (seqs[4 * b + 2] * H + h) * P * N;
            if (seqs[4 * b + 3]) memset(st, 0, (size_t)(P * N) * sizeof(float));
            const float A = -expf(A_log[h]);
#ifdef SCAN_PIECE
            if (N % 16 == 0) {
                head_scan(st, u + row0 * Cd, Cd, h * P, Di + g * N, Di + G * N + g * N, dts + row0 * H + h, H, A,
                          dskip[h], P, N, n, y + row0 * Di + h * P, Di);
                continue;
            }
#endif
            for (int64_t t = row0; t < row0 + n; ++t) {
                const float *ur = u + t * Cd, dt = dts[t * H + h];
                head_step(st, ur + h * P, ur + Di + g * N, ur + Di + G * N + g * N, expf(dt * A), dt, dskip[h], P,
                          N, y + t * Di + h * P);
            }
        }
    }
    return BLZ_OK;
}
