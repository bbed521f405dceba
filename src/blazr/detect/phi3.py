"""Phi-3 / Phi-3.5 / Phi-4 / Phi-4-mini (`Phi3ForCausalLM`) detection: Llama's pre-norm blocks with the
attention's q, k and v rows fused in one `self_attn.qkv_proj` [(H + 2·Hkv)·Dh, D] and the MLP's gate and up
rows in one `mlp.gate_up_proj` [2I, D] (gate first) — blazr's own fused layout, loaded whole
(loading/names/phi3.py); a partial rope (`partial_rotary_factor`, top level or in `rope_parameters`:
Phi-4-mini's 0.75); LongRoPE where `rope_scaling` / `rope_parameters` says "longrope" (or "su"), its short or
long factors chosen by the context limit (model/rope.py `longrope_factors`); a sliding window on every layer
where `sliding_window` is set (Phi-3-mini-4k: 2047); tied embeddings where
`tie_word_embeddings` (Phi-4-mini).

The head counts need config.json: the fused qkv rows cannot tell q's heads from k's and v's. What else no
key gives takes Phi3Config's defaults (RMSNorm eps 1e-5, rope θ 10000, 4096 positions, no window).
"""

from __future__ import annotations

from dataclasses import replace

from blazr.config import LayerConfig, MLPConfig, ModelConfig, NormConfig
from blazr.detect.checkpoint import Shapes
from blazr.detect.llama import llama_attention
from blazr.detect.raw import Raw, activation, layer_indices, need
from blazr.detect.ssm_common import is_tied, require
from blazr.errors import CheckpointError

ARCH = "Phi3ForCausalLM"
PREFIX = "model."


def _partial_rotary(raw: Raw) -> float:
    """`partial_rotary_factor` at the top level (published configs) or in `rope_parameters` (v5 saves)."""
    params = raw.get("rope_parameters")
    nested = params.get("partial_rotary_factor") if isinstance(params, dict) else None
    return raw.float("partial_rotary_factor", float(nested or 1.0))


def build_phi3(raw: Raw, shapes: Shapes) -> ModelConfig:
    vocab, hidden = require(shapes, PREFIX + "embed_tokens.weight")
    hidden = raw.int("hidden_size", hidden)
    prefix = PREFIX + "layers."
    num_layers = raw.int("num_hidden_layers", len(layer_indices(shapes, prefix)))
    if not num_layers:
        raise CheckpointError(f"no {prefix}N.* tensors found")
    attn, mlp_prefix = f"{prefix}0.self_attn.", f"{prefix}0.mlp."
    need(
        raw.int("num_attention_heads"),
        "num_attention_heads",
        f"{attn}qkv_proj.weight fuses q, k and v (its rows cannot tell their heads apart)",
    )
    max_pos = raw.int("max_position_embeddings", 4096)
    rope_raw = Raw({**raw.data, "partial_rotary_factor": _partial_rotary(raw)}, raw.path)
    attention = llama_attention(rope_raw, shapes, attn, hidden, max_pos, raw.int("sliding_window"))
    attention = replace(attention, has_qkv_bias=attn + "qkv_proj.bias" in shapes)
    qkv = require(shapes, attn + "qkv_proj.weight")
    rows = (attention.num_heads + 2 * attention.num_kv_heads) * attention.head_dim
    if qkv[0] != rows:
        raise CheckpointError(
            f"tensor {attn}qkv_proj.weight: expected {rows} rows ({attention.num_heads} q + "
            f"2 × {attention.num_kv_heads} kv heads of {attention.head_dim}), found {list(qkv)}"
        )
    gate_up = require(shapes, mlp_prefix + "gate_up_proj.weight")
    intermediate = raw.int("intermediate_size", gate_up[0] // 2)
    if gate_up[0] != 2 * intermediate:
        raise CheckpointError(
            f"tensor {mlp_prefix}gate_up_proj.weight: expected {2 * intermediate} rows (gate and up of "
            f"intermediate_size {intermediate}), found {list(gate_up)}"
        )
    mlp = MLPConfig(intermediate_size=intermediate, activation=activation(raw.get("hidden_act", "silu")))
    norm = NormConfig("rms", raw.float("rms_norm_eps", 1e-5))
    layer = LayerConfig(mixers=(attention,), mlp=mlp, norm=norm, ffn_norm=norm)
    return ModelConfig(
        architecture=ARCH,
        vocab_size=raw.int("vocab_size", vocab),
        hidden_size=hidden,
        layers=(layer,) * num_layers,
        final_norm=norm,
        max_position_embeddings=max_pos,
        tie_word_embeddings=is_tied(raw, shapes),
    )


def _is_phi3(shapes: Shapes) -> bool:
    """Llama's layout with q/k/v fused in `qkv_proj` and gate/up in `gate_up_proj`."""
    names = list(shapes)
    return any(n.endswith(".self_attn.qkv_proj.weight") for n in names) and any(
        n.endswith(".mlp.gate_up_proj.weight") for n in names
    )


BUILDERS = {ARCH: build_phi3}
MODEL_TYPES = {"phi3": ARCH}
NAME_RULES = [(_is_phi3, ARCH)]
