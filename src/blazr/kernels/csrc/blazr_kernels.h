/* blazr kernels — shared definitions.
 *
 * Every kernel file includes this header. It decides, at compile time, which SIMD paths exist:
 *   BLZ_AVX512  AVX-512 F + BW (+VL): attention, f32 linear, activation quantization
 *   BLZ_VNNI    + AVX512_VNNI: int8 dot products for the q4_0 / q4_1 / q8_0 linear kernels
 *   BLZ_AVX2    AVX2 + FMA + F16C (every x86-64 CPU since Haswell / Zen 1): the linear kernels and
 *               activation quantization where the AVX-512 paths above are not compiled in
 * Every SIMD path has a portable scalar fallback (plain C that the compiler may auto-vectorise for the
 * host ISA), so `-march=x86-64` or a non-x86 target still builds and gives the same results to fp32
 * rounding (the block-quantized kernels: the same bits). Tensors are row-major and contiguous; sizes are int64_t; functions return 0 on success and a
 * negative code on bad input (checked cheaply, outside hot loops).
 */
#ifndef BLAZR_KERNELS_H
#define BLAZR_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define BLZ_AVX512 1
#if defined(__AVX512VNNI__)
#define BLZ_VNNI 1
#endif
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define BLZ_AVX2 1
#endif

/* The build's widest float vector, for kernels written once for both widths (gemm_float.c's panel
 * micro-kernel, mamba2.c's scan): BLZ_VW floats, loads and stores unaligned. */
#if defined(BLZ_AVX512)
#define BLZ_VW 16
typedef __m512 blz_vf;
#define BLZ_VF_LOAD _mm512_loadu_ps
#define BLZ_VF_STORE _mm512_storeu_ps
#define BLZ_VF_ZERO _mm512_setzero_ps
#define BLZ_VF_SET1 _mm512_set1_ps
#define BLZ_VF_FMA _mm512_fmadd_ps
#define BLZ_VF_MUL _mm512_mul_ps
#elif defined(BLZ_AVX2)
#define BLZ_VW 8
typedef __m256 blz_vf;
#define BLZ_VF_LOAD _mm256_loadu_ps
#define BLZ_VF_STORE _mm256_storeu_ps
#define BLZ_VF_ZERO _mm256_setzero_ps
#define BLZ_VF_SET1 _mm256_set1_ps
#define BLZ_VF_FMA _mm256_fmadd_ps
#define BLZ_VF_MUL _mm256_mul_ps
#endif

#define BLZ_EXPORT __attribute__((visibility("default")))
#define BLZ_INLINE static inline __attribute__((always_inline))

/* Bumped whenever an exported signature changes; ops.py refuses a library with another version. */
#define BLZ_ABI_VERSION 18

/* Error codes returned by the kernels. */
#define BLZ_OK 0
#define BLZ_EINVAL (-1)  /* a size or kind argument is invalid */
#define BLZ_ERANGE (-2)  /* an index (position, cache slot) is out of range */
#define BLZ_ENOMEM (-3)  /* scratch allocation failed */

/* Weight kinds of the block-quantized linear kernel (ggml block values, 32 weights per block, in blazr's
 * row-packed layout: see linear_q.c), the GGUF K-quants (256 weights per super-block, ggml's own bytes;
 * BLZ_KMIX: a fused weight of K-quant segments of different kinds — see linear_k.c), and BLZ_Q8_0G: Q8_0 in
 * ggml's own bytes, as a GGUF stores it (linear_q8.c) — all reached through blz_linear_q. */
enum { BLZ_Q4_0 = 0, BLZ_Q4_1 = 1, BLZ_Q8_0 = 2, BLZ_Q4_K = 3, BLZ_Q5_K = 4, BLZ_Q6_K = 5, BLZ_KMIX = 6 };
/* Row types of blz_embedding_q beside the block kinds above: 16-bit float tables as a GGUF stores them. */
enum { BLZ_ROW_F16 = 7, BLZ_ROW_BF16 = 8 };
enum { BLZ_Q8_0G = 9 };
/* MXFP4 (OCP microscaling FP4: 32 e2m1 values under one e8m0 scale) as a GGUF stores it, ggml's block_mxfp4
 * (linear_b32.c): GPT-OSS's experts. */
enum { BLZ_MXFP4 = 10 };
/* Q5_0 (32 five-bit values under one f16 scale) as a GGUF stores it, ggml's block_q5_0 (linear_b32.c): llama.cpp's
 * K-quant files keep it for rows of no multiple of 256 values (Gemma 3's 640, Qwen2.5-0.5B's 896). */
enum { BLZ_Q5_0 = 11 };
/* Q4_K / Q5_K / Q6_K re-laid at load in groups of 16 rows (linear_kx.c): the same bytes as ggml's super-blocks, moved
 * so that one-row calls run vpdpbusd across rows. */
enum { BLZ_Q4_KX = 12, BLZ_Q6_KX = 13, BLZ_Q5_KX = 14 };
BLZ_INLINE int blz_is_kx(int kind) { return kind == BLZ_Q4_KX || kind == BLZ_Q5_KX || kind == BLZ_Q6_KX; }
/* Float weights with their top byte (sign, 7 exponent bits) coded in 4 bits (linear_coded.c): a bf16 weight's
 * bits in 3/4 of the bytes, an f32 weight's in 7/8. A row of K (a multiple of 64 below 65536): a 32-byte table,
 * cap escapes of 4 bytes, K/64 blocks of 96 (f32z: 224); column j of a block at position blz_bz_pos(j, f32).
 * Both are kinds of blz_linear_by_code's weight codes (op · 32 + kind): coded MoE expert stacks. */
enum { BLZ_BF16Z = 15, BLZ_F32Z = 16 };
BLZ_INLINE int64_t blz_bz_cap(int64_t K) { /* escapes a row: K/128, at least 8, a multiple of 8 (32-byte rows) */
    const int64_t c = K / 128 > 8 ? K / 128 : 8;
    return (c + 7) / 8 * 8;
}
BLZ_INLINE int64_t blz_bz_row_bytes(int64_t K, int f32) { return 32 + 4 * blz_bz_cap(K) + K / 64 * (f32 ? 224 : 96); }
BLZ_INLINE int blz_bz_pos(int j, int f32) {
    return f32 ? 16 * ((j % 16) / 4) + 4 * (j / 16) + j % 4 : 16 * ((j % 16) / 4) + 8 * (j / 32) + 2 * (j % 4) + (j / 16) % 2;
}
/* f32z: the byte offset in a block of the low 16 bits at position p (two 64-byte chunks, words in position
 * order: chunk 0 the positions 16L + t, chunk 1 16L + 8 + t, t < 8, word 8L + t) */
BLZ_INLINE int blz_bz_low_at(int p) { return 96 + 64 * ((p % 16) / 8) + 2 * (8 * (p / 16) + p % 8); }
#define BLZ_QK 32
/* Kind flag of blz_linear_q (Q8_0G and the K-quants) and of the f16 and bf16 linear calls: `w` is not the
 * weight's bytes but a row table, int64 [N] — the address of each row's bytes, wherever they lie (a fused
 * weight's parts apart in a checkpoint's map, rows in another order), so such a weight is never copied. */
#define BLZ_ROWS 0x100
/* Kind flag of the f32 linear call: a prefill — many rows may take gemm_float.c's panel GEMM. Without it
 * every row takes the decode path, whose result for a row never depends on the call's other rows. */
#define BLZ_GEMM 0x200
/* Kind flag of blz_linear_q (Q8_0G only): x kept fp32, each weight widened exactly (linear_q8xf.c) instead of
 * x rounded to 8 bits per block — a model's output head, whose errors reach the logits unfiltered. */
#define BLZ_XF32 0x400

/* Whether rows[0..n-1] lie back to back, row_bytes apart (then one linear prefetch stream covers them). */
static inline int blz_rows_follow(const uint8_t *const *rows, int n, int64_t row_bytes) {
    return rows[n - 1] == rows[0] + (n - 1) * row_bytes;
}

