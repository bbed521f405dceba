/* blazr kernels — what the 8-row tile walks over 32-value blocks share (linear_q8.c's q8_0g, linear_b32.c's
 * mxfp4 / q5_0): a tile's gate (and SwiGLU up) row pointers with the next tile's for prefetching, a one-row
 * streamed walk's step of tiles, the portable path's block dot, and the epilogue of one activation row's tile
 * outputs — the packed kernel's on AVX-512
 * builds, so the tiles and the packed groups give the same bits.
 */
#ifndef BLAZR_TILE8_H
#define BLAZR_TILE8_H

#include "blazr_kernels.h"

#define QR 8 /* weight rows per tile (the fp32 lanes) */

/* Tile t's gate rows (and SwiGLU up rows): its nn ≤ QR rows padded with the last, then the next tile's rows
 * (prefetched only: for a plain weight the bytes after the tile, past the end too); apart: whether those
 * next rows lie apart (a row table's). */
static inline void blz_tile_rows(const uint8_t *w, const int64_t *tab, int64_t row_bytes, int64_t n0, int nn,
                                 int64_t nout, int swiglu, const uint8_t *gate[2 * QR], const uint8_t *up[2 * QR],
                                 int apart[2]) {
    for (int i = 0; i < 2 * QR; ++i) {
        const int64_t n = i < QR ? n0 + blz_min(i, nn - 1) : blz_min(n0 + i, nout - 1);
        gate[i] = blz_weight_row(w, tab, n, row_bytes);
        up[i] = swiglu ? blz_weight_row(w, tab, nout + n, row_bytes) : gate[i];
        if (i >= QR && !tab) {
            gate[i] = gate[0] + i * row_bytes;
            up[i] = up[0] + i * row_bytes;
        }
    }
    apart[0] = !blz_rows_follow(gate + QR, QR, row_bytes);
    apart[1] = !blz_rows_follow(up + QR, QR, row_bytes);
}

/* One step of a one-row (M = 1) streamed walk over 8-row tiles (linear_q8.c's q8g_streams, linear_b32.c's
 * b32_streams): the step's tiles t[0..ns-1] (blz_stream_step), each with its nn real rows, their gate rows as
 * streams 0..ns-1 and — SwiGLU — their up rows as streams ns..2·ns-1 (rows, apart: blz_tile_rows); returns ns. */
static inline int blz_stream_tiles(const uint8_t *w, const int64_t *tab, int64_t row_bytes, int64_t nout, int swiglu,
                                   const blz_walk_t *wk, int S, int64_t i, const uint8_t *rows[2 * BLZ_STREAMS][2 * QR],
                                   int apart[2 * BLZ_STREAMS], int nn[BLZ_STREAMS], int64_t t[BLZ_STREAMS]) {
    const uint8_t *up[BLZ_STREAMS][2 * QR];
    int up_apart[BLZ_STREAMS];
    const int ns = blz_stream_step(wk->lo, wk->hi, wk->q, S, i, t);
    for (int s = 0; s < ns; ++s) {
        int ap[2];
        nn[s] = (int)blz_min(QR, nout - t[s] * QR);
        blz_tile_rows(w, tab, row_bytes, t[s] * QR, nn[s], nout, swiglu, rows[s], up[s], ap);
        apart[s] = ap[0];
        up_apart[s] = ap[1];
    }
    for (int s = 0; swiglu && s < ns; ++s) {
        memcpy(rows[ns + s], up[s], sizeof(up[s]));
        apart[ns + s] = up_apart[s];
    }
    return ns;
}

/* The portable path's step: weight row r's block b — its 32 int8 values v, scale dw — against activation rows
 * m0 .. m0+mt-1: the exact integer dot, then acc[m][r] += dot · (dw · dx) in one fmaf (the operations the SIMD
 * paths keep, so every build gives the same bits). */
BLZ_INLINE void blz_tile_block_scalar(const int8_t *v, float dw, const blz_act_t *restrict a, int64_t b, int64_t m0,
                                      int mt, int r, float (*acc)[QR]) {
    for (int m = 0; m < mt; ++m) {
        const int64_t row = (m0 + m) * a->nb + b;
        const int8_t *xq = a->q + (m0 + m) * a->K + b * BLZ_QK;
        int32_t dot = 0;
        for (int i = 0; i < BLZ_QK; ++i) dot += (int32_t)v[i] * xq[i];
        acc[m][r] = fmaf((float)dot, dw * a->d[row], acc[m][r]);
    }
}

/* The outputs of a blz_stream_tiles step from its streams' dots r (SwiGLU: tile s's up dots are r[ns + s]). */
BLZ_INLINE void blz_stream_epilogue(int ns, float (*r)[QR], const int64_t *t, const int *nn, int64_t N, int64_t nout,
                                    const float *bias, const float *residual, float *out, int swiglu) {
    for (int s = 0; s < ns; ++s)
        blz_epilogue_row(r[s], swiglu ? r[ns + s] : r[s], 0, t[s] * QR, nn[s], N, nout, bias, residual, out, swiglu);
}

#endif
