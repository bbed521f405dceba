/* blazr kernels — ggml Q4_0 / Q4_1 / Q5_0 / Q8_0 / MXFP4 blocks and Q4_K / Q5_K / Q6_K super-blocks (as a GGUF file stores
 * them) to float32, at model load: the tensors a model needs as float (a GGUF's token embedding table —
 * Q6_K in llama.cpp's Q4_0 / Q4_K_M mixes —, a path without kernels).
 *
 * The C twin of loading/gguf.py's block dequantizers (torch), which reproduce `gguf.quants.dequantize` bit
 * for bit: the f16 scale (and min) widened to fp32, then one product (and one sum) per value, each rounded
 * on its own (the build passes -ffp-contract=off):
 *   q8_0: d·q       q4_0: d·(q − 8)       q4_1: d·q + m
 *   q4_k / q5_k: q·(d·sc) − dmin·m per 32 values      q6_k: (q − 32)·(d·sc) per 16 values
 *   mxfp4: 2^(e − 128)·kv, kv the doubled e2m1 value of the code (ggml's kvalues_mxfp4; linear_b32.c)
 *   q5_0: d·((q | h << 4) − 16), h bit j of the block's 32-bit qh for element j (linear_b32.c)
 * with byte j of a 4-bit block holding element j (low nibble) and j + 16 (high nibble); the K-quants' bit
 * layouts as kernels/quant.py's docstring and `kquant_fields` describe them. Tested equal to both
 * (tests/test_quantize_kernel.py). One OpenMP chunk of rows per thread; plain loops the compiler vectorises.
 */
#include "blazr_kernels.h"

BLZ_INLINE float f16_field(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return blz_fp16_to_fp32(h);
}

static void dequantize_block(int kind, const uint8_t *restrict blk, float *restrict out) {
    const float d = f16_field(blk);
    if (kind == BLZ_Q8_0) {
        for (int j = 0; j < BLZ_QK; ++j) out[j] = d * (float)(int8_t)blk[2 + j];
    } else if (kind == BLZ_Q4_0) {
        for (int j = 0; j < BLZ_QK / 2; ++j) {
            out[j] = d * (float)((blk[2 + j] & 0x0F) - 8);
            out[j + 16] = d * (float)((blk[2 + j] >> 4) - 8);
        }
    } else {
        const float m = f16_field(blk + 2);
        for (int j = 0; j < BLZ_QK / 2; ++j) {
            out[j] = d * (float)(blk[4 + j] & 0x0F) + m;
            out[j + 16] = d * (float)(blk[4 + j] >> 4) + m;
        }
    }
}

