"""Gemma 3 text parity with transformers on tiny random checkpoints: sandwich (1 + w) norms, per-head q/k
norms, sqrt(hidden)-scaled embeddings, query_pre_attn_scalar, GELU-tanh MLP, sliding-window layers with their
own rope θ beside full layers with a linearly scaled rope, tied embeddings; the text model of a
Gemma3ForConditionalGeneration checkpoint; detection without config.json; a q_norm of the wrong width
refused in one line."""

from __future__ import annotations

import pytest
import torch

from blazr import LLM
from blazr.config import AttentionConfig
from blazr.errors import CheckpointError, UnsupportedError
from tests.drive import full_logits
from tests.hf_parity import ParityTests, check_logits
from tests.ssm_fixtures import detect_with, load_pair, randomise, single_thread

SIZES = dict(
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    query_pre_attn_scalar=24,
    num_hidden_layers=3,
    sliding_window=24,
    layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    rope_parameters=dict(
        sliding_attention=dict(rope_type="default", rope_theta=10000.0),
        full_attention=dict(rope_type="linear", factor=2.0, rope_theta=1000000.0),
    ),
)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return load_pair(tmp_path_factory.mktemp("gemma3"), "gemma3", "Gemma3ForCausalLM", **SIZES)


class TestParity(ParityTests):
    """Logits, greedy tokens, cache invariants and batched == alone against transformers."""


def test_detected_config(pair):
    cfg = pair.llm.config
    attn = [layer.mixer(AttentionConfig) for layer in cfg.layers]
    assert [a.sliding_window for a in attn] == [24, 24, None]
    ropes = [(a.rope.theta, a.rope.scaling) for a in attn]
    assert ropes == [(1e4, "default"), (1e4, "default"), (1e6, "linear")]
    assert all(a.qk_norm is not None and a.is_qk_norm_per_head and a.softmax_scale == 24**-0.5 for a in attn)
    assert cfg.tie_word_embeddings and cfg.embedding_multiplier == 64**0.5


def test_without_config_json(tmp_path):
    """The names say Gemma 3, q_norm the head size; transformers' defaults give the rest (here: a config
    that names only those defaults — 5 sliding layers of 4096 to 1 full, θ 1e4 / 1e6, query scalar = head)."""
    pair = load_pair(
        tmp_path / "with", "defaults", "Gemma3ForCausalLM",
        **dict(SIZES, num_hidden_layers=2, layer_types=None, sliding_window=4096, rope_parameters=None,
               query_pre_attn_scalar=16, max_position_embeddings=131072),
    )  # fmt: skip
    inferred = detect_with(pair.path, tmp_path / "without", None)
    assert inferred == pair.llm.config


def test_conditional_generation_text_model(tmp_path):
    """Gemma3ForConditionalGeneration: the text model under language_model.model. (and text_config), the
    vision tower left unread; its text logits equal transformers'."""
    import transformers

    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  image_size=32, patch_size=8)  # fmt: skip
    text = dict(SIZES, vocab_size=1024, initializer_range=0.1, max_position_embeddings=512)
    config = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    torch.manual_seed(0)
    hf = transformers.Gemma3ForConditionalGeneration(config).float().eval()
    randomise(hf, 1)
    hf.save_pretrained(tmp_path)
    llm = LLM(tmp_path, cpu=True, dtype="float32", max_num_seqs=8)
    assert llm.config.architecture == "Gemma3ForConditionalGeneration"
    check_logits(hf, llm)


def test_mismatched_q_norm_is_one_clear_line(pair, tmp_path):
    def edit(raw):
        raw["head_dim"] = 32
        raw["num_attention_heads"] = 2
        raw["num_key_value_heads"] = 1

    want = r"q_norm\.weight: expected \[32\] \(one head\), found \[16\]$"
    with pytest.raises(CheckpointError, match=want) as e:
        detect_with(pair.path, tmp_path, edit)
    assert "\n" not in str(e.value)


def test_bidirectional_attention_is_refused(pair, tmp_path):
    def edit(raw):
        raw["use_bidirectional_attention"] = True

    with pytest.raises(UnsupportedError, match="use_bidirectional_attention"):
        detect_with(pair.path, tmp_path, edit)


def test_bfloat16_embedding_multiplier_is_rounded_as_transformers(tmp_path):
    """transformers multiplies the embeddings by sqrt(hidden) as a tensor of the weight's dtype: in bfloat16,
    sqrt(72) = 8.485… is 8.5. blazr's bfloat16 forward feeds the first layer exactly those products."""
    pair = load_pair(tmp_path / "hf", "bf16", "Gemma3ForCausalLM", **dict(SIZES, hidden_size=72))
    llm = LLM(pair.path, cpu=True, dtype="bfloat16", max_num_seqs=2)
    seen = []
    llm.model.layers[0].register_forward_pre_hook(lambda module, args: seen.append(args[0].clone()))
    ids = [5, 17, 300, 1023]
    full_logits(llm.runner, [ids])
    table = llm.model.embed_tokens.weight[ids]
    assert seen[0].dtype == torch.bfloat16
    assert torch.equal(seen[0], table * torch.tensor(72**0.5, dtype=torch.bfloat16))
    assert not torch.equal(seen[0], table * 72**0.5)  # the unrounded multiplier gives other values
