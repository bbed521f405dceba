/* blazr kernels — linear layers with ggml Q8_0 weights run as a GGUF stores them (kind BLZ_Q8_0G).
 *
 * Computes out[M, N] = x[M, K] · Wᵀ (+ bias[N]) (+ residual[M, N]), or in SwiGLU mode, for a fused
 * [gate; up] weight of N = 2·I rows, out[M, I] = silu(x·W_gateᵀ + b_gate) * (x·W_upᵀ + b_up). Reached through
 * blz_linear_q (kind code BLZ_Q8_0G).
 *
 * Weights are ggml's bytes, row after row, no repacking — a view of an mmap'd file is used in place: a row is
 * nb = K/32 blocks of 34 bytes, [f16 d][32 int8 q], w = d·q. The values are those of the row-packed BLZ_Q8_0
 * (linear_q.c), and so is the arithmetic, so the two give the same bits: activations quantized by linear_q.c's
 * blz_quantize_act_row (ggml's quantize_row_q8_0: per block of 32, dx = fp16(amax/127), qx =
 * round_half_even(x·127/amax)), the integer block dot Σ q·qx exact in int32, then per block in order
 *     acc = fma((float)dot, dw·dx, acc)
 * in fp32. Every output is computed by exactly this sequence whatever M is and wherever its row falls in a
 * tile, so a row's result never depends on its batch; the AVX2 path and the portable scalar path (explicit
 * fmaf) give the same bits.
 *
 * Long calls (Q8G_PACK_MIN activation rows and more: prefill) pack each 16-row output group (and its SwiGLU up
 * rows) into linear_q.c's row-packed layout in the thread's scratch as they reach it and run the packed
 * kernel's group (blz_q_group_run) on it: the same values and operations, so the same bits, at the packed
 * kernel's rate (a group's bytes read once from memory, then from L2 for every activation row).
 *
 * Parallel strategy otherwise: OpenMP splits the output rows in tiles of QR = 8; a tile walks the blocks once per group
 * of up to QT activation rows, each weight block loaded once for the group, and keeps one 8-lane fp32
 * accumulator per activation row (lane r: weight row r), so a tile's 8 outputs of a row are contiguous. The
 * AVX2 integer dots: see tile_avx2 (a horizontal reduction of 8 rows at once for decode, an in-register
 * transpose to the packed layout's chunks for longer calls). The 8 rows are 8 interleaved streams; the tile
 * prefetches the rows after it (one linear stream) as it goes (BLZ_Q8_PF), as linear_k.c does.
 *
 * Shapes: M activation rows, K in features (a multiple of 32), N out features (SwiGLU: N = 2·I), nb = K/32.
 */
#include "blazr_kernels.h"
#include "tile8.h"

#define QT 16  /* activation rows per tile, at most */
#define QB 34  /* bytes per block: f16 d, 32 int8 */
#ifndef BLZ_Q8_TRANSPOSE_MIN
/* activation rows from which a tile transposes each block (tile_avx2): with VNNI's one-instruction chunk dot
 * from 2 (one thread, in cache, 2-3 rows: the transposed dot takes 0.79-0.89 of the horizontal-sum one), else 4 */
#ifdef BLZ_VNNI
#define BLZ_Q8_TRANSPOSE_MIN 2
#else
#define BLZ_Q8_TRANSPOSE_MIN 4
#endif
#endif
#ifndef BLZ_Q8_PF
#define BLZ_Q8_PF 1 /* 1: prefetch the next tile's rows a block column at a time; 0: none */
#endif
#ifndef Q8G_PACK_MIN
/* Activation rows from which a call packs each 16-row output group into linear_q.c's layout as it goes and
 * runs the packed kernel on it (same bits): Zen 5, 1B shapes, 2 threads, 500 rows 410 → ~1100 GFLOP/s. Below,
 * packing costs more than it saves (LFM2-350M's shapes cold, the tiles against packing: 16 rows 1.6-2.2×,
 * 24 rows 1.03-1.54×, 32 rows 0.95-1.33×, 48 rows 0.78-1.05×, 64 rows 0.70-0.94×; NOTES §64). */
