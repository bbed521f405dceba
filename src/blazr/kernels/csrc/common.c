/* blazr kernels — library-wide helpers: ABI version, compiled-in SIMD features, mapping fresh load-time
 * outputs up front, per-thread scratch, and the packed-argument entry points `blz_call` (one kernel) and
 * `blz_call_many` (a recorded plan). */
#include <stdlib.h>
#ifdef __linux__
#include <sys/mman.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; an older kernel refuses it (EINVAL) and pages fault as usual */
#endif
#endif

#include "blazr_kernels.h"

/* ABI version of this library; ops.py checks it before binding. */
BLZ_EXPORT int blz_abi_version(void) { return BLZ_ABI_VERSION; }

/* Bit mask of the SIMD paths compiled in: 1 = AVX-512 (F/BW/VL), 2 = AVX512_VNNI, 8 = AVX2 (+ FMA, F16C).
 * (4 was AVX512_BF16's vdpbf16ps, which no kernel uses since bf16 weights stopped rounding x: NOTES §44.) */
BLZ_EXPORT int blz_features(void) {
    int f = 0;
#ifdef BLZ_AVX512
    f |= 1;
#endif
#ifdef BLZ_VNNI
    f |= 2;
#endif
#ifdef BLZ_AVX2
    f |= 8;
#endif
    return f;
}

/* Map fresh output memory [p, p + n) in one call instead of one page fault per 4 KB page as a load-time
 * kernel first writes it (a 1B `--quantize int8`'s 1.14 GB: 0.23 s of faults from 2 threads, 0.14-0.16 s
 * populated so, on Sapphire Rapids); each thread populates the part it will write. Advice only: a refusal
 * changes nothing but the time; spans under 1 MB are left to fault. */
void blz_populate(uint8_t *p, int64_t n) {
#if defined(__linux__)
    const uintptr_t page = 4096, a = ((uintptr_t)p + page - 1) & ~(page - 1);
    const uintptr_t b = ((uintptr_t)p + (uintptr_t)n) & ~(page - 1);
    if (n >= (1 << 20) && b > a) (void)madvise((void *)a, b - a, MADV_POPULATE_WRITE);
#else
    (void)p, (void)n;
#endif
}

/* The K-quants' 16-row groups (linear_kx.c) walk streams on AVX2 builds; the VNNI form walks one. */
#ifdef BLZ_VNNI
#define STREAMS_KX_TOP 1
#else
#define STREAMS_KX_TOP BLZ_STREAMS
#endif

/* Q6_K's one-row walk where nothing was measured: its rows in 2 streams on AVX2 builds (Zen 3, cold 1B shapes:
 * 1.4-1.8x the tiles' GB/s, NOTES §74), the tiles on AVX-512 builds (the form measured there; the scalar
 * build has no one-row walk). */
#if defined(BLZ_AVX2) && !defined(BLZ_AVX512)
#define K6_ROWS_DEFAULT 2
#else
#define K6_ROWS_DEFAULT 0
#endif

int blz_tune[BLZ_TUNE_COUNT] = {
    [BLZ_TUNE_STREAMS_F] = BLZ_STREAMS_DEFAULT,
    [BLZ_TUNE_STREAMS_Q] = BLZ_STREAMS_DEFAULT,
    [BLZ_TUNE_STREAMS_Q8G] = BLZ_STREAMS_DEFAULT,
    [BLZ_TUNE_STREAMS_K] = BLZ_STREAMS_DEFAULT,
    [BLZ_TUNE_K1_ZMM] = 0,
    [BLZ_TUNE_STREAMS_B32] = BLZ_STREAMS_DEFAULT,
    [BLZ_TUNE_STREAMS_Z] = 1,
    [BLZ_TUNE_STREAMS_KX] = BLZ_STREAMS_DEFAULT, /* ≤ STREAMS_KX_TOP */
    [BLZ_TUNE_K6_ROWS] = K6_ROWS_DEFAULT,
};

