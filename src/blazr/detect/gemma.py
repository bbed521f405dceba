"""Gemma 2 (`Gemma2ForCausalLM`) and Gemma 3 text (`Gemma3ForCausalLM`, and the language model of
`Gemma3ForConditionalGeneration`) detection.

Both: sandwich norms — an RMSNorm before and after the attention (`input_layernorm`,
`post_attention_layernorm`) and before and after the MLP (`pre_feedforward_layernorm`,
`post_feedforward_layernorm`) — every one scaling by (1 + w) (NormConfig.weight_offset = 1); embeddings
multiplied by sqrt(hidden) rounded to the embedding's dtype; scores scaled by `query_pre_attn_scalar`^-½; a
GELU-tanh gated MLP; tied embeddings; sliding-window layers (the window only masks: the cache keeps every
position).
- Gemma 2: sliding and full layers alternate (even layers slide); one rope θ; attention scores and final
  logits soft-capped (`attn_logit_softcapping`, `final_logit_softcapping`).
- Gemma 3: a per-head q/k RMSNorm (1 + w) before rope; 5 sliding layers to 1 full
  (`sliding_window_pattern` 6, or `layer_types`); the sliding layers' rope θ `rope_local_base_freq`
  (default 10000, no scaling), the full ones' `rope_theta` (default 1e6) with `rope_scaling` (v5:
  `rope_parameters` keyed by layer type). The multimodal checkpoint keeps the text model's keys under
  `text_config` and its tensors under `language_model.model.` (the Hub's files; transformers 5 saves them
  so too); the vision tower and projector are left unread.

Without config.json the names say which (q_norm: Gemma 3), the shapes give the sizes (Gemma 3's head size
from q_norm; Gemma 2's assumed, with a warning), and the rest takes transformers' defaults, except the
query scalar: the head size (as llama.cpp assumes for all but the 27B models).
"""

from __future__ import annotations

from dataclasses import replace

from blazr.config import LayerConfig, MLPConfig, ModelConfig, NormConfig
from blazr.detect.checkpoint import Shapes
from blazr.detect.llama import llama_attention
from blazr.detect.raw import Raw, activation, layer_indices, need
from blazr.detect.ssm_common import is_tied, require
from blazr.errors import CheckpointError, UnsupportedError

GEMMA2, GEMMA3, GEMMA3_VL = "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"
# the text model's tensor prefixes (the multimodal checkpoint's as the Hub's files and transformers save it)
PREFIXES = ("model.", "language_model.model.")


def text_prefix(shapes: Shapes) -> str:
    """The prefix the text model's tensors carry (the longest of PREFIXES whose embedding is present)."""
    found = [p for p in PREFIXES if p + "embed_tokens.weight" in shapes]
    if not found:
        raise CheckpointError(f"missing tensor embed_tokens.weight under any of {', '.join(PREFIXES)}")
    return max(found, key=len)


def _layer_types(raw: Raw, arch: str, num_layers: int) -> list[str]:
    kinds = raw.get("layer_types")
    if kinds is None:
        every = 2 if arch == GEMMA2 else raw.int("sliding_window_pattern", 6) or 6
        return ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(num_layers)]
    if not isinstance(kinds, list) or len(kinds) != num_layers:
        raise CheckpointError(f"{raw.path}: layer_types must list {num_layers} layer types, found {kinds!r}")
    if any(k not in ("sliding_attention", "full_attention") for k in kinds):
        raise CheckpointError(
            f"{raw.path}: layer_types must be sliding_attention or full_attention, found {kinds}"
        )
    return list(kinds)


def _rope_raw(raw: Raw, arch: str, kind: str) -> Raw:
    """The config keys the rope of a layer of type `kind` reads (Gemma 3: one rope per layer type)."""
    if arch == GEMMA2:
        return raw
    data = {k: v for k, v in raw.data.items() if k not in ("rope_parameters", "rope_scaling", "rope_theta")}
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and kind in params:  # v5: keyed by layer type
        default = 1e6 if kind == "full_attention" else 10000.0
        return Raw({**data, "rope_theta": default, "rope_parameters": params[kind]}, raw.path)
    if kind == "sliding_attention":
        return Raw({**data, "rope_theta": raw.float("rope_local_base_freq", 10000.0)}, raw.path)
    scaling = raw.get("rope_scaling")
    return Raw({**data, "rope_theta": raw.float("rope_theta", 1e6), "rope_scaling": scaling}, raw.path)


