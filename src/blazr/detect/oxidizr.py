"""oxidizr checkpoints (spec: shared/spec/oxidizr-format.md): names without a `model.` prefix, layers of kind
Mamba2, MLA+MoE, MLA+MLP or GQA+MLP in any order.

Layer kinds come from config.json `layer_types`, else the legacy `mamba_layers` list, else tensor names.
Every size is recovered from tensor shapes when config.json is missing or silent; what no shape carries
takes oxidizr's own defaults (rope θ 10000, RMSNorm eps 1e-5, Mamba2 n_groups 1 and chunk 256, dt limits
[0.001, 0.1]) — and experts_per_tok, which shapes cannot give, defaults to min(2, E // 2) (the trainer's
presets: nano-start E=2 k=1, nano E=4 k=2), with a warning. Config values that contradict a tensor are
caught by the loader with the tensor's name, expected and found shape.
"""

from __future__ import annotations

import logging
import math
import re

from blazr.config import (
    AttentionConfig,
    LayerConfig,
    Mamba2Config,
    MLAConfig,
    MLPConfig,
    ModelConfig,
    MoEConfig,
    NormConfig,
    RopeConfig,
)
from blazr.detect.checkpoint import Shapes
from blazr.detect.raw import Raw, guess_head_dim, layer_indices, shape_of
from blazr.errors import CheckpointError, UnsupportedError

log = logging.getLogger("blazr.detect")

_KINDS = {
    "mamba2": "mamba2",
    "mlawithmoe": "mla+moe",
    "mla_with_moe": "mla+moe",
    "mlawithmlp": "mla+mlp",
    "mla_with_mlp": "mla+mlp",
    "standard": "attention+mlp",
    "gqa": "attention+mlp",
    "attention": "attention+mlp",
}
_UNSUPPORTED = {"mamba", "mamba1", "mamba3"}

MAMBA_BLOCK_NORM = NormConfig("layer", 1e-6)


def _layer_kinds(raw: Raw, shapes: Shapes, num_layers: int) -> list[str]:
    types = raw.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != num_layers:
            raise CheckpointError(
                f"{raw.path}: layer_types must list {num_layers} layer kinds, found {types!r}"
            )
        kinds = []
        for i, t in enumerate(types):
            key = str(t).lower()
            if key in _UNSUPPORTED:
                raise UnsupportedError(
                    f"layer {i}: oxidizr layer kind {t!r} is not supported (Mamba2, MLA, GQA)"
                )
            if key not in _KINDS:
                raise CheckpointError(
                    f"{raw.path}: layer_types[{i}] = {t!r}; expected one of {sorted(_KINDS)}"
                )
            kinds.append(_KINDS[key])
        return kinds
    mamba_layers = raw.get("mamba_layers")
    if mamba_layers is not None:
        attn_kind = "mla+moe" if raw.get("kv_latent_dim") is not None else "attention+mlp"
        return ["mamba2" if i in set(mamba_layers) else attn_kind for i in range(num_layers)]
    return [_kind_from_names(shapes, i) for i in range(num_layers)]


def _kind_from_names(shapes: Shapes, i: int) -> str:
    p = f"layers.{i}."
    has = lambda part: any(n.startswith(p + part) for n in shapes)
    if has("mamba2."):
        return "mamba2"
    if has("mamba3.") or has("mamba."):
        raise UnsupportedError(
            f"layer {i}: Mamba1/Mamba3 oxidizr layers are not supported (Mamba2, MLA, GQA)"
        )
    if has("self_attn.w_dkv"):
        return "mla+moe" if has("moe.") else "mla+mlp"
    if has("self_attn.q_proj"):
        return "attention+mlp"
    raise CheckpointError(f"layer {i}: no mamba2.*, self_attn.w_dkv or self_attn.q_proj tensors under {p}")


def _require(shapes: Shapes, name: str) -> tuple[int, ...]:
    shape = shape_of(shapes, name)
    if shape is None:
        raise CheckpointError(f"missing tensor {name}")
    return shape


