"""Gemma 4 text detection (`Gemma4ForCausalLM`, and the language model of `Gemma4ForConditionalGeneration`:
its keys under `text_config`, its tensors under `model.language_model.`; vision and audio towers unread).

Over Gemma 3 (detect/gemma.py) it changes or adds, as transformers' modeling_gemma4.py does:
- plain RMSNorms (scale w, not 1 + w), and no query scalar: scores are q·k unscaled (softmax scale 1), the
  per-head q / k norms doing the scaling; values RMS-normed per head without weights;
- full layers with their own head size and KV heads (`per_layer_config` {layer: {head_dim,
  num_key_value_heads}}, or the older `global_head_dim` / `num_global_key_value_heads`), and with
  `attention_k_eq_v` no v projection there (values = the k projection's output, before its norm);
- proportional rope on the full layers (`rope_parameters.full_attention`: rope_type "proportional",
  partial_rotary_factor, θ 1e6 by default), default rope θ 1e4 on the sliding ones;
- KV shared across layers: the last `num_kv_shared_layers` layers have no k / v projections and read the
  cache of the last earlier layer of their type (sliding / full); `use_double_wide_mlp` doubles their MLP;
- per-layer input embeddings (`hidden_size_per_layer_input` P > 0; table `vocab_size_per_layer_input`);
- a learned output scalar per layer (`layer_scalar`), and the final-logit soft-cap;
- `enable_moe_block` (26B-A4B): every layer runs its MLP beside a MoE (`num_experts`, `top_k_experts`,
  `moe_intermediate_size`; softmax top-k renormalised, times `router.per_expert_scale`), each with its own
  post-norm; the experts read `pre_feedforward_layernorm_2` of the residual, the router its weightless
  RMSNorm times `router.scale` and hidden^-½.
The last layer is always a full one (transformers forces it so).
"""

from __future__ import annotations

from typing import Any

from blazr.config import (
    AttentionConfig,
    LayerConfig,
    MLPConfig,
    ModelConfig,
    MoEConfig,
    NormConfig,
    PerLayerInputConfig,
    RopeConfig,
)
from blazr.detect.checkpoint import Shapes
from blazr.detect.raw import Raw, activation, rope_from_raw
from blazr.detect.ssm_common import is_tied, require
from blazr.errors import CheckpointError, UnsupportedError

GEMMA4, GEMMA4_VL = "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"
PREFIXES = {GEMMA4: "model.", GEMMA4_VL: "model.language_model."}
SLIDING, FULL = "sliding_attention", "full_attention"
# transformers' default rope per layer type
DEFAULT_ROPE: dict[str, dict[str, Any]] = {
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
    FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}


def layer_types(raw: Raw, num_layers: int) -> list[str]:
    """The layer types: `layer_types`, else 5 sliding to 1 full; the last layer full either way."""
    kinds = raw.get("layer_types")
    if kinds is None:
        kinds = [FULL if (i + 1) % 6 == 0 else SLIDING for i in range(num_layers)]
    if (
        not isinstance(kinds, list)
        or len(kinds) != num_layers
        or any(k not in (SLIDING, FULL) for k in kinds)
    ):
        raise CheckpointError(
            f"{raw.path}: layer_types must list {num_layers} of sliding_attention / full_attention, "
            f"found {kinds!r}"
        )
    return [*kinds[:-1], FULL]


def kv_sources(kinds: list[str], num_shared: int) -> list[int | None]:
    """Per layer, the layer whose K / V it reads (None: its own): each of the last `num_shared` layers reads
    the last layer of its type before them (transformers' kv_sharing_modes)."""
    first = len(kinds) - num_shared
    if num_shared and (first <= 0 or set(kinds[first:]) - set(kinds[:first])):
        raise CheckpointError(
            f"num_kv_shared_layers {num_shared}: every shared layer needs an earlier layer of its type "
            f"among the first {first}"
        )
    last = {kind: i for i, kind in enumerate(kinds[:first])}
    return [None if i < first else last[kind] for i, kind in enumerate(kinds)]


def _rope(raw: Raw, kind: str, head_dim: int, max_pos: int) -> RopeConfig:
    params = raw.get("rope_parameters")
    p = params.get(kind) if isinstance(params, dict) and kind in params else DEFAULT_ROPE[kind]
    if not isinstance(p, dict):
        raise CheckpointError(f"{raw.path}: rope_parameters.{kind} must be an object, found {p!r}")
    if p.get("rope_type") == "proportional":
        return RopeConfig(
            dim=head_dim,
            theta=float(p.get("rope_theta", DEFAULT_ROPE[FULL]["rope_theta"])),
            scaling="proportional",
            factor=float(p.get("factor") or 1.0),
            proportion=float(p.get("partial_rotary_factor", 1.0)),
        )
    return rope_from_raw(Raw({"rope_parameters": {"rope_theta": 10_000.0, **p}}, raw.path), head_dim, max_pos)