/* Set knob `knob` (BLZ_TUNE_*) to `value` for every later call; returns its previous value, or BLZ_EINVAL for
 * an unknown knob or a value outside its range in this build (streams knobs: 1 .. BLZ_STREAMS, the K-quant
 * groups' 1 .. STREAMS_KX_TOP; K-quant 512-bit dots: 0, or 1 on
 * AVX-512 builds; Q6_K's walk 0 .. BLZ_STREAMS). Not for use while kernels run on other threads. */
BLZ_EXPORT int blz_set_tune(int knob, int value) {
    int top, low = 0;
    switch (knob) {
        case BLZ_TUNE_STREAMS_F:
        case BLZ_TUNE_STREAMS_Q:
        case BLZ_TUNE_STREAMS_Q8G:
        case BLZ_TUNE_STREAMS_K:
        case BLZ_TUNE_STREAMS_B32:
        case BLZ_TUNE_STREAMS_Z:
            top = BLZ_STREAMS;
            low = 1;
            break;
        case BLZ_TUNE_STREAMS_KX:
            top = STREAMS_KX_TOP;
            low = 1;
            break;
        case BLZ_TUNE_K6_ROWS: top = BLZ_STREAMS; break;
#ifdef BLZ_AVX512
        case BLZ_TUNE_K1_ZMM: top = 1; break;
#else
        case BLZ_TUNE_K1_ZMM: top = 0; break;
#endif
        default: return BLZ_EINVAL;
    }
    if (value < low || value > top) return BLZ_EINVAL;
    const int old = blz_tune[knob];
    blz_tune[knob] = value;
    return old;
}

/* The current value of a knob (BLZ_EINVAL for an unknown one). */
BLZ_EXPORT int blz_get_tune(int knob) { return knob >= 0 && knob < BLZ_TUNE_COUNT ? blz_tune[knob] : BLZ_EINVAL; }

int blz_walk_hold = -1;
int64_t blz_walk_taken;

/* Test hook: hold thread t (−1: none) of every balanced team until the others are done (blz_walk_begin).
 * Returns the runs of steps taken from other threads while the previous hold was set. */
BLZ_EXPORT int64_t blz_set_walk_hold(int t) {
    const int64_t taken = blz_walk_taken;
    blz_walk_taken = 0;
    blz_walk_hold = t;
    return taken;
}

static _Thread_local void *scratch_ptr[BLZ_SCRATCH_SLOTS];
static _Thread_local size_t scratch_cap[BLZ_SCRATCH_SLOTS];

void *blz_scratch_slot(int slot, size_t bytes) {
    if (bytes <= scratch_cap[slot]) return scratch_ptr[slot];
    const size_t cap = (size_t)blz_round_up((int64_t)(bytes + bytes / 4), 4096);
    void *p = aligned_alloc(64, cap);
    if (!p) return NULL;
    free(scratch_ptr[slot]);
    scratch_ptr[slot] = p;
    scratch_cap[slot] = cap;
    return p;
}

void *blz_scratch(size_t bytes) { return blz_scratch_slot(0, bytes); }

/* One linear kernel call by weight code (op · 32 + kind; see blz_moe_experts), no bias or residual. */
int blz_linear_by_code(int code, const float *x, int64_t M, int64_t K, const void *w, int64_t N, float *out,
                       int swiglu, int nthreads) {
    switch (code >> 5) {
        case BLZ_OP_LINEAR_Q:
            return blz_linear_q(code & 31, x, M, K, (const uint8_t *)w, N, NULL, NULL, out, swiglu, nthreads);
        case BLZ_OP_LINEAR_F32:
            return blz_linear_f32(x, M, K, (const float *)w, N, NULL, NULL, out, swiglu, nthreads);
        case BLZ_OP_LINEAR_BF16:
            return blz_linear_bf16(x, M, K, (const uint16_t *)w, N, NULL, NULL, out, swiglu, nthreads);
        case BLZ_OP_LINEAR_F16:
            return blz_linear_f16(x, M, K, (const uint16_t *)w, N, NULL, NULL, out, swiglu, nthreads);
    }
    return BLZ_EINVAL;
}

#define P(T, k) ((T)(intptr_t)a->i[k])

/* Run kernel a->op with arguments a->i[0..] (pointers and integers, in signature order) and a->f[0..]
 * (the float argument). Returns the kernel's code, or BLZ_EINVAL for an unknown op. */