#define Q8G_PACK_MIN 40
#endif

/* Portable path: acc[m][r] = the dot products of weight rows rows[0..nr-1] with activation rows
 * m0 .. m0+mt-1, by the operations of the header comment. */
__attribute__((unused)) static void tile_scalar(const uint8_t *const rows[QR], int nr, const blz_act_t *restrict a,
                                                int64_t m0, int mt, float acc[QT][QR]) {
    for (int m = 0; m < mt; ++m)
        for (int r = 0; r < QR; ++r) acc[m][r] = 0.0f;
    for (int64_t b = 0; b < a->nb; ++b)
        for (int r = 0; r < nr; ++r) {
            const uint8_t *blk = rows[r] + b * QB;
            uint16_t h;
            memcpy(&h, blk, 2);
            blz_tile_block_scalar((const int8_t *)(blk + 2), blz_fp16_to_fp32(h), a, b, m0, mt, r, acc);
        }
}

#ifdef BLZ_AVX2
/* The 8 rows' block b as the packed layout's chunks, built in registers: w[c] lane r = row r's elements
 * 4c..4c+3 (an 8×8 transpose of dwords), aw[c] = |w[c]| bytewise — with AVX512-VNNI instead w[c] + 128 (xor
 * 0x80: the unsigned operand of vpdpbusd, its −128·Σqx cancelled by the activation's `off`). */
BLZ_INLINE void transpose_block(const uint8_t *const rows[QR], int64_t b, __m256i w[8], __m256i aw[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; ++i) {
        const __m256i r0 = _mm256_loadu_si256((const __m256i *)(rows[2 * i] + b * QB + 2));
        const __m256i r1 = _mm256_loadu_si256((const __m256i *)(rows[2 * i + 1] + b * QB + 2));
        t[2 * i] = _mm256_unpacklo_epi32(r0, r1);     /* c0 c0 c1 c1 | c4 c4 c5 c5 of rows 2i, 2i+1 */
        t[2 * i + 1] = _mm256_unpackhi_epi32(r0, r1); /* c2 c2 c3 c3 | c6 c6 c7 c7 */
    }
    for (int h = 0; h < 2; ++h) { /* rows 0-3, 4-7 */
        const __m256i *p = t + 4 * h;
        u[4 * h + 0] = _mm256_unpacklo_epi64(p[0], p[2]); /* c0 of 4 rows | c4 */
        u[4 * h + 1] = _mm256_unpackhi_epi64(p[0], p[2]); /* c1 | c5 */
        u[4 * h + 2] = _mm256_unpacklo_epi64(p[1], p[3]); /* c2 | c6 */
        u[4 * h + 3] = _mm256_unpackhi_epi64(p[1], p[3]); /* c3 | c7 */
    }
    for (int c = 0; c < 4; ++c) {
        w[c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x20);
        w[c + 4] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x31);
    }
#ifdef BLZ_VNNI
    for (int c = 0; c < 8; ++c) aw[c] = _mm256_xor_si256(w[c], _mm256_set1_epi8((char)0x80));
#else
    for (int c = 0; c < 8; ++c) aw[c] = _mm256_abs_epi8(w[c]);
#endif
}

/* acc + the sums of each dword's four products u·s (u unsigned bytes ≤ 128, s signed bytes ≥ −127: exact in
 * int32 either way) — one vpdpbusd with AVX512-VNNI, else vpmaddubsw (pair sums within ±2·128·127: no
 * saturation) widened by vpmaddwd: the same integers, so the same bits. */
BLZ_INLINE __m256i dot_u8s8(const __m256i acc, const __m256i u, const __m256i s, const __m256i ones) {
#ifdef BLZ_VNNI
    (void)ones;
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones));
#endif
}