/* Row n of a weight of row_bytes-byte rows: w + n·row_bytes, or the address a row table lists. */
static inline const uint8_t *blz_weight_row(const uint8_t *w, const int64_t *tab, int64_t n, int64_t row_bytes) {
    return tab ? (const uint8_t *)(intptr_t)tab[n] : w + n * row_bytes;
}

/* Element types of the KV-cache pools (attention and kv_write), and of float weight rows (gemm_float.c). */
enum { BLZ_KV_F32 = 0, BLZ_KV_BF16 = 1, BLZ_KV_F16 = 2 };

/* Row n of a weight of K 16-bit values a row (f16 / bf16): from w, or where the row table says. */
static inline const uint16_t *blz_weight_row16(const uint16_t *w, const int64_t *tab, int64_t n, int64_t K) {
    return (const uint16_t *)blz_weight_row((const uint8_t *)w, tab, n, 2 * K);
}

/* Exported kernels (documented where they are defined). */
int blz_linear_q(int kind, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N,
                 const float *bias, const float *residual, float *out, int swiglu, int nthreads);
int blz_linear_f32(const float *x, int64_t M, int64_t K, const float *w, int64_t N, const float *bias,
                   const float *residual, float *out, int swiglu, int nthreads);
/* blz_linear_f32; with `gemm` many rows may take the panel GEMM (a prefill call, AVX2 hosts). */
int blz_linear_f32_gemm(const float *x, int64_t M, int64_t K, const float *w, int64_t N, const float *bias,
                        const float *residual, float *out, int swiglu, int nthreads, int gemm);
int blz_linear_bf16(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N, const float *bias,
                    const float *residual, float *out, int swiglu, int nthreads);
int blz_linear_bf16_rows(const float *x, int64_t M, int64_t K, const uint16_t *w, const int64_t *tab, int64_t N,
                         const float *bias, const float *residual, float *out, int swiglu, int nthreads);
int blz_linear_q8g_xf(const float *x, int64_t M, int64_t K, const uint8_t *w, const int64_t *tab, int64_t N,
                      const float *bias, const float *residual, float *out, int swiglu, int nthreads);
int blz_linear_f16(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N, const float *bias,
                   const float *residual, float *out, int swiglu, int nthreads);
int blz_linear_f16_rows(const float *x, int64_t M, int64_t K, const uint16_t *w, const int64_t *tab, int64_t N,
                        const float *bias, const float *residual, float *out, int swiglu, int nthreads);
/* gemm_float.c: the many-row GEMM of float weights w [N, K] (rows from w, or at tab[n] when a row table is
 * given) of kind wk on fp32 FMAs, out [M, N] as the blz_linear_* calls (x as given: 16-bit weights widened exactly);
 * nt threads. Each output one sequential fp32 sum over k, whatever M. */
enum { BLZ_PANEL_F16 = BLZ_KV_F16, BLZ_PANEL_BF16 = BLZ_KV_BF16, BLZ_PANEL_F32 = BLZ_KV_F32 }; /* widened by blz_kv_load* */
enum { BLZ_PANEL_BF16Z = 3, BLZ_PANEL_F32Z = 4 }; /* coded rows, decoded 16 at a time (blz_bz_decode_rows) */
/* Weight rows rows[0..nr-1] (nr ≤ BLZ_STREAMS) · the call's mt ≤ 8 x rows (row m at x + m·K elements) →
 * res[r·mt + m], each pair by the operations it takes alone. */
typedef void (*blz_rows_fn)(int nr, int mt, const void *const *rows, int64_t K, const void *x, float *res);
void blz_populate(uint8_t *p, int64_t n);
int blz_panel_gemm(const void *w, const int64_t *tab, int wk, const float *x, int64_t M, int64_t K, int64_t N,
                   const float *bias, const float *residual, float *out, int swiglu, int nt);
int blz_embedding_q(int kind, const int64_t *ids, int64_t T, const uint8_t *table, int64_t V, int64_t D,
                    float scale, float *out);
int blz_quantize_act(const float *x, int64_t M, int64_t K, int8_t *q, float *d, float *s);
int blz_pack_blocks(int kind, const uint8_t *src, int64_t N, int64_t K, uint8_t *dst, int nthreads);
int blz_quantize_blocks(int kind, const void *w, int type, int64_t N, int64_t K, uint8_t *dst, int nthreads);
int blz_pack_rows(int kind, const int64_t *rows, int64_t N, int64_t K, uint8_t *dst, int nthreads);
int blz_gather_rows(const int64_t *rows, int64_t N, int64_t row_bytes, uint8_t *dst, int nthreads);
int blz_quantize_rows(int kind, const int64_t *rows, int type, int64_t N, int64_t K, uint8_t *dst, int nthreads);
int blz_dequantize_blocks(int kind, const uint8_t *src, int64_t N, int64_t K, float *dst, int nthreads);
int blz_quantize_q8k(const float *x, int64_t M, int64_t K, int8_t *q, float *d, int16_t *bsums);
int blz_rms_norm(const float *x, const float *w, int64_t M, int64_t D, float eps, float *out, int nthreads);
int blz_gated_rms_norm(const float *y, const float *z, int64_t ldz, const float *w, int64_t M, int64_t D,
                       int64_t group, float eps, int norm_before_gate, float *out, int nthreads);
int blz_rope_neox(float *x, int64_t T, int64_t H, int64_t Dh, int64_t ldx, const int64_t *pos,
                  const float *cos, const float *sin, int64_t P, int64_t R, int nthreads);
int blz_paged_attention_decode(const float *q, int64_t ldq, const void *k_pool, const void *v_pool,
                               int kv_type, int64_t S, const int64_t *kv_indices, int64_t idx_stride,
                               const int64_t *seq_lens, int64_t B, int64_t H, int64_t Hkv, int64_t D,
                               int64_t Dv, float scale, int64_t window, float *out, int nthreads,
                               const float *sinks, float softcap);
int blz_attention_prefill(const float *q, int64_t ldq, const void *k_pool, const void *v_pool, int kv_type,
                          int64_t S, const int64_t *idx, int64_t n, int64_t ctx, int64_t H, int64_t Hkv, int64_t D,
                          int64_t Dv, float scale, int64_t window, const float *sinks, float softcap, float *out,
                          int64_t ldo, int nthreads);
int blz_kv_write(const float *k, int64_t ldk, const float *v, int64_t ldv, const int64_t *slots, int64_t T,
                 int64_t Hkv, int64_t D, int64_t Dv, void *k_pool, void *v_pool, int kv_type, int64_t S);
int blz_mamba2_step(const float *xbc, const float *dt_raw, int64_t ld, const int64_t *slots, int64_t B,
                    const float *conv_w, const float *conv_b, float *conv_pool, int64_t K, const float *dt_bias,
                    const float *A_log, const float *dskip, float *ssm_pool, int64_t S, int64_t H, int64_t P, int64_t G,
                    int64_t N, float dt_min, float dt_max, float *y, int nthreads);
int blz_mamba2_prefill(const float *xbc, const float *dt_raw, int64_t ld, const int64_t *seqs, int64_t B,
                       const float *conv_w, const float *conv_b, float *conv_pool, int64_t K, const float *dt_bias,
                       const float *A_log, const float *dskip, float *ssm_pool, int64_t S, int64_t H, int64_t P,
                       int64_t G, int64_t N, float dt_min, float dt_max, float *y, int nthreads);
int blz_embedding(const int64_t *ids, int64_t T, const float *table, int64_t V, int64_t D, float scale,
                  float *out);
int blz_axpby(const float *x, float a, const float *y, float b, int64_t n, float *out);
int blz_softcap(float *x, int64_t n, float cap, int nthreads);
int blz_activation(const float *x, int64_t M, int64_t N, int kind, int gated, float *out, int nthreads);
int blz_moe_route(const float *logits, int64_t T, int64_t E, const float *bias, int sigmoid, int64_t G,
                  int64_t topk_groups, int group_top2, int64_t k, int renorm, float scale, float *weights,
                  int64_t *ids);
