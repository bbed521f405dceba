/* blazr kernels — quantizing float weights to Q4_0 / Q4_1 / Q8_0 blocks in the kernel's row-packed layout
 * (or Q8_0 in ggml's own row order, q8_0g), at model load (`--quantize int8 | int4`).
 *
 * The C twin of `quantize_reference` (kernels/quant.py), which reproduces gguf's numpy quantizers (and so
 * ggml's reference C ones): the same bytes (tests/test_quantize_kernel.py). Per block of 32 values, in fp32
 * with every operation rounded on its own (no FMA contraction: the build passes -ffp-contract=off):
 *   q8_0: d = max|x| / 127, id = 1/d (0 where d = 0), q = round-half-away(x·id)            → f16 d, int8 q
 *   q4_0: m = the first x of largest |x|, d = m / −8, id as above, q = min(15, trunc(x·id + 8.5))
 *   q4_1: d = (max − min) / 15, id as above, q = min(15, trunc((x − min)·id + 0.5))        → f16 d, f16 min
 * 4-bit quants pack element j low and j + 16 high in byte j. Each row is quantized into ggml's block order,
 * then moved into its 16-row group by pack.c's `blz_pack_row` (the layout of linear_q.c), so a quantized
 * weight is written once, in its final place. Input rows are f32, bf16 or f16 (BLZ_KV_* element codes); a
 * bf16 / f16 weight is widened exactly, so the bytes equal those of its f32 copy. Each OpenMP thread takes
 * one contiguous share of the rows (row groups), its part of the output mapped first (`blz_populate`).
 */
#include <stdlib.h>

#include "blazr_kernels.h"

/* Values [32] of block b of a row of element type `type`, as fp32. */
BLZ_INLINE void load_block(const void *row, int type, int64_t b, float v[BLZ_QK]) {
    const int64_t at = b * BLZ_QK;
#if defined(BLZ_AVX2)
    for (int i = 0; i < BLZ_QK; i += 8) _mm256_storeu_ps(v + i, blz_kv_load8(row, at + i, type));
#else
    for (int j = 0; j < BLZ_QK; ++j) v[j] = blz_kv_load1(row, at + j, type);
#endif
}

BLZ_INLINE void put_f16(uint8_t *p, float v) {
    const uint16_t h = blz_fp32_to_fp16(v);
    memcpy(p, &h, 2);
}

/* trunc(t), clamped to 0..15: gguf's `np.trunc(t).astype(np.uint8).clip(0, 15)` for t in its range. */
BLZ_INLINE uint8_t nibble(float t) {
    const float q = truncf(t);
    return q <= 0.0f ? 0 : q >= 15.0f ? 15 : (uint8_t)q;
}

#if defined(BLZ_AVX2)
/* The horizontal min of 8 lanes (the max: blz_hmax256). */
BLZ_INLINE float hmin8(__m256 a) {
    __m128 m = _mm_min_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_min_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_min_ss(m, _mm_movehdup_ps(m)));
}

/* trunc(t) clamped to 0..15, as int32 lanes (`nibble` on 8 values). */
BLZ_INLINE __m256i nibbles8(__m256 t) {
    const __m256 q = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    return _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(q, _mm256_setzero_ps()), _mm256_set1_ps(15.0f)));
}

/* Quants q[32] (int32 lanes in 0..15, element order) → 16 bytes: element j low, j + 16 high. */
BLZ_INLINE void store_nibbles(const __m256i q[4], uint8_t *out) {
    const __m256i b = blz_bytes32(q[0], q[1], q[2], q[3]);
    const __m128i lo = _mm256_castsi256_si128(b), hi = _mm256_extracti128_si256(b, 1);
    _mm_storeu_si128((__m128i *)out, _mm_or_si128(lo, _mm_slli_epi16(hi, 4)));
}
#endif

#if defined(BLZ_AVX512)
/* q8_0_block of the 32 values x[0] | x[1]: the AVX2 form's operations, 16 lanes at a time. */
BLZ_INLINE void q8_0_block16(const __m512 x[2], uint8_t *blk) {
    const __m512 sign = _mm512_set1_ps(-0.0f);
    const float d = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, x[0]), _mm512_andnot_ps(sign, x[1]))) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    put_f16(blk, d);
    for (int i = 0; i < 2; ++i) {
        const __m512 p = _mm512_mul_ps(x[i], _mm512_set1_ps(id));
        const __m512 a = _mm512_andnot_ps(sign, p), fl = _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
        const __m512 f2 = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_set1_ps(2.0f), _mm512_sub_ps(a, fl)),
                                               _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
        const __m512i q = _mm512_cvttps_epi32(_mm512_or_ps(_mm512_add_ps(fl, f2), _mm512_and_ps(sign, p)));
        _mm_storeu_si128((__m128i *)(blk + 2 + 16 * i), _mm512_cvtsepi32_epi8(q));
    }
}
#endif