def _softcap(raw: Raw, arch: str, key: str) -> float | None:
    """A soft-cap from config.json: absent → transformers' default (Gemma 2: 50 for the scores, 30 for the
    logits; Gemma 3: none); null or 0 → none."""
    if key not in raw.data:
        defaults = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}
        return defaults[key] if arch == GEMMA2 else None
    value = raw.data[key]
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise CheckpointError(f"{raw.path}: {key} must be a number or null, found {value!r}")
    return float(value) if value else None


def build_gemma(raw: Raw, shapes: Shapes, arch: str) -> ModelConfig:
    if arch == GEMMA3_VL and isinstance(raw.get("text_config"), dict):
        raw = Raw(raw.get("text_config"), raw.path)
    if raw.get("use_bidirectional_attention", False):
        raise UnsupportedError(f"{raw.path}: use_bidirectional_attention (EmbeddingGemma) is not supported")
    prefix = text_prefix(shapes)
    vocab, hidden = require(shapes, prefix + "embed_tokens.weight")
    hidden = raw.int("hidden_size", hidden)
    lp = prefix + "layers."
    num_layers = raw.int("num_hidden_layers", len(layer_indices(shapes, lp)))
    if not num_layers:
        raise CheckpointError(f"no {lp}N.* tensors found")
    max_pos = raw.int("max_position_embeddings", 8192 if arch == GEMMA2 else 131072)
    norm = NormConfig("rms", raw.float("rms_norm_eps", 1e-6), weight_offset=1.0)
    gate = shapes.get(lp + "0.mlp.gate_proj.weight")
    mlp = MLPConfig(
        intermediate_size=need(
            raw.int("intermediate_size", gate[0] if gate else None),
            "intermediate_size",
            f"{lp}0.mlp.gate_proj.weight is missing",
        ),
        activation=activation(raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"),
    )
    window = raw.int("sliding_window", 4096)
    attn_cap = _softcap(raw, arch, "attn_logit_softcapping")
    final_cap = _softcap(raw, arch, "final_logit_softcapping")
    layers = []
    for i, kind in enumerate(_layer_types(raw, arch, num_layers)):
        attn = f"{lp}{i}.self_attn."
        attention = llama_attention(
            _rope_raw(raw, arch, kind), shapes, attn, hidden, max_pos,
            window if kind == "sliding_attention" else None,
        )  # fmt: skip
        scalar = raw.float("query_pre_attn_scalar", float(attention.head_dim))
        attention = replace(
            attention,
            softmax_scale=scalar**-0.5,
            logit_softcap=attn_cap,
        )
        if arch != GEMMA2:
            for x in "qk":
                found = require(shapes, f"{attn}{x}_norm.weight")
                if found[0] != attention.head_dim:
                    raise CheckpointError(
                        f"tensor {attn}{x}_norm.weight: expected [{attention.head_dim}] (one head), "
                        f"found {list(found)}"
                    )
            attention = replace(attention, qk_norm=norm, is_qk_norm_per_head=True)
        layers.append(
            LayerConfig(
                mixers=(attention,), mlp=mlp, norm=norm, ffn_norm=norm, post_norm=norm, ffn_post_norm=norm
            )
        )
    return ModelConfig(
        architecture=arch,
        vocab_size=raw.int("vocab_size", vocab),
        hidden_size=hidden,
        layers=tuple(layers),
        final_norm=norm,
        max_position_embeddings=max_pos,
        tie_word_embeddings=is_tied(raw, shapes),
        embedding_multiplier=hidden**0.5,
        is_embedding_multiplier_rounded=True,
        final_logit_softcap=final_cap,
    )


def _is_gemma(shapes: Shapes) -> bool:
    """Sandwich norms: `pre_feedforward_layernorm` beside `input_layernorm` (and no Gemma 4 layer_scalar)."""
    names = list(shapes)
    if any(n.endswith(".layer_scalar") for n in names):
        return False
    return any(n.endswith(".pre_feedforward_layernorm.weight") for n in names) and any(
        n.endswith(".input_layernorm.weight") for n in names
    )


def _is_gemma3(shapes: Shapes) -> bool:
    return _is_gemma(shapes) and any(n.endswith(".self_attn.q_norm.weight") for n in shapes)


BUILDERS = {
    arch: (lambda raw, shapes, a=arch: build_gemma(raw, shapes, a)) for arch in (GEMMA2, GEMMA3, GEMMA3_VL)
}
MODEL_TYPES = {"gemma2": GEMMA2, "gemma3_text": GEMMA3, "gemma3": GEMMA3_VL}
NAME_RULES = [
    (lambda shapes: _is_gemma3(shapes) and text_prefix(shapes) != "model.", GEMMA3_VL),
    (_is_gemma3, GEMMA3),
    (_is_gemma, GEMMA2),
]