int blz_moe_experts(const float *x, int64_t T, int64_t D, const int64_t *ids, const float *weights, int64_t k,
                    int64_t E, int code_up, const void *w_up, int64_t up_stride, int code_down,
                    const void *w_down, int64_t down_stride, int64_t I, int act, int gated, float *out,
                    int nthreads, const float *b_up, const float *b_down, float alpha, float limit);
int blz_mla_cache_write(const float *kv, int64_t ldkv, int64_t T, int64_t L, int64_t R, const float *norm_w,
                        float eps, const int64_t *pos, const float *cos, const float *sin, int64_t P,
                        const int64_t *slots, void *pool, int kv_type, int64_t S);
int blz_mla_decode(const float *q_lat, int64_t ld_lat, int64_t hs_lat, const float *q_rope, int64_t ld_rope,
                   int64_t hs_rope, const void *pool, int kv_type, int64_t S, const int64_t *kv_indices,
                   int64_t idx_stride, const int64_t *seq_lens, int64_t B, int64_t H, int64_t R, int64_t L,
                   float scale, float *out, int nthreads);
int blz_linear_heads(const float *x, int64_t ldx, int64_t hsx, int64_t B, int64_t H, int64_t K, int code,
                     const void *w, int64_t w_stride, int64_t N, float *out, int64_t ldo, int64_t hso,
                     int nthreads);
int blz_argmax_rows(const float *x, int64_t B, int64_t V, int64_t *out, int nthreads);
int blz_sample_rows(const float *x, int64_t B, int64_t V, const float *temperature, const float *min_p,
                    const int64_t *top_k, const float *top_p, const float *u, int64_t *out, int nthreads);
int blz_deltanet_step(const float *qkvz, const float *ba, const int64_t *slots, int64_t B, const float *conv_w,
                      float *conv_pool, int64_t K, const float *dt_bias, const float *A_log, const float *norm_w,
                      float *state_pool, int64_t S, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, int tiled,
                      float beta_scale, float eps, float *y, int nthreads);
int blz_deltanet_prefill(const float *qkvz, const float *ba, const int64_t *seqs, int64_t B, const int64_t *saves,
                         int64_t ns, const float *conv_w, float *conv_pool, int64_t K, const float *dt_bias,
                         const float *A_log, const float *norm_w, float *state_pool, int64_t S, int64_t Hk,
                         int64_t Hv, int64_t Dk, int64_t Dv, int tiled, int64_t chunk, float beta_scale, float eps,
                         float *y, int nthreads);
int blz_kda_step(const float *qkv, const float *f, const float *b, const float *gate, const int64_t *slots, int64_t B,
                 const float *conv_w, float *conv_pool, int64_t K, const float *dt_bias, const float *A_log,
                 const float *norm_w, float *state_pool, int64_t S, int64_t H, int64_t D, float eps, float *y,
                 int nthreads);
int blz_kda_prefill(const float *qkv, const float *f, const float *b, const float *gate, const int64_t *seqs,
                    int64_t B, const int64_t *saves, int64_t ns, const float *conv_w, float *conv_pool, int64_t K,
                    const float *dt_bias, const float *A_log, const float *norm_w, float *state_pool, int64_t S,
                    int64_t H, int64_t D, int64_t chunk, float eps, float *y, int nthreads);
int blz_head_rms_norm(float *x, int64_t T, int64_t H, int64_t D, int64_t ldt, const float *w, float eps, float *out,
                      int64_t ldo, int nthreads);
int blz_sigmoid_mul(float *x, int64_t M, int64_t N, int64_t ldx, const float *g, int64_t ldg, int64_t gw, int nthreads);
int blz_mul(float *x, int64_t M, int64_t N, int64_t ldx, const float *g, int64_t ldg, int64_t gw, int nthreads);
int blz_copy_rows(const float *x, int64_t M, int64_t N, int64_t ldx, float *out, int64_t ldo);
int blz_causal_conv(const float *x, const float *gin, const float *gout, int64_t ld, const int64_t *index, int64_t B,
                    int prefill, const float *w, const float *bias, float *state, int64_t S, int64_t C, int64_t K,
                    int silu, float *y, int nthreads);
int blz_mamba1_scan(const float *xc, const float *dt_raw, const float *bc, const float *z, int64_t ldz,
                    const int64_t *index, int64_t B, int prefill, const float *A, const float *dskip, float *ssm,
                    int64_t S, int64_t Di, int64_t N, float *y, int nthreads);
int blz_mamba1_dt_bc(const float *dbc, int64_t T, int64_t R, int64_t N, const float *w_dt, const float *w_b,
                     const float *w_c, int norm, float eps, float *dt_out, float *bc_out);
/* Internal (causal_conv.c): a recurrent kernel's slots / sequences checked, the rows they span in *T. */
int blz_recurrent_rows(const int64_t *index, int64_t B, int prefill, int64_t S, int64_t *T);

/* Internal: pack.c's block size of a 32-block kind (and its per-row header bytes) and its move of one row of
 * ggml blocks into a 16-row group, shared with quantize.c. */
int blz_block_bytes(int kind, int *header);
void blz_pack_row(const uint8_t *src, int64_t nb, int bs, int header, uint32_t flip, int j, uint8_t *group);

/* Internal: one linear call by weight code (op · 32 + kind, kinds 0-31), no bias or residual (common.c). */
int blz_linear_by_code(int code, const float *x, int64_t M, int64_t K, const void *w, int64_t N, float *out,
                       int swiglu, int nthreads);

/* Internal: the K-quant linear kernel (linear_k.c), the in-place Q8_0 one (linear_q8.c), MXFP4's and Q5_0's
 * (linear_b32.c: kind BLZ_MXFP4 or BLZ_Q5_0), blz_linear_q's signature plus the row table of BLZ_ROWS (NULL:
 * rows follow each other from w); and a fused weight's segments of different kinds (linear_mix.c, BLZ_KMIX). */
int blz_linear_k(int kind, const float *x, int64_t M, int64_t K, const uint8_t *w, const int64_t *tab, int64_t N,
                 const float *bias, const float *residual, float *out, int swiglu, int nthreads);
int blz_linear_q8g(const float *x, int64_t M, int64_t K, const uint8_t *w, const int64_t *tab, int64_t N,
                   const float *bias, const float *residual, float *out, int swiglu, int nthreads);
int blz_linear_b32(int kind, const float *x, int64_t M, int64_t K, const uint8_t *w, const int64_t *tab, int64_t N,
                   const float *bias, const float *residual, float *out, int swiglu, int nthreads);
int blz_linear_mix(const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, const float *bias,
                   const float *residual, float *out, int swiglu, int nthreads);
int blz_linear_coded(int f32, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, const float *bias,
                     const float *residual, float *out, int swiglu, int nthreads);
void blz_bz_decode_rows(const uint8_t *w, int64_t K, int64_t n0, int64_t nr, void *dst, int f32);
void blz_bz_decode_rows_f32(const uint8_t *w, int64_t K, int64_t n0, int64_t nr, float *dst, int f32); /* fp32 out */
int blz_linear_kx(int kind, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, const float *bias,
                  const float *residual, float *out, int swiglu, int nthreads);

/* Internal: the 32-block activations of linear_q.c (ggml's quantize_row_q8_0 / q8_1), shared with
 * linear_q8.c — rows of K int8 in natural order and per block of 32 the fp16-rounded scale d, Q4_1's offset
 * term s and −offset·Σq (see linear_q.c's header). blz_act_alloc lays them out for an M×K call in the calling
 * thread's scratch; blz_quantize_act_row quantizes one row. */
typedef struct {
    int8_t *q;    /* [M][K] */
    float *d;     /* [M][nb] block scale, fp16-rounded */
    float *s;     /* [M][nb] fp16(amax/127 · Σq) (Q4_1's offset term) */
    int32_t *off; /* [M][nb] −offset·Σq (cancels a weight offset inside the integer sum) */
    int64_t K, nb;
} blz_act_t;
int blz_act_alloc(blz_act_t *a, int64_t M, int64_t K);
/* linear_q.c: one packed 16-row output group's dots for all M activation rows of `a`, then its epilogue (see
 * there); linear_q8.c's prefill runs Q8_0 rows packed per call through it. */
