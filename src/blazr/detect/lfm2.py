"""HF `Lfm2ForCausalLM` (LFM2, LFM2.5) and `Lfm2MoeForCausalLM` (LFM2-MoE) detection: each layer holds a
gated short conv (`conv.`) or GQA attention with per-head q / k RMSNorm and rope (`self_attn.`), then a
SwiGLU `feed_forward` (`w1` gate, `w3` up, `w2` down) — in LFM2-MoE, after its first `num_dense_layers`, a
sigmoid-routed MoE whose `expert_bias` steers the choice only (blazr's correction bias). Norms
`operator_norm`, `ffn_norm`, final `embedding_norm`, all with `norm_eps`.

Layer kinds: `layer_types` ("conv" / "full_attention"), else `full_attn_idxs`, else which of `conv.` /
`self_attn.` each layer holds. config.json keys: norm_eps (legacy block_norm_eps), conv_L_cache, conv_bias,
rope_theta / rope_parameters (default θ 1e6), max_position_embeddings, num_attention_heads,
num_key_value_heads, tie_word_embeddings (legacy tie_embedding); MoE: num_experts, num_experts_per_tok,
norm_topk_prob, routed_scaling_factor, num_dense_layers. The MLP width is the w1 tensor's (config.json's
intermediate_size is adjusted by `block_auto_adjust_ff_dim` before use). transformers renormalises the
chosen sigmoid scores with +1e-6 in the denominator, blazr with +1e-20: a relative difference of ~1e-6.
"""

from __future__ import annotations

from dataclasses import replace

from blazr.config import (
    LayerConfig,
    MixerConfig,
    MLPConfig,
    ModelConfig,
    MoEConfig,
    NormConfig,
    RopeConfig,
    ShortConvConfig,
)
from blazr.detect.checkpoint import Shapes
from blazr.detect.raw import Raw, activation, rope_from_raw
from blazr.detect.ssm_common import attention_config, has_prefix, layers_with, num_layers_of, require
from blazr.errors import CheckpointError

ARCH = "Lfm2ForCausalLM"
MOE_ARCH = "Lfm2MoeForCausalLM"
PREFIX = "model."
_THETA = 1_000_000.0  # transformers' LFM2 default


def _is_attention(raw: Raw, shapes: Shapes, num_layers: int) -> list[bool]:
    types = raw.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != num_layers:
            raise CheckpointError(
                f"{raw.path}: layer_types must list {num_layers} layer types, found {types!r}"
            )
        bad = [t for t in types if t not in ("conv", "full_attention", "attention")]
        if bad:
            raise CheckpointError(f"{raw.path}: layer_types: {bad[0]!r}; expected conv or full_attention")
        return [t != "conv" for t in types]
    idxs = raw.get("full_attn_idxs")
    if idxs is not None:
        if not isinstance(idxs, list) or any(not isinstance(i, int) or not 0 <= i < num_layers for i in idxs):
            raise CheckpointError(
                f"{raw.path}: full_attn_idxs must list indices below {num_layers}, found {idxs!r}"
            )
        return [i in idxs for i in range(num_layers)]
    kinds = []
    for i in range(num_layers):
        p = f"{PREFIX}layers.{i}."
        if not has_prefix(shapes, p + "conv.") and not has_prefix(shapes, p + "self_attn."):
            raise CheckpointError(f"layer {i}: no {p}conv.* or {p}self_attn.* tensors")
        kinds.append(has_prefix(shapes, p + "self_attn."))
    return kinds


def _moe(raw: Raw, shapes: Shapes, p: str) -> MoEConfig:
    num_experts = raw.int("num_experts") or require(shapes, p + "gate.weight")[0]
    width = raw.int("moe_intermediate_size") or require(shapes, p + "experts.0.w1.weight")[0]
    return MoEConfig(
        num_experts=num_experts,
        top_k=raw.int("num_experts_per_tok", 4),
        expert=MLPConfig(width, activation(raw.get("hidden_act", "silu"))),
        scoring="sigmoid",
        is_renormalized=bool(raw.get("norm_topk_prob", True)),
        routed_scaling_factor=raw.float("routed_scaling_factor", 1.0),
        has_correction_bias=p + "expert_bias" in shapes,
    )


def build_lfm2(raw: Raw, shapes: Shapes, arch: str = ARCH) -> ModelConfig:
    vocab, hidden = require(shapes, PREFIX + "embed_tokens.weight")
    num_layers = num_layers_of(raw, shapes, PREFIX + "layers.")
    is_attention = _is_attention(raw, shapes, num_layers)
    norm = NormConfig("rms", raw.float("norm_eps", raw.float("block_norm_eps", 1e-5)))
    max_pos = raw.int("max_position_embeddings", 128_000)
    rope_raw = Raw({**raw.data, "rope_theta": raw.get("rope_theta", _THETA)}, raw.path)

    def rope(head_dim: int) -> RopeConfig:
        return rope_from_raw(rope_raw, head_dim, max_pos)

    num_dense = raw.int("num_dense_layers", 0) if arch == MOE_ARCH else num_layers
    layers = []
    for i, is_attn in enumerate(is_attention):
        p = f"{PREFIX}layers.{i}."
        if is_attn:
            attn = attention_config(raw, shapes, p + "self_attn.", rope)
            mixer: MixerConfig = replace(
                attn,
                has_o_bias=p + "self_attn.out_proj.bias" in shapes,
                qk_norm=NormConfig(eps=norm.eps),  # per head, before rope
            )
        else:
            conv = require(shapes, p + "conv.conv.weight")  # [W, 1, L]
            mixer = ShortConvConfig(
                width=conv[0],
                conv_kernel=raw.int("conv_L_cache", conv[2]),
                has_bias=p + "conv.in_proj.bias" in shapes,
            )
        if i < num_dense or not has_prefix(shapes, p + "feed_forward.gate."):
            mlp = MLPConfig(
                require(shapes, p + "feed_forward.w1.weight")[0], activation(raw.get("hidden_act", "silu"))
            )
            layers.append(LayerConfig(mixers=(mixer,), mlp=mlp, norm=norm, ffn_norm=norm))
        else:
            layers.append(
                LayerConfig(
                    mixers=(mixer,), moe=_moe(raw, shapes, p + "feed_forward."), norm=norm, ffn_norm=norm
                )
            )
    tied = raw.get("tie_word_embeddings", raw.get("tie_embedding"))
    return ModelConfig(
        architecture=arch,
        vocab_size=raw.int("vocab_size", vocab),
        hidden_size=raw.int("hidden_size", hidden),
        layers=tuple(layers),
        final_norm=norm,
        max_position_embeddings=max_pos,
        tie_word_embeddings="lm_head.weight" not in shapes if tied is None else bool(tied),
    )


def _is_lfm2(shapes: Shapes) -> bool:
    return (
        bool(layers_with(shapes, PREFIX + "layers.", "conv.in_proj."))
        and PREFIX + "embedding_norm.weight" in shapes
    )


def _is_lfm2_moe(shapes: Shapes) -> bool:
    return _is_lfm2(shapes) and bool(layers_with(shapes, PREFIX + "layers.", "feed_forward.gate."))


BUILDERS = {ARCH: build_lfm2, MOE_ARCH: lambda raw, shapes: build_lfm2(raw, shapes, MOE_ARCH)}
MODEL_TYPES = {"lfm2": ARCH, "lfm2_moe": MOE_ARCH}
NAME_RULES = [(_is_lfm2_moe, MOE_ARCH), (_is_lfm2, ARCH)]
