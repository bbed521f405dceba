/* Measurement prototype, not a kernel of the library: Q4_K / Q6_K re-laid in 16-row groups so that one-row
 * (decode) dots run by vpdpbusd across rows, as the library's packed Q4_0 / Q8_0 (csrc/linear_q.c) and its
 * prefill K-quant groups (csrc/linear_k_groups.c) do. benchmarks/kquant_packed.py compiles it (AVX-512 VNNI
 * hosts), checks its outputs against blz_linear_k bit for bit and times both (benchmarks/NOTES.md §56).
 *
 * Layout, per 16-row group g and super-block b (the same bytes as the 16 rows' ggml blocks, moved):
 *   Q4_K (2304 B): f16 d[16] | f16 dmin[16] | the 12-byte scale field as 3 planes of 16 dwords (plane p, lane
 *                  r = bytes 4p..4p+3 of row r's field) | 32 chunks of 64 B (chunk 8c + i, lane r = nibble
 *                  bytes 32c + 4i .. 32c + 4i + 3 of row r: low nibbles sub-block 2c, high 2c + 1)
 *   Q6_K (3360 B): f16 d[16] | int8 sc[16 sub-blocks][16 rows] | ql chunks (16h + i, i < 16: lane r = ql bytes
 *                  64h + 4i .. + 3 of row r) | qh chunks (8h + i, i < 8: qh bytes 32h + 4i .. + 3)
 * A chunk holds 4 elements of all 16 rows, so vpdpbusd against the activation's 4 matching bytes broadcast
 * leaves row r's partial dot in int32 lane r; a sub-block's chain is scaled by one vpmullo of the 16 rows'
 * scales. The integer sums are exact, so sumi and summ are blz_linear_k's values, and the fp32 steps per
 * super-block are its steps in its order — the same bits (the driver asserts it).
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <omp.h>
#define GB 2304 /* bytes of one Q4_K 16-row group's super-block */
#ifndef PFD
#define PFD 4608 /* software prefetch distance in bytes (each super-block's lines that far ahead) */
#endif

/* Q4_K rows [N][nb · 144] (ggml) → packed [N/16][nb][GB]; N % 16 == 0. */
void kp_pack(const uint8_t *w, int64_t N, int64_t nb, uint8_t *out) {
    for (int64_t g = 0; g < N / 16; ++g)
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t *p = out + (g * nb + b) * GB;
            for (int r = 0; r < 16; ++r) {
                const uint8_t *blk = w + ((g * 16 + r) * nb + b) * 144;
                memcpy(p + 2 * r, blk, 2);
                memcpy(p + 32 + 2 * r, blk + 2, 2);
                for (int pl = 0; pl < 3; ++pl) memcpy(p + 64 + 64 * pl + 4 * r, blk + 4 + 4 * pl, 4);
                for (int c = 0; c < 4; ++c)
                    for (int i = 0; i < 8; ++i) memcpy(p + 256 + 64 * (8 * c + i) + 4 * r, blk + 16 + 32 * c + 4 * i, 4);
            }
        }
}

static inline __m512i bc4(const int8_t *p) { int32_t v; memcpy(&v, p, 4); return _mm512_set1_epi32(v); }

/* out[N] = the dots of one activation row quantized by blz_quantize_q8k: xq [K] int8, xd [nb], bs [nb · 16]
 * int16 (sums per 16). */
