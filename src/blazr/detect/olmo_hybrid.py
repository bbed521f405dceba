"""OLMo-Hybrid (`OlmoHybridForCausalLM`) detection: gated DeltaNet layers (`linear_attn.*`: separate q / k /
v / a / b / g projections, β scaled by 2 when `linear_allow_neg_eigval`, its gated norm at eps 1e-5 as FLA's)
in pre-norm blocks, and OLMo 3 attention layers (`self_attn.*`: a q/k RMSNorm over all heads' features,
rope — or NoPE when `rope_parameters` names no θ, as the released checkpoints) in post-norm blocks (the
attention's and the MLP's outputs normed before their residual adds, no norm before them); SwiGLU MLPs.

Sizes default as OlmoHybridConfig: KV heads = heads, DeltaNet key heads = heads, key head size
0.75·hidden / key heads, value head size twice it. Without config.json: heads from the shapes' common head
size (a warning), the DeltaNet value heads from A_log [Hv], its widths from q_proj / v_proj, its conv
taps from q_conv1d.
"""

from __future__ import annotations

import logging

from blazr.config import AttentionConfig, GatedDeltaNetConfig, LayerConfig, MLPConfig, ModelConfig, NormConfig
from blazr.detect.checkpoint import Shapes
from blazr.detect.raw import Raw, activation, guess_head_dim, rope_from_raw
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

ARCH = "OlmoHybridForCausalLM"
PREFIX = "model."


def _heads(raw: Raw, shapes: Shapes, p: str) -> tuple[int, int, int]:
    """(heads, KV heads, head size) of the attention under `p`."""
    q, k = require(shapes, p + "q_proj.weight"), require(shapes, p + "k_proj.weight")
    heads = raw.int("num_attention_heads")
    if heads is None:
        head_dim = guess_head_dim(q[0], k[0])
        log.warning("num_attention_heads is not in config.json; assuming head_dim %d", head_dim)
        heads = q[0] // head_dim
    head_dim = raw.int("head_dim", q[0] // heads)
    return heads, raw.int("num_key_value_heads", k[0] // head_dim), head_dim


def _deltanet(raw: Raw, shapes: Shapes, p: str, heads: int, hidden: int) -> GatedDeltaNetConfig:
    Hv = raw.int("linear_num_value_heads", require(shapes, p + "A_log")[0])
    Hk = raw.int("linear_num_key_heads", heads)
    q = require(shapes, p + "q_proj.weight")  # [Hk·Dk, D]
    v = require(shapes, p + "v_proj.weight")  # [Hv·Dv, D]
    cfg = GatedDeltaNetConfig(
        num_k_heads=Hk,
        num_v_heads=Hv,
        head_k_dim=raw.int("linear_key_head_dim", q[0] // Hk),
        head_v_dim=raw.int("linear_value_head_dim", v[0] // Hv),
        conv_kernel=raw.int("linear_conv_kernel_dim", require(shapes, p + "q_conv1d.weight")[-1]),
        beta_scale=2.0 if raw.get("linear_allow_neg_eigval", True) else 1.0,
        norm_eps=1e-5,  # OlmoHybridGatedDeltaNet's o_norm: FLA's FusedRMSNormGated default
    )
    if (q[0], v[0]) != (cfg.key_dim, cfg.value_dim):
        raise CheckpointError(
            f"{p}q_proj.weight / v_proj.weight: expected {cfg.key_dim} / {cfg.value_dim} rows for {Hk} key "
            f"heads of {cfg.head_k_dim} and {Hv} value heads of {cfg.head_v_dim}, found {q[0]} / {v[0]}"
        )
    return cfg


def build_olmo_hybrid(raw: Raw, shapes: Shapes) -> ModelConfig:
    vocab, hidden = require(shapes, PREFIX + "embed_tokens.weight")
    hidden = raw.int("hidden_size", hidden)
    prefix = PREFIX + "layers."
    num_layers = num_layers_of(raw, shapes, prefix)
    kinds = layer_kinds_from_list(raw, ("layer_types",), num_layers)
    if kinds is None:
        attention = layers_with(shapes, prefix, "self_attn.")
        kinds = ["attention" if i in attention else "mamba" for i in range(num_layers)]
    check_silu(raw, "hidden_act")
    max_pos = raw.int("max_position_embeddings", 65536)
    norm = NormConfig("rms", raw.float("rms_norm_eps", 1e-6))
    params = raw.get("rope_parameters")
    has_rope = bool(raw.get("rope_theta")) or (
        isinstance(params, dict) and params.get("rope_theta") is not None
    )
    att = next((i for i, k in enumerate(kinds) if k == "attention"), None)
    heads, kv_heads, head_dim = (
        _heads(raw, shapes, f"{prefix}{att}.self_attn.") if att is not None else (0, 0, 0)
    )
    gate = shapes.get(f"{prefix}0.mlp.gate_proj.weight")
    mlp = MLPConfig(
        intermediate_size=raw.int("intermediate_size", gate[0] if gate else None),
        activation=activation(raw.get("hidden_act", "silu")),
    )
    layers = []
    for i, kind in enumerate(kinds):
        p = f"{prefix}{i}."
        if kind == "mamba":
            mixer = _deltanet(
                raw, shapes, p + "linear_attn.", heads or raw.int("num_attention_heads", 1), hidden
            )
            layers.append(LayerConfig(mixers=(mixer,), mlp=mlp, norm=norm, ffn_norm=norm))
        elif kind == "attention":
            attention = AttentionConfig(
                num_heads=heads,
                num_kv_heads=kv_heads,
                head_dim=head_dim,
                rope=rope_from_raw(raw, head_dim, max_pos) if has_rope else None,
                softmax_scale=head_dim**-0.5,
                has_qkv_bias=p + "self_attn.q_proj.bias" in shapes,
                has_o_bias=p + "self_attn.o_proj.bias" in shapes,
                qk_norm=norm,
                is_qk_norm_per_head=False,
            )
            layers.append(
                LayerConfig(
                    mixers=(attention,), mlp=mlp, norm=None, ffn_norm=None, post_norm=norm, ffn_post_norm=norm
                )
            )
        else:
            raise CheckpointError(
                f"{raw.path}: layer {i} is {kind!r}; expected linear_attention or full_attention"
            )
    return ModelConfig(
        architecture=ARCH,
        vocab_size=raw.int("vocab_size", vocab),
        hidden_size=hidden,
        layers=tuple(layers),
        final_norm=norm,
        max_position_embeddings=max_pos,
        tie_word_embeddings=is_tied(raw, shapes),
    )


BUILDERS = {ARCH: build_olmo_hybrid}
MODEL_TYPES = {"olmo_hybrid": ARCH}
NAME_RULES = [(lambda shapes: any(".linear_attn.g_proj." in n for n in shapes), ARCH)]
