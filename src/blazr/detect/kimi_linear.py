"""Kimi-Linear (`KimiLinearForCausalLM`) detection: Kimi Delta Attention layers (`self_attn.A_log`,
`b_proj`, …) interleaved with NoPE MLA layers (`self_attn.kv_a_proj_with_mqa`; the rope part of the keys is
kept but never rotated: RopeConfig scaling "none"), then a SwiGLU MLP (the first `first_k_dense_replace`
layers) or a DeepSeek-V3-style MoE (sigmoid scores, the correction bias for selection, groups by their top-2
sum, renormalised where `moe_renormalize` / `norm_topk_prob`, then × routed_scaling_factor; shared experts).

Which layer is which comes from its tensors (config.json's `layer_types`, or `linear_attn_config`'s 1-based
`kda_layers` / `full_attn_layers`, must agree). Sizes from config.json where present (moonshotai's keys —
`linear_attn_config`, `num_experts`, `num_experts_per_token`, `moe_renormalize`, `num_expert_group`,
`model_max_length` — or transformers' — `linear_head_dim`, `num_local_experts`, `num_experts_per_tok`,
`norm_topk_prob`, `n_group`), else from shapes: KDA heads from A_log [1, 1, H, 1], the head size from
dt_bias [H·Dh], the conv taps from q_conv1d [W, 1, K]; MLA sizes as DeepSeek's (q [H·(Dn + R), D], kv_a
[Lkv + R, D], kv_b [H·(Dn + Dv), Lkv], o [D, H·Dv]); experts from the router rows. What no shape carries
(top-k, the scaling factor) takes KimiLinearConfig's defaults with a warning.
"""

from __future__ import annotations

import logging
import math

from blazr.config import (
    KimiDeltaConfig,
    LayerConfig,
    MixerConfig,
    MLAConfig,
    MLPConfig,
    ModelConfig,
    MoEConfig,
    NormConfig,
    RopeConfig,
)
from blazr.detect.checkpoint import Shapes
from blazr.detect.raw import Raw, activation
from blazr.detect.ssm_common import check_silu, is_tied, layers_with, num_layers_of, require
from blazr.errors import CheckpointError, UnsupportedError

log = logging.getLogger("blazr.detect")

ARCH = "KimiLinearForCausalLM"
_PREFIX = "model.layers."
_LATENT_NORM_EPS = 1e-6  # HF builds kv_a_layernorm / q_a_layernorm with the default eps


def _sub(raw: Raw) -> Raw:
    """moonshotai's `linear_attn_config` (head_dim, num_heads, short_conv_kernel_size, the layer lists)."""
    sub = raw.get("linear_attn_config")
    return Raw(sub if isinstance(sub, dict) else {}, raw.path)


def _first_int(raw: Raw, *keys: str) -> int | None:
    return next((v for k in keys if (v := raw.int(k)) is not None), None)


def _layer_kinds(raw: Raw, shapes: Shapes, num_layers: int) -> list[str]:
    """Per layer "kda" or "mla" from the tensors, checked against config.json's lists where it has them."""
    mla = layers_with(shapes, _PREFIX, "self_attn.kv_a_proj_with_mqa.")
    kda = layers_with(shapes, _PREFIX, "self_attn.A_log")
    kinds = []
    for i in range(num_layers):
        if (i in mla) == (i in kda):
            raise CheckpointError(
                f"{_PREFIX}{i}.self_attn: expected either a KDA layer (A_log) or an MLA layer "
                f"(kv_a_proj_with_mqa), found {'both' if i in mla else 'neither'}"
            )
        kinds.append("mla" if i in mla else "kda")
    listed = raw.get("layer_types")
    sub = _sub(raw)
    if listed is None and sub.get("full_attn_layers") is not None:
        full = {int(n) - 1 for n in sub.get("full_attn_layers")}  # 1-based in moonshotai's config
        listed = ["full_attention" if i in full else "linear_attention" for i in range(num_layers)]
    if listed is not None:
        said = ["mla" if t == "full_attention" else "kda" for t in listed]
        if said != kinds:
            raise CheckpointError(f"{raw.path}: layer types {listed} disagree with the tensors' {kinds}")
    return kinds