/* AVX2 path of tile_scalar; all QR rows are read (a short tile repeats its last). Two ways to the same
 * exact integer dots, then the same fmas:
 *   is_transposed = 0 (decode, few activation rows): per (weight row, activation row) dot_u8s8(|q|,
 *     sign(qx, q)), the 8 rows' vectors reduced at once (blz_hsum8x8_epi32) into lane r = row r's dot;
 *   is_transposed = 1 (longer calls): the block transposed once (transpose_block), then per activation row
 *     the packed kernel's dot (linear_q.c group_avx2) — each activation dword broadcast against the 8 rows'
 *     lanes, no horizontal sums (prefill 512 rows, Zen 3: 64-69 → 79-87 GFLOP/s, as packed q8_0). With
 *     AVX512-VNNI each step is one vpdpbusd instead of three instructions: 1.29-1.43x at 16-512 rows on
 *     Sapphire Rapids (1B shapes, 2 threads: 220-255 → 300-336 GFLOP/s; NOTES §36) — and with the weights
 *     made unsigned at the transpose (q + 128) and −128·Σqx added once, no sign step either: one vpdpbusd
 *     with a folded broadcast per chunk (a verification's 4-16 rows: NOTES §51). */
BLZ_INLINE void tile_avx2(const uint8_t *const rows[2 * QR], const int listed, const blz_act_t *restrict a,
                          const int64_t m0, const int mt, const int is_transposed, float acc_out[QT][QR]) {
    const int64_t nb = a->nb;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[QT];
    for (int m = 0; m < mt; ++m) acc[m] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        if (BLZ_Q8_PF && m0 == 0) blz_prefetch_next_tile(rows, QR, listed, QB, b);
        __m256i w[8], aw[8]; /* transposed: chunks c of the 8 rows; else row r's block (|q|: |−128| = 128 as u8) */
        uint16_t dh[QR];
        for (int r = 0; r < QR; ++r) memcpy(&dh[r], rows[r] + b * QB, 2);
        if (is_transposed)
            transpose_block(rows, b, w, aw);
        else
            for (int r = 0; r < QR; ++r) aw[r] = _mm256_abs_epi8(_mm256_loadu_si256((const __m256i *)(rows[r] + b * QB + 2)));
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh)); /* F16C: exact */
        for (int m = 0; m < mt; ++m) {
            const int64_t row = (m0 + m) * nb + b;
            const int8_t *xq = a->q + (m0 + m) * a->K + b * BLZ_QK;
            __m256i dot = _mm256_setzero_si256();
            if (is_transposed) {
#ifdef BLZ_VNNI /* Σ (q + 128)·qx − 128·Σqx: one vpdpbusd a chunk (the broadcast folds into it), no sign step */
                dot = _mm256_set1_epi32(a->off[row]);
                for (int c = 0; c < 8; ++c) dot = _mm256_dpbusd_epi32(dot, aw[c], blz_bcast4_256(xq + 4 * c));
#else
                for (int c = 0; c < 8; ++c) dot = dot_u8s8(dot, aw[c], _mm256_sign_epi8(blz_bcast4_256(xq + 4 * c), w[c]), ones);
#endif
            } else {
                const __m256i x = _mm256_loadu_si256((const __m256i *)xq);
                __m256i v[QR];
                for (int r = 0; r < QR; ++r) {
                    const __m256i q = _mm256_loadu_si256((const __m256i *)(rows[r] + b * QB + 2));
                    v[r] = dot_u8s8(_mm256_setzero_si256(), aw[r], _mm256_sign_epi8(x, q), ones);
                }
                dot = blz_hsum8x8_epi32(v);
            }
            const __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(a->d[row]));
            acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sc, acc[m]);
        }
    }
    for (int m = 0; m < mt; ++m) _mm256_storeu_ps(acc_out[m], acc[m]);
}
#endif

/* acc[m][r] = dot products of weight rows rows[0..QR-1] (the first nr real, the rest repeats) with
 * activation rows m0 .. m0+mt-1. */