BLZ_EXPORT int blz_call(const blz_args_t *a) {
    const int64_t *i = a->i;
    switch (a->op) {
        case BLZ_OP_LINEAR_Q:
            return blz_linear_q((int)i[0], P(const float *, 1), i[2], i[3], P(const uint8_t *, 4), i[5],
                                P(const float *, 6), P(const float *, 7), P(float *, 8), (int)i[9],
                                (int)i[10]);
        case BLZ_OP_LINEAR_F32: /* i[0] & BLZ_GEMM: a prefill call */
            return blz_linear_f32_gemm(P(const float *, 1), i[2], i[3], P(const float *, 4), i[5],
                                       P(const float *, 6), P(const float *, 7), P(float *, 8), (int)i[9],
                                       (int)i[10], (int)(i[0] & BLZ_GEMM));
        case BLZ_OP_LINEAR_BF16: /* i[0] & BLZ_ROWS: i[4] is a row table */
            return blz_linear_bf16_rows(P(const float *, 1), i[2], i[3],
                                        i[0] & BLZ_ROWS ? NULL : P(const uint16_t *, 4),
                                        i[0] & BLZ_ROWS ? P(const int64_t *, 4) : NULL, i[5], P(const float *, 6),
                                        P(const float *, 7), P(float *, 8), (int)i[9], (int)i[10]);
        case BLZ_OP_LINEAR_F16: /* i[0] & BLZ_ROWS: i[4] is a row table */
            return blz_linear_f16_rows(P(const float *, 1), i[2], i[3],
                                       i[0] & BLZ_ROWS ? NULL : P(const uint16_t *, 4),
                                       i[0] & BLZ_ROWS ? P(const int64_t *, 4) : NULL, i[5], P(const float *, 6),
                                       P(const float *, 7), P(float *, 8), (int)i[9], (int)i[10]);
        case BLZ_OP_EMBEDDING_Q:
            return blz_embedding_q((int)i[0], P(const int64_t *, 1), i[2], P(const uint8_t *, 3), i[4], i[5],
                                   (float)a->f[0], P(float *, 6));
        case BLZ_OP_RMS_NORM:
            return blz_rms_norm(P(const float *, 0), P(const float *, 1), i[2], i[3], (float)a->f[0],
                                P(float *, 4), (int)i[5]);
        case BLZ_OP_ROPE_NEOX:
            return blz_rope_neox(P(float *, 0), i[1], i[2], i[3], i[4], P(const int64_t *, 5),
                                 P(const float *, 6), P(const float *, 7), i[8], i[9], (int)i[10]);
        case BLZ_OP_PAGED_ATTENTION_DECODE:
            return blz_paged_attention_decode(P(const float *, 0), i[1], P(const void *, 2),
                                              P(const void *, 3), (int)i[4], i[5], P(const int64_t *, 6),
                                              i[7], P(const int64_t *, 8), i[9], i[10], i[11], i[12], i[13],
                                              (float)a->f[0], i[14], P(float *, 15), (int)i[16],
                                              P(const float *, 17), (float)a->f[1]);
        case BLZ_OP_ATTENTION_PREFILL:
            return blz_attention_prefill(P(const float *, 0), i[1], P(const void *, 2), P(const void *, 3), (int)i[4],
                                         i[5], P(const int64_t *, 6), i[7], i[8], i[9], i[10], i[11], i[12],
                                         (float)a->f[0], i[13], P(const float *, 14), (float)a->f[1], P(float *, 15),
                                         i[16], (int)i[17]);
        case BLZ_OP_KV_WRITE:
            return blz_kv_write(P(const float *, 0), i[1], P(const float *, 2), i[3], P(const int64_t *, 4),
                                i[5], i[6], i[7], i[8], P(void *, 9), P(void *, 10), (int)i[11], i[12]);
        case BLZ_OP_GATED_RMS_NORM:
            return blz_gated_rms_norm(P(const float *, 0), P(const float *, 1), i[2], P(const float *, 3), i[4], i[5],
                                      i[6], (float)a->f[0], (int)i[7], P(float *, 8), (int)i[9]);
        case BLZ_OP_MAMBA2_STEP:
            return blz_mamba2_step(P(const float *, 0), P(const float *, 1), i[2], P(const int64_t *, 3), i[4],
                                   P(const float *, 5), P(const float *, 6), P(float *, 7), i[8],
                                   P(const float *, 9), P(const float *, 10), P(const float *, 11), P(float *, 12),
                                   i[13], i[14], i[15], i[16], i[17], (float)a->f[0], (float)a->f[1],
                                   P(float *, 18), (int)i[19]);
        case BLZ_OP_MAMBA2_PREFILL:
            return blz_mamba2_prefill(P(const float *, 0), P(const float *, 1), i[2], P(const int64_t *, 3), i[4],
                                      P(const float *, 5), P(const float *, 6), P(float *, 7), i[8],
                                      P(const float *, 9), P(const float *, 10), P(const float *, 11),
                                      P(float *, 12), i[13], i[14], i[15], i[16], i[17], (float)a->f[0],
                                      (float)a->f[1], P(float *, 18), (int)i[19]);
        case BLZ_OP_EMBEDDING:
            return blz_embedding(P(const int64_t *, 0), i[1], P(const float *, 2), i[3], i[4], (float)a->f[0],
                                 P(float *, 5));
        case BLZ_OP_SOFTCAP:
            return blz_softcap(P(float *, 0), i[1], (float)a->f[0], (int)i[2]);
        case BLZ_OP_ACTIVATION:
            return blz_activation(P(const float *, 0), i[1], i[2], (int)i[3], (int)i[4], P(float *, 5), (int)i[6]);
        case BLZ_OP_MOE_ROUTE:
            return blz_moe_route(P(const float *, 0), i[1], i[2], P(const float *, 3), (int)i[4], i[5], i[6],
                                 (int)i[7], i[8], (int)i[9], (float)a->f[0], P(float *, 10), P(int64_t *, 11));
        case BLZ_OP_MOE_EXPERTS:
            return blz_moe_experts(P(const float *, 0), i[1], i[2], P(const int64_t *, 3), P(const float *, 4),
                                   i[5], i[6], (int)i[7], P(const void *, 8), i[9], (int)i[10],
                                   P(const void *, 11), i[12], i[13], (int)i[14], (int)i[15], P(float *, 16),
                                   (int)i[17], P(const float *, 18), P(const float *, 19), (float)a->f[0],
                                   (float)a->f[1]);
        case BLZ_OP_MLA_CACHE_WRITE:
            return blz_mla_cache_write(P(const float *, 0), i[1], i[2], i[3], i[4], P(const float *, 5),
                                       (float)a->f[0], P(const int64_t *, 6), P(const float *, 7),
                                       P(const float *, 8), i[9], P(const int64_t *, 10), P(void *, 11),
                                       (int)i[12], i[13]);
        case BLZ_OP_MLA_DECODE:
            return blz_mla_decode(P(const float *, 0), i[1], i[2], P(const float *, 3), i[4], i[5],
                                  P(const void *, 6), (int)i[7], i[8], P(const int64_t *, 9), i[10],
                                  P(const int64_t *, 11), i[12], i[13], i[14], i[15], (float)a->f[0],
                                  P(float *, 16), (int)i[17]);
        case BLZ_OP_LINEAR_HEADS:
            return blz_linear_heads(P(const float *, 0), i[1], i[2], i[3], i[4], i[5], (int)i[6],
                                    P(const void *, 7), i[8], i[9], P(float *, 10), i[11], i[12], (int)i[13]);
        case BLZ_OP_AXPBY:
            return blz_axpby(P(const float *, 0), (float)a->f[0], P(const float *, 1), (float)a->f[1], i[2],
                             P(float *, 3));
        case BLZ_OP_DELTANET_STEP:
            return blz_deltanet_step(P(const float *, 0), P(const float *, 1), P(const int64_t *, 2), i[3],
                                     P(const float *, 4), P(float *, 5), i[6], P(const float *, 7),
                                     P(const float *, 8), P(const float *, 9), P(float *, 10), i[11], i[12], i[13],
                                     i[14], i[15], (int)i[16], (float)a->f[0], (float)a->f[1], P(float *, 17),
                                     (int)i[18]);
        case BLZ_OP_DELTANET_PREFILL:
            return blz_deltanet_prefill(P(const float *, 0), P(const float *, 1), P(const int64_t *, 2), i[3],
                                        P(const int64_t *, 4), i[5], P(const float *, 6), P(float *, 7), i[8],
                                        P(const float *, 9), P(const float *, 10), P(const float *, 11),
                                        P(float *, 12), i[13], i[14], i[15], i[16], i[17], (int)i[18], i[19],
                                        (float)a->f[0], (float)a->f[1], P(float *, 20), (int)i[21]);
        case BLZ_OP_KDA_STEP:
            return blz_kda_step(P(const float *, 0), P(const float *, 1), P(const float *, 2), P(const float *, 3),
                                P(const int64_t *, 4), i[5], P(const float *, 6), P(float *, 7), i[8],
                                P(const float *, 9), P(const float *, 10), P(const float *, 11), P(float *, 12),
                                i[13], i[14], i[15], (float)a->f[0], P(float *, 16), (int)i[17]);
        case BLZ_OP_KDA_PREFILL:
            return blz_kda_prefill(P(const float *, 0), P(const float *, 1), P(const float *, 2), P(const float *, 3),
                                   P(const int64_t *, 4), i[5], P(const int64_t *, 6), i[7], P(const float *, 8),
                                   P(float *, 9), i[10], P(const float *, 11), P(const float *, 12),
                                   P(const float *, 13), P(float *, 14), i[15], i[16], i[17], i[18],
                                   (float)a->f[0], P(float *, 19), (int)i[20]);
        case BLZ_OP_HEAD_RMS_NORM:
            return blz_head_rms_norm(P(float *, 0), i[1], i[2], i[3], i[4], P(const float *, 5), (float)a->f[0],
                                     P(float *, 6), i[7], (int)i[8]);
        case BLZ_OP_SIGMOID_MUL:
            return blz_sigmoid_mul(P(float *, 0), i[1], i[2], i[3], P(const float *, 4), i[5], i[6], (int)i[7]);
        case BLZ_OP_MUL:
            return blz_mul(P(float *, 0), i[1], i[2], i[3], P(const float *, 4), i[5], i[6], (int)i[7]);
        case BLZ_OP_COPY_ROWS:
            return blz_copy_rows(P(const float *, 0), i[1], i[2], i[3], P(float *, 4), i[5]);
        case BLZ_OP_CAUSAL_CONV:
            return blz_causal_conv(P(const float *, 0), P(const float *, 1), P(const float *, 2), i[3],
                                   P(const int64_t *, 4), i[5], (int)i[6], P(const float *, 7), P(const float *, 8),
                                   P(float *, 9), i[10], i[11], i[12], (int)i[13], P(float *, 14), (int)i[15]);
        case BLZ_OP_MAMBA1_SCAN:
            return blz_mamba1_scan(P(const float *, 0), P(const float *, 1), P(const float *, 2), P(const float *, 3),
                                   i[4], P(const int64_t *, 5), i[6], (int)i[7], P(const float *, 8),
                                   P(const float *, 9), P(float *, 10), i[11], i[12], i[13], P(float *, 14), (int)i[15]);
        case BLZ_OP_MAMBA1_DT_BC:
            return blz_mamba1_dt_bc(P(const float *, 0), i[1], i[2], i[3], P(const float *, 4), P(const float *, 5),
                                    P(const float *, 6), (int)i[7], (float)a->f[0], P(float *, 8), P(float *, 9));
    }
    return BLZ_EINVAL;
}

/* Run n packed calls in order (a recorded "plan", e.g. a whole decode step over static buffers): one
 * ctypes call instead of n. Stops at the first failing call, stores its index in *failed and returns
 * its code; returns BLZ_OK (and *failed = -1) when all succeed. */
BLZ_EXPORT int blz_call_many(const blz_args_t *list, int64_t n, int64_t *failed) {
    for (int64_t k = 0; k < n; ++k) {
        const int rc = blz_call(&list[k]);
        if (rc != BLZ_OK) {
            *failed = k;
            return rc;
        }
    }
    *failed = -1;
    return BLZ_OK;
}
#undef P