def _kda(raw: Raw, shapes: Shapes, p: str) -> KimiDeltaConfig:
    sub = _sub(raw)
    a_log = require(shapes, p + "A_log")
    dt_bias = require(shapes, p + "dt_bias")
    heads = _first_int(sub, "num_heads") or _first_int(raw, "linear_num_heads") or math.prod(a_log)
    head_dim = _first_int(sub, "head_dim") or _first_int(raw, "linear_head_dim") or dt_bias[0] // heads
    conv = shapes.get(p + "q_conv1d.weight") or require(shapes, p + "conv1d.weight")
    kernel = (
        _first_int(sub, "short_conv_kernel_size") or _first_int(raw, "linear_conv_kernel_dim") or conv[-1]
    )
    cfg = KimiDeltaConfig(
        num_heads=heads, head_dim=head_dim, conv_kernel=kernel, norm_eps=raw.float("rms_norm_eps", 1e-5)
    )
    sizes = f"{heads} heads of {head_dim}"
    for name, found, want in (
        ("A_log", math.prod(a_log), heads),
        ("dt_bias", dt_bias, (cfg.width,)),
        ("o_proj.weight", require(shapes, p + "o_proj.weight")[1:], (cfg.width,)),
    ):
        if found != want:
            what = f"{list(want)} features" if isinstance(want, tuple) else f"{want} heads"
            raise CheckpointError(
                f"tensor {p}{name}: expected {what} ({sizes}), found {list(shapes[p + name])}"
            )
    return cfg


