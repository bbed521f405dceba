"""GPT-OSS parity with transformers on tiny random checkpoints: attention sinks (random, large enough to take
a real share of each softmax), q/k/v/o biases, sliding-window and full layers as `layer_types` lists them,
YaRN rope; every layer a MoE with a router bias, experts with biases and the clamped SwiGLU (a limit small
enough here that the clamps bite), gate / up interleaved in transformers' fused tensors; MXFP4 experts
(`*_blocks` / `*_scales`) dequantized as transformers' own `convert_moe_packed_tensors` does, and a
checkpoint stored so loading to the same model (`--quantize none`) or, by default, kept MXFP4 with the same
values and run by the mxfp4 kernel; detection without config.json; the sinks split by heads across
tensor-parallel ranks (2 ranks == 1 in test_tensor_parallel)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from blazr import LLM, SamplingParams
from blazr.config import AttentionConfig
from blazr.kernels.quant import dequantize
from blazr.loading import mxfp4
from tests.drive import full_logits
from tests.hf_parity import ParityTests, check_greedy, check_logits, prompts
from tests.ssm_fixtures import Pair, detect_with, randomise, single_thread
from tests.tiny import build

SIZES = dict(
    hidden_size=64,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    num_local_experts=4,
    num_experts_per_tok=2,
)
VARIANTS = {
    # window 8 < the prompts; the limit 0.6 clamps a good share of gate and up values
    "yarn-window": dict(
        SIZES, num_hidden_layers=3, sliding_window=8, swiglu_limit=0.6,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=8.0, beta_fast=32.0, beta_slow=1.0,
                             truncate=False, original_max_position_embeddings=64),
    ),
    "defaults": dict(SIZES, num_hidden_layers=2),  # transformers' defaults: window 128, YaRN ×32, limit 7
}  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@torch.no_grad()
def build_gpt_oss(root: Path, seed: int = 0, **overrides: object) -> torch.nn.Module:
    """A tiny GptOssForCausalLM with random sinks (std 1.5), router and expert biases, saved under `root`."""
    hf = build("GptOssForCausalLM", root, seed=seed, **overrides)
    randomise(hf, seed + 1)
    g = torch.Generator().manual_seed(seed + 2)
    for name, p in hf.named_parameters():
        if name.endswith("sinks"):
            p.copy_(1.5 * torch.randn(p.shape, generator=g))
        elif name.endswith(("_proj_bias", "router.bias")):
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    hf.save_pretrained(root)
    return hf


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    hf = build_gpt_oss(root, **VARIANTS[request.param])
    return Pair(hf, LLM(root, cpu=True, dtype="float32", max_num_seqs=8), root, request.param)


class TestParity(ParityTests):
    """Logits, greedy tokens, cache invariants and batched == alone against transformers."""


def test_detected_config(pair):
    cfg = pair.llm.config
    attn = [layer.mixer(AttentionConfig) for layer in cfg.layers]
    assert all(a.has_sinks and a.has_qkv_bias and a.has_o_bias and a.head_dim == 32 for a in attn)
    assert all(a.rope is not None and a.rope.scaling == "yarn" for a in attn)
    moe = cfg.layers[0].moe
    assert moe is not None and moe.has_router_bias and moe.is_renormalized and moe.top_k == 2
    assert moe.expert.activation == "swiglu_oai" and moe.expert.has_bias
    if pair.name == "yarn-window":
        assert [a.sliding_window for a in attn] == [8, None, 8]
        assert attn[0].rope.factor == 8.0 and attn[0].rope.original_max_position == 64
        assert moe.expert.swiglu_limit == 0.6
    else:
        assert [a.sliding_window for a in attn] == [128, None]
        assert attn[0].rope.factor == 32.0 and attn[0].rope.theta == 150000.0


@pytest.mark.parametrize("pair", ["yarn-window"], indirect=True)
def test_decode_plan_captures_sinks_and_experts(pair):
    """The CPU decode step — attention with sinks in the C kernel, the MoE's biased router and experts
    in moe_experts — is recorded as one plan (no eager fallback)."""
    runner = pair.llm.runner
    assert runner.decode_plan is not None
    before = runner.decode_plan.num_runs
    pair.llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True))
    assert runner.decode_plan.num_runs > before


def test_without_config_json(tmp_path):
    """Shapes (heads from the sinks) and transformers' defaults (top-4 routing among them) give the same
    model."""
    root = tmp_path / "with"
    build_gpt_oss(root, **dict(VARIANTS["defaults"], num_experts_per_tok=4))
    with_cfg = LLM(root, cpu=True, dtype="float32", max_num_seqs=2).config
    assert replace(detect_with(root, tmp_path / "without", None), max_position_embeddings=0) == replace(
        with_cfg, max_position_embeddings=0
    )


# --------------------------------------------------------------------------------------------- MXFP4


def test_mxfp4_dequantization_equals_transformers():
    """Random blocks and scales (every code, scales around 2⁰): ours equals transformers' conversion."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 10, 4, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(118, 136, (3, 10, 4), dtype=torch.uint8, generator=g)
    want = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    got = mxfp4.dequantize_hf_transposed(blocks, scales)
    assert got.shape == want.shape == (3, 128, 10)
    assert torch.equal(got, want)
    # quantize_hf is exact on values that are MXFP4 already
    again = mxfp4.quantize_hf(mxfp4.dequantize_hf(blocks, scales))
    assert torch.equal(mxfp4.dequantize_hf(*again), mxfp4.dequantize_hf(blocks, scales))


