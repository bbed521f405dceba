/* blazr kernels — mixture of experts for decode: the router's top-k choice and the chosen experts' MLPs.
 *
 * blz_moe_route: router logits [T, E] → for each token the top-k experts (ids [T, k], int64) and their
 * weights [T, k] fp32, as model/moe.py's Router (kernels/reference.py `moe_route_reference`):
 *   scores = softmax(logits) or sigmoid(logits); choice = scores + bias (selection only, may be NULL);
 *   group-limited (G > 1 groups of E/G): keep the `topk_groups` groups with the best group score (the group
 *   max, or the sum of its top two), choose only inside them; ids = top-k of choice (ties: lower id first);
 *   weights = the un-biased scores of those ids, divided by their sum (+1e-20) when `renorm`, times `scale`.
 *
 * blz_moe_experts: out [T, D] = Σ_j weights[t, j] · expert_{ids[t, j]}(x[t]), the experts' MLPs run only for the
 * experts chosen: act(x · W_upᵀ) (gated: act(gate) · up over the [gate; up] halves of W_up [2I, D]; ungated: act(x ·
 * W_upᵀ), W_up [I, D]) · W_downᵀ, W_down [D, I]. The experts' weights are stacked: expert e's rows start at w_up +
 * e·up_stride / w_down + e·down_stride bytes, in any weight format of the linear kernels (`code` = op · 32 + kind:
 * op 1 block-quantized or coded (kind BLZ_Q4_0 … BLZ_F32Z), 2 f32, 3 bf16, 18 f16), so a quantized expert streams
 * only its own quantized rows. The (token, slot) assignments are grouped by expert, each expert runs one linear pair
 * on its rows (M = tokens routed to it: one weight read for all of them), and the k outputs of a token are summed in
 * slot order j = 0..k-1. Optional biases (NULL: none): b_up [E, Nup] added to the up projection's output, b_down [E,
 * D] to the down projection's (GPT-OSS). Activation codes (reference.py ACTIVATIONS): 0 silu, 1 gelu (tanh), 2
 * relu², 3 gelu (erf), 4 GPT-OSS's clamped SwiGLU (gated only): g = min(gate, limit), u = clamp(up, −limit, limit),
 * (u + 1) · g · sigmoid(alpha · g). The block-quantized linear kernels compute a row the same whatever the
 * other rows of the call, so with those weights a token's output does not depend on what else is in the batch;
 * float weights (f32, 16-bit, coded bf16z / f32z) do so up to 8 tokens an expert, and from 9 on run the panel
 * GEMM (gemm_float.c through linear_float.c, linear_16bit.c, linear_coded.c), each row again independent of the
 * others there: the two agree to fp32 rounding, as a float model's GEMM and GEMV. (Until 2026-11 stored f32
 * experts ran their rows at every count: on Zen 3 a float32 Qwen3-Next's prefill spent 16 % in them, NOTES §76.)
 *
 * Shapes: T tokens, D hidden, E experts, k chosen per token, I expert width, G groups.
 */
#include "blazr_kernels.h"

#define BLZ_MOE_MAX_E 1024