void blz_q_group_run(int kind, const blz_act_t *a, int64_t M, int64_t tile, const uint8_t *wg, const uint8_t *uw0,
                     const uint8_t *uw1, int64_t shift, int64_t n0, int64_t nn, int64_t N, int64_t nout,
                     const float *bias, const float *residual, float *out, int swiglu);
#define BLZ_MT_LONG 8 /* activation rows per register tile of a packed group in a long (prefill) call */
void blz_quantize_act_row(const float *restrict x, int64_t K, int32_t offset, int8_t *restrict q,
                          float *restrict d, float *restrict s, int32_t *restrict off);

/* Packed call (see common.c): the arguments of one kernel, in order, as int64 (pointers and integers) and
 * double (float arguments). Python fills one preallocated struct per thread and passes its address, which
 * costs ~1 µs through ctypes instead of ~0.3 µs per separately converted argument. */
enum {
    BLZ_OP_LINEAR_Q = 1,
    BLZ_OP_LINEAR_F32 = 2,
    BLZ_OP_LINEAR_BF16 = 3,
    BLZ_OP_RMS_NORM = 4,
    BLZ_OP_ROPE_NEOX = 5,
    BLZ_OP_PAGED_ATTENTION_DECODE = 6,
    BLZ_OP_KV_WRITE = 7,
    BLZ_OP_MAMBA2_STEP = 8,
    BLZ_OP_GATED_RMS_NORM = 9,
    BLZ_OP_EMBEDDING = 10,
    BLZ_OP_AXPBY = 11,
    BLZ_OP_ACTIVATION = 12,
    BLZ_OP_MAMBA2_PREFILL = 13,
    BLZ_OP_MOE_ROUTE = 14,
    BLZ_OP_MOE_EXPERTS = 15,
    BLZ_OP_MLA_CACHE_WRITE = 16,
    BLZ_OP_MLA_DECODE = 17,
    BLZ_OP_LINEAR_F16 = 18,
    BLZ_OP_EMBEDDING_Q = 19,
    BLZ_OP_LINEAR_HEADS = 20,
    BLZ_OP_CAUSAL_CONV = 21, /* short convolutions and Mamba1 (causal_conv.c, mamba1.c) */
    BLZ_OP_MAMBA1_SCAN = 22,
    BLZ_OP_MAMBA1_DT_BC = 23,
    BLZ_OP_SOFTCAP = 24,
    BLZ_OP_ATTENTION_PREFILL = 25, /* attention_prefill.c */
    BLZ_OP_DELTANET_STEP = 30, /* gated DeltaNet (deltanet.c) and gated attention / MoE pieces (gates.c) */
    BLZ_OP_DELTANET_PREFILL = 31,
    BLZ_OP_HEAD_RMS_NORM = 32,
    BLZ_OP_SIGMOID_MUL = 33,
    BLZ_OP_MUL = 34,
    BLZ_OP_COPY_ROWS = 35,
    BLZ_OP_KDA_STEP = 40, /* Kimi Delta Attention (kda.c) */
    BLZ_OP_KDA_PREFILL = 41,
};
typedef struct {
    int64_t op;
    int64_t i[24];
    double f[2];
} blz_args_t;

/* Per-thread scratch buffer, grown on demand and reused across calls (never freed). It belongs to the
 * calling thread, so two Python threads calling kernels at once do not share it; inside one call the
 * OpenMP team reads and writes it through the returned pointer. 64-byte aligned. */
void *blz_scratch(size_t bytes);
/* The same, from one of BLZ_SCRATCH_SLOTS independent buffers (slot 0 is blz_scratch's): a kernel that calls
 * other kernels keeps its own buffers in slot 1 while they use slot 0 (moe.c, mla.c, linear_mix.c — whose
 * kmix weights are never an expert's or an MLA head's, so no two of them nest); slot 2 holds the float
 * panel GEMM's packed x (gemm_float.c), which a kernel of slot 1 may call; slot 3 a leaf kernel's own
 * weight rows: each OpenMP thread's re-laid K-quant rows (linear_k_groups.c), the panel GEMM's decoded coded
 * rows, the portable build's decoded coded weight (linear_coded.c, which moe.c calls for coded experts). */
#define BLZ_SCRATCH_SLOTS 4
void *blz_scratch_slot(int slot, size_t bytes);

/* Multiply-adds below which a linear call runs on one thread: an OpenMP fork/join costs ~1-2 µs, about
 * what 64K multiply-adds take. */
#define BLZ_LINEAR_PARALLEL_MIN (1 << 16)

/* Threads to use for a call of `work` units: 1 below `min_work`, else the caller's count (≥ 1). */
BLZ_INLINE int blz_threads(int nthreads, int64_t work, int64_t min_work) {
    return work < min_work || nthreads < 1 ? 1 : nthreads;
}

BLZ_INLINE int64_t blz_round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
BLZ_INLINE int64_t blz_min(int64_t a, int64_t b) { return a < b ? a : b; }
BLZ_INLINE int64_t blz_max(int64_t a, int64_t b) { return a > b ? a : b; }

/* Thread t of nt's share [*lo, *hi) of n items: the contiguous block `omp for schedule(static)` gives it. */
BLZ_INLINE void blz_share(int64_t n, int64_t t, int64_t nt, int64_t *lo, int64_t *hi) {
    const int64_t per = (n + nt - 1) / nt;
    *lo = blz_min(n, t * per);
    *hi = blz_min(n, *lo + per);
}

