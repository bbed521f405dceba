"""MLA: parity with transformers' DeepseekV3Attention (q LoRA, interleaved rope, plain and YaRN) and
DeepseekV2Attention (no q LoRA) on copied weights, the oxidizr form against a transcription of spec §5.4, the
naive and absorbed forms against each other, and the cache invariants on a real latent pool (prefill + decode
== full forward, chunked prefill == whole, sequences decoding together == alone, only Lkv + R values cached).

Shapes: T tokens, D hidden, H heads, Lq / Lkv latent ranks, Dn / R / Dv head dims, S cache slots.
"""

from __future__ import annotations

import math

import pytest
import torch

from blazr.config import MLAConfig, RopeConfig
from blazr.loading.absorb import absorb_mla
from blazr.model.mla import MLA, SPEC, interleaved_to_half_rows
from blazr.model.rope import RotaryEmbedding
from blazr.state.batch import ForwardBatch
from blazr.state.kv_cache import LayerCache

D, H, LQ, LKV, DN, R, DV = 64, 4, 48, 32, 16, 8, 12
MAX_LEN = 128
LENGTHS = [5, 17, 9]
# "kernels": auto, with the per-head decode weights the loader makes (float32), so decode-only steps run the
# kernel ops (`MLA._decode`)
IMPLS = ["auto", "naive", "absorb", "kernels"]


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5)


