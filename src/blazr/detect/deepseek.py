"""DeepSeek-V2 / V3 detection: MLA in every layer; a dense SwiGLU MLP in the first `first_k_dense_replace`
layers (and, in DeepSeek's own code, off the `moe_layer_freq` stride), routed experts + shared experts in
the rest. From HF config keys (transformers v4 `rope_theta`/`rope_scaling` or v5 `rope_parameters`) or from
tensor shapes alone.

Sizes from shapes (layer 0 attention; H heads, Dn/R/Dv nope/rope/value head dims, Lq/Lkv ranks):
  kv_a_proj_with_mqa [Lkv + R, D], kv_a_layernorm [Lkv] → Lkv, R;  q_a_proj [Lq, D] → Lq (q_proj → None);
  q rows H·(Dn + R), kv_b_proj rows H·(Dn + Dv), o_proj cols H·Dv → H = (q − kv_b + o) / R, Dv, Dn;
  experts from the router rows, expert / shared / dense widths from their gate_proj rows, the dense layers
  from which layers lack `mlp.gate.weight`. MTP layers (`eh_proj`, past the last decoder layer) are skipped.

Routing follows DeepSeek's reference code (HF agrees for every released checkpoint):
- V2: softmax; `topk_method` greedy, or group_limited_greedy (groups scored by their max); when
  `norm_topk_prob` (and k > 1) the k weights are renormalised and NOT scaled, else scaled by
  `routed_scaling_factor`. (HF v5 ignores `norm_topk_prob` for V2 and always scales.)
- V3: sigmoid + `e_score_correction_bias` for selection; groups scored by their top-2 sum; renormalised
  when `norm_topk_prob` (and k > 1), then always scaled.
Attention: softmax_scale = (Dn + R)^-0.5, times mscale(factor, mscale_all_dim)² under a scaled rope with
`mscale_all_dim` (YaRN); the rope's cos/sin carry mscale / mscale_all_dim. DeepSeek rotates interleaved
pairs (V2 always, V3 when `rope_interleave`, the default); the name map permutes those rows to blazr's
half-split layout at load.

What no shape carries takes the HF defaults of each version (k: 6 for V2 as in V2/V2-Lite, 8 for V3;
routed_scaling_factor 1.0 / 2.5; norm_topk_prob False / True; no group limit; rope θ 10000 unscaled;
RMSNorm eps 1e-6), with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from blazr.config import LayerConfig, MLAConfig, MLPConfig, ModelConfig, MoEConfig, NormConfig
from blazr.detect.checkpoint import Shapes
from blazr.detect.raw import Raw, activation, layer_indices, need, rope_from_raw, shape_of, yarn_mscale
from blazr.errors import CheckpointError, UnsupportedError

log = logging.getLogger("blazr.detect")

V2, V3 = "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"
_PREFIX = "model.layers."
_LATENT_NORM_EPS = 1e-6  # HF and DeepSeek build q_a_layernorm / kv_a_layernorm with the default eps


@dataclass(frozen=True)
class _Defaults:
    """HF config defaults of one DeepSeek version, for what no tensor shape carries."""

    num_experts_per_tok: int
    routed_scaling_factor: float
    norm_topk_prob: bool
    scoring_func: str
    max_position_embeddings: int


_DEFAULTS = {
    V2: _Defaults(6, 1.0, False, "softmax", 2048),
    V3: _Defaults(8, 2.5, True, "sigmoid", 4096),
}


def _dim0(shapes: Shapes, name: str) -> int | None:
    shape = shape_of(shapes, name)
    return None if shape is None else shape[0]


def _size(raw: Raw, key: str, infer: Callable[[], int | None], how: str) -> int:
    """config.json's `key`, else `infer()` from shapes, else a one-line error saying what was missing."""
    value = raw.int(key)
    return value if value is not None else need(infer(), key, how)


def _num_layers(raw: Raw, shapes: Shapes) -> int:
    def decoder_layers() -> int | None:
        found = layer_indices(shapes, _PREFIX)
        return len([i for i in found if f"{_PREFIX}{i}.eh_proj.weight" not in shapes]) or None

    return _size(raw, "num_hidden_layers", decoder_layers, f"no {_PREFIX}N.* tensors were found")


