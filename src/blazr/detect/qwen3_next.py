"""Qwen3-Next (`Qwen3NextForCausalLM`) and Qwen3.5 / 3.6 dense and MoE (`Qwen3_5ForCausalLM`,
`Qwen3_5MoeForCausalLM`, and the text model of `Qwen3_5[Moe]ForConditionalGeneration`) detection.

Layers ("linear_attention" / "full_attention" in `layer_types`, else every `full_attention_interval`-th — 4 —
is attention): gated DeltaNet (`linear_attn.*`) or gated attention (`self_attn.*`: q_proj emits [q_h; gate_h]
per head, per-head q/k RMSNorm, partial rope — `partial_rotary_factor`, 0.25 by default; Qwen3.5's
interleaved mRoPE is plain rope for text, whose three position rows are equal); then a SwiGLU MLP or a MoE
(softmax top-k, renormalised where `norm_topk_prob`, with a shared expert gated by
sigmoid(shared_expert_gate)) on the layers that hold a router (Qwen3-Next: by decoder_sparse_step and
mlp_only_layers; Qwen3.5-MoE: all).
Every RMSNorm but DeltaNet's gated one scales by (1 + w) (NormConfig.weight_offset = 1).

The `…ForConditionalGeneration` checkpoints hold the language model under `model.language_model.` and its
config under `text_config`; the vision tower (`model.visual.*`) is left unread (one log line).
Without config.json, sizes come from the tensors (heads from the per-head q_norm [Dh], DeltaNet value heads
from A_log [Hv], widths from the projections); the DeltaNet key head size takes HF's default, 128.
"""

from __future__ import annotations

import logging

from blazr.config import (
    AttentionConfig,
    GatedDeltaNetConfig,
    LayerConfig,
    MixerConfig,
    MLPConfig,
    ModelConfig,
    MoEConfig,
    NormConfig,
)
from blazr.detect.checkpoint import Shapes
from blazr.detect.raw import Raw, activation, rope_from_raw
from blazr.detect.ssm_common import (
    check_silu,
    is_tied,
    layer_kinds_from_list,
    layers_with,
    num_layers_of,
    require,
)
from blazr.errors import CheckpointError

log = logging.getLogger("blazr.detect")

NEXT = "Qwen3NextForCausalLM"
DENSE, MOE = "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"
DENSE_VL, MOE_VL = "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"
# the text model's tensor prefix
PREFIXES = {NEXT: "model.", DENSE: "model.", MOE: "model.", DENSE_VL: "model.language_model.",
            MOE_VL: "model.language_model."}  # fmt: skip
VISION_PREFIX = "model.visual."