static void q8_0_block(const float v[BLZ_QK], uint8_t *blk) {
#if defined(BLZ_AVX2)
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 x[4], amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
        x[i] = _mm256_loadu_ps(v + 8 * i);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, x[i]));
    }
    const float d = blz_hmax256(amax) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    put_f16(blk, d);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) { /* round half away, as gguf's np_roundf: fl + floor(2·(a − fl)), signed */
        const __m256 p = _mm256_mul_ps(x[i], _mm256_set1_ps(id));
        const __m256 a = _mm256_andnot_ps(sign, p), fl = _mm256_floor_ps(a);
        const __m256 r = _mm256_add_ps(fl, _mm256_floor_ps(_mm256_mul_ps(_mm256_set1_ps(2.0f), _mm256_sub_ps(a, fl))));
        q[i] = _mm256_cvttps_epi32(_mm256_or_ps(r, _mm256_and_ps(sign, p)));
    }
    _mm256_storeu_si256((__m256i *)(blk + 2), blz_bytes32(q[0], q[1], q[2], q[3]));
#else
    float amax = 0.0f;
    for (int j = 0; j < BLZ_QK; ++j) amax = fmaxf(amax, fabsf(v[j]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    put_f16(blk, d);
    for (int j = 0; j < BLZ_QK; ++j) blk[2 + j] = (uint8_t)(int8_t)roundf(v[j] * id);
#endif
}

static void q4_0_block(const float v[BLZ_QK], uint8_t *blk) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < BLZ_QK; ++j) {
        if (fabsf(v[j]) > amax) { /* the first of equal magnitudes, as numpy's argmax */
            amax = fabsf(v[j]);
            max = v[j];
        }
    }
    const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    put_f16(blk, d);
#if defined(BLZ_AVX2)
    __m256i q[4];
    for (int i = 0; i < 4; ++i)
        q[i] = nibbles8(_mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(v + 8 * i), _mm256_set1_ps(id)), _mm256_set1_ps(8.5f)));
    store_nibbles(q, blk + 2);
#else
    for (int j = 0; j < BLZ_QK / 2; ++j)
        blk[2 + j] = nibble(v[j] * id + 8.5f) | (uint8_t)(nibble(v[j + 16] * id + 8.5f) << 4);
#endif
}

static void q4_1_block(const float v[BLZ_QK], uint8_t *blk) {
#if defined(BLZ_AVX2)
    __m256 x[4], vmax, vmin;
    for (int i = 0; i < 4; ++i) x[i] = _mm256_loadu_ps(v + 8 * i);
    vmax = _mm256_max_ps(_mm256_max_ps(x[0], x[1]), _mm256_max_ps(x[2], x[3]));
    vmin = _mm256_min_ps(_mm256_min_ps(x[0], x[1]), _mm256_min_ps(x[2], x[3]));
    const float max = blz_hmax256(vmax), min = hmin8(vmin);
#else
    float max = v[0], min = v[0];
    for (int j = 1; j < BLZ_QK; ++j) {
        max = fmaxf(max, v[j]);
        min = fminf(min, v[j]);
    }
#endif
    const float d = (max - min) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    put_f16(blk, d);
    put_f16(blk + 2, min);
#if defined(BLZ_AVX2)
    __m256i q[4];
    for (int i = 0; i < 4; ++i) {
        const __m256 t = _mm256_mul_ps(_mm256_sub_ps(x[i], _mm256_set1_ps(min)), _mm256_set1_ps(id));
        q[i] = nibbles8(_mm256_add_ps(t, _mm256_set1_ps(0.5f)));
    }
    store_nibbles(q, blk + 4);
#else
    for (int j = 0; j < BLZ_QK / 2; ++j)
        blk[4 + j] = nibble((v[j] - min) * id + 0.5f) | (uint8_t)(nibble((v[j + 16] - min) * id + 0.5f) << 4);
#endif
}

/* Fetch the values Q_PF elements after block b's (past the row's end too: a prefetch never faults). The
 * hardware prefetcher left a q8_0 quantization of 64 MB of bf16 rows at 1.0 G values/s on one Sapphire
 * Rapids thread, 2.7 with this (as fast as the same rows from L2). */
#define Q_PF 1024
BLZ_INLINE void prefetch_ahead(const void *row, int type, int64_t b) {
#if defined(BLZ_AVX2)
    const int64_t esize = blz_kv_elem_bytes(type);
    const char *p = (const char *)row + esize * (b * BLZ_QK + Q_PF);
    _mm_prefetch(p, _MM_HINT_T0);
    if (esize == 4) _mm_prefetch(p + 64, _MM_HINT_T0); /* 32 fp32 values: two lines */
#else
    (void)row, (void)type, (void)b;
#endif
}