def store_mxfp4_experts(root: Path, hf: torch.nn.Module) -> None:
    """Rewrite the checkpoint under `root` with its experts as MXFP4 (`*_blocks` / `*_scales` and a
    quantization_config, as the Hub's files) and set `hf`'s experts to the dequantized values."""
    tensors = load_file(str(root / "model.safetensors"))
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        blocks, scales = mxfp4.quantize_hf(tensors.pop(name).transpose(1, 2))  # rows: output features
        tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
        hf.get_parameter(name).data.copy_(mxfp4.dequantize_hf_transposed(blocks, scales))
    save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
    raw = json.loads((root / "config.json").read_text())
    raw["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["self_attn", "router"]}
    (root / "config.json").write_text(json.dumps(raw))


@pytest.fixture(scope="module")
def mxfp4_checkpoint(tmp_path_factory) -> tuple[torch.nn.Module, Path]:
    root = tmp_path_factory.mktemp("mxfp4")
    hf = build_gpt_oss(root, **VARIANTS["yarn-window"])
    store_mxfp4_experts(root, hf)
    return hf, root


def test_mxfp4_checkpoint_dequantized(mxfp4_checkpoint):
    """The experts stored as MXFP4, read on the reference path (`--quantize none`: dequantized as transformers
    does): transformers' model with the dequantized experts, logits and greedy tokens."""
    hf, root = mxfp4_checkpoint
    llm = LLM(root, cpu=True, dtype="float32", max_num_seqs=2, quantize="none")
    assert all(layer.moe.experts.w_up is None for layer in llm.runner.model.layers)
    check_logits(hf, llm)
    check_greedy(hf, llm, n=16)


def test_mxfp4_checkpoint_runs_as_stored(mxfp4_checkpoint):
    """By default the MXFP4 experts stay MXFP4 (kernels/mxfp4.py: HF's blocks re-laid in GGUF's order, 4.25
    bits a value) holding exactly the dequantized path's values, gate / up de-interleaved as the float path
    does; the model then differs from that path only by the 8-bit activation rounding of the experts' dot
    products (llama.cpp's too), and its decode step is still one recorded plan."""
    _, root = mxfp4_checkpoint
    ours = LLM(root, cpu=True, dtype="float32", max_num_seqs=2)
    plain = LLM(root, cpu=True, dtype="float32", max_num_seqs=2, quantize="none")
    for layer, ref in zip(ours.runner.model.layers, plain.runner.model.layers, strict=True):
        experts, want = layer.moe.experts, ref.moe.experts
        assert experts.w_up.kind == experts.w_down.kind == "mxfp4"
        E, N, D = want.gate_up_proj.shape
        assert torch.equal(dequantize(experts.w_up), want.gate_up_proj.reshape(E * N, D))
        assert torch.equal(dequantize(experts.w_down), want.down_proj.reshape(E * D, -1))
        for w in (experts.w_up, experts.w_down):  # 17 bytes per 32 values
            assert w.nbytes * 8 == 4.25 * w.out_features * w.in_features
    check_close_to_dequantized(ours, plain)
    before = ours.runner.decode_plan.num_runs
    ours.generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True))
    assert ours.runner.decode_plan.num_runs > before


def check_close_to_dequantized(ours: LLM, dequantized: LLM) -> None:
    """Logits within 8-bit activation rounding of the dequantized path's (as the other quantized kinds'
    GGUF tests): mean error ≤ 2% of the logit scale, a different top-1 only at a near-tie."""
    batch = prompts([7, 30], seed=5, vocab=ours.config.vocab_size)
    pairs = zip(full_logits(ours.runner, batch), full_logits(dequantized.runner, batch), strict=True)
    for got, want in pairs:
        scale = want.abs().max().item()
        assert (got - want).abs().mean().item() <= 0.02 * scale
        row_error = (got - want).abs().amax(-1)
        margin = want.amax(-1) - want.gather(-1, got.argmax(-1, keepdim=True)).squeeze(-1)
        assert (margin <= 2 * row_error).all(), (margin, row_error)


def test_tensor_parallel_splits_sinks():
    """Sinks are per query head: a rank holds its heads' (distributed/shard.py slices them as q's rows)."""
    from blazr.model.attention import _slice

    cfg = AttentionConfig(
        num_heads=4, num_kv_heads=2, head_dim=8, rope=None, softmax_scale=1.0, has_sinks=True
    )
    sinks = torch.arange(4.0)
    assert torch.equal(_slice(cfg, "sinks", sinks, 1, 2), torch.tensor([2.0, 3.0]))


def test_quantized_experts(pair):
    """--quantize int8 stacks the experts in a kernel format (moe_experts on their int8 rows): biases and the
    clamped SwiGLU still apply — on one routing, close to the float experts (whole-model logits are not
    compared: a rounding may flip a tiny model's top-k choice)."""
    llm = LLM(pair.path, cpu=True, dtype="float32", max_num_seqs=2, quantize="int8")
    g = torch.Generator().manual_seed(6)
    for i in range(llm.config.num_layers):
        ours, ref = llm.runner.model.layers[i].moe, pair.llm.runner.model.layers[i].moe
        assert ours.experts.w_up is not None and ours.experts.w_up.kind != "f32"
        x = torch.randn(9, llm.config.hidden_size, generator=g)
        weights, ids = ref.router(x)
        want = ref.experts(x, weights, ids)
        assert (ours.experts(x, weights, ids) - want).abs().max() <= 0.03 * want.abs().max()
