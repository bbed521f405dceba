"""Mixtral parity with transformers on tiny random checkpoints (8 experts top-2; 4 experts top-2 with a
sliding window), the cache invariants, detection without config.json (architecture from
`block_sparse_moe` names, sizes from shapes) and from v4-style keys, and `blazr info`'s parameter counts.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from blazr import LLM
from blazr.config import AttentionConfig
from blazr.detect import inspect_checkpoint
from blazr.info import describe
from tests import hf_parity
from tests.drive import full_logits
from tests.tiny import build

ARCH = "MixtralForCausalLM"
# head_dim 64: what detection assumes for these shapes when no config.json gives the head count
HEADS: dict[str, Any] = dict(num_attention_heads=2, num_key_value_heads=1)
VARIANTS: dict[str, dict[str, Any]] = {
    "mixtral-8x2": dict(num_local_experts=8, num_experts_per_tok=2),
    "mixtral-4x2-window": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=24),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Each variant built, saved and loaded once, on first use."""
    loaded: dict[str, tuple[torch.nn.Module, LLM, Path]] = {}

    def get(name: str) -> tuple[torch.nn.Module, LLM, Path]:
        if name not in loaded:
            path = tmp_path_factory.mktemp(name)
            hf = build(ARCH, path, **HEADS, **VARIANTS[name])
            loaded[name] = hf, LLM(path, cpu=True, dtype="float32", max_num_seqs=8), path
        return loaded[name]

    return get


@pytest.fixture(params=list(VARIANTS))
def pair(request, models):
    return models(request.param)


def test_logits_match_transformers(pair):
    hf, llm, _ = pair
    hf_parity.check_logits(hf, llm)


def test_greedy_tokens_match_transformers_with_cache(pair):
    hf, llm, _ = pair
    hf_parity.check_greedy(hf, llm)


def test_cache_invariants(pair):
    _, llm, _ = pair
    hf_parity.check_cache_invariants(llm)


def test_batched_generation_equals_each_alone(pair):
    _, llm, _ = pair
    hf_parity.check_batched_equals_alone(llm)


def test_detected_structure(models):
    _, llm, _ = models("mixtral-4x2-window")
    layer = llm.config.layers[0]
    assert [x.kind for x in llm.config.layers] == ["attention+moe"] * 2
    a = layer.mixer(AttentionConfig)
    assert (a.num_heads, a.num_kv_heads, a.head_dim) == (2, 1, 64)
    assert (a.sliding_window, a.rope.theta) == (24, 1e6)
    moe = layer.moe
    assert (moe.num_experts, moe.top_k, moe.expert.intermediate_size) == (4, 2, 256)
    assert (moe.scoring, moe.is_renormalized, moe.shared) == ("softmax", True, None)


def test_config_without_config_json(models, tmp_path):
    """Everything but max_position_embeddings comes from shapes or Mixtral's defaults (k 2, θ 1e6, eps
    1e-5, no window), which this checkpoint uses: the same config and the same logits."""
    _, llm, path = models("mixtral-8x2")
    shutil.copy(path / "model.safetensors", tmp_path / "model.safetensors")
    inferred = LLM(tmp_path, cpu=True, dtype="float32")
    assert inferred.config.architecture == ARCH
    assert dataclasses.replace(inferred.config, max_position_embeddings=0) == dataclasses.replace(
        llm.config, max_position_embeddings=0
    )
    prompt = hf_parity.prompts([19], seed=6, vocab=1024)
    assert torch.equal(full_logits(inferred.runner, prompt)[0], full_logits(llm.runner, prompt)[0])


def test_v4_config_keys_give_the_same_config(models, tmp_path):
    """transformers v4 checkpoints carry a top-level rope_theta instead of v5's rope_parameters."""
    _, llm, path = models("mixtral-4x2-window")
    cfg = json.loads((path / "config.json").read_text())
    cfg["rope_theta"] = cfg.pop("rope_parameters")["rope_theta"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shutil.copy(path / "model.safetensors", tmp_path / "model.safetensors")
    assert inspect_checkpoint(tmp_path).config == llm.config


def test_info_reports_cache_bytes_and_active_parameters(models):
    hf, llm, _ = models("mixtral-8x2")
    info = describe(llm.checkpoint)
    # K+V × kv heads × head dim × fp32 bytes × layers
    assert info["cache"]["kv_bytes_per_token"] == 2 * 1 * 64 * 4 * 2
    params = info["parameters"]
    assert params["total"] == sum(p.numel() for p in hf.parameters())
    routed = 2 * 3 * 256 * 128 * 8  # layers × (w1, w2, w3) × I × D × E
    assert params["total"] - params["active_per_token"] == routed * (8 - 2) // 8
