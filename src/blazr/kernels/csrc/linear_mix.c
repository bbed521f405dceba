/* blazr kernels — a fused linear weight whose parts are stored in different kinds (kind BLZ_KMIX): q|k|v or
 * gate|up made of a GGUF's separate tensors where llama.cpp's mixes quantized them differently — Q4_K_M's
 * attn_q / attn_k in Q4_K beside attn_v in Q6_K, or Gemma 3's attn_q / attn_k in Q5_0 beside attn_v in Q8_0.
 *
 * Bytes: the 64-byte segment table — int32 count n ≤ KSEG_MAX, int32 kinds[KSEG_MAX], int32 rows[KSEG_MAX] —,
 * then each segment's rows in its own ggml layout, one segment after another (kernels/quant.py `from_parts`).
 * A segment's kind is any kind run as a GGUF stores it: the K-quants (BLZ_Q4_K … BLZ_Q6_K), BLZ_Q8_0G,
 * BLZ_MXFP4, BLZ_Q5_0 — or a K-quant re-laid in 16-row groups (BLZ_Q4_KX / Q5_KX / Q6_KX, linear_kx.c; its
 * rows a multiple of 16, its bytes the stored kind's, moved: the loader re-lays a kmix weight's K-quant
 * segments as it does whole weights, kernels/kquant_packed.py).
 *
 * Computes what blz_linear_q computes (out = x·Wᵀ (+bias) (+residual), or the SwiGLU form) in one of two ways:
 *   - every segment a K-quant as stored: linear_k.c's one pass over the segments (its tiles never cross one);
 *   - otherwise each segment by its own kernel (blz_linear_q of its kind: its activation rounding, its
 *     arithmetic — a segment's dots are the bits its rows alone would give), no bias, into the raw dots
 *     [M, N], then blz_epilogue over them (bias, residual or SwiGLU's silu(gate)·up). One OpenMP team per
 *     segment: at decode a fused weight of 2-3 segments costs one or two extra team wake-ups, no extra bytes.
 *
 * Shapes: M activation rows, K in features, N out features (all segments' rows; SwiGLU: N = 2·I).
 */
#include <stdlib.h>

#include "blazr_kernels.h"

#define MIX_HEADER 64
#define MIX_MAX 7

/* Bytes of one row of K values of segment kind `kind`, 0 when K does not split into its blocks (or an unknown
 * kind). */
static int64_t mix_row_bytes(int kind, int64_t K) {
    int qk = BLZ_QK, bs = 0;
    switch (kind) {
        case BLZ_Q4_K: qk = 256, bs = 144; break;
        case BLZ_Q5_K: qk = 256, bs = 176; break;
        case BLZ_Q6_K: qk = 256, bs = 210; break;
        case BLZ_Q4_KX: qk = 256, bs = 144; break;
        case BLZ_Q5_KX: qk = 256, bs = 176; break;
        case BLZ_Q6_KX: qk = 256, bs = 210; break;
        case BLZ_Q8_0G: bs = 34; break;
        case BLZ_MXFP4: bs = 17; break;
        case BLZ_Q5_0: bs = 22; break;
        default: return 0;
    }
    return K % qk ? 0 : K / qk * bs;
}

/* out = x·Wᵀ (+bias) (+residual) or the SwiGLU form; see the file header. x [M, K], w the segment table then
 * the segments, bias [N] or NULL, residual [M, N] or NULL (may equal out), out [M, N] (SwiGLU: [M, N/2]). */
int blz_linear_mix(const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, const float *bias,
                   const float *residual, float *out, int swiglu, int nthreads) {
    if (M < 0 || N < 0 || K <= 0) return BLZ_EINVAL;
    if (swiglu && (N % 2 || residual)) return BLZ_EINVAL;
    int32_t hdr[1 + 2 * MIX_MAX];
    memcpy(hdr, w, sizeof(hdr));
    const int n = hdr[0];
    if (n < 1 || n > MIX_MAX) return BLZ_EINVAL;
    int is_k = 1;
    int64_t total = 0, widest = 0;
    for (int i = 0; i < n; ++i) {
        const int kind = hdr[1 + i], rows = hdr[1 + MIX_MAX + i];
        const int is_kx = kind == BLZ_Q4_KX || kind == BLZ_Q5_KX || kind == BLZ_Q6_KX;
        if (rows < 0 || !mix_row_bytes(kind, K) || (is_kx && rows % 16)) return BLZ_EINVAL;
        is_k &= kind >= BLZ_Q4_K && kind <= BLZ_Q6_K;
        total += rows;
        widest = blz_max(widest, rows);
    }
    if (total != N) return BLZ_EINVAL;
    if (is_k) return blz_linear_k(BLZ_KMIX, x, M, K, w, NULL, N, bias, residual, out, swiglu, nthreads);
    if (M == 0 || N == 0) return BLZ_OK;
    /* the raw dots [M, N], and one segment's [M, rows] where M > 1 (with one row a segment's dots are a run
     * of the row's: written in place) — malloc, not the scratch, which the segments' kernels use */
    float *raw = malloc((size_t)(M * N + (M > 1 ? M * widest : 0)) * sizeof(float));
    if (!raw) return BLZ_ENOMEM;
    float *seg = raw + M * N;
    const uint8_t *p = w + MIX_HEADER;
    int64_t row0 = 0;
    for (int i = 0; i < n; ++i) {
        const int kind = hdr[1 + i];
        const int64_t rows = hdr[1 + MIX_MAX + i];
        if (rows) {
            float *dst = M > 1 ? seg : raw + row0;
            const int rc = blz_linear_q(kind, x, M, K, p, rows, NULL, NULL, dst, 0, nthreads);
            if (rc) {
                free(raw);
                return rc;
            }
            for (int64_t m = 0; M > 1 && m < M; ++m) memcpy(raw + m * N + row0, seg + m * rows, rows * sizeof(float));
        }
        p += rows * mix_row_bytes(kind, K);
        row0 += rows;
    }
    const int64_t nout = swiglu ? N / 2 : N;
    const int nt = blz_threads(nthreads, M * N, BLZ_LINEAR_PARALLEL_MIN);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t m = 0; m < M; ++m)
        blz_epilogue_row(raw + m * N, raw + m * N + nout, m, 0, nout, N, nout, bias, residual, out, swiglu);
    free(raw);
    return BLZ_OK;
}