BLZ_EXPORT int blz_moe_route(const float *logits, int64_t T, int64_t E, const float *bias, int sigmoid,
                             int64_t G, int64_t topk_groups, int group_top2, int64_t k, int renorm,
                             float scale, float *weights, int64_t *ids) {
    if (T < 0 || E <= 0 || E > BLZ_MOE_MAX_E || k <= 0 || G <= 0 || E % G || topk_groups <= 0 ||
        topk_groups > G || k > topk_groups * (E / G))
        return BLZ_EINVAL;
    float scores[BLZ_MOE_MAX_E], choice[BLZ_MOE_MAX_E], group[BLZ_MOE_MAX_E];
    char is_open[BLZ_MOE_MAX_E]; /* expert e may still be chosen */
    const int64_t per = E / G;
    for (int64_t t = 0; t < T; ++t) {
        const float *l = logits + t * E;
        if (sigmoid) {
            for (int64_t e = 0; e < E; ++e) scores[e] = 1.0f / (1.0f + expf(-l[e]));
        } else {
            float m = l[0], s = 0.0f;
            for (int64_t e = 1; e < E; ++e) m = l[e] > m ? l[e] : m;
            for (int64_t e = 0; e < E; ++e) s += scores[e] = expf(l[e] - m);
            for (int64_t e = 0; e < E; ++e) scores[e] /= s;
        }
        for (int64_t e = 0; e < E; ++e) {
            choice[e] = bias ? scores[e] + bias[e] : scores[e];
            is_open[e] = 1;
        }
        if (G > 1) { /* close every group outside the topk_groups best */
            for (int64_t g = 0; g < G; ++g) {
                const float *c = choice + g * per;
                float a = -INFINITY, b = -INFINITY; /* the group's best two */
                for (int64_t e = 0; e < per; ++e) {
                    if (c[e] > a) {
                        b = a;
                        a = c[e];
                    } else if (c[e] > b) {
                        b = c[e];
                    }
                }
                group[g] = group_top2 ? a + b : a;
            }
            char is_kept[BLZ_MOE_MAX_E] = {0};
            for (int64_t n = 0; n < topk_groups; ++n) {
                int64_t best = -1;
                for (int64_t g = 0; g < G; ++g)
                    if (!is_kept[g] && (best < 0 || group[g] > group[best])) best = g;
                is_kept[best] = 1;
            }
            for (int64_t e = 0; e < E; ++e) is_open[e] = is_kept[e / per];
        }
        float *w = weights + t * k, sum = 0.0f;
        int64_t *id = ids + t * k;
        for (int64_t j = 0; j < k; ++j) { /* selection by repeated arg-max (k is small); ties: lower id */
            int64_t best = -1;
            for (int64_t e = 0; e < E; ++e)
                if (is_open[e] && (best < 0 || choice[e] > choice[best])) best = e;
            is_open[best] = 0;
            id[j] = best;
            w[j] = scores[best];
            sum += scores[best];
        }
        for (int64_t j = 0; j < k; ++j) w[j] = (renorm ? w[j] / (sum + 1e-20f) : w[j]) * scale;
    }
    return BLZ_OK;
}

/* x[m, :] += b for the n rows of x [n, N]. */
static void add_rows(float *x, int64_t n, int64_t N, const float *b) {
    for (int64_t m = 0; m < n; ++m)
        for (int64_t i = 0; i < N; ++i) x[m * N + i] += b[i];
}

/* GPT-OSS's clamped SwiGLU of h [n, 2I] ([gate; up] halves) → out [n, I]. */
static void oai_glu(const float *h, int64_t n, int64_t I, float alpha, float limit, float *out) {
    for (int64_t m = 0; m < n; ++m) {
        const float *g = h + m * 2 * I, *u = g + I;
        float *o = out + m * I;
        for (int64_t i = 0; i < I; ++i) {
            const float gi = fminf(g[i], limit), ui = fminf(fmaxf(u[i], -limit), limit);
            o[i] = (ui + 1.0f) * gi / (1.0f + expf(-alpha * gi));
        }
    }
}

/* One expert projection on its n routed rows: blz_linear_by_code, with f32 weights the GEMM from 9 rows on as
 * the other float kinds (the file header). */
static int expert_linear(int code, const float *x, int64_t n, int64_t K, const void *w, int64_t N, float *out,
                         int swiglu, int nthreads) {
    if (code >> 5 == BLZ_OP_LINEAR_F32)
        return blz_linear_f32_gemm(x, n, K, (const float *)w, N, NULL, NULL, out, swiglu, nthreads, 1);
    return blz_linear_by_code(code, x, n, K, w, N, out, swiglu, nthreads);
}

