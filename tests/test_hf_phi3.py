"""Phi-3 / Phi-4 parity with transformers on tiny random checkpoints: fused qkv_proj and gate_up_proj; a
Phi-3-mini-4k shape (all heads, full rope, a sliding window on every layer, untied head) and a Phi-4-mini
shape (GQA, partial rope 0.75, LongRoPE, tied embeddings).

LongRoPE's rule (model/rope.py `longrope_factors`): the long factors where the context limit exceeds
original_max_position_embeddings, else the short ones, for every position. transformers picks per forward
from the sequence's length, so each regime is checked where the two rules agree:
- long: original_max_position_embeddings 4 under a 256-token limit, every prompt longer than 4 (the
  ParityTests, cache invariants included);
- short: original 64 under a 64-token limit, every sequence within 64 tokens (logits and greedy tokens).
Plus a published (transformers-v4) config.json — `rope_scaling` with "su", the original context at the top
level — detected the same, and one-line refusals (no head count, factors of the wrong length)."""

from __future__ import annotations

import pytest

from blazr import LLM
from blazr.config import AttentionConfig, RopeConfig
from blazr.errors import CheckpointError
from blazr.model.rope import longrope_factors
from tests.hf_parity import ParityTests, check_greedy, check_logits
from tests.ssm_fixtures import detect_with, load_pair, single_thread

# token ids inside the tiny vocabulary (Phi3Config's defaults are 32000 and up)
SIZES = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, pad_token_id=0, bos_token_id=1,
             eos_token_id=2)  # fmt: skip
SHORT = [1.0 + 0.1 * i for i in range(6)]  # rotary dim 12 (head 16 · 0.75): 6 frequencies
LONG = [2.0 + i for i in range(6)]


def longrope(original: int) -> dict:
    return dict(
        partial_rotary_factor=0.75,
        max_position_embeddings=256,
        original_max_position_embeddings=original,
        rope_scaling=dict(type="longrope", short_factor=SHORT, long_factor=LONG),
    )


VARIANTS = {
    "phi3-mini-window": ("Phi3ForCausalLM", dict(SIZES, num_key_value_heads=4, sliding_window=24)),
    "phi4-mini-longrope": (
        "Phi3ForCausalLM",
        dict(SIZES, num_key_value_heads=2, tie_word_embeddings=True, **longrope(4)),
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
    assert all(a.head_dim == 16 and not a.has_qkv_bias for a in attn)
    if pair.name == "phi3-mini-window":
        assert [a.sliding_window for a in attn] == [24, 24]
        assert attn[0].rope == RopeConfig(dim=16) and attn[0].num_kv_heads == 4
        assert not cfg.tie_word_embeddings
    else:
        rope = attn[0].rope
        assert (rope.dim, rope.scaling, rope.original_max_position) == (12, "longrope", 4)
        assert rope.short_factor == tuple(SHORT) and rope.long_factor == tuple(LONG)
        assert rope.attention_factor == pytest.approx(2.0)  # √(1 + ln(256 / 4) / ln 4)
        assert cfg.tie_word_embeddings and attn[0].sliding_window is None


def test_longrope_short_factors_within_the_original_context(tmp_path):
    """A limit within the original context: the short factors, as transformers on sequences that short."""
    pair = load_pair(
        tmp_path, "short", "Phi3ForCausalLM", **dict(SIZES, num_key_value_heads=2, **longrope(64))
    )
    llm = LLM(tmp_path, cpu=True, dtype="float32", max_num_seqs=2, max_model_len=64)
    check_logits(pair.hf, llm)  # prompts of 5 … 40 tokens
    check_greedy(pair.hf, llm)  # 11 + 32 tokens


def test_longrope_factors_switch_past_the_original_context():
    rope = RopeConfig(
        dim=4, scaling="longrope", original_max_position=64, short_factor=(1, 2), long_factor=(3, 4)
    )
    assert longrope_factors(rope, 64) == (1, 2)
    assert longrope_factors(rope, 65) == (3, 4)


@pytest.mark.parametrize("pair", ["phi4-mini-longrope"], indirect=True)
def test_published_config_json(pair, tmp_path):
    """Phi-4-mini's config.json as published (v4 keys): `rope_scaling` ("su": LongRoPE's first name),
    `rope_theta`, `partial_rotary_factor` and the original context at the top level."""

    def as_published(raw):
        params = raw.pop("rope_parameters")
        raw["rope_theta"] = params["rope_theta"]
        raw["rope_scaling"] = dict(type="su", short_factor=SHORT, long_factor=LONG)
        raw["original_max_position_embeddings"] = 4

    assert detect_with(pair.path, tmp_path, as_published) == pair.llm.config


@pytest.mark.parametrize("pair", ["phi4-mini-longrope"], indirect=True)
def test_refusals_are_one_clear_line(pair, tmp_path):
    with pytest.raises(CheckpointError, match=r"num_attention_heads: not in config.json and .*qkv_proj") as e:
        detect_with(pair.path, tmp_path / "no-config", None)
    assert "\n" not in str(e.value)

    def short_list(raw):
        raw["rope_parameters"]["long_factor"] = LONG[:4]

    with pytest.raises(
        CheckpointError, match=r"long_factor must list 6 numbers .*found \[2\.0, 3\.0, 4\.0, 5\.0\]$"
    ):
        detect_with(pair.path, tmp_path / "short-list", short_list)