/* One row of K values → its K/32 ggml blocks (bs bytes each) in `out`. */
static void quantize_row(int kind, const void *row, int type, int64_t nb, int bs, uint8_t *out) {
#if defined(BLZ_AVX512)
    if (kind == BLZ_Q8_0) {
        for (int64_t b = 0; b < nb; ++b) {
            prefetch_ahead(row, type, b);
            /* read from the row itself (blz_kv_load16): a 512-bit load of load_block's buffer, just stored
             * by 256-bit halves, cannot be forwarded and stalled this loop ~3x */
            const __m512 x[2] = {blz_kv_load16(row, b * BLZ_QK, type), blz_kv_load16(row, b * BLZ_QK + 16, type)};
            q8_0_block16(x, out + b * bs);
        }
        return;
    }
#endif
    float v[BLZ_QK];
    for (int64_t b = 0; b < nb; ++b) {
        prefetch_ahead(row, type, b);
        load_block(row, type, b, v);
        uint8_t *blk = out + b * bs;
        if (kind == BLZ_Q8_0) q8_0_block(v, blk);
        else if (kind == BLZ_Q4_0) q4_0_block(v, blk);
        else q4_1_block(v, blk);
    }
}

/* Rows n of the weight at `rows[n]` (addresses), else at base + n · stride bytes → the packed layout. */
static int quantize_rows(int kind, const char *base, int64_t stride, const int64_t *rows, int type, int64_t N,
                         int64_t K, uint8_t *dst, int nthreads) {
    int header = 0;
    const int bs = blz_block_bytes(kind == BLZ_Q8_0G ? BLZ_Q8_0 : kind, &header);
    if (!bs || N < 0 || K <= 0 || K % BLZ_QK) return BLZ_EINVAL;
    if (type != BLZ_KV_F32 && type != BLZ_KV_BF16 && type != BLZ_KV_F16) return BLZ_EINVAL;
    const int64_t nb = K / BLZ_QK, row = nb * bs, G = (N + 15) / 16;
    if (kind == BLZ_Q8_0G) { /* ggml's own row layout: each row's blocks straight into place */
#pragma omp parallel num_threads(nthreads > 0 ? nthreads : 1)
        {
            int64_t lo, hi;
            blz_thread_share(N, &lo, &hi);
            blz_populate(dst + lo * row, (hi - lo) * row);
            for (int64_t n = lo; n < hi; ++n)
                quantize_row(BLZ_Q8_0, rows ? (const char *)(intptr_t)rows[n] : base + n * stride, type, nb, bs,
                             dst + n * row);
        }
        return BLZ_OK;
    }
    const uint32_t flip = kind == BLZ_Q8_0 ? 0x80808080u : 0;
    int rc = BLZ_OK;
#pragma omp parallel num_threads(nthreads > 0 ? nthreads : 1)
    {
        uint8_t *blocks = malloc((size_t)row);
        if (!blocks) {
#pragma omp atomic write
            rc = BLZ_ENOMEM;
        }
        int64_t glo, ghi;
        blz_thread_share(G, &glo, &ghi);
        blz_populate(dst + glo * 16 * row, (ghi - glo) * 16 * row);
        for (int64_t g = glo; g < ghi; ++g) {
            if (!blocks) continue;
            uint8_t *group = dst + g * 16 * row;
            for (int j = 0; j < 16; ++j) {
                const int64_t n = g * 16 + j;
                if (n < N) {
                    const char *src = rows ? (const char *)(intptr_t)rows[n] : base + n * stride;
                    quantize_row(kind, src, type, nb, bs, blocks);
                }
                blz_pack_row(n < N ? blocks : NULL, nb, bs, header, flip, j, group);
            }
        }
        free(blocks);
    }
    return rc;
}

/* Quantize w [N, K] (row-major, contiguous; element type `type`: BLZ_KV_F32 / BF16 / F16) to `kind`
 * (BLZ_Q4_0 / Q4_1 / Q8_0) into dst, uint8 [⌈N/16⌉, 16 · K/32 · block bytes] in the row-packed layout —
 * exactly `blz_pack_blocks` of the weight's ggml blocks, padding rows included; BLZ_Q8_0G: Q8_0's blocks in
 * ggml's own row order, uint8 [N, K/32 · 34] (the layout linear_q8.c runs). */
BLZ_EXPORT int blz_quantize_blocks(int kind, const void *w, int type, int64_t N, int64_t K, uint8_t *dst,
                                   int nthreads) {
    return quantize_rows(kind, w, K * blz_kv_elem_bytes(type), NULL, type, N, K, dst, nthreads);
}

/* blz_quantize_blocks with each row found on its own: rows[n] is the address of row n's K values (a
 * checkpoint's memory map: fused q|k|v or gate|up parts, permuted rows), so nothing is gathered first. */
BLZ_EXPORT int blz_quantize_rows(int kind, const int64_t *rows, int type, int64_t N, int64_t K, uint8_t *dst,
                                 int nthreads) {
    return quantize_rows(kind, NULL, 0, rows, type, N, K, dst, nthreads);
}
