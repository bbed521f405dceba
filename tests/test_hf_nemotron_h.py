"""NemotronHForCausalLM parity with transformers: blocks "M*M-ME" — Mamba2 (n_groups 2), NoPE attention, a
relu² MLP, and a MoE of relu² experts with a sigmoid router, a (random) correction bias, group-limited top-2
(2 groups, 1 kept), routed scaling and shared experts; a second model "ME*" with MLP and Mamba2 biases and
unnormalised routing; a third "ME*E" with Nemotron 3 Super's latent MoE (experts between biased
`fc1_latent_proj` / `fc2_latent_proj`, 64 wide in a 128 hidden), also under `--quantize int8`. Block kinds
from `layers_block_type` or the legacy `hybrid_override_pattern`; the SSM state is float32
(`mamba_ssm_cache_dtype`); detection without config.json."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from blazr import LLM
from blazr.config import AttentionConfig, Mamba2Config, ModelConfig
from blazr.errors import CheckpointError
from blazr.kernels import q8_packed
from blazr.model.moe import MoE
from blazr.model.qlinear import QuantizedLinear
from tests.drive import full_logits
from tests.hf_parity import (
    check_batched_equals_alone,
    check_cache_invariants,
    check_greedy,
    check_logits,
    prompts,
)
from tests.ssm_fixtures import (
    Pair,
    check_state_bytes,
    check_without_config_json,
    detect_with,
    layer_kinds,
    load_pair,
    map_layers,
    single_thread,
)

ARCH = "NemotronHForCausalLM"
COMMON = dict(
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    mamba_num_heads=8,
    mamba_head_dim=32,
    ssm_state_size=16,
    chunk_size=8,
    moe_intermediate_size=64,
    moe_shared_expert_intermediate_size=32,
    num_experts_per_tok=2,
)
PATTERNS = {"grouped-routing": "M*M-ME", "bias-unnormalised": "ME*", "latent": "ME*E"}
VARIANTS = {
    "grouped-routing": dict(
        COMMON,
        hybrid_override_pattern=PATTERNS["grouped-routing"],
        n_groups=2,
        n_routed_experts=8,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=2.0,
    ),
    "bias-unnormalised": dict(
        COMMON,
        hybrid_override_pattern=PATTERNS["bias-unnormalised"],
        n_groups=1,
        n_routed_experts=4,
        norm_topk_prob=False,
        mlp_bias=True,
        use_bias=True,
    ),
    "latent": dict(
        COMMON,
        hybrid_override_pattern=PATTERNS["latent"],
        n_groups=2,
        n_routed_experts=8,
        moe_latent_size=64,
        mlp_bias=True,
        routed_scaling_factor=1.5,
    ),
}
KIND = {"M": "mamba2", "*": "attention", "-": "mlp", "E": "moe"}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    yield from single_thread()


_PAIRS: dict[str, Pair] = {}


def _pair(name: str, tmp_path_factory) -> Pair:
    if name not in _PAIRS:
        _PAIRS[name] = load_pair(tmp_path_factory.mktemp(name), name, ARCH, **VARIANTS[name])
    return _PAIRS[name]


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    return _pair(request.param, tmp_path_factory)


def test_detected_config(pair):
    cfg, c = pair.llm.config, pair.hf.config
    assert layer_kinds(cfg) == [KIND[k] for k in PATTERNS[pair.name]]
    moe = next(layer.moe for layer in cfg.layers if layer.moe)
    assert (moe.scoring, moe.has_correction_bias, moe.group_score) == ("sigmoid", True, "top2_sum")
    assert (moe.num_groups, moe.topk_groups, moe.routed_scaling_factor) == (
        c.n_group,
        c.topk_group,
        c.routed_scaling_factor,
    )
    assert moe.is_renormalized == c.norm_topk_prob
    assert (moe.latent_size, moe.has_latent_bias) == (c.moe_latent_size, c.moe_latent_size is not None)
    assert (moe.expert.activation, moe.expert.is_gated, moe.shared.intermediate_size) == ("relu2", False, 32)
    assert all(m.rope is None for layer in cfg.layers if (m := layer.mixer(AttentionConfig)))
    assert {m.dt_min for layer in cfg.layers if (m := layer.mixer(Mamba2Config))} == {c.time_step_min}
    assert c.mamba_ssm_cache_dtype == "float32"
    assert {lc.ssm.dtype for lc in pair.llm.runner.cache.layers if hasattr(lc, "ssm")} == {torch.float32}


def test_logits_match_transformers(pair):
    check_logits(pair.hf, pair.llm)


def test_greedy_tokens_match_transformers_with_cache(pair):
    check_greedy(pair.hf, pair.llm)


def test_cache_invariants(pair):
    check_cache_invariants(pair.llm)


def test_batched_generation_equals_each_alone(pair):
    check_batched_equals_alone(pair.llm)


def test_state_bytes_per_sequence(pair):
    c = pair.hf.config
    num_mamba = PATTERNS[pair.name].count("M")
    check_state_bytes(
        pair, c.mamba_num_heads, c.mamba_head_dim, c.ssm_state_size, c.n_groups, c.conv_kernel, num_mamba
    )


def _routing_not_inferable(cfg: ModelConfig) -> ModelConfig:
    """Routing hyper-parameters no shape carries take transformers' defaults: 1 group, scale 1,
    renormalised. (n_groups 2 × state 16 is inferred: the default 8 halved until the state is 16.)"""
    return map_layers(
        cfg,
        moe=lambda m: dataclasses.replace(
            m, num_groups=1, topk_groups=1, routed_scaling_factor=1.0, is_renormalized=True
        ),
    )


def test_without_config_json(pair, tmp_path):
    check_without_config_json(pair, tmp_path, _routing_not_inferable)


def test_legacy_pattern_and_keys(pair, tmp_path):
    """Hub checkpoints ship `hybrid_override_pattern`, `mamba_`-prefixed Mamba2 keys and
    `attention_head_dim`; a config.json without `architectures` is recognised by model_type."""
    legacy = {
        "n_groups": "mamba_n_groups",
        "conv_kernel": "mamba_d_conv",
        "chunk_size": "mamba_chunk_size",
        "time_step_min": "mamba_dt_min",
        "head_dim": "attention_head_dim",
    }

    def edit(raw):
        del raw["layers_block_type"], raw["architectures"]
        raw["hybrid_override_pattern"] = PATTERNS[pair.name]
        for new, old in legacy.items():
            raw[old] = raw.pop(new)

    assert detect_with(pair.path, tmp_path, edit) == pair.llm.config


def test_latent_moe_quantized_int8(tmp_path_factory):
    """`--quantize int8`: the latent projections are Q8_0 linears beside the stacked Q8_0 experts and the
    shared experts; the decode step is one recorded plan; the logits stay close to the float model's
    (top-1 and KL: tiny random MoE models flip routing at near-ties); batched greedy equals each alone."""
    pair = _pair("latent", tmp_path_factory)
    llm = LLM(pair.path, cpu=True, dtype="float32", quantize="int8", max_num_seqs=8)
    for moe in (m for m in llm.model.modules() if isinstance(m, MoE)):
        kind = q8_packed.runs_as()  # the layout a GGUF's Q8_0 runs as here; the experts' stacks stay q8_0g
        assert isinstance(moe.latent_down, QuantizedLinear) and moe.latent_down.qweight.kind == kind
        assert isinstance(moe.latent_up, QuantizedLinear) and moe.latent_up.qweight.kind == kind
        assert moe.latent_down.bias is not None and moe.latent_up.bias is not None
        assert moe.experts.w_up is not None and moe.experts.w_up.kind == "q8_0g"
        assert moe.experts.w_up.in_features == 64
    assert not any(isinstance(m, torch.nn.Linear) for m in llm.model.modules()), "a linear left float"
    assert llm.runner.decode_plan is not None
    batch = prompts([40, 25], seed=6, vocab=llm.config.vocab_size)
    for got, want in zip(full_logits(llm.runner, batch), full_logits(pair.llm.runner, batch), strict=True):
        top1 = (got.argmax(-1) == want.argmax(-1)).float().mean()
        kl = F.kl_div(got.log_softmax(-1), want.log_softmax(-1), log_target=True, reduction="batchmean")
        assert top1 >= 0.75 and kl <= 0.05, (top1, kl)  # measured 0.85 / 0.016 (routing near-ties flip)
    check_batched_equals_alone(llm)


def test_latent_size_mismatch_names_the_tensor(tmp_path_factory, tmp_path):
    pair = _pair("latent", tmp_path_factory)
    with pytest.raises(CheckpointError, match=r"fc1_latent_proj.weight: expected 32 rows.*\[64, 128\]"):
        detect_with(pair.path, tmp_path, lambda raw: raw.update(moe_latent_size=32))