def _mla(raw: Raw, shapes: Shapes, p: str, max_pos: int) -> MLAConfig:
    if raw.get("attention_bias", False) or p + "kv_a_proj_with_mqa.bias" in shapes:
        raise UnsupportedError(f"{raw.path}: Kimi-Linear MLA with attention_bias is not supported")
    q_lora = shapes.get(p + "q_a_proj.weight")
    kv_lora = raw.int("kv_lora_rank", require(shapes, p + "kv_a_layernorm.weight")[0])
    rope_dim = raw.int("qk_rope_head_dim", require(shapes, p + "kv_a_proj_with_mqa.weight")[0] - kv_lora)
    q_rows = require(shapes, p + ("q_proj.weight" if q_lora is None else "q_b_proj.weight"))[0]
    kv_b_rows = require(shapes, p + "kv_b_proj.weight")[0]
    o_cols = require(shapes, p + "o_proj.weight")[1]
    heads = raw.int("num_attention_heads", (q_rows - kv_b_rows + o_cols) // rope_dim)
    v_dim = raw.int("v_head_dim", o_cols // heads)
    nope_dim = raw.int("qk_nope_head_dim", q_rows // heads - rope_dim)
    cfg = MLAConfig(
        num_heads=heads,
        q_lora_rank=None if q_lora is None else q_lora[0],
        kv_lora_rank=kv_lora,
        qk_nope_head_dim=nope_dim,
        qk_rope_head_dim=rope_dim,
        v_head_dim=v_dim,
        rope=RopeConfig(dim=rope_dim, scaling="none"),  # NoPE: the rope part passes unrotated
        softmax_scale=(nope_dim + rope_dim) ** -0.5,
        norm_eps=_LATENT_NORM_EPS,
    )
    if q_rows != heads * (nope_dim + rope_dim) or kv_b_rows != heads * (nope_dim + v_dim):
        raise CheckpointError(
            f"{p}q / kv_b_proj.weight: expected {heads * (nope_dim + rope_dim)} / "
            f"{heads * (nope_dim + v_dim)} rows for {heads} heads (nope {nope_dim}, rope {rope_dim}, "
            f"value {v_dim}), found {q_rows} / {kv_b_rows}"
        )
    return cfg


def _ffn_prefix(shapes: Shapes, p: str) -> str:
    """`block_sparse_moe.` or `mlp.`: where layer `p`'s feed-forward lives."""
    return p + ("mlp." if any(n.startswith(p + "mlp.") for n in shapes) else "block_sparse_moe.")


def _ffn(raw: Raw, shapes: Shapes, p: str) -> dict[str, MLPConfig | MoEConfig]:
    act = activation(raw.get("hidden_act", "silu"))
    m = _ffn_prefix(shapes, p)
    router = shapes.get(m + "gate.weight")
    if router is None:
        size = raw.int("intermediate_size", require(shapes, m + "gate_proj.weight")[0])
        return {"mlp": MLPConfig(intermediate_size=size, activation=act)}
    num_experts = _first_int(raw, "num_experts", "num_local_experts") or router[0]
    width = raw.int("moe_intermediate_size", require(shapes, m + "experts.0.w1.weight")[0])
    shared = shapes.get(m + "shared_experts.gate_proj.weight")
    top_k = _first_int(raw, "num_experts_per_token", "num_experts_per_tok")
    factor = raw.get("routed_scaling_factor")
    if top_k is None or factor is None:
        log.warning("top-k / routed_scaling_factor not in config.json (shapes cannot tell); assuming "
                    "KimiLinearConfig's defaults: 8, 2.446")  # fmt: skip
    top_k = min(top_k or 8, num_experts)
    renorm = raw.get("moe_renormalize", raw.get("norm_topk_prob", True))
    groups = _first_int(raw, "num_expert_group", "n_group") or 1
    topk_groups = raw.int("topk_group", 1) or 1
    if num_experts % groups or top_k > topk_groups * (num_experts // groups):
        raise CheckpointError(
            f"{raw.path}: {groups} expert groups, top-{topk_groups} groups cannot route top-{top_k} of "
            f"{num_experts} experts (groups must split the experts evenly and hold at least k of them)"
        )
    return {
        "moe": MoEConfig(
            num_experts=num_experts,
            top_k=top_k,
            expert=MLPConfig(intermediate_size=width, activation=act),
            scoring="sigmoid",
            is_renormalized=bool(renorm),
            routed_scaling_factor=float(factor if factor is not None else 2.446),
            num_groups=groups,
            topk_groups=topk_groups,
            group_score="top2_sum",
            has_correction_bias=m + "gate.e_score_correction_bias" in shapes,
            shared=None if shared is None else MLPConfig(intermediate_size=shared[0], activation=act),
        )
    }


def _check_supported(raw: Raw) -> None:
    """What moonshotai's config.json may switch that blazr (and transformers) do not run: MLA with rope,
    another router activation, multi-token-prediction layers."""
    if raw.get("mla_use_nope", True) is False:
        raise UnsupportedError(
            f"{raw.path}: mla_use_nope = false (rotary MLA) is not supported for Kimi-Linear"
        )
    act = raw.get("moe_router_activation_func", "sigmoid")
    if act != "sigmoid":
        raise UnsupportedError(
            f"{raw.path}: moe_router_activation_func = {act!r}; Kimi-Linear routes by sigmoid"
        )
    if raw.int("num_nextn_predict_layers", 0):
        log.info("%s: the multi-token-prediction layers are not loaded", raw.path)


def build_kimi_linear(raw: Raw, shapes: Shapes) -> ModelConfig:
    _check_supported(raw)
    vocab, hidden = require(shapes, "model.embed_tokens.weight")
    num_layers = num_layers_of(raw, shapes, _PREFIX)
    check_silu(raw, "hidden_act")
    max_pos = _first_int(raw, "model_max_length", "max_position_embeddings") or 1048576
    norm = NormConfig("rms", raw.float("rms_norm_eps", 1e-5))
    layers = []
    for i, kind in enumerate(_layer_kinds(raw, shapes, num_layers)):
        p = f"{_PREFIX}{i}."
        mixer: MixerConfig
        mixer = (
            _kda(raw, shapes, p + "self_attn.")
            if kind == "kda"
            else _mla(raw, shapes, p + "self_attn.", max_pos)
        )
        layers.append(LayerConfig(mixers=(mixer,), norm=norm, ffn_norm=norm, **_ffn(raw, shapes, p)))
    return ModelConfig(
        architecture=ARCH,
        vocab_size=raw.int("vocab_size", vocab),
        hidden_size=raw.int("hidden_size", hidden),
        layers=tuple(layers),
        final_norm=norm,
        max_position_embeddings=max_pos,
        tie_word_embeddings=is_tied(raw, shapes),
    )


BUILDERS = {ARCH: build_kimi_linear}
MODEL_TYPES = {"kimi_linear": ARCH}
NAME_RULES = [(lambda shapes: any(n.endswith(".self_attn.f_a_proj.weight") for n in shapes), ARCH)]