def _randomize(module: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name or "layernorm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))


def _deepseek_cfg(
    q_lora_rank: int | None = LQ, rope: RopeConfig | None = None, scale: float = 0.0
) -> MLAConfig:
    rope = rope or RopeConfig(dim=R, theta=10000.0)
    return MLAConfig(
        num_heads=H,
        q_lora_rank=q_lora_rank,
        kv_lora_rank=LKV,
        qk_nope_head_dim=DN,
        qk_rope_head_dim=R,
        v_head_dim=DV,
        rope=rope,
        softmax_scale=scale or (DN + R) ** -0.5,
    )


def _mla(cfg: MLAConfig, impl: str = "auto") -> MLA:
    return MLA(cfg, D, RotaryEmbedding(cfg.rope, MAX_LEN), impl=impl).eval()


def _model(impl: str = "auto") -> MLA:
    torch.manual_seed(1)
    mla = _mla(_deepseek_cfg(), "auto" if impl == "kernels" else impl)
    _randomize(mla)
    if impl == "kernels":
        absorb_mla(mla, "none")
    return mla


def _causal_mask(n: int) -> torch.Tensor:
    """Additive [1, 1, n, n] mask for HF's eager attention."""
    return torch.full((n, n), float("-inf")).triu(1)[None, None]


# --------------------------------------------------------------------------------------------------------
# The rope-row permutation.
# --------------------------------------------------------------------------------------------------------


def test_interleaved_to_half_rows_turns_pair_rotation_into_half_split():
    rows_per_head, offset, heads = DN + R, DN, 3
    w = torch.randn(heads * rows_per_head, 10)
    x = torch.randn(10)
    pos = torch.tensor([5])
    rope = RotaryEmbedding(RopeConfig(dim=R), MAX_LEN)
    y_old = (w @ x).view(heads, rows_per_head)[:, offset:]  # interleaved pairs
    y_new = (interleaved_to_half_rows(w, R, rows_per_head, offset) @ x).view(heads, rows_per_head)
    # nope rows untouched
    torch.testing.assert_close(y_new[:, :offset], (w @ x).view(heads, rows_per_head)[:, :offset])
    # interleaved rotation (pairs (2j, 2j+1) by angle t·θ_j), de-interleaved == our half-split rotation
    angle = 5 * rope.cos.new_tensor([10000.0 ** (-2 * j / R) for j in range(R // 2)])
    even, odd = y_old[:, 0::2], y_old[:, 1::2]
    rotated = torch.cat((even * angle.cos() - odd * angle.sin(), odd * angle.cos() + even * angle.sin()), -1)
    torch.testing.assert_close(rope(y_new[None, :, offset:], pos)[0], rotated)
    # a bias permutes the same way
    b = torch.arange(float(heads * rows_per_head))
    torch.testing.assert_close(
        interleaved_to_half_rows(b, R, rows_per_head, offset),
        interleaved_to_half_rows(b[:, None], R, rows_per_head, offset)[:, 0],
    )
    with pytest.raises(ValueError, match="rows per head"):
        interleaved_to_half_rows(w, R, rows_per_head + 1, offset)


# --------------------------------------------------------------------------------------------------------
# HF parity.
# --------------------------------------------------------------------------------------------------------


def _copy_deepseek(ours: MLA, hf: torch.nn.Module) -> None:
    """HF DeepSeek attention → ours, permuting the interleaved rope rows to half-split."""
    with torch.no_grad():
        if ours.cfg.q_lora_rank is None:
            ours.q_proj.weight.copy_(interleaved_to_half_rows(hf.q_proj.weight, R, DN + R, DN))
        else:
            ours.q_a_proj.weight.copy_(hf.q_a_proj.weight)
            ours.q_a_norm.weight.copy_(hf.q_a_layernorm.weight)
            ours.q_b_proj.weight.copy_(interleaved_to_half_rows(hf.q_b_proj.weight, R, DN + R, DN))
        ours.kv_a_proj.weight.copy_(interleaved_to_half_rows(hf.kv_a_proj_with_mqa.weight, R, LKV + R, LKV))
        ours.kv_a_norm.weight.copy_(hf.kv_a_layernorm.weight)
        ours.kv_b_proj.weight.copy_(hf.kv_b_proj.weight)
        ours.o_proj.weight.copy_(hf.o_proj.weight)


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


YARN = dict(
    rope_type="yarn",
    rope_theta=10000.0,
    factor=4.0,
    original_max_position_embeddings=16,
    mscale=1.0,
    mscale_all_dim=0.8,
    beta_fast=32.0,
    beta_slow=1.0,
)


@pytest.mark.parametrize("impl", ["naive", "absorb"])
@pytest.mark.parametrize("rope_kind", ["default", "yarn"])
def test_deepseek_v3_attention_equals_hf(rope_kind, impl):
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3Attention,
        DeepseekV3RotaryEmbedding,
    )

    rope_parameters = YARN if rope_kind == "yarn" else dict(rope_type="default", rope_theta=10000.0)
    hf_cfg = DeepseekV3Config(
        hidden_size=D,
        num_attention_heads=H,
        num_key_value_heads=H,
        q_lora_rank=LQ,
        kv_lora_rank=LKV,
        qk_nope_head_dim=DN,
        qk_rope_head_dim=R,
        v_head_dim=DV,
        rope_interleave=True,
        rope_parameters=rope_parameters,
        max_position_embeddings=64,  # = factor × original: YaRN's implicit factor agrees
    )
    hf_cfg._attn_implementation = "eager"
    hf = DeepseekV3Attention(hf_cfg, layer_idx=0).eval()
    _randomize(hf)
    hf_rope = DeepseekV3RotaryEmbedding(hf_cfg)

    if rope_kind == "yarn":
        # HF: cos/sin × mscale(f, mscale)/mscale(f, mscale_all_dim); softmax × mscale(f, mscale_all_dim)²
        rope = RopeConfig(
            dim=R,
            theta=10000.0,
            scaling="yarn",
            factor=4.0,
            original_max_position=16,
            beta_fast=32.0,
            beta_slow=1.0,
            attention_factor=_yarn_mscale(4.0, 1.0) / _yarn_mscale(4.0, 0.8),
        )
        scale = (DN + R) ** -0.5 * _yarn_mscale(4.0, 0.8) ** 2
        assert rope.attention_factor != 1.0 and scale != (DN + R) ** -0.5
    else:
        rope, scale = RopeConfig(dim=R, theta=10000.0), (DN + R) ** -0.5
    assert math.isclose(scale, hf.scaling, rel_tol=1e-12)
    ours = _mla(_deepseek_cfg(LQ, rope, scale), impl)
    _copy_deepseek(ours, hf)

    x = torch.randn(sum(LENGTHS), D)
    with torch.no_grad():
        out = ours(x, ForwardBatch.prefill(LENGTHS), None)
        start = 0
        for n in LENGTHS:
            xb = x[start : start + n][None]
            cos_sin = hf_rope(xb, torch.arange(n)[None])
            ref = hf(xb, position_embeddings=cos_sin, attention_mask=_causal_mask(n))[0][0]
            _close(out[start : start + n], ref)
            start += n


@pytest.mark.parametrize("impl", ["naive", "absorb"])
def test_deepseek_v2_attention_without_q_lora_equals_hf(impl):
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import (
        DeepseekV2Attention,
        DeepseekV2RotaryEmbedding,
    )

    hf_cfg = DeepseekV2Config(
        hidden_size=D,
        num_attention_heads=H,
        num_key_value_heads=H,
        q_lora_rank=None,
        kv_lora_rank=LKV,
        qk_nope_head_dim=DN,
        qk_rope_head_dim=R,
        v_head_dim=DV,
    )
    hf_cfg._attn_implementation = "eager"
    hf = DeepseekV2Attention(hf_cfg, layer_idx=0).eval()
    _randomize(hf)
    hf_rope = DeepseekV2RotaryEmbedding(hf_cfg)
    ours = _mla(_deepseek_cfg(q_lora_rank=None), impl)
    assert not hasattr(ours, "q_a_proj")
    _copy_deepseek(ours, hf)

    x = torch.randn(sum(LENGTHS), D)
    with torch.no_grad():
        out = ours(x, ForwardBatch.prefill(LENGTHS), None)
        start = 0
        for n in LENGTHS:
            xb = x[start : start + n][None]
            freqs_cis = hf_rope(xb, torch.arange(n)[None])  # complex [1, n, R/2]
            ref = hf(xb, attention_mask=_causal_mask(n), position_embeddings=freqs_cis)[0][0]
            _close(out[start : start + n], ref)
            start += n


# --------------------------------------------------------------------------------------------------------
# oxidizr (spec §5.4) transcribed.
# --------------------------------------------------------------------------------------------------------

OX_HD, OX_R, OX_LQ, OX_LKV, OX_THETA = 16, 8, 24, 20, 10000.0


def _ox_rope(x: torch.Tensor) -> torch.Tensor:
    """§4 RoPE on x [T, ..., r]: angle t·θ^(-2j/r) for t = 0..T-1, x·cos + cat(-x2, x1)·sin."""
    T, r = x.shape[0], x.shape[-1]
    inv_freq = OX_THETA ** (-torch.arange(0, r, 2).float() / r)
    angle = torch.arange(T).float()[:, None] * inv_freq[None]
    cos, sin = torch.cat((angle, angle), -1).cos(), torch.cat((angle, angle), -1).sin()
    shape = (T,) + (1,) * (x.dim() - 2) + (r,)
    rot = torch.cat((-x[..., r // 2 :], x[..., : r // 2]), -1)
    return x * cos.view(shape) + rot * sin.view(shape)


def _ox_mla(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """One sequence x [T, D] through oxidizr's MLA (model.rs:153-256 as written in spec §5.4)."""
    T = x.shape[0]
    c_kv, c_q = x @ w["w_dkv"].T, x @ w["w_dq"].T
    q_r = _ox_rope((x @ w["w_qr"].T).view(T, H, OX_R))
    k_r = _ox_rope(x @ w["w_kr"].T)  # [T, r], shared by all heads
    q_c = (c_q @ w["w_uq"].T).view(T, H, OX_HD)
    k_c = (c_kv @ w["w_uk"].T).view(T, H, OX_HD)
    v = (c_kv @ w["w_uv"].T).view(T, H, OX_HD)
    q = torch.cat((q_c, q_r), -1)
    k = torch.cat((k_c, k_r[:, None, :].expand(T, H, OX_R)), -1)
    scores = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(OX_HD + OX_R)
    scores = scores + torch.full((T, T), float("-inf")).triu(1)
    o = torch.einsum("hij,jhd->ihd", scores.softmax(-1), v).reshape(T, H * OX_HD)
    return o @ w["o_proj"].T


@pytest.mark.parametrize("impl", ["naive", "absorb"])
def test_oxidizr_mla_equals_spec_transcription(impl):
    shapes = dict(
        w_dkv=(OX_LKV, D),
        w_dq=(OX_LQ, D),
        w_uq=(H * OX_HD, OX_LQ),
        w_uk=(H * OX_HD, OX_LKV),
        w_uv=(H * OX_HD, OX_LKV),
        w_qr=(H * OX_R, D),
        w_kr=(OX_R, D),
        o_proj=(D, H * OX_HD),
    )
    w = {name: torch.randn(shape) / math.sqrt(shape[1]) for name, shape in shapes.items()}
    cfg = MLAConfig(
        num_heads=H,
        q_lora_rank=OX_LQ,
        kv_lora_rank=OX_LKV,
        qk_nope_head_dim=OX_HD,
        qk_rope_head_dim=OX_R,
        v_head_dim=OX_HD,
        rope=RopeConfig(dim=OX_R, theta=OX_THETA),
        softmax_scale=1 / math.sqrt(OX_HD + OX_R),
        has_latent_norms=False,
        is_q_rope_from_hidden=True,
    )
    ours = _mla(cfg, impl)
    assert {n for n, _ in ours.named_parameters()} == {
        "q_a_proj.weight", "q_b_proj.weight", "q_rope_proj.weight", "kv_a_proj.weight", "kv_b_proj.weight",
        "o_proj.weight",
    }  # fmt: skip
    with torch.no_grad():  # the load-time renames: kv_a = [w_dkv; w_kr]; kv_b per head [w_uk_h; w_uv_h]
        ours.q_a_proj.weight.copy_(w["w_dq"])
        ours.q_b_proj.weight.copy_(w["w_uq"])
        ours.q_rope_proj.weight.copy_(w["w_qr"])
        ours.kv_a_proj.weight.copy_(torch.cat((w["w_dkv"], w["w_kr"])))
        kv_b = torch.stack((w["w_uk"].view(H, OX_HD, OX_LKV), w["w_uv"].view(H, OX_HD, OX_LKV)), dim=1)
        ours.kv_b_proj.weight.copy_(kv_b.reshape(H * 2 * OX_HD, OX_LKV))
        ours.o_proj.weight.copy_(w["o_proj"])
    x = torch.randn(sum(LENGTHS), D)
    with torch.no_grad():
        out = ours(x, ForwardBatch.prefill(LENGTHS), None)
        start = 0
        for n in LENGTHS:
            _close(out[start : start + n], _ox_mla(x[start : start + n], w))
            start += n


# --------------------------------------------------------------------------------------------------------
# Naive == absorbed, and the cache invariants on a real latent pool.
# --------------------------------------------------------------------------------------------------------

SLOTS_PER_SEQ = 64  # sequence i owns slots [1 + i·64, 1 + (i + 1)·64); slot 0 is padding


class Pool:
    """A LayerCache with a latent pool pre-filled with garbage, and ForwardBatches for steps on it."""

    def __init__(self, num_seqs: int, width: int = LKV + R) -> None:
        self.cache = LayerCache(latent=100 * torch.randn(1 + num_seqs * SLOTS_PER_SEQ, width))

    @staticmethod
    def slots(seq: int, start: int, stop: int) -> torch.Tensor:
        return 1 + seq * SLOTS_PER_SEQ + torch.arange(start, stop)

    def batch(self, steps: list[tuple[int, int, int]]) -> ForwardBatch:
        """steps: (sequence, context_len, query_len) per sequence, decodes (query_len 1, ctx > 0) first."""
        num_decodes = 0
        while num_decodes < len(steps) and steps[num_decodes][2] == 1 and steps[num_decodes][1] > 0:
            num_decodes += 1
        lmax = max(ctx + n for _, ctx, n in steps)
        kv_indices = torch.zeros(len(steps), lmax, dtype=torch.long)
        for b, (seq, ctx, n) in enumerate(steps):
            kv_indices[b, : ctx + n] = self.slots(seq, 0, ctx + n)
        positions = torch.cat([torch.arange(ctx, ctx + n) for _, ctx, n in steps])
        return ForwardBatch(
            positions=positions,
            query_lens=tuple(n for *_, n in steps),
            context_lens=tuple(ctx for _, ctx, _ in steps),
            num_decodes=num_decodes,
            logits_indices=torch.arange(positions.shape[0]),
            slot_mapping=torch.cat([self.slots(seq, ctx, ctx + n) for seq, ctx, n in steps]),
            kv_indices=kv_indices,
            decode_lens=torch.tensor([ctx + n for _, ctx, n in steps[:num_decodes]]),
        )


@torch.no_grad()
def _full(mla: MLA, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    out = mla(torch.cat(xs), ForwardBatch.prefill([x.shape[0] for x in xs]), None)
    return list(out.split([x.shape[0] for x in xs]))


@torch.no_grad()
def test_naive_equals_absorbed_on_prefill_and_decode():
    naive, absorbed = _model("naive"), _model("absorb")
    xs = [torch.randn(n, D) for n in LENGTHS]
    for a, b in zip(_full(naive, xs), _full(absorbed, xs), strict=True):
        _close(a, b)
    # decode: the three sequences step together over their cached prefixes
    pools = Pool(3), Pool(3)
    prefill = [(i, 0, n - 1) for i, n in enumerate(LENGTHS)]
    decode = [(i, n - 1, 1) for i, n in enumerate(LENGTHS)]
    last = torch.stack([x[-1] for x in xs])
    outs = []
    for mla, pool in zip((naive, absorbed), pools, strict=True):
        mla(torch.cat([x[:-1] for x in xs]), pool.batch(prefill), pool.cache)
        outs.append(mla(last, pool.batch(decode), pool.cache))
    _close(outs[0], outs[1])


@pytest.mark.parametrize("impl", IMPLS)
@torch.no_grad()
def test_prefill_then_decode_equals_full_forward(impl):
    mla, pool = _model(impl), Pool(1)
    x = torch.randn(30, D)
    (full,) = _full(mla, [x])
    outs = [mla(x[:20], pool.batch([(0, 0, 20)]), pool.cache)]
    for t in range(20, 30):
        outs.append(mla(x[t : t + 1], pool.batch([(0, t, 1)]), pool.cache))
    _close(torch.cat(outs), full)


@pytest.mark.parametrize("impl", IMPLS)
@torch.no_grad()
def test_chunked_prefill_equals_whole(impl):
    mla, pool = _model(impl), Pool(1)
    x = torch.randn(30, D)
    (full,) = _full(mla, [x])
    outs = []
    for start in range(0, 30, 7):
        n = min(7, 30 - start)
        outs.append(mla(x[start : start + n], pool.batch([(0, start, n)]), pool.cache))
    _close(torch.cat(outs), full)


@pytest.mark.parametrize("impl", IMPLS)
@torch.no_grad()
def test_sequences_decoding_together_equal_alone(impl):
    """Three sequences of different lengths prefilled together, then 4 decode steps together; then a mixed
    step: two decodes, a 6-token chunk on top of a context and a 10-token chunk on a 2-token context (in
    "auto" these take different forms). Each must equal its own full forward."""
    mla, pool = _model(impl), Pool(4)
    prompt_lens, num_steps = [5, 12, 9], 4
    xs = [torch.randn(n + num_steps + 6, D) for n in prompt_lens] + [torch.randn(12, D)]
    fulls = _full(mla, xs)
    out = mla(torch.cat([x[:n] for x, n in zip(xs, prompt_lens, strict=False)]),
              pool.batch([(i, 0, n) for i, n in enumerate(prompt_lens)]), pool.cache)  # fmt: skip
    for o, full, n in zip(out.split(prompt_lens), fulls, prompt_lens, strict=False):
        _close(o, full[:n])
    for step in range(num_steps):
        ctx = [n + step for n in prompt_lens]
        x = torch.stack([x[c] for x, c in zip(xs, ctx, strict=False)])
        out = mla(x, pool.batch([(i, c, 1) for i, c in enumerate(ctx)]), pool.cache)
        for i, c in enumerate(ctx):
            _close(out[i], fulls[i][c])
    # mixed: sequences 0 and 2 decode, sequence 1 prefills 6 tokens, sequence 3 its first 2 then the next 10
    ctx = [n + num_steps for n in prompt_lens]
    mla(xs[3][:2], pool.batch([(3, 0, 2)]), pool.cache)
    x = torch.cat([xs[0][ctx[0]][None], xs[2][ctx[2]][None], xs[1][ctx[1] : ctx[1] + 6], xs[3][2:12]])
    batch = pool.batch([(0, ctx[0], 1), (2, ctx[2], 1), (1, ctx[1], 6), (3, 2, 10)])
    assert batch.num_decodes == 2
    if impl in ("auto", "kernels"):  # decodes and the 6 over 16 cached keys absorbed; 10 over 2 naive
        assert mla._runs(batch) == [(0, 3, True), (3, 4, False)]
    out = mla(x, batch, pool.cache)
    _close(out[0], fulls[0][ctx[0]])
    _close(out[1], fulls[2][ctx[2]])
    _close(out[2:8], fulls[1][ctx[1] : ctx[1] + 6])
    _close(out[8:], fulls[3][2:12])


def test_auto_form_choice_at_deepseek_sizes():
    """Decode rows and short chunks over long contexts are absorbed; fresh and long chunks are naive."""
    cfg = MLAConfig(
        num_heads=16,
        q_lora_rank=None,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        rope=RopeConfig(dim=64),
        softmax_scale=192**-0.5,
    )
    with torch.device("meta"):
        mla = MLA(cfg, 1024, RotaryEmbedding(cfg.rope, 16))
    steps = [(0, 4095, 1), (1, 4080, 16), (2, 4032, 64), (3, 0, 512), (4, 4096, 512), (5, 300, 200)]
    batch = Pool(6).batch(steps)
    assert mla._runs(batch) == [(0, 3, True), (3, 6, False)]


@torch.no_grad()
def test_cache_holds_only_normed_latent_and_rotated_rope_key():
    mla, pool = _model(), Pool(2)
    before = pool.cache.latent.clone()
    x = torch.randn(11, D)
    mla(x, pool.batch([(1, 0, 11)]), pool.cache)
    assert pool.cache.latent.shape[1] == LKV + R
    assert [t.shape for t in SPEC.cache(mla.cfg)] == [(LKV + R,)]  # what the kind declares: the latent row
    written = pool.slots(1, 0, 11)
    is_written = torch.zeros(pool.cache.latent.shape[0], dtype=torch.bool)
    is_written[written] = True
    torch.testing.assert_close(pool.cache.latent[~is_written], before[~is_written], rtol=0, atol=0)
    # independently: RMSNorm(c_kv) · w, then the half-split rotation of k_rope at positions 0..10
    c_kv, k_rope = (x @ mla.kv_a_proj.weight.T).split([LKV, R], -1)
    normed = c_kv * torch.rsqrt(c_kv.pow(2).mean(-1, keepdim=True) + 1e-6) * mla.kv_a_norm.weight
    inv_freq = 10000.0 ** (-torch.arange(0, R, 2).float() / R)
    angle = torch.arange(11).float()[:, None] * inv_freq
    k1, k2 = k_rope[:, : R // 2], k_rope[:, R // 2 :]
    rotated = torch.cat((k1 * angle.cos() - k2 * angle.sin(), k2 * angle.cos() + k1 * angle.sin()), -1)
    _close(pool.cache.latent[written], torch.cat((normed, rotated), -1))


@torch.no_grad()
def test_bfloat16_decode_absorbed_close_to_naive():
    """In bf16 (cache in bf16 too) the absorbed decode stays within bf16 rounding of the naive one."""
    naive, auto = _model("naive").to(torch.bfloat16), _model("auto").to(torch.bfloat16)
    x = torch.randn(24, D).to(torch.bfloat16)
    outs = []
    for mla in (naive, auto):
        pool = Pool(1)
        pool.cache.latent = pool.cache.latent.to(torch.bfloat16)
        mla(x[:16], pool.batch([(0, 0, 16)]), pool.cache)
        outs.append(
            torch.cat([mla(x[t : t + 1], pool.batch([(0, t, 1)]), pool.cache) for t in range(16, 24)])
        )
    torch.testing.assert_close(outs[1].float(), outs[0].float(), rtol=3e-2, atol=3e-2)