def _mamba(raw: Raw, shapes: Shapes, i: int, hidden: int) -> Mamba2Config:
    p = f"layers.{i}.mamba2.mixer."
    num_heads = raw.int("mamba2_num_heads", _require(shapes, p + "A_log")[0])
    conv = _require(shapes, p + "conv1d.weight")  # [Cd, 1, K]
    d_inner_norm = shape_of(shapes, p + "norm.weight")
    head_dim = raw.int("mamba2_head_dim")
    if head_dim is None:
        expand = raw.int("mamba2_expand")
        d_inner = d_inner_norm[0] if d_inner_norm else (hidden * expand if expand else None)
        if d_inner is None:
            raise CheckpointError(
                f"cannot determine mamba2_head_dim: not in config.json and {p}norm.weight is missing"
            )
        head_dim = d_inner // num_heads
    d_inner = num_heads * head_dim
    groups_x_state = (conv[0] - d_inner) // 2
    state = raw.int("mamba2_state_size")
    groups = raw.int("mamba2_n_groups")
    if state is None and groups is None:
        groups = 1
        log.info(
            "layer %d: mamba2_n_groups not in config.json; assuming 1 (state size %d)", i, groups_x_state
        )
    if state is None:
        state = groups_x_state // groups
    if groups is None:
        groups = max(groups_x_state // state, 1)
    return Mamba2Config(
        num_heads=num_heads,
        head_dim=head_dim,
        state_size=state,
        n_groups=groups,
        conv_kernel=raw.int("mamba2_conv_kernel", conv[2]),
        chunk_size=raw.int("mamba2_chunk_size", 256),
        has_in_proj_bias=p + "in_proj.bias" in shapes,
        has_out_proj_bias=p + "out_proj.bias" in shapes,
        has_conv_bias=p + "conv1d.bias" in shapes,
        dt_min=0.001,
        dt_max=0.1,
        has_gated_norm=True,
        norm_group_size=d_inner,
        is_norm_before_gate=False,
        norm_eps=1e-6,
    )


def _mla(raw: Raw, shapes: Shapes, i: int, rope_theta: float, max_pos: int) -> MLAConfig:
    p = f"layers.{i}.self_attn."
    kv_latent = raw.int("kv_latent_dim", _require(shapes, p + "w_dkv.weight")[0])
    q_latent = raw.int("q_latent_dim", _require(shapes, p + "w_dq.weight")[0])
    d_rope = raw.int("d_rope", _require(shapes, p + "w_kr.weight")[0])
    num_heads = raw.int(
        "num_attention_heads", raw.int("num_heads", _require(shapes, p + "w_qr.weight")[0] // d_rope)
    )
    head_dim = _require(shapes, p + "w_uq.weight")[0] // num_heads
    return MLAConfig(
        num_heads=num_heads,
        q_lora_rank=q_latent,
        kv_lora_rank=kv_latent,
        qk_nope_head_dim=head_dim,
        qk_rope_head_dim=d_rope,
        v_head_dim=head_dim,
        rope=RopeConfig(dim=d_rope, theta=rope_theta),
        softmax_scale=1.0 / math.sqrt(head_dim + d_rope),
        has_latent_norms=False,
        is_q_rope_from_hidden=True,
    )


def _moe(raw: Raw, shapes: Shapes, i: int) -> MoEConfig:
    p = f"layers.{i}.moe."
    pat = re.compile(re.escape(p) + r"experts\.(\d+)\.")
    found = {int(m.group(1)) for n in shapes if (m := pat.match(n))}
    num_experts = raw.int("num_experts", max(found) + 1 if found else None)
    if num_experts is None:
        raise CheckpointError(
            f"cannot determine num_experts: not in config.json and no {p}experts.N.* tensors"
        )
    intermediate = raw.int("intermediate_size", _require(shapes, p + "experts.0.gate_proj.weight")[0])
    top_k = raw.int("experts_per_tok")
    if top_k is None:
        top_k = max(1, min(2, num_experts // 2))
        log.warning("experts_per_tok is not in config.json (shapes cannot tell); assuming %d", top_k)
    shared = None
    if p + "shared_expert.gate_proj.weight" in shapes:
        shared = MLPConfig(intermediate_size=shapes[p + "shared_expert.gate_proj.weight"][0])
    return MoEConfig(
        num_experts=num_experts,
        top_k=top_k,
        expert=MLPConfig(intermediate_size=intermediate),
        scoring="softmax",
        is_renormalized=True,
        shared=shared,
    )


def _gqa(raw: Raw, shapes: Shapes, i: int, hidden: int, rope_theta: float) -> AttentionConfig:
    p = f"layers.{i}.self_attn."
    q = _require(shapes, p + "q_proj.weight")
    k = _require(shapes, p + "k_proj.weight")
    num_heads = raw.int("num_attention_heads", raw.int("num_heads"))
    if num_heads is None:
        head_dim = guess_head_dim(q[0], k[0], prefer=(64, 128, 32, 96, 80, 256, 16))
        num_heads = q[0] // head_dim
        log.warning(
            "num_attention_heads is not in config.json; assuming head_dim %d (%d heads)", head_dim, num_heads
        )
    head_dim = hidden // num_heads
    num_kv_heads = raw.int("num_kv_heads", raw.int("kv_heads", k[0] // head_dim))
    return AttentionConfig(
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rope=RopeConfig(dim=head_dim, theta=rope_theta),
        softmax_scale=head_dim**-0.5,
    )


def _mlp(raw: Raw, shapes: Shapes, i: int) -> MLPConfig:
    gate = _require(shapes, f"layers.{i}.mlp.gate_proj.weight")
    return MLPConfig(intermediate_size=gate[0])


def build_oxidizr(raw: Raw, shapes: Shapes) -> ModelConfig:
    embed = _require(shapes, "embed_tokens.weight")
    hidden = raw.int("hidden_size", embed[1])
    vocab = raw.int("vocab_size", embed[0])
    num_layers = raw.int("num_layers", len(layer_indices(shapes, "layers.")))
    if not num_layers:
        raise CheckpointError("no layers.N.* tensors found")
    rope_theta = raw.float("rope_theta", 10000.0)
    max_pos = raw.int("max_seq_len", 4096)
    rms = NormConfig("rms", raw.float("rms_norm_eps", 1e-5))
    layers = []
    for i, kind in enumerate(_layer_kinds(raw, shapes, num_layers)):
        if kind == "mamba2":
            layers.append(LayerConfig(mixers=(_mamba(raw, shapes, i, hidden),), norm=MAMBA_BLOCK_NORM))
        elif kind == "attention+mlp":
            attn = _gqa(raw, shapes, i, hidden, rope_theta)
            layers.append(LayerConfig(mixers=(attn,), mlp=_mlp(raw, shapes, i), norm=rms, ffn_norm=rms))
        else:
            mla = _mla(raw, shapes, i, rope_theta, max_pos)
            ffn = {"moe": _moe(raw, shapes, i)} if kind == "mla+moe" else {"mlp": _mlp(raw, shapes, i)}
            layers.append(LayerConfig(mixers=(mla,), norm=rms, ffn_norm=rms, **ffn))
    return ModelConfig(
        architecture="oxidizr",
        vocab_size=vocab,
        hidden_size=hidden,
        layers=tuple(layers),
        final_norm=rms,
        max_position_embeddings=max_pos,
        tie_word_embeddings=False,
    )


BUILDERS = {"oxidizr": build_oxidizr}