def _full_layer_overrides(raw: Raw, i: int) -> dict[str, Any]:
    """A full layer's head size and KV heads: `per_layer_config` (transformers ≥ 5.2), else
    `global_head_dim` (default 512) and, with attention_k_eq_v, `num_global_key_value_heads`."""
    per_layer = raw.get("per_layer_config")
    if isinstance(per_layer, dict):
        found = per_layer.get(str(i), per_layer.get(i, {}))
        return dict(found) if isinstance(found, dict) else {}
    out: dict[str, Any] = {"head_dim": raw.int("global_head_dim", 512)}
    if raw.get("attention_k_eq_v", False) and raw.int("num_global_key_value_heads") is not None:
        out["num_key_value_heads"] = raw.int("num_global_key_value_heads")
    return out


def _attention(
    raw: Raw, shapes: Shapes, attn: str, i: int, kind: str, source: int | None, norm: NormConfig, max_pos: int
) -> AttentionConfig:
    heads = raw.int("num_attention_heads", 8) or 8
    head_dim, kv_heads = raw.int("head_dim", 256) or 256, raw.int("num_key_value_heads", 4) or 4
    if kind == FULL:
        over = _full_layer_overrides(raw, i)
        head_dim = int(over.get("head_dim", head_dim))
        kv_heads = int(over.get("num_key_value_heads", kv_heads))
    is_v_from_k = bool(raw.get("attention_k_eq_v", False)) and kind == FULL
    hidden = raw.int("hidden_size", 0) or 0
    expected = {"q_proj": (heads * head_dim, hidden), "q_norm": (head_dim,)}
    if source is None:
        expected |= {"k_proj": (kv_heads * head_dim, hidden), "k_norm": (head_dim,)}
        if not is_v_from_k:
            expected["v_proj"] = (kv_heads * head_dim, hidden)
    for name, want in expected.items():
        found = require(shapes, f"{attn}{name}.weight")
        if tuple(found) != want:
            raise CheckpointError(f"tensor {attn}{name}.weight: expected {list(want)}, found {list(found)}")
    if is_v_from_k and source is None and f"{attn}v_proj.weight" in shapes:
        raise CheckpointError(
            f"tensor {attn}v_proj.weight: present, but attention_k_eq_v says values are keys"
        )
    bias = bool(raw.get("attention_bias", False))
    return AttentionConfig(
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rope=_rope(raw, kind, head_dim, max_pos),
        softmax_scale=1.0,
        has_qkv_bias=bias,
        has_o_bias=bias,
        sliding_window=raw.int("sliding_window", 512) if kind == SLIDING else None,
        qk_norm=norm,
        is_qk_norm_per_head=True,
        kv_source=source,
        is_v_from_k=is_v_from_k,
        has_v_norm=True,
    )


def _moe(raw: Raw, act: str, norm: NormConfig) -> MoEConfig:
    """Every layer's MoE beside its MLP: softmax top-k renormalised, times a learned scale per expert; the
    experts and the router read the residual through their own norms (MoEConfig.input_norm)."""
    num, k, width = raw.int("num_experts"), raw.int("top_k_experts"), raw.int("moe_intermediate_size")
    if not (num and k and width):
        raise CheckpointError(
            f"{raw.path}: enable_moe_block needs num_experts, top_k_experts and moe_intermediate_size"
        )
    expert = MLPConfig(intermediate_size=width, activation=act)
    return MoEConfig(num_experts=num, top_k=k, expert=expert, input_norm=norm, has_expert_scale=True)


def _check_experts(shapes: Shapes, lp: str, moe: MoEConfig, hidden: int) -> None:
    E, I = moe.num_experts, moe.expert.intermediate_size
    for name, want in (
        ("experts.gate_up_proj", (E, 2 * I, hidden)),
        ("experts.down_proj", (E, hidden, I)),
        ("router.proj.weight", (E, hidden)),
        ("router.per_expert_scale", (E,)),
    ):
        found = require(shapes, lp + name)
        if tuple(found) != want:
            raise CheckpointError(f"tensor {lp}{name}: expected {list(want)}, found {list(found)}")