static void tile_dots(const uint8_t *const rows[2 * QR], int listed, int nr, const blz_act_t *a, int64_t m0,
                      int mt, float acc[QT][QR]) {
#ifdef BLZ_AVX2
    (void)nr;
    if (mt == 1) /* one activation row (decode) compiled on its own */
        tile_avx2(rows, listed, a, m0, 1, 0, acc);
    else if (mt < BLZ_Q8_TRANSPOSE_MIN)
        tile_avx2(rows, listed, a, m0, mt, 0, acc);
    else
        tile_avx2(rows, listed, a, m0, mt, 1, acc);
#else
    (void)listed;
    tile_scalar(rows, nr, a, m0, mt, acc);
#endif
}

#if defined(BLZ_AVX2) && BLZ_STREAMS > 1
/* One activation row (M = 1) against ns ≤ BLZ_STREAMS tiles far apart (one per stream, blazr_kernels.h), their
 * blocks walked together: acc_out[s] = tile s's dots by tile_avx2's operations at mt = 1, each tile
 * prefetching its successor as it goes. */
BLZ_INLINE void tiles1_avx2(const int ns, const uint8_t *const *const rows, const int *apart,
                            const blz_act_t *restrict a, float acc_out[][QR]) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[BLZ_STREAMS];
    for (int s = 0; s < ns; ++s) acc[s] = _mm256_setzero_ps();
    for (int64_t b = 0; b < a->nb; ++b) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(a->q + b * BLZ_QK));
        const __m256 dx = _mm256_set1_ps(a->d[b]);
        for (int s = 0; s < ns; ++s) {
            const uint8_t *const *tr = rows + 2 * QR * s;
            if (BLZ_Q8_PF) blz_prefetch_next_tile(tr, QR, apart[s], QB, b);
            uint16_t dh[QR];
            __m256i v[QR];
            for (int r = 0; r < QR; ++r) {
                memcpy(&dh[r], tr[r] + b * QB, 2);
                const __m256i q = _mm256_loadu_si256((const __m256i *)(tr[r] + b * QB + 2));
                v[r] = dot_u8s8(_mm256_setzero_si256(), _mm256_abs_epi8(q), _mm256_sign_epi8(x, q), ones);
            }
            const __m256 sc = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh)), dx);
            acc[s] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(blz_hsum8x8_epi32(v)), sc, acc[s]);
        }
    }
    for (int s = 0; s < ns; ++s) _mm256_storeu_ps(acc_out[s], acc[s]);
}

/* blz_linear_q8g at M = 1 (activations quantized in a): this thread's block of tiles cut into BLZ_STREAMS
 * parts (SwiGLU: half as many, each read with its up rows), tile i of every part run together; the
 * steps walked balanced between the threads (blz_walk_t). */
static void q8g_streams(const uint8_t *w, const int64_t *tab, int64_t row_bytes, int64_t ntiles, int64_t N,
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
        float r[BLZ_STREAMS][QR];
        BLZ_TILE_SWITCH(tiles1_avx2, swiglu ? 2 * ns : ns, &rows[0][0], apart, a, r);
        blz_stream_epilogue(ns, r, t, nn, N, nout, bias, residual, out, swiglu);
    }
}
#endif

/* out = x·Wᵀ (+bias) (+residual) or the SwiGLU form; see the file header. x [M, K], w [N][nb · 34] in
 * ggml's layout — or, with a row table `tab` (int64 [N], BLZ_ROWS), each row where tab[n] says —, bias [N]
 * or NULL, residual [M, N] or NULL (may equal out), out [M, N] (SwiGLU: [M, N/2]). */