void kp_gemv(const uint8_t *pk, int64_t N, int64_t nb, const int8_t *xq, const float *xd, const int16_t *bs,
             float *out, int nthreads) {
    int16_t xs2[64 * 8]; /* per super-block: pairs (xs0,xs2),(xs1,xs3),(xs4,xs6),(xs5,xs7) */
    for (int64_t b = 0; b < nb; ++b) {
        int16_t xs[8];
        for (int j = 0; j < 8; ++j) xs[j] = bs[16 * b + 2 * j] + bs[16 * b + 2 * j + 1];
        const int ord[8] = {0, 2, 1, 3, 4, 6, 5, 7};
        for (int j = 0; j < 8; ++j) xs2[8 * b + j] = xs[ord[j]];
    }
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t g = 0; g < N / 16; ++g) {
        const __m512i lo4 = _mm512_set1_epi8(0x0f), m3f = _mm512_set1_epi8(0x3f), m03 = _mm512_set1_epi8(0x03);
        const __m512i m00ff = _mm512_set1_epi32(0x00ff00ff);
        __m512 acc = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t *p = pk + (g * nb + b) * GB;
            for (int l = 0; l < GB; l += 64) _mm_prefetch((const char *)p + PFD + l, _MM_HINT_T0);
            const int8_t *x = xq + 256 * b;
            const __m512i w0 = _mm512_load_si512(p + 64), w1 = _mm512_load_si512(p + 128), w2 = _mm512_load_si512(p + 192);
            const __m512i sc0 = _mm512_and_si512(w0, m3f);
            const __m512i mn0 = _mm512_and_si512(w1, m3f);
            const __m512i sc1 = _mm512_or_si512(_mm512_and_si512(w2, lo4), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w0, 6), m03), 4));
            const __m512i mn1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w2, 4), lo4), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w1, 6), m03), 4));
            __m512i sumi = _mm512_setzero_si512();
            for (int c = 0; c < 4; ++c) {
                __m512i a = _mm512_setzero_si512(), h = _mm512_setzero_si512();
                const uint8_t *q = p + 256 + 512 * c;
                for (int i = 0; i < 8; ++i) {
                    const __m512i v = _mm512_load_si512(q + 64 * i);
                    a = _mm512_dpbusd_epi32(a, _mm512_and_si512(v, lo4), bc4(x + 64 * c + 4 * i));
                    h = _mm512_dpbusd_epi32(h, _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4), bc4(x + 64 * c + 32 + 4 * i));
                }
                const __m512i s = c < 2 ? sc0 : sc1; /* scales 2c, 2c+1: bytes (2c)%4, (2c+1)%4 */
                const int sh = 16 * (c & 1);
                const __m512i s_a = _mm512_and_si512(_mm512_srli_epi32(s, sh), _mm512_set1_epi32(0xff));
                const __m512i s_h = _mm512_and_si512(_mm512_srli_epi32(s, sh + 8), _mm512_set1_epi32(0xff));
                sumi = _mm512_add_epi32(sumi, _mm512_add_epi32(_mm512_mullo_epi32(a, s_a), _mm512_mullo_epi32(h, s_h)));
            }
            /* mins: int16 pairs (m0,m2),(m1,m3) of mn0, same for mn1 */
            __m512i summ = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_and_si512(mn0, m00ff), bc4((const int8_t *)(xs2 + 8 * b)));
            summ = _mm512_dpwssd_epi32(summ, _mm512_srli_epi16(mn0, 8), bc4((const int8_t *)(xs2 + 8 * b + 2)));
            summ = _mm512_dpwssd_epi32(summ, _mm512_and_si512(mn1, m00ff), bc4((const int8_t *)(xs2 + 8 * b + 4)));
            summ = _mm512_dpwssd_epi32(summ, _mm512_srli_epi16(mn1, 8), bc4((const int8_t *)(xs2 + 8 * b + 6)));
            const __m512 dx = _mm512_set1_ps(xd[b]);
            const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)p));
            const __m512 dm = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(p + 32)));
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_mul_ps(dw, dx), acc);
            acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(summ), _mm512_mul_ps(dm, dx), acc);
        }
        _mm512_storeu_ps(out + 16 * g, acc);
    }
}