def build_gemma4(raw: Raw, shapes: Shapes, arch: str) -> ModelConfig:
    if arch == GEMMA4_VL:
        text = raw.get("text_config")
        if not isinstance(text, dict):
            raise CheckpointError(f"{raw.path}: a Gemma4ForConditionalGeneration config needs a text_config")
        raw = Raw(text, raw.path)
    if not raw.data:
        raise UnsupportedError(
            "Gemma 4 needs its config.json (shared KV layers and head sizes are not in names)"
        )
    if raw.get("use_bidirectional_attention") == "all":
        raise UnsupportedError(f"{raw.path}: use_bidirectional_attention 'all' (an encoder) is not supported")
    prefix = PREFIXES[arch]
    vocab, hidden = require(shapes, prefix + "embed_tokens.weight")
    raw = Raw({**raw.data, "hidden_size": raw.int("hidden_size", hidden)}, raw.path)
    hidden = raw.int("hidden_size", hidden) or hidden
    num_layers = raw.int("num_hidden_layers", 30) or 30
    max_pos = raw.int("max_position_embeddings", 131072) or 131072
    norm = NormConfig("rms", raw.float("rms_norm_eps", 1e-6))
    act = activation(raw.get("hidden_activation") or "gelu_pytorch_tanh")
    kinds = layer_types(raw, num_layers)
    sources = kv_sources(kinds, raw.int("num_kv_shared_layers", 0) or 0)
    width = raw.int("intermediate_size", 9216) or 9216
    is_double_wide = bool(raw.get("use_double_wide_mlp", False))
    moe = _moe(raw, act, norm) if raw.get("enable_moe_block", False) else None
    layers = []
    for i, (kind, source) in enumerate(zip(kinds, sources, strict=True)):
        lp = f"{prefix}layers.{i}."
        attention = _attention(raw, shapes, lp + "self_attn.", i, kind, source, norm, max_pos)
        mlp = MLPConfig(
            intermediate_size=width * (2 if is_double_wide and source is not None else 1), activation=act
        )
        found = require(shapes, lp + "mlp.gate_proj.weight")
        if found[0] != mlp.intermediate_size:
            raise CheckpointError(
                f"tensor {lp}mlp.gate_proj.weight: expected {mlp.intermediate_size} rows, found {found[0]}"
            )
        if moe is not None:
            _check_experts(shapes, lp, moe, hidden)
        layers.append(
            LayerConfig(
                mixers=(attention,),
                mlp=mlp,
                moe=moe,
                norm=norm,
                ffn_norm=norm,
                post_norm=norm,
                ffn_post_norm=norm,
                has_output_scale=lp + "layer_scalar" in shapes,
                mlp_post_norm=norm if moe is not None else None,
                moe_post_norm=norm if moe is not None else None,
            )
        )
    per_layer = None
    size = raw.int("hidden_size_per_layer_input", 256) or 0
    if size:
        table = require(shapes, prefix + "embed_tokens_per_layer.weight")
        if table[1] != num_layers * size:
            raise CheckpointError(
                f"tensor {prefix}embed_tokens_per_layer.weight: expected {num_layers * size} columns "
                f"({num_layers} layers × {size}), found {table[1]}"
            )
        per_layer = PerLayerInputConfig(
            size=size,
            vocab_size=raw.int("vocab_size_per_layer_input", table[0]) or table[0],
            activation=act,
            norm=norm,
        )
    softcap = raw.get("final_logit_softcapping")
    return ModelConfig(
        architecture=arch,
        vocab_size=raw.int("vocab_size", vocab) or vocab,
        hidden_size=hidden,
        layers=tuple(layers),
        final_norm=norm,
        max_position_embeddings=max_pos,
        tie_word_embeddings=is_tied(raw, shapes),  # lm_head.weight: either model's untied head
        embedding_multiplier=hidden**0.5,
        is_embedding_multiplier_rounded=True,
        final_logit_softcap=float(softcap) if softcap else None,
        per_layer_input=per_layer,
    )


BUILDERS = {arch: (lambda raw, shapes, a=arch: build_gemma4(raw, shapes, a)) for arch in (GEMMA4, GEMMA4_VL)}
MODEL_TYPES = {"gemma4_text": GEMMA4, "gemma4": GEMMA4_VL}
NAME_RULES = [
    (lambda shapes: "model.language_model.layers.0.layer_scalar" in shapes, GEMMA4_VL),
    (lambda shapes: "model.layers.0.layer_scalar" in shapes, GEMMA4),
]