int blz_linear_q8g(const float *x, int64_t M, int64_t K, const uint8_t *w, const int64_t *tab, int64_t N,
                   const float *bias, const float *residual, float *out, int swiglu, int nthreads) {
    if (M < 0 || N < 0 || K <= 0 || K % BLZ_QK) return BLZ_EINVAL;
    if (swiglu && (N % 2 || residual)) return BLZ_EINVAL;
    if (M == 0 || N == 0) return BLZ_OK;
    blz_act_t a;
    if (blz_act_alloc(&a, M, K)) return BLZ_ENOMEM;
    const int64_t row_bytes = a.nb * QB, nout = swiglu ? N / 2 : N, ntiles = (nout + QR - 1) / QR;
    const int nt = blz_threads(nthreads, M * N * K, BLZ_LINEAR_PARALLEL_MIN);
#if defined(BLZ_AVX2) && BLZ_STREAMS > 1
    if (M == 1) {
        blz_quantize_act_row(x, K, 0, a.q, a.d, a.s, a.off);
        blz_team_t team;
        blz_team_init(&team, nt, ntiles, blz_gemv_parts(BLZ_TUNE_STREAMS_Q8G, 1, swiglu));
#pragma omp parallel num_threads(nt)
        q8g_streams(w, tab, row_bytes, ntiles, N, nout, &a, bias, residual, out, swiglu, &team);
        return BLZ_OK;
    }
#endif
    if (M >= Q8G_PACK_MIN) {
        const int64_t ngroups = (nout + 15) / 16, gbytes = a.nb * 16 * QB;
        int rc = BLZ_OK;
#pragma omp parallel num_threads(nt)
        {
#pragma omp for schedule(static)
            for (int64_t m = 0; m < M; ++m) /* offset 128: the packed Q8_0's quants are stored + 128 */
                blz_quantize_act_row(x + m * K, K, 128, a.q + m * K, a.d + m * a.nb, a.s + m * a.nb, a.off + m * a.nb);
            uint8_t *buf = blz_scratch_slot(3, (size_t)(swiglu ? 2 : 1) * (size_t)gbytes); /* this thread's */
            if (!buf) {
#pragma omp atomic write
                rc = BLZ_ENOMEM;
            }
#pragma omp for schedule(static)
            for (int64_t g = 0; g < ngroups; ++g) {
                if (!buf) continue;
                const int64_t n0 = g * 16, nn = blz_min(16, nout - n0);
                for (int j = 0; j < 16; ++j) {
                    const uint8_t *gate = j < nn ? blz_weight_row(w, tab, n0 + j, row_bytes) : NULL;
                    blz_pack_row(gate, a.nb, QB, 2, 0x80808080u, j, buf);
                    if (swiglu)
                        blz_pack_row(j < nn ? blz_weight_row(w, tab, nout + n0 + j, row_bytes) : NULL, a.nb, QB, 2,
                                     0x80808080u, j, buf + gbytes);
                }
                blz_q_group_run(BLZ_Q8_0, &a, M, BLZ_MT_LONG, buf, buf + gbytes, NULL, 0, n0, nn, N, nout, bias,
                                residual, out, swiglu);
            }
        }
        return rc;
    }
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; ++m) /* off = −128·Σqx per block: the VNNI transposed dot's offset */
            blz_quantize_act_row(x + m * K, K, 128, a.q + m * K, a.d + m * a.nb, a.s + m * a.nb, a.off + m * a.nb);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < ntiles; ++t) {
            float r[QT][QR] __attribute__((aligned(32))), u[QT][QR] __attribute__((aligned(32)));
            const int64_t n0 = t * QR;
            const int nn = (int)blz_min(QR, nout - n0);
            const uint8_t *gate[2 * QR], *up[2 * QR]; /* this tile's rows, then the next tile's (prefetch) */
            int apart[2];
            blz_tile_rows(w, tab, row_bytes, n0, nn, nout, swiglu, gate, up, apart);
            for (int64_t m0 = 0; m0 < M; m0 += QT) {
                const int mt = (int)blz_min(QT, M - m0);
                tile_dots(gate, apart[0], nn, &a, m0, mt, r);
                if (swiglu) tile_dots(up, apart[1], nn, &a, m0, mt, u);
                for (int m = 0; m < mt; ++m)
                    blz_epilogue_row(r[m], u[m], m0 + m, n0, nn, N, nout, bias, residual, out, swiglu);
            }
        }
    }
    return BLZ_OK;
}
