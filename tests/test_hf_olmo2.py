"""OLMo 2 and OLMo 3 parity with transformers on tiny random checkpoints: post-norm blocks, a q/k RMSNorm over
all heads (GQA: k_norm over the KV heads), and OLMo 3's sliding-window layers (3 of 4) with a rope per layer
type; detection without config.json (OLMo 2) and a q_norm of the wrong width refused with one line."""

from __future__ import annotations

import dataclasses

import pytest

from blazr.config import AttentionConfig
from blazr.errors import CheckpointError
from tests.hf_parity import ParityTests
from tests.ssm_fixtures import detect_with, load_pair, single_thread

SIZES = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2)
ROPES = dict(
    sliding_attention=dict(rope_type="default", rope_theta=10000.0),
    full_attention=dict(rope_type="default", rope_theta=500000.0),
)
VARIANTS = {
    "olmo2": ("Olmo2ForCausalLM", dict(SIZES)),
    "olmo3-window": (
        "Olmo3ForCausalLM",
        dict(SIZES, num_hidden_layers=4, sliding_window=24, rope_parameters=ROPES, tie_word_embeddings=True),
    ),
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
    assert all(a.qk_norm is not None and not a.is_qk_norm_per_head for a in attn)
    assert all(layer.norm is None and layer.post_norm and layer.ffn_post_norm for layer in cfg.layers)
    if pair.name == "olmo3-window":
        assert [a.sliding_window for a in attn] == [24, 24, 24, None]
        assert [a.rope.theta for a in attn] == [10000.0, 10000.0, 10000.0, 500000.0]


def test_without_config_json(tmp_path):
    """The names say OLMo 2; shapes and transformers' defaults give the same model (the fixture's heads are
    64 wide: the size assumed when no config gives the head count)."""
    pair = load_pair(tmp_path / "with", "olmo2", "Olmo2ForCausalLM", **dict(SIZES, hidden_size=128,
                     num_attention_heads=2, num_key_value_heads=1))  # fmt: skip
    inferred = detect_with(pair.path, tmp_path / "without", None)
    assert dataclasses.replace(inferred, max_position_embeddings=0) == dataclasses.replace(
        pair.llm.config, max_position_embeddings=0
    )


@pytest.mark.parametrize("pair", ["olmo2"], indirect=True)
def test_mismatched_q_norm_is_one_clear_line(pair, tmp_path):
    def edit(raw):
        raw["head_dim"] = 32  # q_norm is [64]: all 4 heads of 16, not of 32

    with pytest.raises(CheckpointError, match=r"q_norm\.weight: expected \[128\] .*found \[64\]$") as e:
        detect_with(pair.path, tmp_path, edit)
    assert "\n" not in str(e.value)