def _deltanet(raw: Raw, shapes: Shapes, p: str, is_v_tiled: bool) -> GatedDeltaNetConfig:
    """The DeltaNet sizes of layer prefix `p` (`…layers.N.linear_attn.`)."""
    Hv = raw.int("linear_num_value_heads", require(shapes, p + "A_log")[0])
    conv = require(shapes, p + "conv1d.weight")  # [C, 1, K]
    out = require(shapes, p + "out_proj.weight")  # [D, Vd]
    Dv = raw.int("linear_value_head_dim", out[1] // Hv)
    Dk = raw.int("linear_key_head_dim", 128)
    Hk = raw.int("linear_num_key_heads", (conv[0] - Hv * Dv) // (2 * Dk))
    cfg = GatedDeltaNetConfig(
        num_k_heads=Hk,
        num_v_heads=Hv,
        head_k_dim=Dk,
        head_v_dim=Dv,
        conv_kernel=raw.int("linear_conv_kernel_dim", conv[-1]),
        is_v_tiled=is_v_tiled,
        norm_eps=raw.float("rms_norm_eps", 1e-6),
    )
    if conv[0] != cfg.conv_dim or out[1] != cfg.value_dim:
        raise CheckpointError(
            f"{p}conv1d.weight {list(conv)} / out_proj.weight {list(out)}: expected {cfg.conv_dim} conv "
            f"channels and {cfg.value_dim} value features for {Hk} key heads of {Dk}, {Hv} value heads of "
            f"{Dv}"
        )
    return cfg


def _attention(raw: Raw, shapes: Shapes, p: str, norm: NormConfig, max_pos: int) -> AttentionConfig:
    """Gated attention under `p` (`…layers.N.self_attn.`): q_proj [2·H·Dh, D] (q and gate per head)."""
    q = require(shapes, p + "q_proj.weight")
    k = require(shapes, p + "k_proj.weight")
    head_dim = raw.int("head_dim", require(shapes, p + "q_norm.weight")[0])
    num_heads = raw.int("num_attention_heads", q[0] // (2 * head_dim))
    num_kv_heads = raw.int("num_key_value_heads", k[0] // head_dim)
    params = raw.get("rope_parameters") or {}
    factor = params.get("partial_rotary_factor") if isinstance(params, dict) else None
    factor = float(factor if factor is not None else raw.float("partial_rotary_factor", 0.25))
    cfg = AttentionConfig(
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rope=rope_from_raw(raw, int(head_dim * factor), max_pos),
        softmax_scale=head_dim**-0.5,
        has_qkv_bias=p + "q_proj.bias" in shapes,
        has_o_bias=p + "o_proj.bias" in shapes,
        qk_norm=norm,
        has_output_gate=True,
    )
    if q[0] != 2 * num_heads * head_dim:
        raise CheckpointError(
            f"tensor {p}q_proj.weight: expected {2 * num_heads * head_dim} rows (q and gate of {num_heads} "
            f"heads of {head_dim}), found {q[0]}"
        )
    return cfg


def _ffn(raw: Raw, shapes: Shapes, p: str) -> dict[str, MLPConfig | MoEConfig]:
    """The feed-forward of the layer under `p` (`…layers.i.`): the MoE (gated shared expert) where it holds a
    router (`mlp.gate.weight`: Qwen3-Next's decoder_sparse_step / mlp_only_layers are in the tensors), else a
    SwiGLU MLP."""
    act = activation(raw.get("hidden_act", "silu"))
    router = shapes.get(p + "mlp.gate.weight")
    if router is None:
        gate = shapes.get(p + "mlp.gate_proj.weight")
        size = raw.int("intermediate_size", gate[0] if gate else None)
        if size is None:
            raise CheckpointError(
                f"cannot determine intermediate_size: not in config.json and no {p}mlp.gate_proj"
            )
        return {"mlp": MLPConfig(intermediate_size=size, activation=act)}
    shared = shapes.get(p + "mlp.shared_expert.gate_proj.weight")
    expert = shapes.get(p + "mlp.experts.0.gate_proj.weight") or shapes.get(p + "mlp.experts.gate_up_proj")
    moe_width = expert[-2] // (1 if len(expert) == 2 else 2) if expert else None
    top_k = raw.int("num_experts_per_tok")
    if top_k is None:
        raise CheckpointError(f"{raw.path}: num_experts_per_tok is needed for a MoE (shapes cannot tell)")
    return {
        "moe": MoEConfig(
            num_experts=raw.int("num_experts", router[0]),
            top_k=top_k,
            expert=MLPConfig(intermediate_size=raw.int("moe_intermediate_size", moe_width), activation=act),
            scoring="softmax",
            is_renormalized=bool(raw.get("norm_topk_prob", True)),
            shared=MLPConfig(
                intermediate_size=raw.int("shared_expert_intermediate_size", shared[0] if shared else None),
                activation=act,
            ),
            has_shared_gate=True,
        )
    }


def build_qwen3_next(raw: Raw, shapes: Shapes, arch: str) -> ModelConfig:
    if arch in (DENSE_VL, MOE_VL):
        text = raw.get("text_config")
        if isinstance(text, dict):  # the text model's config; a tie flag at the top level wins
            tied = raw.get("tie_word_embeddings", text.get("tie_word_embeddings"))
            raw = Raw({**text, "tie_word_embeddings": tied}, raw.path)
        vision = sum(1 for n in shapes if n.startswith(VISION_PREFIX))
        log.info("%s: loading the language model; the vision tower (%d tensors) is not loaded", arch, vision)
    prefix = PREFIXES[arch] + "layers."
    vocab, hidden = require(shapes, PREFIXES[arch] + "embed_tokens.weight")
    num_layers = num_layers_of(raw, shapes, prefix)
    kinds = layer_kinds_from_list(raw, ("layer_types",), num_layers)
    if kinds is None:
        attention = layers_with(shapes, prefix, "self_attn.")
        if attention:
            kinds = ["attention" if i in attention else "mamba" for i in range(num_layers)]
        else:
            every = raw.int("full_attention_interval", 4) or 4
            kinds = ["mamba" if (i + 1) % every else "attention" for i in range(num_layers)]
    check_silu(raw, "hidden_act")
    max_pos = raw.int("max_position_embeddings", 32768)
    eps = raw.float("rms_norm_eps", 1e-6)
    norm = NormConfig("rms", eps, weight_offset=1.0)  # (1 + w)
    is_v_tiled = bool(
        raw.get("blazr_v_heads_tiled", False)
    )  # a GGUF of llama.cpp's converter (detect/gguf_hybrid.py)
    layers = []
    for i, kind in enumerate(kinds):
        p = f"{prefix}{i}."
        mixer: MixerConfig
        if kind == "mamba":
            mixer = _deltanet(raw, shapes, p + "linear_attn.", is_v_tiled)
        elif kind == "attention":
            mixer = _attention(raw, shapes, p + "self_attn.", norm, max_pos)
        else:
            raise CheckpointError(
                f"{raw.path}: layer {i} is {kind!r}; expected linear_attention or full_attention"
            )
        layers.append(LayerConfig(mixers=(mixer,), norm=norm, ffn_norm=norm, **_ffn(raw, shapes, p)))
    return ModelConfig(
        architecture=arch,
        vocab_size=raw.int("vocab_size", vocab),
        hidden_size=raw.int("hidden_size", hidden),
        layers=tuple(layers),
        final_norm=norm,
        max_position_embeddings=max_pos,
        tie_word_embeddings=is_tied(raw, shapes),
    )


def _arch_of(shapes: Shapes) -> str | None:
    """The family member a checkpoint without config.json is, by its tensor names (None: not this family)."""
    names = list(shapes)
    if any(".linear_attn.in_proj_qkvz." in n for n in names):
        return NEXT
    if not any(".linear_attn.in_proj_qkv." in n for n in names):
        return None
    is_moe = any(n.endswith(".mlp.gate.weight") for n in names)
    if any(n.startswith("model.language_model.") for n in names):
        return MOE_VL if is_moe else DENSE_VL
    return MOE if is_moe else DENSE


BUILDERS = {arch: (lambda raw, shapes, a=arch: build_qwen3_next(raw, shapes, a)) for arch in PREFIXES}
NAME_RULES = [(lambda shapes, a=arch: _arch_of(shapes) == a, arch) for arch in PREFIXES]
MODEL_TYPES = {
    "qwen3_next": NEXT,
    "qwen3_5_text": DENSE,
    "qwen3_5_moe_text": MOE,
    "qwen3_5": DENSE_VL,
    "qwen3_5_moe": MOE_VL,
}
