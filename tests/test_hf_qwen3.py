"""Qwen3 and Qwen3-MoE parity with transformers on tiny random checkpoints: per-head q/k RMSNorm (random
weights), a head size other than hidden / heads, q/k/v biases and a sliding window on the layers from
`max_window_layers` on (Qwen3); dense and sparse layers mixed by `mlp_only_layers` (routing not
renormalised) or `decoder_sparse_step` (Qwen3-MoE); detection without config.json and from transformers'
fused expert tensors; a q_norm of the wrong width refused with one line."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from blazr import LLM
from blazr.config import AttentionConfig
from blazr.errors import CheckpointError
from tests.drive import full_logits
from tests.hf_parity import ParityTests, prompts
from tests.ssm_fixtures import detect_with, load_pair, single_thread

SIZES = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=32)
VARIANTS = {
    "qwen3-bias-window": (
        "Qwen3ForCausalLM",
        dict(SIZES, attention_bias=True, use_sliding_window=True, sliding_window=24, max_window_layers=1),
    ),
    "qwen3-moe": (
        "Qwen3MoeForCausalLM",
        dict(SIZES, num_hidden_layers=3, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
             mlp_only_layers=[1], norm_topk_prob=False, tie_word_embeddings=True),
    ),
    "qwen3-moe-step2": (
        "Qwen3MoeForCausalLM",
        dict(SIZES, num_hidden_layers=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
             decoder_sparse_step=2, norm_topk_prob=True),
    ),
}  # fmt: skip
KINDS = {
    "qwen3-moe": ["attention+moe", "attention+mlp", "attention+moe"],
    "qwen3-moe-step2": ["attention+mlp", "attention+moe", "attention+mlp", "attention+moe"],
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    arch, overrides = VARIANTS[request.param]
    return load_pair(tmp_path_factory.mktemp(request.param), request.param, arch, **overrides)


class TestParity(ParityTests):
    """Logits, greedy tokens, cache invariants and batched == alone against transformers."""


def test_detected_config(pair):
    cfg = pair.llm.config
    attn = [layer.mixer(AttentionConfig) for layer in cfg.layers]
    assert all(a.qk_norm is not None and a.is_qk_norm_per_head and a.head_dim == 32 for a in attn)
    if pair.name in KINDS:
        assert [layer.kind for layer in cfg.layers] == KINDS[pair.name]
        moe = next(layer.moe for layer in cfg.layers if layer.moe)
        assert (moe.num_experts, moe.top_k, moe.expert.intermediate_size) == (4, 2, 48)
        assert moe.is_renormalized == (pair.name == "qwen3-moe-step2")
        assert cfg.tie_word_embeddings == (pair.name == "qwen3-moe")
    else:
        assert [a.sliding_window for a in attn] == [None, 24] and attn[0].has_qkv_bias


def test_without_config_json(tmp_path):
    """The names say Qwen3, q_norm's width the head size, shapes the rest; rope θ and eps take
    transformers' defaults, which this checkpoint uses: the same model."""
    pair = load_pair(tmp_path / "with", "qwen3", "Qwen3ForCausalLM", **SIZES)
    inferred = detect_with(pair.path, tmp_path / "without", None)
    assert dataclasses.replace(inferred, max_position_embeddings=0) == dataclasses.replace(
        pair.llm.config, max_position_embeddings=0
    )


@pytest.mark.parametrize("pair", ["qwen3-bias-window"], indirect=True)
def test_mismatched_q_norm_is_one_clear_line(pair, tmp_path):
    def edit(raw):
        raw["head_dim"], raw["num_attention_heads"] = 16, 8  # q_norm is [32]: one head of 32

    with pytest.raises(CheckpointError, match=r"q_norm\.weight: expected \[16\] .*found \[32\]$") as e:
        detect_with(pair.path, tmp_path, edit)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("pair", ["qwen3-moe"], indirect=True)
def test_fused_expert_tensors(pair, tmp_path):
    """transformers' own names (`save_original_format=False`): the experts as fused 3-D tensors load to the
    same model."""
    pair.hf.save_pretrained(tmp_path, save_original_format=False)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert "model.layers.0.mlp.experts.gate_up_proj" in set(f.keys())
    llm = LLM(tmp_path, cpu=True, dtype="float32", max_num_seqs=2)
    batch = prompts([20], seed=9, vocab=llm.config.vocab_size)
    assert torch.equal(full_logits(llm.runner, batch)[0], full_logits(pair.llm.runner, batch)[0])