def _mla(raw: Raw, shapes: Shapes, arch: str, max_pos: int) -> MLAConfig:
    a = f"{_PREFIX}0.self_attn."
    if raw.get("attention_bias", False) or f"{a}kv_a_proj_with_mqa.bias" in shapes:
        raise UnsupportedError(f"{raw.path}: DeepSeek MLA with attention_bias is not supported")
    # explicit null → q_proj (DeepSeek-V2-Lite); no key → whichever the checkpoint holds
    has_key = "q_lora_rank" in raw.data
    q_lora = raw.int("q_lora_rank") if has_key else _dim0(shapes, a + "q_a_proj.weight")
    kv_lora = _size(
        raw,
        "kv_lora_rank",
        lambda: _dim0(shapes, a + "kv_a_layernorm.weight"),
        f"{a}kv_a_layernorm.weight is missing",
    )
    kv_a_rows = _dim0(shapes, a + "kv_a_proj_with_mqa.weight")  # Lkv + R
    rope_dim = _size(
        raw,
        "qk_rope_head_dim",
        lambda: kv_a_rows - kv_lora if kv_a_rows else None,
        f"{a}kv_a_proj_with_mqa.weight is missing",
    )
    q_name = a + ("q_proj.weight" if q_lora is None else "q_b_proj.weight")
    q_rows = _dim0(shapes, q_name)  # H·(Dn + R)
    kv_b_rows = _dim0(shapes, a + "kv_b_proj.weight")  # H·(Dn + Dv)
    o_proj = shape_of(shapes, a + "o_proj.weight")  # [D, H·Dv]
    is_known = q_rows is not None and kv_b_rows is not None and o_proj is not None
    how = f"{q_name}, {a}kv_b_proj.weight or {a}o_proj.weight is missing"
    num_heads = _size(
        raw,
        "num_attention_heads",
        lambda: (q_rows - kv_b_rows + o_proj[1]) // rope_dim if is_known else None,
        how,
    )
    v_dim = _size(raw, "v_head_dim", lambda: o_proj[1] // num_heads if o_proj else None, how)
    nope_dim = _size(raw, "qk_nope_head_dim", lambda: q_rows // num_heads - rope_dim if q_rows else None, how)
    rope = rope_from_raw(raw, rope_dim, max_pos)
    scale = (nope_dim + rope_dim) ** -0.5
    mscale_all_dim = _rope_parameters(raw).get("mscale_all_dim")
    if rope.scaling != "default" and mscale_all_dim:
        scale *= yarn_mscale(rope.factor, float(mscale_all_dim)) ** 2
    return MLAConfig(
        num_heads=num_heads,
        q_lora_rank=q_lora,
        kv_lora_rank=kv_lora,
        qk_nope_head_dim=nope_dim,
        qk_rope_head_dim=rope_dim,
        v_head_dim=v_dim,
        rope=rope,
        softmax_scale=scale,
        has_latent_norms=True,
        is_rope_interleaved=arch != V3 or bool(raw.get("rope_interleave", True)),
        norm_eps=_LATENT_NORM_EPS,
    )


def _rope_parameters(raw: Raw) -> dict[str, object]:
    """v5 `rope_parameters` merged with v4 `rope_scaling` (the same merge `rope_from_raw` does)."""
    params, scaling = raw.get("rope_parameters") or {}, raw.get("rope_scaling") or {}
    return {**params, **scaling} if isinstance(params, dict) and isinstance(scaling, dict) else {}


def _is_moe_layer(raw: Raw, shapes: Shapes, num_layers: int) -> list[bool]:
    """Which layers hold routed experts: DeepSeek's rule when config.json gives first_k_dense_replace,
    else the layers whose router tensor exists."""
    if "n_routed_experts" in raw.data and not raw.int("n_routed_experts"):
        return [False] * num_layers  # DeepSeek's code: no routed experts → a dense model
    first = raw.int("first_k_dense_replace")
    if first is None:
        return [f"{_PREFIX}{i}.mlp.gate.weight" in shapes for i in range(num_layers)]
    freq = raw.int("moe_layer_freq", 1) or 1
    return [i >= first and i % freq == 0 for i in range(num_layers)]


def _dense_mlp(raw: Raw, shapes: Shapes, i: int) -> MLPConfig:
    m = f"{_PREFIX}{i}.mlp."
    intermediate = _size(
        raw,
        "intermediate_size",
        lambda: _dim0(shapes, m + "gate_proj.weight"),
        f"{m}gate_proj.weight is missing",
    )
    return MLPConfig(intermediate_size=intermediate, activation=activation(raw.get("hidden_act", "silu")))


def _expert_width(shapes: Shapes, m: str) -> int | None:
    gate = _dim0(shapes, m + "experts.0.gate_proj.weight")
    fused = shape_of(shapes, m + "experts.gate_up_proj")  # [E, 2I, D] (transformers v5 in-memory layout)
    return gate if gate is not None else (fused[1] // 2 if fused else None)


def _moe(raw: Raw, shapes: Shapes, arch: str, i: int) -> MoEConfig:
    m = f"{_PREFIX}{i}.mlp."
    defaults = _DEFAULTS[arch]
    num_experts = _size(
        raw, "n_routed_experts", lambda: _dim0(shapes, m + "gate.weight"), f"{m}gate.weight is missing"
    )
    width = _size(
        raw, "moe_intermediate_size", lambda: _expert_width(shapes, m), f"{m}experts.0.* are missing"
    )
    act = activation(raw.get("hidden_act", "silu"))
    if "n_shared_experts" in raw.data:
        num_shared = raw.int("n_shared_experts") or 0
        shared = MLPConfig(width * num_shared, act) if num_shared else None
    else:
        shared_width = _dim0(shapes, m + "shared_experts.gate_proj.weight")
        shared = MLPConfig(shared_width, act) if shared_width else None
    assumed = [
        k for k in ("num_experts_per_tok", "routed_scaling_factor", "norm_topk_prob") if k not in raw.data
    ]
    if assumed:
        log.warning(
            "%s not in config.json (shapes cannot tell); assuming %s's defaults: %s",
            ", ".join(assumed),
            arch,
            ", ".join(f"{k}={getattr(defaults, k)}" for k in assumed),
        )
    top_k = raw.int("num_experts_per_tok") or min(defaults.num_experts_per_tok, num_experts)
    factor = raw.float("routed_scaling_factor", defaults.routed_scaling_factor)
    is_renormalized = bool(raw.get("norm_topk_prob", defaults.norm_topk_prob)) and top_k > 1
    scoring = raw.get("scoring_func", defaults.scoring_func)
    if scoring not in ("softmax", "sigmoid"):
        raise UnsupportedError(f"{raw.path}: scoring_func {scoring!r} is not supported (softmax, sigmoid)")
    num_groups, topk_groups = 1, 1
    if arch == V2:
        method = raw.get("topk_method", "greedy")
        if method == "group_limited_greedy":
            num_groups, topk_groups = raw.int("n_group", 1), raw.int("topk_group", 1)
        elif method != "greedy":
            raise UnsupportedError(
                f"{raw.path}: topk_method {method!r} is not supported for DeepSeek-V2 "
                "(greedy, group_limited_greedy)"
            )
        if is_renormalized:
            factor = 1.0  # DeepSeek-V2's gate scales only weights it does not renormalise
    else:
        num_groups, topk_groups = raw.int("n_group", 1), raw.int("topk_group", 1)
    if num_experts % num_groups or top_k > topk_groups * (num_experts // num_groups):
        raise CheckpointError(
            f"{raw.path}: n_group={num_groups}, topk_group={topk_groups} cannot route top-{top_k} of "
            f"{num_experts} experts (groups must split the experts evenly and hold at least k of them)"
        )
    return MoEConfig(
        num_experts=num_experts,
        top_k=top_k,
        expert=MLPConfig(width, act),
        scoring=scoring,
        is_renormalized=is_renormalized,
        routed_scaling_factor=factor,
        num_groups=num_groups,
        topk_groups=topk_groups,
        group_score="max" if arch == V2 else "top2_sum",
        has_correction_bias=arch == V3 and f"{m}gate.e_score_correction_bias" in shapes,
        shared=shared,
    )


def build_deepseek(raw: Raw, shapes: Shapes, arch: str) -> ModelConfig:
    scaled = next((n for n in shapes if n.endswith(".weight_scale_inv")), None)
    if scaled is not None:  # DeepSeek-V3/R1 as released: FP8 weights with 128×128 block scales
        raise UnsupportedError(
            f"{scaled}: FP8 block-quantized weights are not supported; use a bfloat16 conversion"
        )
    embed = shape_of(shapes, "model.embed_tokens.weight")
    if embed is None:
        raise CheckpointError("missing tensor model.embed_tokens.weight")
    vocab, hidden = raw.int("vocab_size", embed[0]), raw.int("hidden_size", embed[1])
    num_layers = _num_layers(raw, shapes)
    max_pos = raw.int("max_position_embeddings", _DEFAULTS[arch].max_position_embeddings)
    mla = _mla(raw, shapes, arch, max_pos)
    norm = NormConfig("rms", raw.float("rms_norm_eps", 1e-6))
    is_moe = _is_moe_layer(raw, shapes, num_layers)
    moe = _moe(raw, shapes, arch, is_moe.index(True)) if any(is_moe) else None
    mlp = _dense_mlp(raw, shapes, is_moe.index(False)) if not all(is_moe) else None
    layers = tuple(
        LayerConfig(mixers=(mla,), moe=moe, norm=norm, ffn_norm=norm)
        if flag
        else LayerConfig(mixers=(mla,), mlp=mlp, norm=norm, ffn_norm=norm)
        for flag in is_moe
    )
    tied = raw.get("tie_word_embeddings")
    if tied is None:
        tied = "lm_head.weight" not in shapes
    return ModelConfig(
        architecture=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        layers=layers,
        final_norm=norm,
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(tied),
    )


def _has(part: str) -> Callable[[Shapes], bool]:
    return lambda shapes: any(part in n for n in shapes)


BUILDERS = {
    V2: lambda raw, shapes: build_deepseek(raw, shapes, V2),
    V3: lambda raw, shapes: build_deepseek(raw, shapes, V3),
}
MODEL_TYPES = {"deepseek_v2": V2, "deepseek_v3": V3}
# V3's router carries the selection bias; an MLA checkpoint without one is V2 (same math when dense). MLA
# beside linear-attention layers (`self_attn.A_log`) is Kimi-Linear's (detect/kimi_linear.py).


def _is_mla(shapes: Shapes) -> bool:
    return _has(".self_attn.kv_a_proj_with_mqa.")(shapes) and not _has(".self_attn.A_log")(shapes)


NAME_RULES = [
    (lambda shapes: _is_mla(shapes) and _has(".mlp.gate.e_score_correction_bias")(shapes), V3),
    (_is_mla, V2),
]