/* MXFP4 block blk [e][16 bytes of codes] → 32 values d·kv, d = 2^(e − 128) as GGML_E8M0_TO_FP32_HALF. */
static void dequantize_mxfp4(const uint8_t *restrict blk, float *restrict out) {
    static const int8_t kv[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    const uint32_t bits = blk[0] < 2 ? 0x00200000u << blk[0] : (uint32_t)(blk[0] - 1) << 23;
    float d;
    memcpy(&d, &bits, 4);
    for (int j = 0; j < BLZ_QK / 2; ++j) {
        out[j] = d * (float)kv[blk[1 + j] & 15];
        out[j + 16] = d * (float)kv[blk[1 + j] >> 4];
    }
}

/* Q5_0 block blk [f16 d][u32 qh][16 bytes of low nibbles] → 32 values d·((q | h << 4) − 16). */
static void dequantize_q5_0(const uint8_t *restrict blk, float *restrict out) {
    const float d = f16_field(blk);
    uint32_t qh;
    memcpy(&qh, blk + 2, 4);
    for (int j = 0; j < BLZ_QK / 2; ++j) {
        out[j] = d * (float)((int)((blk[6 + j] & 0x0F) | ((qh >> j) & 1) << 4) - 16);
        out[j + 16] = d * (float)((int)((blk[6 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16);
    }
}

/* A 32-value block of kind BLZ_Q4_0 / Q4_1 / Q8_0 / MXFP4 / Q5_0 → 32 floats. */
static void dequantize_any32(int kind, const uint8_t *restrict blk, float *restrict out) {
    if (kind == BLZ_MXFP4) dequantize_mxfp4(blk, out);
    else if (kind == BLZ_Q5_0) dequantize_q5_0(blk, out);
    else dequantize_block(kind, blk, out);
}

/* Bytes per block of a 32-value kind (0: not one). */
static int bytes32(int kind) {
    int header = 0;
    return kind == BLZ_MXFP4 ? 17 : kind == BLZ_Q5_0 ? 22 : blz_block_bytes(kind, &header);
}

#define QK_K 256

/* Q4_K / Q5_K's 12-byte field → 8 six-bit scales and mins (kernels/quant.py `k4_scale_min`). */
BLZ_INLINE void k4_scale_min(const uint8_t *s, float sc[8], float mn[8]) {
    for (int j = 0; j < 4; ++j) {
        sc[j] = (float)(s[j] & 63);
        mn[j] = (float)(s[j + 4] & 63);
        sc[j + 4] = (float)((s[j + 8] & 0x0F) | ((s[j] >> 6) << 4));
        mn[j + 4] = (float)((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
    }
}

static void dequantize_superblock(int kind, const uint8_t *restrict blk, float *restrict out) {
    if (kind == BLZ_Q6_K) {
        const uint8_t *ql = blk, *qh = blk + 128;
        const int8_t *sc = (const int8_t *)(blk + 192);
        const float d = f16_field(blk + 208);
        float dl[16];
        for (int g = 0; g < 16; ++g) dl[g] = d * (float)sc[g];
        for (int h = 0; h < 2; ++h) {
            const uint8_t *l8 = ql + 64 * h, *h8 = qh + 32 * h;
            float *o = out + 128 * h;
            const float *dh = dl + 8 * h;
            for (int l = 0; l < 32; ++l) {
                o[l] = (float)(((l8[l] & 15) | ((h8[l] & 3) << 4)) - 32) * dh[l / 16];
                o[l + 32] = (float)(((l8[l + 32] & 15) | (((h8[l] >> 2) & 3) << 4)) - 32) * dh[2 + l / 16];
                o[l + 64] = (float)(((l8[l] >> 4) | (((h8[l] >> 4) & 3) << 4)) - 32) * dh[4 + l / 16];
                o[l + 96] = (float)(((l8[l + 32] >> 4) | (((h8[l] >> 6) & 3) << 4)) - 32) * dh[6 + l / 16];
            }
        }
        return;
    }
    float sc[8], mn[8], d8[8], m8[8];
    k4_scale_min(blk + 4, sc, mn);
    const float d = f16_field(blk), dmin = f16_field(blk + 2);
    for (int g = 0; g < 8; ++g) {
        d8[g] = d * sc[g];
        m8[g] = dmin * mn[g];
    }
    const uint8_t *qs = blk + (kind == BLZ_Q4_K ? 16 : 48), *qh = blk + 16;
    for (int c = 0; c < 4; ++c)
        for (int h = 0; h < 2; ++h) {
            const int g = 2 * c + h;
            for (int l = 0; l < 32; ++l) {
                int q = h ? qs[32 * c + l] >> 4 : qs[32 * c + l] & 15;
                if (kind == BLZ_Q5_K) q |= ((qh[l] >> g) & 1) << 4;
                out[32 * g + l] = (float)q * d8[g] - m8[g];
            }
        }
}

/* Dequantize ggml-ordered blocks src (N rows, contiguous, of `kind`: BLZ_Q4_0 / Q4_1 / Q8_0 / MXFP4 / Q5_0 — K/32 blocks
 * a row — or BLZ_Q4_K / Q5_K / Q6_K — K/256 super-blocks) into dst, float32 [N, K]. */
BLZ_EXPORT int blz_dequantize_blocks(int kind, const uint8_t *src, int64_t N, int64_t K, float *dst,
                                     int nthreads) {
    const int is_k = kind == BLZ_Q4_K || kind == BLZ_Q5_K || kind == BLZ_Q6_K;
    const int qk = is_k ? QK_K : BLZ_QK;
    const int bs = is_k ? (kind == BLZ_Q4_K ? 144 : kind == BLZ_Q5_K ? 176 : 210) : bytes32(kind);
    if (!bs || N < 0 || K <= 0 || K % qk) return BLZ_EINVAL;
    const int64_t nb = K / qk;
#pragma omp parallel for schedule(static) num_threads(nthreads > 0 ? nthreads : 1)
    for (int64_t n = 0; n < N; ++n)
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t *blk = src + (n * nb + b) * bs;
            float *out = dst + n * K + b * qk;
            if (is_k) dequantize_superblock(kind, blk, out);
            else dequantize_any32(kind, blk, out);
        }
    return BLZ_OK;
}

/* Embedding lookup in a table kept as a GGUF stores it: out[t] = scale · row ids[t] of table [V, D],
 * each row dequantized on the spot — `kind` a block kind (BLZ_Q4_0 … BLZ_Q6_K, rows of ggml blocks),
 * BLZ_ROW_F16 / BLZ_ROW_BF16 (rows of 16-bit floats) or BLZ_BF16Z / BLZ_F32Z (coded rows, decoded). The same values as dequantizing the whole table
 * (blz_dequantize_blocks, gguf.quants) and then blz_embedding: the product by scale is skipped at 1, as
 * there. A lookup touches only its own rows, so a memory-mapped table stays out of memory. */
BLZ_EXPORT int blz_embedding_q(int kind, const int64_t *ids, int64_t T, const uint8_t *table, int64_t V,
                               int64_t D, float scale, float *out) {
    if (kind == BLZ_BF16Z || kind == BLZ_F32Z) { /* coded rows (linear_coded.c): a tied head's own bytes */
        if (T < 0 || V <= 0 || D <= 0 || D % 64 || D >= 65536) return BLZ_EINVAL;
        for (int64_t t = 0; t < T; ++t)
            if (ids[t] < 0 || ids[t] >= V) return BLZ_ERANGE;
        for (int64_t t = 0; t < T; ++t) {
            float *o = out + t * D;
            blz_bz_decode_rows(table, D, ids[t], 1, o, kind == BLZ_F32Z);
            if (kind == BLZ_BF16Z) /* the bits in o's first half: widened from the end, in place */
                for (int64_t i = D - 1; i >= 0; --i) o[i] = blz_bf16_to_fp32(((const uint16_t *)o)[i]);
            if (scale != 1.0f)
                for (int64_t i = 0; i < D; ++i) o[i] *= scale;
        }
        return BLZ_OK;
    }
    const int is_k = kind == BLZ_Q4_K || kind == BLZ_Q5_K || kind == BLZ_Q6_K;
    const int is_f = kind == BLZ_ROW_F16 || kind == BLZ_ROW_BF16;
    const int qk = is_k ? QK_K : is_f ? 1 : BLZ_QK;
    const int bs = is_k ? (kind == BLZ_Q4_K ? 144 : kind == BLZ_Q5_K ? 176 : 210) : is_f ? 2 : bytes32(kind);
    if (!bs || kind == BLZ_KMIX || T < 0 || V <= 0 || D <= 0 || D % qk) return BLZ_EINVAL;
    for (int64_t t = 0; t < T; ++t)
        if (ids[t] < 0 || ids[t] >= V) return BLZ_ERANGE;
    const int64_t nb = D / qk;
    for (int64_t t = 0; t < T; ++t) {
        const uint8_t *row = table + ids[t] * nb * bs;
        float *o = out + t * D;
        if (is_f) {
            const uint16_t *h = (const uint16_t *)row;
            for (int64_t i = 0; i < D; ++i) o[i] = kind == BLZ_ROW_F16 ? blz_fp16_to_fp32(h[i]) : blz_bf16_to_fp32(h[i]);
        } else {
            for (int64_t b = 0; b < nb; ++b) {
                if (is_k) dequantize_superblock(kind, row + b * bs, o + b * qk);
                else dequantize_any32(kind, row + b * bs, o + b * qk);
            }
        }
        if (scale != 1.0f)
            for (int64_t i = 0; i < D; ++i) o[i] *= scale;
    }
    return BLZ_OK;
}
