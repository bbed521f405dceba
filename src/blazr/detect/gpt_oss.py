"""GPT-OSS (`GptOssForCausalLM`) detection: Llama's pre-norm layout with
- attention: q/k/v/o biases, attention sinks (`self_attn.sinks` [H]: a learned logit per head in the
  softmax's denominator), sliding-window and full layers alternating as `layer_types` says (default: even
  layers slide, window `sliding_window` 128), YaRN rope (`rope_scaling` / `rope_parameters`; transformers'
  default factor 32 over 4096 positions, θ 150000, not truncated);
- every layer a MoE: the router `mlp.router` [E, D] with a bias, softmax over the top-k logits (= the
  softmax renormalised over the k), experts with biases and the clamped SwiGLU (`swiglu_alpha` 1.702,
  `swiglu_limit` 7). The experts are transformers' fused tensors `mlp.experts.gate_up_proj` [E, D, 2I]
  (gate and up columns interleaved) and `down_proj` [E, I, D], or their MXFP4 `*_blocks` / `*_scales`
  (read as the same float tensors, loading/mxfp4.py).

Without config.json the shapes give the sizes (the head size from sinks: H heads of q_proj's rows), the rest
takes transformers' defaults.
"""

from __future__ import annotations

from dataclasses import replace

from blazr.config import LayerConfig, MLPConfig, ModelConfig, MoEConfig, NormConfig
from blazr.detect.checkpoint import Shapes
from blazr.detect.llama import llama_attention
from blazr.detect.raw import Raw, layer_indices, need
from blazr.detect.ssm_common import is_tied, require
from blazr.errors import CheckpointError, UnsupportedError

ARCH = "GptOssForCausalLM"
PREFIX = "model."
# transformers' GptOssConfig defaults for what no shape carries
_ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}
_THETA, _TOP_K, _WINDOW = 150000.0, 4, 128


def _layer_types(raw: Raw, num_layers: int) -> list[str]:
    kinds = raw.get("layer_types")
    if kinds is None:
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)]
    if not isinstance(kinds, list) or len(kinds) != num_layers:
        raise CheckpointError(f"{raw.path}: layer_types must list {num_layers} layer types, found {kinds!r}")
    if any(k not in ("sliding_attention", "full_attention") for k in kinds):
        raise CheckpointError(f"{raw.path}: layer_types must be sliding_attention or full_attention: {kinds}")
    return list(kinds)


def _rope_raw(raw: Raw) -> Raw:
    """config.json with transformers' rope defaults where it names none (θ 150000; YaRN ×32 over 4096)."""
    data = {"rope_theta": _THETA, **{k: v for k, v in raw.data.items() if v is not None}}
    if not raw.get("rope_scaling") and not raw.get("rope_parameters"):
        data["rope_scaling"] = _ROPE
    return Raw(data, raw.path)


def _experts(raw: Raw, shapes: Shapes, p: str) -> MoEConfig:
    """The MoE of the layer under `p` (`model.layers.i.`)."""
    router = require(shapes, p + "mlp.router.weight")
    down = shapes.get(p + "mlp.experts.down_proj")  # [E, I, D]
    width = raw.int("intermediate_size", down[1] if down else None)
    quant = raw.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method") not in (None, "mxfp4"):
        raise UnsupportedError(f"{raw.path}: quantization {quant.get('quant_method')!r} (blazr reads mxfp4)")
    moe = MoEConfig(
        num_experts=raw.int("num_local_experts", raw.int("num_experts", router[0])),
        top_k=raw.int("num_experts_per_tok", _TOP_K),
        expert=MLPConfig(
            intermediate_size=need(width, "intermediate_size", f"{p}mlp.experts.down_proj is missing"),
            activation="swiglu_oai",
            has_bias=True,
            swiglu_alpha=raw.float("swiglu_alpha", 1.702),
            swiglu_limit=raw.float("swiglu_limit", 7.0),
        ),
        scoring="softmax",
        is_renormalized=True,
        has_router_bias=True,
    )
    if moe.num_experts != router[0]:
        raise CheckpointError(
            f"tensor {p}mlp.router.weight: expected {moe.num_experts} rows (num_local_experts), "
            f"found {router[0]}"
        )
    return moe


def build_gpt_oss(raw: Raw, shapes: Shapes) -> ModelConfig:
    vocab, hidden = require(shapes, PREFIX + "embed_tokens.weight")
    hidden = raw.int("hidden_size", hidden)
    lp = PREFIX + "layers."
    num_layers = raw.int("num_hidden_layers", len(layer_indices(shapes, lp)))
    if not num_layers:
        raise CheckpointError(f"no {lp}N.* tensors found")
    max_pos = raw.int("max_position_embeddings", 131072)
    norm = NormConfig("rms", raw.float("rms_norm_eps", 1e-5))
    window = raw.int("sliding_window", _WINDOW)
    sinks = require(shapes, lp + "0.self_attn.sinks")
    q = require(shapes, lp + "0.self_attn.q_proj.weight")
    data = dict(raw.data)
    if "num_attention_heads" not in data and "head_dim" not in data:
        data["num_attention_heads"], data["head_dim"] = sinks[0], q[0] // sinks[0]
    rope_raw = _rope_raw(Raw(data, raw.path))
    layers = []
    for i, kind in enumerate(_layer_types(raw, num_layers)):
        attn = f"{lp}{i}.self_attn."
        attention = llama_attention(
            rope_raw, shapes, attn, hidden, max_pos, window if kind == "sliding_attention" else None
        )
        if attention.num_heads != sinks[0] or attention.num_heads * attention.head_dim != q[0]:
            raise CheckpointError(
                f"tensor {attn}sinks: expected [{attention.num_heads}] (one per head of "
                f"{attention.head_dim}), found {list(sinks)} beside q_proj [{q[0]}, …]"
            )
        attention = replace(attention, has_sinks=True)
        layers.append(LayerConfig(mixers=(attention,), moe=_experts(raw, shapes, f"{lp}{i}."), norm=norm,
                                  ffn_norm=norm))  # fmt: skip
    return ModelConfig(
        architecture=ARCH,
        vocab_size=raw.int("vocab_size", vocab),
        hidden_size=hidden,
        layers=tuple(layers),
        final_norm=norm,
        max_position_embeddings=max_pos,
        tie_word_embeddings=is_tied(raw, shapes),
    )


def _is_gpt_oss(shapes: Shapes) -> bool:
    return any(n.endswith(".self_attn.sinks") for n in shapes)


BUILDERS = {ARCH: build_gpt_oss}
MODEL_TYPES = {"gpt_oss": ARCH}
NAME_RULES = [(_is_gpt_oss, ARCH)]
