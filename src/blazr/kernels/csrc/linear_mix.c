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
 *     arithmetic — a segment's dots are the bits its rows alone would give), no bias, then blz_epilogue
 *     (bias, residual) into its columns of out — or, for a SwiGLU, whose gate and up columns pair across
 *     segments, into the raw dots [M, N] and silu(gate)·up over them at the end. One OpenMP team per
 *     segment: at decode a fused weight of 2-3 segments costs one or two extra team wake-ups, no extra bytes.
 *
 * Shapes: M activation rows, K in features, N out features (all segments' rows; SwiGLU: N = 2·I).
 */
#include "blazr_kernels.h"

#define MIX_HEADER 64
#define MIX_MAX 7

/* Bytes of one row of K values of segment kind `kind`, 0 when K does not split into its blocks (or an unknown
 * kind). */
static int64_t mix_row_bytes(int kind, int64_t K) {
    int qk = BLZ_QK, bs = 0;
    switch (kind) {
        case BLZ_Q4_K: case BLZ_Q4_KX: qk = 256, bs = 144; break; /* re-laid: the stored kind's bytes */
        case BLZ_Q5_K: case BLZ_Q5_KX: qk = 256, bs = 176; break;
        case BLZ_Q6_K: case BLZ_Q6_KX: qk = 256, bs = 210; break;
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
        if (rows < 0 || !mix_row_bytes(kind, K) || (blz_is_kx(kind) && rows % 16)) return BLZ_EINVAL;
        is_k &= kind >= BLZ_Q4_K && kind <= BLZ_Q6_K;
        total += rows;
        widest = blz_max(widest, rows);
    }
    if (total != N) return BLZ_EINVAL;
    if (is_k) return blz_linear_k(BLZ_KMIX, x, M, K, w, NULL, N, bias, residual, out, swiglu, nthreads);
    if (M == 0 || N == 0) return BLZ_OK;
    /* Scratch slot 1, kept between calls (the segments' kernels use slots 0, 2 and 3; a fresh malloc of a
     * prefill's buffers faulted their pages in at every call). One segment's dots seg [M, rows] go through
     * the epilogue into their columns of out at once; a SwiGLU pairs gate and up columns across segments, so
     * there the raw dots [M, N] are gathered first (with one row a segment's dots are a run of the row's,
     * written in place) and the epilogue runs over them after the last segment. */
    const int64_t nraw = swiglu ? M * N : 0, nseg = swiglu && M == 1 ? 0 : M * widest;
    float *raw = blz_scratch_slot(1, (size_t)(nraw + nseg) * sizeof(float));
    if (!raw) return BLZ_ENOMEM;
    float *seg = raw + nraw;
    const int64_t nout = swiglu ? N / 2 : N;
    const uint8_t *p = w + MIX_HEADER;
    int64_t row0 = 0;
    for (int i = 0; i < n; ++i) {
        const int kind = hdr[1 + i];
        const int64_t rows = hdr[1 + MIX_MAX + i];
        if (rows) {
            float *dst = swiglu && M == 1 ? raw + row0 : seg;
            const int rc = blz_linear_q(kind, x, M, K, p, rows, NULL, NULL, dst, 0, nthreads);
            if (rc) return rc;
            const int nt = blz_threads(nthreads, M * rows, BLZ_LINEAR_PARALLEL_MIN);
            if (!swiglu) {
#pragma omp parallel for schedule(static) num_threads(nt)
                for (int64_t m = 0; m < M; ++m)
                    blz_epilogue_row(seg + m * rows, NULL, m, row0, rows, N, N, bias, residual, out, 0);
            } else if (M > 1) {
#pragma omp parallel for schedule(static) num_threads(nt)
                for (int64_t m = 0; m < M; ++m) memcpy(raw + m * N + row0, seg + m * rows, rows * sizeof(float));
            }
        }
        p += rows * mix_row_bytes(kind, K);
        row0 += rows;
    }
    if (swiglu) {
        const int nt = blz_threads(nthreads, M * N, BLZ_LINEAR_PARALLEL_MIN);
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t m = 0; m < M; ++m)
            blz_epilogue_row(raw + m * N, raw + m * N + nout, m, 0, nout, N, nout, bias, residual, out, 1);
    }
    return BLZ_OK;
}
