"""BambaForCausalLM parity with transformers: Mamba2 layers and attention layers (`attn_layer_indices`,
RoPE on half of each head) each followed by a SwiGLU; a variant with every bias (q/k/v/o, MLP, Mamba2
in/out) and n_groups 2; layer kinds from `attn_layer_indices` or from legacy / v5 layer-type names;
detection without config.json.

transformers' BambaModel sets position_ids = arange(new tokens) with no past offset, so a hand-driven
cached decode without position_ids rotates at position 0; generate() passes them, and the greedy check
goes through generate()."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from blazr.config import AttentionConfig, ModelConfig
from tests.drive import assert_logits_close, stepwise_logits
from tests.hf_parity import (
    check_batched_equals_alone,
    check_cache_invariants,
    check_greedy,
    check_logits,
    prompts,
)
from tests.ssm_fixtures import (
    HEADS,
    check_state_bytes,
    check_without_config_json,
    detect_with,
    layer_kinds,
    load_pair,
    map_layers,
    single_thread,
)

ARCH = "BambaForCausalLM"
MAMBA = dict(mamba_n_heads=8, mamba_d_head=32, mamba_d_state=16, mamba_chunk_size=8, mamba_expand=2)
VARIANTS = {
    "mamba-attn-mamba": dict(MAMBA, **HEADS, num_hidden_layers=3, attn_layer_indices=[1], mamba_n_groups=1),
    "bias-g2": dict(
        MAMBA,
        **HEADS,
        num_hidden_layers=2,
        attn_layer_indices=[0],
        mamba_n_groups=2,
        attention_bias=True,
        mlp_bias=True,
        mamba_proj_bias=True,
    ),
}
KINDS = {
    "mamba-attn-mamba": ["mamba2+mlp", "attention+mlp", "mamba2+mlp"],
    "bias-g2": ["attention+mlp", "mamba2+mlp"],
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    return load_pair(tmp_path_factory.mktemp(request.param), request.param, ARCH, **VARIANTS[request.param])


def test_detected_config(pair):
    cfg = pair.llm.config
    assert layer_kinds(cfg) == KINDS[pair.name]
    attn = next(a for layer in cfg.layers if (a := layer.mixer(AttentionConfig)))
    assert (attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.rope.dim) == (2, 1, 64, 32)
    is_biased = pair.name == "bias-g2"
    assert attn.has_qkv_bias == attn.has_o_bias == is_biased
    assert all(layer.mlp.has_bias == is_biased for layer in cfg.layers)


def test_logits_match_transformers(pair):
    check_logits(pair.hf, pair.llm)


def test_greedy_tokens_match_transformers_with_cache(pair):
    check_greedy(pair.hf, pair.llm)


def test_cache_invariants(pair):
    check_cache_invariants(pair.llm)


def test_batched_generation_equals_each_alone(pair):
    check_batched_equals_alone(pair.llm)


@torch.no_grad()
def test_cached_decode_matches_transformers_given_position_ids(pair):
    """blazr's prefill 12 + 8 single-token steps against transformers decoding by hand with its cache —
    passing position_ids, without which BambaModel rotates every new token at position 0."""
    ids = prompts([20], seed=5, vocab=pair.llm.config.vocab_size)[0]
    ours = stepwise_logits(pair.llm, [ids], [[12] + [1] * 8])[0]
    out = pair.hf(input_ids=torch.tensor([ids[:12]]), use_cache=True)
    rows = [out.logits[0]]
    for n in range(12, 20):
        out = pair.hf(
            input_ids=torch.tensor([[ids[n]]]),
            cache=out.past_key_values,
            position_ids=torch.tensor([[n]]),
            use_cache=True,
        )
        rows.append(out.logits[0])
    assert_logits_close(ours, torch.cat(rows))


def test_state_bytes_per_sequence(pair):
    c = pair.hf.config
    num_mamba = c.num_hidden_layers - len(c.attn_layer_indices)
    check_state_bytes(
        pair, c.mamba_n_heads, c.mamba_d_head, c.mamba_d_state, c.mamba_n_groups, c.mamba_d_conv, num_mamba
    )


def _groups_not_inferable(cfg: ModelConfig) -> ModelConfig:
    """Shapes give only n_groups × state (2 × 16): read as Bamba's default 1 group of 32."""
    return map_layers(
        cfg, mamba2=lambda m: dataclasses.replace(m, n_groups=1, state_size=32, norm_group_size=m.d_inner)
    )


def test_without_config_json(pair, tmp_path):
    check_without_config_json(
        pair, tmp_path, _groups_not_inferable if pair.name == "bias-g2" else lambda c: c
    )


@pytest.mark.parametrize("names", ["legacy", "v5"])
def test_layer_types_instead_of_attn_layer_indices(pair, tmp_path, names):
    """`layer_types` in legacy ("mamba"/"attention") or v5 names gives the same layers; without
    `architectures` the model_type names the architecture."""
    kinds = {"legacy": ("mamba", "attention"), "v5": ("linear_attention", "full_attention")}[names]

    def edit(raw):
        indices = raw.pop("attn_layer_indices")
        raw["layer_types"] = [kinds[i in indices] for i in range(raw["num_hidden_layers"])]
        del raw["architectures"]

    assert detect_with(pair.path, tmp_path, edit) == pair.llm.config