BLZ_EXPORT int blz_moe_experts(const float *x, int64_t T, int64_t D, const int64_t *ids, const float *weights,
                               int64_t k, int64_t E, int code_up, const void *w_up, int64_t up_stride,
                               int code_down, const void *w_down, int64_t down_stride, int64_t I, int act,
                               int gated, float *out, int nthreads, const float *b_up, const float *b_down,
                               float alpha, float limit) {
    if (T < 0 || D <= 0 || k <= 0 || E <= 0 || I <= 0 || act < 0 || act > 4 || (act == 4 && !gated))
        return BLZ_EINVAL;
    if (T == 0) return BLZ_OK;
    const int64_t A = T * k, Nup = gated ? 2 * I : I;
    for (int64_t a = 0; a < A; ++a)
        if (ids[a] < 0 || ids[a] >= E) return BLZ_ERANGE;
    /* scratch: start [E + 1], order [A], where [A] (int64); xs [A, D], h [A, Nup], act [A, I], ys [A, D]
     * (fp32) */
    const int64_t ibytes = blz_round_up((E + 1 + 2 * A) * (int64_t)sizeof(int64_t), 64);
    char *s = blz_scratch_slot(1, (size_t)(ibytes + A * (2 * D + Nup + I) * (int64_t)sizeof(float)));
    if (!s) return BLZ_ENOMEM;
    int64_t *start = (int64_t *)s, *order = start + E + 1, *where = order + A;
    float *xs = (float *)(s + ibytes), *h = xs + A * D, *act_out = h + A * Nup, *ys = act_out + A * I;
    /* counting sort of the assignments a = t·k + j by expert, stable */
    memset(start, 0, (size_t)(E + 1) * sizeof(int64_t));
    for (int64_t a = 0; a < A; ++a) ++start[ids[a] + 1];
    for (int64_t e = 0; e < E; ++e) start[e + 1] += start[e];
    for (int64_t a = 0; a < A; ++a) {
        const int64_t p = start[ids[a]]++;
        order[p] = a;
        where[a] = p;
    }
    for (int64_t e = E; e > 0; --e) start[e] = start[e - 1]; /* back to the first row of each expert */
    start[0] = 0;
    for (int64_t p = 0; p < A; ++p) memcpy(xs + p * D, x + order[p] / k * D, (size_t)D * sizeof(float));
    const int swiglu = gated && act == 0 && !b_up; /* SwiGLU in the linear kernel's epilogue */
    for (int64_t e = 0; e < E; ++e) {
        const int64_t p0 = start[e], n = start[e + 1] - p0;
        if (!n) continue;
        const char *wu = (const char *)w_up + e * up_stride, *wd = (const char *)w_down + e * down_stride;
        float *he = h + p0 * Nup, *ae = swiglu ? he : act_out + p0 * I; /* SwiGLU: [n, I] written to h */
        int rc = expert_linear(code_up, xs + p0 * D, n, D, wu, Nup, he, swiglu, nthreads);
        if (rc != BLZ_OK) return rc;
        if (b_up) add_rows(he, n, Nup, b_up + e * Nup);
        if (act == 4) oai_glu(he, n, I, alpha, limit, ae);
        else if (!swiglu && (rc = blz_activation(he, n, Nup, act, gated, ae, 1)) != BLZ_OK) return rc;
        rc = expert_linear(code_down, ae, n, I, wd, D, ys + p0 * D, 0, nthreads);
        if (rc != BLZ_OK) return rc;
        if (b_down) add_rows(ys + p0 * D, n, D, b_down + e * D);
    }
    for (int64_t t = 0; t < T; ++t) {
        float *o = out + t * D;
        memset(o, 0, (size_t)D * sizeof(float));
        for (int64_t j = 0; j < k; ++j) {
            const float wj = weights[t * k + j], *y = ys + where[t * k + j] * D;
            for (int64_t d = 0; d < D; ++d) o[d] += wj * y[d];
        }
    }
    return BLZ_OK;
}
