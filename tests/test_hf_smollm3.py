"""SmolLM3 parity with transformers on tiny random checkpoints: NoPE every 4th layer (the default), and an
explicit `no_rope_layers` with sliding-window layers."""

from __future__ import annotations

import pytest

from blazr.config import AttentionConfig
from tests.hf_parity import ParityTests
from tests.ssm_fixtures import load_pair, single_thread

# token ids inside the tiny vocabulary (SmolLM3Config defaults to 128000 and up)
SIZES = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
             pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
VARIANTS = {
    "smollm3": ("SmolLM3ForCausalLM", dict(SIZES, num_hidden_layers=4)),
    "smollm3-window": (
        "SmolLM3ForCausalLM",
        dict(SIZES, num_hidden_layers=3, no_rope_layers=[1, 0, 1], use_sliding_window=True, sliding_window=24,
             layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
    ),
}  # fmt: skip


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
    attn = [layer.mixer(AttentionConfig) for layer in pair.llm.config.layers]
    if pair.name == "smollm3":
        assert [a.rope is not None for a in attn] == [True, True, True, False]
        assert {a.rope.theta for a in attn if a.rope} == {2000000.0}
    else:
        assert [a.rope is not None for a in attn] == [True, False, True]
        assert [a.sliding_window for a in attn] == [24, None, 24]