BLZ_INLINE int blz_thread_num(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

BLZ_INLINE int blz_num_threads(void) {
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

/* This OpenMP thread's share [*lo, *hi) of n items. */
BLZ_INLINE void blz_thread_share(int64_t n, int64_t *lo, int64_t *hi) {
    blz_share(n, blz_thread_num(), blz_num_threads(), lo, hi);
}

/* FN(c, ...) with c = mt (1..3, else 4) a compile-time constant in each case: a kernel inlined per tile size. */
#define BLZ_TILE_SWITCH(FN, mt, ...) \
    switch (mt) {                    \
        case 1:                      \
            FN(1, __VA_ARGS__);      \
            break;                   \
        case 2:                      \
            FN(2, __VA_ARGS__);      \
            break;                   \
        case 3:                      \
            FN(3, __VA_ARGS__);      \
            break;                   \
        default:                     \
            FN(4, __VA_ARGS__);      \
    }

/* Weight streams of a decode linear. A GEMV reads every weight once, so its speed is the memory bandwidth one
 * core draws, which grows with the sequential streams it reads at once: on Sapphire Rapids (2 threads, weights
 * beyond L3) 25-27 GB/s walking rows one after the other, 31-33 GB/s reading 4 far-apart streams in 256-byte
 * steps (NOTES §38). So a one-row linear (f16: up to 4 rows) cuts each thread's block of output rows — or
 * tiles, or packed groups — into BLZ_STREAMS parts and computes item i of every part together, each by the
 * very operations it takes alone, so no result changes. The quantized and coded walkers are AVX2 code, in
 * AVX2 builds too (NOTES §66); the float walkers (linear_16bit.c, linear_float.c, linear_q8xf.c) take streams
 * at 1-8 rows on AVX-512 builds and at one row on AVX2 ones (NOTES §76). */
#ifdef BLZ_AVX2
#define BLZ_STREAMS 4
#else
#define BLZ_STREAMS 1
#endif

/* Balancing those streams between the threads. A core's memory reads are bound by the misses it keeps in
 * flight, not by the bus (Sapphire Rapids VM: one thread reads 15.7 GB/s, two 31), so a thread that finishes
 * its share of a GEMV early idles half the bandwidth while the other finishes — in a 2-thread f32 hybrid
 * decode they finished 7 % of each call apart. Each thread's share is still its contiguous block as S parts
 * of q steps, step i computing item lo + s·q + i of every part; it takes its steps front to back in runs of
 * BLZ_RUN claimed from its slot, and, its own done, the others' remaining runs from their backs, so two
 * threads on one block meet in the middle without reading the same lines. Which thread computes a step
 * changes no bits (each item by the operations it takes alone). */
#define BLZ_RUN 8
#define BLZ_BALANCE_MAX 64 /* threads that get slots; a bigger team walks its static shares */

/* Host tuning. A kernel whose best form depends on the microarchitecture reads its variant here at run time;
 * blazr/kernels/tuning.py measures the variants once per CPU model and library build and sets them at load
 * (blz_set_tune). Every variant of a knob computes the same bits — only the speed differs — and the tests
 * run each. Defaults — what runs where nothing was measured (the host busy at every load so far,
 * BLAZR_TUNE=off) — the forms that lose least on the hosts measured: BLZ_STREAMS_DEFAULT weight streams.
 * 4 streams had been the default, Sapphire Rapids' best by 5-9 % over 2 (Emerald Rapids' 0-5 %); on Zen 5
 * the 4-stream walks of packed Q4_0 / Q4_1, Q8_0 as stored, K-quants and the 32-block kinds read 30-41 GB/s
 * against 45-76 in 1-2 (NOTES §63), so an untuned process decoded those at ~half speed there. AVX2 builds
 * default to 1, the form they ran before their walkers took streams (Zen 3: packed Q4_0 reads best in 4,
 * coded bf16 in 2, Q8_0 as stored, the K-quants and Q5_0 in 1; NOTES §66). */
#ifdef BLZ_AVX512
#define BLZ_STREAMS_DEFAULT 2
#else
#define BLZ_STREAMS_DEFAULT 1
#endif
enum {
    /* weight streams per thread of a one-row decode linear, 1 .. BLZ_STREAMS, per walker: float weights
     * (f32 / f16 / bf16), packed Q4_0 / Q4_1 / Q8_0, Q8_0 as stored, K-quants (Zen 5: 4, 2, 1, 1 — Q4_1
     * in 4 streams read 22 GB/s there, in 2 44) */
    BLZ_TUNE_STREAMS_F = 0,
    BLZ_TUNE_STREAMS_Q = 1,
    BLZ_TUNE_STREAMS_Q8G = 2,
    BLZ_TUNE_STREAMS_K = 3,
    BLZ_TUNE_K1_ZMM = 4, /* K-quant one-row dots in 512-bit registers (1; AVX-512 builds) or 256-bit (0) */
    BLZ_TUNE_STREAMS_B32 = 5, /* weight streams of the 32-block kinds' one-row walk (linear_b32.c: q5_0, mxfp4) */
    BLZ_TUNE_STREAMS_Z = 6,   /* weight streams of the coded bf16 decode (linear_coded.c; Zen 5: 1) */
    BLZ_TUNE_STREAMS_KX = 7,  /* of the K-quants' 16-row groups on AVX2 builds without VNNI (linear_kx.c) */
    /* a one-row Q6_K call as stored (linear_k.c): 0 walks its tiles (8 rows a super-block at a time, in
     * STREAMS_K streams), S ≥ 1 walks each weight row across its super-blocks, in S streams */
    BLZ_TUNE_K6_ROWS = 8,
    BLZ_TUNE_COUNT
};
extern int blz_tune[BLZ_TUNE_COUNT];

/* One thread's steps not yet taken, [front, back) = (steps >> 32, steps & 0xffffffff); a cache line each. */
typedef struct {
    _Alignas(64) uint64_t steps;
} blz_slot_t;

/* A balanced team: nt threads walking n items as S streams each. slot[t] is thread t's steps; slot[nt]
 * counts the threads done (for blz_walk_hold). Built in the calling thread, before the parallel region. */
typedef struct {
    blz_slot_t slot[BLZ_BALANCE_MAX + 1];
    int nt, S; /* nt 1 or above BLZ_BALANCE_MAX: nothing to balance, each thread walks its static share */
    int64_t n;
} blz_team_t;

/* Test hook (common.c; blz_set_walk_hold): thread blz_walk_hold of a balanced team (−1: none) starts its walk
 * only once every other thread has finished, so they take all of its steps — the stealing, made certain;
 * meanwhile blz_walk_taken counts the runs taken from other threads. */
extern int blz_walk_hold;
extern int64_t blz_walk_taken;

typedef struct {
    const blz_team_t *team;
    blz_slot_t *slots; /* NULL: this thread's own steps, no atomics */
    int me, nt, pass;  /* pass p walks thread (me + p) % nt's steps */
    int64_t lo, hi, q; /* the block being walked: items [lo, hi) as S parts of q steps */
    int64_t i, end;    /* the run of its steps being taken */
} blz_walk_t;

BLZ_INLINE int blz_team_balanced(int nt) { return nt >= 2 && nt <= BLZ_BALANCE_MAX; }

BLZ_INLINE void blz_team_init(blz_team_t *tm, int nt, int64_t n, int S) {
    tm->nt = nt;
    tm->S = S;
    tm->n = n;
    if (!blz_team_balanced(nt)) return;
    for (int t = 0; t < nt; ++t) {
        int64_t lo, hi;
        blz_share(n, t, nt, &lo, &hi);
        tm->slot[t].steps = (uint64_t)((hi - lo + S - 1) / S);
    }
    tm->slot[nt].steps = 0;
}

/* Thread t's block [lo, hi) and its steps q as the walk's current block. */
BLZ_INLINE void blz_walk_block(blz_walk_t *w, int t) {
    blz_share(w->team->n, t, w->nt, &w->lo, &w->hi);
    w->q = (w->hi - w->lo + w->team->S - 1) / w->team->S;
}

/* In the parallel region: this thread's walk in team tm. A team of another size than tm was built for (a
 * nested region) walks static shares. */
BLZ_INLINE void blz_walk_begin(blz_walk_t *w, blz_team_t *tm) {
    w->team = tm;
    w->me = blz_thread_num();
    w->nt = blz_num_threads();
    w->slots = blz_team_balanced(tm->nt) && w->nt == tm->nt ? tm->slot : NULL;
    if (w->slots && blz_walk_hold == w->me)
        while (__atomic_load_n(&tm->slot[tm->nt].steps, __ATOMIC_ACQUIRE) < (uint64_t)(tm->nt - 1)) {
        }
    w->pass = 0;
    w->i = w->end = 0;
    blz_walk_block(w, w->me);
}

/* The next run of steps [*i0, *i0 + count) of the block in w->lo / hi / q; 0 when no step is left. */
BLZ_INLINE int64_t blz_walk_next(blz_walk_t *w, int64_t *i0) {
    if (!w->slots) {
        *i0 = 0;
        return w->pass++ ? 0 : w->q;
    }
    for (;;) {
        blz_slot_t *slot = &w->slots[(w->me + w->pass) % w->nt];
        uint64_t v = __atomic_load_n(&slot->steps, __ATOMIC_RELAXED);
        for (;;) {
            const uint64_t f = v >> 32, b = v & 0xffffffffu;
            if (f >= b) break;
            const uint64_t c = b - f < BLZ_RUN ? b - f : BLZ_RUN;
            const uint64_t nv = w->pass ? (f << 32) | (b - c) : ((f + c) << 32) | b;
            if (__atomic_compare_exchange_n(&slot->steps, &v, nv, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
                if (w->pass && blz_walk_hold >= 0) __atomic_add_fetch(&blz_walk_taken, 1, __ATOMIC_RELAXED);
                *i0 = (int64_t)(w->pass ? b - c : f);
                return (int64_t)c;
            }
        }
        if (++w->pass == w->nt) {
            if (blz_walk_hold >= 0) __atomic_add_fetch(&w->slots[w->nt].steps, 1, __ATOMIC_RELEASE);
            return 0;
        }
        blz_walk_block(w, (w->me + w->pass) % w->nt);
    }
}

/* The walk's next step *i of the block in w->lo / hi / q (which may then be another thread's); 0 when no step
 * is left. */
BLZ_INLINE int blz_walk_step(blz_walk_t *w, int64_t *i) {
    if (w->i == w->end) {
        int64_t i0;
        const int64_t run = blz_walk_next(w, &i0);
        if (run == 0) return 0;
        w->i = i0;
        w->end = i0 + run;
    }
    *i = w->i++;
    return 1;
}

/* Step i of those streams: idx[0..ns-1] = the items lo + s·q + i that exist (the last parts may be short);
 * returns ns. */
BLZ_INLINE int blz_stream_step(int64_t lo, int64_t hi, int64_t q, int S, int64_t i, int64_t *idx) {
    int ns = 0;
    for (int s = 0; s < S; ++s)
        if (lo + s * q + i < hi) idx[ns++] = lo + s * q + i;
    return ns;
}

/* IEEE half → float, portable (no F16C needed). */
BLZ_INLINE float blz_fp16_to_fp32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu, bits;
    if (exp == 0x1fu) {
        bits = sign | 0x7f800000u | (mant << 13); /* inf / nan */
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else { /* subnormal half: normalise */
        uint32_t e = 113;
        while (!(mant & 0x400u)) {
            mant <<= 1;
            --e;
        }
        bits = sign | (e << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* float → IEEE half, round to nearest even (as F16C's vcvtps2ph and torch's `.half()`), portable:
 * subnormal halves, overflow to ±inf, NaN kept quiet. */
BLZ_INLINE uint16_t blz_fp32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* ≥ 65520 rounds to inf */
    if (ax < 0x38800000u) {                                    /* below 2⁻¹⁴: a subnormal half or 0 */
        if (ax < 0x33000000u) return (uint16_t)sign;           /* below 2⁻²⁵ (a tie at 2⁻²⁵ → 0) */
        const int shift = 126 - (int)(ax >> 23);               /* value / 2⁻²⁴ = mant · 2^-shift */
        const uint32_t mant = (ax & 0x7fffffu) | 0x800000u, half = 1u << (shift - 1);
        uint32_t q = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1u);
        if (rem > half || (rem == half && (q & 1u))) ++q;
        return (uint16_t)(sign | q);
    }
    const uint32_t r = ax - 0x38000000u; /* rebias the exponent 127 → 15, then round 23 → 10 bits */
    return (uint16_t)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
}

BLZ_INLINE float blz_bf16_to_fp32(uint16_t b) {
    const uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* float → bf16, round to nearest even (NaN kept quiet), as torch's `.to(torch.bfloat16)`. */
BLZ_INLINE uint16_t blz_fp32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* Bytes per element of a KV pool of type kv_type. */
BLZ_INLINE int64_t blz_kv_elem_bytes(int kv_type) { return kv_type == BLZ_KV_F32 ? 4 : 2; }

/* Element i of a cache row as fp32. */
BLZ_INLINE float blz_kv_load1(const char *row, int64_t i, int kv_type) {
    if (kv_type == BLZ_KV_F32) return ((const float *)row)[i];
    const uint16_t h = ((const uint16_t *)row)[i];
    return kv_type == BLZ_KV_BF16 ? blz_bf16_to_fp32(h) : blz_fp16_to_fp32(h);
}

#ifdef BLZ_AVX2
/* The 4 bytes at p (int8 quants, or an int16 pair) broadcast to every 32-bit lane: the second operand of
 * vpmaddubsw / vpmaddwd / vpdpbusd / vpdpwssd steps. */
BLZ_INLINE __m256i blz_bcast4_256(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Elements i .. i+7 of a row of element type kv_type (a cache row, or a float weight row) as fp32: exact
 * widening (bf16: shifted into the high half; f16: vcvtph2ps), the values of blz_kv_load1. */
BLZ_INLINE __m256 blz_kv_load8(const void *row, int64_t i, int kv_type) {
    if (kv_type == BLZ_KV_F32) return _mm256_loadu_ps((const float *)row + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    if (kv_type == BLZ_KV_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#endif

#ifdef BLZ_AVX512
/* blz_bcast4_256 in 16 lanes. */
BLZ_INLINE __m512i blz_bcast4_512(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* blz_kv_load8 for elements i .. i+15. */
BLZ_INLINE __m512 blz_kv_load16(const void *row, int64_t i, int kv_type) {
    if (kv_type == BLZ_KV_F32) return _mm512_loadu_ps((const float *)row + i);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i));
    if (kv_type == BLZ_KV_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

/* Store one fp32 value into a cache row (bf16 / f16: round to nearest even, as torch's casts). */
BLZ_INLINE void blz_kv_store1(char *row, int64_t i, float v, int kv_type) {
    if (kv_type == BLZ_KV_F32) ((float *)row)[i] = v;
    else ((uint16_t *)row)[i] = kv_type == BLZ_KV_BF16 ? blz_fp32_to_bf16(v) : blz_fp32_to_fp16(v);
}

/* blz_exp256's operations on one value, one by one (the same clamps, reduction and polynomial; fnmadd(n, c,
 * x) is fmaf(−n, c, x) exactly), so the two agree bit for bit; ≤ 2 ulp from exp. */
BLZ_INLINE float blz_exp_poly(float x) {
    x = fminf(fmaxf(x, -87.3f), 88.3f);
    const float n = nearbyintf(x * 1.44269504088896341f);
    float r = fmaf(-n, 0.693359375f, x);
    r = fmaf(-n, -2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    const float y = fmaf(p, r * r, r) + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &bits, 4);
    return y * s;
}

/* silu(x) = x / (1 + exp(−x)), exp by blz_exp_poly: the same bits as the vector steps (blz_silu256,
 * blz_epilogue16), so an output's SwiGLU is the same whichever path, width or build computed it. */
BLZ_INLINE float blz_silu(float x) { return x / (1.0f + blz_exp_poly(0.0f - x)); }


/* Epilogue shared by the linear kernels, for the tile of output rows m0 .. m0+mt-1 at column n.
 * r[m] is the dot product of input row m0+m with weight row n; in SwiGLU mode g[m] is the dot product
 * with weight row n + nout ("up"), and out[m, n] = silu(r + bias[n]) * (g + bias[n + nout]) with
 * out of width nout = N/2. Otherwise out[m, n] = r + bias[n] + residual[m, n] (out may alias residual). */
BLZ_INLINE void blz_epilogue(const float *r, const float *g, int mt, int64_t m0, int64_t n, int64_t N,
                             int64_t nout, const float *bias, const float *residual, float *out,
                             int swiglu) {
    for (int m = 0; m < mt; ++m) {
        const int64_t row = m0 + m;
        if (swiglu) {
            const float gate = r[m] + (bias ? bias[n] : 0.0f);
            const float up = g[m] + (bias ? bias[n + nout] : 0.0f);
            out[row * nout + n] = blz_silu(gate) * up;
        } else {
            float v = r[m] + (bias ? bias[n] : 0.0f);
            if (residual) v += residual[row * N + n];
            out[row * N + n] = v;
        }
    }
}

/* A decode linear's output rows (mt ≤ 8 x rows) as weight streams (see BLZ_STREAMS), inside a parallel region:
 * this thread's block of rows [lo, hi) cut into S parts of q rows — S = the knob's stream count for one x row,
 * 2 for more (the accumulators of 2 rows × 4 x rows fill the registers; the knob is measured on one row) —,
 * halved for SwiGLU, whose up rows are streams too, step i computing row lo + s·q + i of every part s at once.
 * (2 for more x rows whatever the knob: with the knob at 2, one part had run cold bf16 weights at 3-8 x rows
 * 1.05-1.8× slower than two, stored and coded alike, Zen 5, benchmarks/NOTES.md §59.) The epilogue
 * is blz_epilogue's, row by row. w: row n at w + n·row_bytes, or at tab[n] (BLZ_ROWS).
 * Inlined into each float kind (fn a constant there), and each step's row addresses taken from the row
 * numbers as they are found, not re-read from the n[] just stored (blz_stream_step's form): on Sapphire
 * Rapids a cold f32 GEMV of 100352 × 768 read 25-28 GB/s the old way, 29-32 this way (same bits).
 * The steps are walked balanced (blz_walk_t) in the team the caller built with blz_team_init(team, nt, nout,
 * blz_gemv_parts(BLZ_TUNE_STREAMS_F, mt, swiglu)), nout = N/2 for SwiGLU, else N. blz_gemv_parts(knob, 1,
 * swiglu) is also the part count of the quantized kinds' one-row walks (q_streams, q8g_streams, k_streams:
 * tiles or row groups), each with its own stream-count knob. */
BLZ_INLINE int blz_gemv_parts(int knob, int mt, int swiglu) {
    const int S = mt == 1 ? blz_tune[knob] : blz_min(2, BLZ_STREAMS);
    return (int)blz_max(1, S / (swiglu ? 2 : 1));
}

/* res [nr, mt] (4 < mt ≤ 8) of a rows function that takes ≤ 4 x rows, as two passes of its weight rows: over x
 * rows 0-3 (lo [nr, 4]), then rows 4 .. mt − 1 (hi [nr, mt − 4]; its weight rows from L1) — each pair by the
 * operations it takes alone (linear_16bit.c, linear_coded.c). */
BLZ_INLINE void blz_merge_passes(const int nr, const int mt, const float *lo, const float *hi, float *res) {
    for (int r = 0; r < nr; ++r)
        for (int m = 0; m < mt; ++m) res[r * mt + m] = m < 4 ? lo[r * 4 + m] : hi[r * (mt - 4) + m - 4];
}

BLZ_INLINE void blz_gemv_streams(blz_rows_fn fn, const uint8_t *w, const int64_t *tab, int64_t row_bytes,
                                 int64_t K, const void *x, int mt, int64_t N, const float *bias,
                                 const float *residual, float *out, int swiglu, blz_team_t *team) {
    const int64_t nout = swiglu ? N / 2 : N;
    const int S = team->S;
    blz_walk_t wk;
    blz_walk_begin(&wk, team);
    for (int64_t i; blz_walk_step(&wk, &i);) {
        int64_t n[BLZ_STREAMS];
        const void *rows[2 * BLZ_STREAMS];
        int ns = 0;
        for (int s = 0; s < S; ++s) {
            const int64_t row = wk.lo + s * wk.q + i;
            if (row < wk.hi) {
                n[ns] = row;
                rows[ns++] = blz_weight_row(w, tab, row, row_bytes);
            }
        }
        for (int s = 0; swiglu && s < ns; ++s) rows[ns + s] = blz_weight_row(w, tab, n[s] + nout, row_bytes);
        float r[2 * BLZ_STREAMS * 4];
        fn(swiglu ? 2 * ns : ns, mt, rows, K, x, r);
        for (int s = 0; s < ns; ++s)
            blz_epilogue(r + s * mt, swiglu ? r + (ns + s) * mt : NULL, mt, 0, n[s], N, nout, bias, residual,
                         out, swiglu);
    }
}

#ifdef BLZ_AVX2
/* The 8-lane sum of v by one fixed tree (halves of 256, then of 128, then of 64 bits). */
BLZ_INLINE float blz_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The sum of v's 8 int32 lanes (exact, whatever the tree). */
BLZ_INLINE int32_t blz_hsum256_epi32(const __m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)));
}

/* The largest of 8 lanes (halves of 256, then 128, then 64 bits; vmaxps's NaN rule at each step). */
BLZ_INLINE float blz_hmax256(__m256 a) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

/* int32 lanes of a0..a3 (8 each, values that fit a byte) → 32 bytes in element order: the packs interleave
 * 128-bit halves, one permute of dwords restores the order. */
BLZ_INLINE __m256i blz_bytes32(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(a0, a1), _mm256_packs_epi32(a2, a3));
    return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* The dot of four 8-wide quarter accumulators a0..a3 (the float weights' decode form: linear_16bit.c,
 * linear_q8xf.c): blz_hsum256((a0 + a1) + (a2 + a3)). */
BLZ_INLINE float blz_quarters256(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    return blz_hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}
#ifdef BLZ_AVX512
/* The same sums with quarters 0|1 in a01's halves and 2|3 in a23's: the same bits. */
BLZ_INLINE float blz_quarters512(__m512 a01, __m512 a23) {
    return blz_quarters256(_mm512_castps512_ps256(a01), _mm512_extractf32x8_ps(a01, 1), _mm512_castps512_ps256(a23),
                           _mm512_extractf32x8_ps(a23, 1));
}
#endif

/* Step b of fetching a tile's successor while the tile runs (linear_q8.c, linear_k.c): rows[n .. 2n-1] are
 * the next tile's n rows of `bb`-byte blocks. Back to back (`apart` = 0; a plain weight's rows after the
 * tile, past its end for the last one: prefetches only) one linear stream, an n·bb-byte slice a step, which
 * the hardware follows well; apart (a row table's rows) block b of each row — fetching row by row where the
 * rows follow each other measured 1.3x slower for Q4_K at M = 1. */
BLZ_INLINE void blz_prefetch_next_tile(const uint8_t *const *rows, const int n, const int apart, const int64_t bb,
                                       const int64_t b) {
    if (apart) {
        for (int r = 0; r < n; ++r)
            for (int64_t o = 0; o < bb; o += 64) _mm_prefetch((const char *)(rows[n + r] + b * bb + o), _MM_HINT_T0);
        return;
    }
    const char *next = (const char *)rows[n] + b * n * bb;
    for (int64_t o = 0; o < n * bb; o += 64) _mm_prefetch(next + o, _MM_HINT_T0);
}

/* The 8 int32 vectors v[r] → one vector whose lane r is Σ lanes of v[r] (exact integer adds). */
BLZ_INLINE __m256i blz_hsum8x8_epi32(const __m256i v[8]) {
    const __m256i ab = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i cd = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(ab, cd, 0x20), _mm256_permute2x128_si256(ab, cd, 0x31));
}

/* exp(x) for 8 lanes, as blz_exp512 (the same reduction and Cephes polynomial; ·2^n through the exponent
 * bits). Inputs are clamped to [−87.3, 88.3]: below gives ~1e-38 (callers mask those lanes). */
BLZ_INLINE __m256 blz_exp256(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* silu(x) = x / (1 + exp(−x)) for 8 lanes, exp by blz_exp256 (blz_silu_rows' vector step). */
BLZ_INLINE __m256 blz_silu256(__m256 x) {
    const __m256 e = blz_exp256(_mm256_sub_ps(_mm256_setzero_ps(), x));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

/* Lanes 0 .. n-1 set (n ≤ 8): a mask for vmaskmovps. */
BLZ_INLINE __m256i blz_mask256(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif

/* v[i] ← silu(v[i]) for i < n, exp by blz_exp256 / blz_exp_poly (the same bits in the vector steps and
 * the tail, wherever a value lies): Mamba2's gate (norm_rope.c), where libm's expf per value cost more
 * than the norm around it. Below −88.3, silu(x) = x / (1 + e^88.3) (|x|·5e-39) rather than ~0. */
BLZ_INLINE void blz_silu_rows(float *v, int64_t n) {
    int64_t i = 0;
#ifdef BLZ_AVX2
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(v + i, blz_silu256(_mm256_loadu_ps(v + i)));
#endif
    for (; i < n; ++i) v[i] = v[i] / (1.0f + blz_exp_poly(0.0f - v[i]));
}

/* Soft-capping (Gemma 2's attention scores and final logits): cap · tanh(v / cap), with tanh(x) below
 * |x| = 1/4 by its Taylor polynomial to x⁹ (≤ 1e-8 relative), above as sign(x) · (1 − 2 / (e^{2|x|} + 1))
 * with blz_exp_poly (≤ ~1e-7 absolute, ≤ ~5e-7 relative there; ±1 past |x| ≈ 44). blz_softcap256 is the
 * same operations on 8 lanes — explicit FMAs, and the library builds with -ffp-contract=off — so the two
 * give the same bits (as blz_exp_poly and blz_exp256). */
#define BLZ_TANH_C3 -0.333333333333f /* tanh x = x + x³ (C3 + x² (C5 + x² (C7 + x² C9))) + O(x¹¹) */
#define BLZ_TANH_C5 0.133333333333f
#define BLZ_TANH_C7 -0.053968253968f
#define BLZ_TANH_C9 0.021869488536f
BLZ_INLINE float blz_softcap1(float v, float cap) {
    const float x = v / cap, a = fabsf(x);
    float t; /* tanh |x| */
    if (a < 0.25f) {
        const float a2 = a * a;
        float p = fmaf(a2, BLZ_TANH_C9, BLZ_TANH_C7);
        p = fmaf(p, a2, BLZ_TANH_C5);
        p = fmaf(p, a2, BLZ_TANH_C3);
        t = fmaf(a * a2, p, a);
    } else {
        t = 1.0f - 2.0f / (blz_exp_poly(2.0f * a) + 1.0f);
    }
    return copysignf(t, x) * cap;
}

#ifdef BLZ_AVX2
BLZ_INLINE __m256 blz_softcap256(__m256 v, __m256 cap) {
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    const __m256 x = _mm256_div_ps(v, cap), a = _mm256_andnot_ps(sign, x), a2 = _mm256_mul_ps(a, a);
    __m256 p = _mm256_fmadd_ps(a2, _mm256_set1_ps(BLZ_TANH_C9), _mm256_set1_ps(BLZ_TANH_C7));
    p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(BLZ_TANH_C5));
    p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(BLZ_TANH_C3));
    const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(a, a2), p, a);
    const __m256 e = blz_exp256(_mm256_add_ps(a, a));
    const __m256 big = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
    const __m256 t = _mm256_blendv_ps(big, small, _mm256_cmp_ps(a, _mm256_set1_ps(0.25f), _CMP_LT_OQ));
    return _mm256_mul_ps(_mm256_or_ps(_mm256_andnot_ps(sign, t), _mm256_and_ps(sign, x)), cap); /* copysign */
}
#endif

/* v[i] ← cap · tanh(v[i] / cap) for i < n: 8 lanes at a time where the build has AVX2, the tail (and
 * portable builds) one value at a time — the same bits on every build and wherever a value lies. */
BLZ_INLINE void blz_softcap_rows(float *v, int64_t n, float cap) {
    int64_t i = 0;
#ifdef BLZ_AVX2
    const __m256 c = _mm256_set1_ps(cap);
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(v + i, blz_softcap256(_mm256_loadu_ps(v + i), c));
#endif
    for (; i < n; ++i) v[i] = blz_softcap1(v[i], cap);
}

#ifdef BLZ_AVX512
/* exp(x) for 16 lanes: x = n·ln2 + r, |r| ≤ ln2/2, e^r by the Cephes degree-6 polynomial, then ·2^n with
 * vscalefps. Relative error ≈ 2 ulp over the float range; inputs below −87.3 give ~1e-38 (callers
 * mask those lanes). */
BLZ_INLINE __m512 blz_exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    x = _mm512_min_ps(x, _mm512_set1_ps(88.7f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    const __m512 r2 = _mm512_mul_ps(r, r);
    const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, n);
}
#endif

#ifdef BLZ_AVX512
/* blz_epilogue for 16 consecutive outputs n0 .. n0+nn-1 (nn ≤ 16) of one row, r (and u, the SwiGLU up
 * values) in lanes: the same operations, so the same bits (a missing bias adds +0 as blz_epilogue's does;
 * silu's exp is blz_exp512 clamped as blz_exp_poly: its operations in 16 lanes). */
BLZ_INLINE void blz_epilogue16(__m512 r, __m512 u, int64_t row, int64_t n0, int nn, int64_t N, int64_t nout,
                               const float *bias, const float *residual, float *out, int swiglu) {
    const __mmask16 k = (__mmask16)((1u << nn) - 1u);
    if (swiglu) {
        r = _mm512_add_ps(r, bias ? _mm512_maskz_loadu_ps(k, bias + n0) : _mm512_setzero_ps());
        u = _mm512_add_ps(u, bias ? _mm512_maskz_loadu_ps(k, bias + nout + n0) : _mm512_setzero_ps());
        /* blz_exp512 below 88.3, blz_exp_poly's range (above it exp512 goes on to 88.7) */
        const __m512 e = blz_exp512(_mm512_min_ps(_mm512_sub_ps(_mm512_setzero_ps(), r), _mm512_set1_ps(88.3f)));
        const __m512 silu = _mm512_div_ps(r, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_mask_storeu_ps(out + row * nout + n0, k, _mm512_mul_ps(silu, u));
    } else {
        r = _mm512_add_ps(r, bias ? _mm512_maskz_loadu_ps(k, bias + n0) : _mm512_setzero_ps());
        if (residual) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(k, residual + row * N + n0));
        _mm512_mask_storeu_ps(out + row * N + n0, k, r);
    }
}
#endif

/* blz_epilogue for the nn consecutive outputs n0 .. n0+nn-1 of one row (r[j], u[j]: output n0 + j's dots;
 * u unused without SwiGLU) in vector steps where the build has them — the same bits as blz_epilogue output
 * by output (silu's exp is blz_exp_poly's operations at every width). The prefill GEMMs' epilogue: libm's
 * expf one value at a time cost ~10 % of a SwiGLU projection's time at 256-500 rows. */
BLZ_INLINE void blz_epilogue_row(const float *r, const float *u, int64_t row, int64_t n0, int64_t nn, int64_t N,
                                 int64_t nout, const float *bias, const float *residual, float *out, int swiglu) {
    int64_t j = 0;
#ifdef BLZ_AVX512
    for (; j < nn; j += 16) {
        const int n = (int)blz_min(16, nn - j);
        const __mmask16 k = (__mmask16)((1u << n) - 1u);
        const __m512 uv = swiglu ? _mm512_maskz_loadu_ps(k, u + j) : _mm512_setzero_ps();
        blz_epilogue16(_mm512_maskz_loadu_ps(k, r + j), uv, row, n0 + j, n, N, nout, bias, residual, out, swiglu);
    }
#elif defined(BLZ_AVX2)
    for (; swiglu && j + 8 <= nn; j += 8) {
        const int64_t n = n0 + j;
        const __m256 zero = _mm256_setzero_ps();
        const __m256 g = _mm256_add_ps(_mm256_loadu_ps(r + j), bias ? _mm256_loadu_ps(bias + n) : zero);
        const __m256 v = _mm256_add_ps(_mm256_loadu_ps(u + j), bias ? _mm256_loadu_ps(bias + nout + n) : zero);
        _mm256_storeu_ps(out + row * nout + n, _mm256_mul_ps(blz_silu256(g), v));
    }
#endif
    for (; j < nn; ++j) blz_epilogue(r + j, swiglu ? u + j : NULL, 1, row, n0 + j, N, nout, bias, residual, out, swiglu);
}

/* Row t of a causal depthwise conv over C channels, K taps, before its activation (Mamba2's and gated
 * DeltaNet's prefill): u[c] = bias[c] (0 without) + Σ_j wt[j·C + c]·x(t − (K−1) + j, c), x(r) = rows[r·ld + c]
 * for r ≥ 0 (rows: the sequence's first new row), else its conv state st[c·(K−1) + (K−1) + r] (zeros where
 * st is NULL: a fresh sequence); wt: the taps transposed, [K, C]. One fma per tap, in tap order. */
BLZ_INLINE void blz_conv_row(const float *rows, int64_t ld, int64_t t, const float *wt, const float *bias,
                             const float *st, int64_t C, int64_t K, float *u) {
    for (int64_t c = 0; c < C; ++c) u[c] = bias ? bias[c] : 0.0f;
    for (int64_t j = 0; j < K; ++j) {
        const int64_t r = t - (K - 1) + j;
        const float *w = wt + j * C;
        if (r >= 0) {
            const float *src = rows + r * ld;
            for (int64_t c = 0; c < C; ++c) u[c] = fmaf(w[c], src[c], u[c]);
        } else if (st) {
            for (int64_t c = 0; c < C; ++c) u[c] = fmaf(w[c], st[c * (K - 1) + (K - 1) + r], u[c]);
        }
    }
}

#endif /* BLAZR_KERNELS_H */