/* Q6_K rows [N][nb · 210] → packed [N/16][nb][GB6] (the header's layout). */
#define GB6 3360
void kp6_pack(const uint8_t *w, int64_t N, int64_t nb, uint8_t *out) {
    for (int64_t g = 0; g < N / 16; ++g)
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t *p = out + (g * nb + b) * GB6;
            for (int r = 0; r < 16; ++r) {
                const uint8_t *blk = w + ((g * 16 + r) * nb + b) * 210;
                memcpy(p + 2 * r, blk + 208, 2);
                for (int j = 0; j < 16; ++j) p[32 + 16 * j + r] = blk[192 + j];
                for (int h = 0; h < 2; ++h) {
                    for (int i = 0; i < 16; ++i) memcpy(p + 288 + 64 * (16 * h + i) + 4 * r, blk + 64 * h + 4 * i, 4);
                    for (int i = 0; i < 8; ++i) memcpy(p + 2336 + 64 * (8 * h + i) + 4 * r, blk + 128 + 32 * h + 4 * i, 4);
                }
            }
        }
}

/* kp_gemv for Q6_K: each 16-element sub-block's chain starts at −32 · its activation sum. */
void kp6_gemv(const uint8_t *pk, int64_t N, int64_t nb, const int8_t *xq, const float *xd, const int16_t *bs,
              float *out, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t g = 0; g < N / 16; ++g) {
        const __m512i lo4 = _mm512_set1_epi8(0x0f), b30 = _mm512_set1_epi8(0x30);
        __m512 acc = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t *p = pk + (g * nb + b) * GB6;
            for (int l = 0; l < GB6; l += 64) _mm_prefetch((const char *)p + PFD + l, _MM_HINT_T0);
            const int8_t *x = xq + 256 * b;
            __m512i sumi = _mm512_setzero_si512();
            for (int h = 0; h < 2; ++h) {
                __m512i ch[8]; /* (t, is) -> 2t + is */
                for (int t = 0; t < 4; ++t)
                    for (int is = 0; is < 2; ++is) ch[2 * t + is] = _mm512_set1_epi32(-32 * bs[16 * b + 8 * h + 2 * t + is]);
                for (int i = 0; i < 8; ++i) {
                    const int is = i / 4;
                    const __m512i A = _mm512_loadu_si512(p + 288 + 64 * (16 * h + i));
                    const __m512i B = _mm512_loadu_si512(p + 288 + 64 * (16 * h + 8 + i));
                    const __m512i H = _mm512_loadu_si512(p + 2336 + 64 * (8 * h + i));
                    const __m512i e0 = _mm512_or_si512(_mm512_and_si512(A, lo4), _mm512_and_si512(_mm512_slli_epi16(H, 4), b30));
                    const __m512i e1 = _mm512_or_si512(_mm512_and_si512(B, lo4), _mm512_and_si512(_mm512_slli_epi16(H, 2), b30));
                    const __m512i e2 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(A, 4), lo4), _mm512_and_si512(H, b30));
                    const __m512i e3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(B, 4), lo4), _mm512_and_si512(_mm512_srli_epi16(H, 2), b30));
                    const int8_t *xh = x + 128 * h + 4 * i;
                    ch[0 + is] = _mm512_dpbusd_epi32(ch[0 + is], e0, bc4(xh));
                    ch[2 + is] = _mm512_dpbusd_epi32(ch[2 + is], e1, bc4(xh + 32));
                    ch[4 + is] = _mm512_dpbusd_epi32(ch[4 + is], e2, bc4(xh + 64));
                    ch[6 + is] = _mm512_dpbusd_epi32(ch[6 + is], e3, bc4(xh + 96));
                }
                for (int t = 0; t < 4; ++t)
                    for (int is = 0; is < 2; ++is) {
                        const __m512i sc = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 32 + 16 * (8 * h + 2 * t + is))));
                        sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(ch[2 * t + is], sc));
                    }
            }
            const __m512 dx = _mm512_set1_ps(xd[b]);
            const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_mul_ps(dw, dx), acc);
        }
        _mm512_storeu_ps(out + 16 * g, acc);
    }
}
