"""GGUF → HF names of the attention-only families, dense and MoE: per llama.cpp architecture (llama — and
Mixtral —, deepseek2, qwen2 / qwen3 / qwen3moe, granite / granitemoe, smollm3, olmo2, gemma2 / gemma3,
glm4moe, phi3, gpt-oss, gemma4), which GGUF tensors make each HF tensor and by which op — the inverse of
`convert_hf_to_gguf.py`'s names for them.

In: the shared rules and `Arch` of loading/gguf_hf_rules.py. Out: `ARCHES` (llama.cpp architecture → its
`Arch`) and `OUTPUT_NORM_OFFSET` (those whose output norm is a (1 + w) norm stored as 1 + w), merged with
the hybrid families' by loading/gguf_hf.py.
"""

from __future__ import annotations

import dataclasses

from blazr.loading.gguf_hf_rules import (
    ATTENTION,
    GRANITE_FFN,
    INTERLEAVE,
    MLA,
    MODEL,
    NORMS,
    OFFSET,
    SAME,
    SWIGLU,
    Arch,
    Rule,
)

ARCHES: dict[str, Arch] = {
    "llama": Arch(  # Mixtral too: its converter writes a `llama` file with a router and stacked experts
        "LlamaForCausalLM",
        "model.layers.{i}.",
        MODEL,
        [*NORMS, *ATTENTION, *SWIGLU, ("block_sparse_moe.gate.weight", ("ffn_gate_inp.weight",), SAME)],
        [
            (f"block_sparse_moe.experts.{{e}}.{w}.weight", f"ffn_{x}_exps.weight")
            for x, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))
        ],
        {"a": "self_attn.", "f": "mlp."},
        permuted=True,
    ),
    "deepseek2": Arch(
        "DeepseekV2ForCausalLM",  # V3 differs only in routing, which detection reads from metadata
        "model.layers.{i}.",
        MODEL,
        [
            *NORMS,
            *MLA,
            *SWIGLU,
            ("mlp.gate.weight", ("ffn_gate_inp.weight",), SAME),
            ("mlp.gate.e_score_correction_bias", ("exp_probs_b.bias",), SAME),
            *[
                (f"mlp.shared_experts.{x}_proj.weight", (f"ffn_{x}_shexp.weight",), SAME)
                for x in ("gate", "up", "down")
            ],
        ],
        [(f"mlp.experts.{{e}}.{x}_proj.weight", f"ffn_{x}_exps.weight") for x in ("gate", "up", "down")],
        {"a": "self_attn.", "f": "mlp."},
        permuted=False,
    ),
}
# Qwen2 / Qwen3 / Qwen3-MoE (the converter's Qwen2Model, Qwen3Model, Qwen3MoeModel): Llama's tensors with NEOX
# rope (q/k rows as HF keeps them), q/k biases (Qwen2), per-head q/k norms (Qwen3), and on Qwen3-MoE's sparse
# layers a router and stacked experts (its dense layers, `mlp_only_layers`, keep ffn_gate / up / down).
_QWEN: list[Rule] = [
    *NORMS,
    *ATTENTION,
    *[(f"{{a}}{x}_norm.weight", (f"attn_{x}_norm.weight",), SAME) for x in "qk"],
    *SWIGLU,
    ("mlp.gate.weight", ("ffn_gate_inp.weight",), SAME),
]
ARCHES.update(
    {
        gguf_arch: Arch(
            hf_arch,
            "model.layers.{i}.",
            MODEL,
            _QWEN,
            [(f"mlp.experts.{{e}}.{x}_proj.weight", f"ffn_{x}_exps.weight") for x in ("gate", "up", "down")],
            {"a": "self_attn.", "f": "mlp."},
            permuted=False,
        )
        for gguf_arch, hf_arch in (
            ("qwen2", "Qwen2ForCausalLM"),
            ("qwen3", "Qwen3ForCausalLM"),
            ("qwen3moe", "Qwen3MoeForCausalLM"),
        )
    }
)
# Granite 3 (the converter's GraniteModel, GraniteMoeModel: LlamaModel's q/k permutation): the dense MLP as
# Llama's; the experts' gate and up stored apart, joined per expert into input_linear, as hybrid Granite's.
ARCHES.update(
    granite=Arch(
        "GraniteForCausalLM",
        "model.layers.{i}.",
        MODEL,
        [*NORMS, *ATTENTION, *SWIGLU],
        [],
        {"a": "self_attn.", "f": "mlp."},
        permuted=True,
    ),
    granitemoe=Arch(
        "GraniteMoeForCausalLM",  # GraniteMoeShared with shared experts (detection reads the metadata)
        "model.layers.{i}.",
        MODEL,
        [*NORMS, *ATTENTION, *GRANITE_FFN[:5]],
        [],
        {"a": "self_attn."},
        permuted=True,
    ),
)
# SmolLM3 (the converter's SmolLM3Model: LlamaModel's tensors and q/k permutation; its NoPE layers, every 4th,
# are llama.cpp's fixed step and SmolLM3's default, which detection assumes).
ARCHES["smollm3"] = dataclasses.replace(ARCHES["llama"], hf_architecture="SmolLM3ForCausalLM", experts=[])
# OLMo 2 / OLMo 3 (the converter's Olmo2Model): post-norm blocks, q/k norms over all heads, NEOX rope.
ARCHES["olmo2"] = Arch(
    "Olmo2ForCausalLM",  # OLMo 3 where the file has sliding-window layers: detection reads the metadata
    "model.layers.{i}.",
    MODEL,
    [
        ("post_attention_layernorm.weight", ("post_attention_norm.weight",), SAME),
        ("post_feedforward_layernorm.weight", ("post_ffw_norm.weight",), SAME),
        *ATTENTION,
        *[(f"{{a}}{x}_norm.weight", (f"attn_{x}_norm.weight",), SAME) for x in "qk"],
        *SWIGLU,
    ],
    [],
    {"a": "self_attn.", "f": "mlp."},
    permuted=False,
)
# Gemma 2 / Gemma 3 (the converter's Gemma2Model, Gemma3Model): sandwich norms, every one a (1 + w) norm
# stored as 1 + w (the output norm too), Gemma 3's per-head q/k norms; NEOX rope (q/k rows as HF keeps them).
_GEMMA: list[Rule] = [
    ("input_layernorm.weight", ("attn_norm.weight",), OFFSET),
    ("post_attention_layernorm.weight", ("post_attention_norm.weight",), OFFSET),
    ("pre_feedforward_layernorm.weight", ("ffn_norm.weight",), OFFSET),
    ("post_feedforward_layernorm.weight", ("post_ffw_norm.weight",), OFFSET),
    *ATTENTION,
    *[(f"{{a}}{x}_norm.weight", (f"attn_{x}_norm.weight",), OFFSET) for x in "qk"],
    *SWIGLU,
]
ARCHES.update(
    {
        gguf_arch: Arch(
            hf_arch, "model.layers.{i}.", MODEL, _GEMMA, [], {"a": "self_attn.", "f": "mlp."}, False
        )
        for gguf_arch, hf_arch in (("gemma2", "Gemma2ForCausalLM"), ("gemma3", "Gemma3ForCausalLM"))
    }
)
OUTPUT_NORM_OFFSET = {"gemma2", "gemma3"}  # the output norm is a (1 + w) norm too
# GLM-4.5 / 4.6 (the converter's Glm4MoeModel): Llama's tensors with NEOX rope (q/k rows as HF keeps
# them), q/k biases, per-head q/k norms where the model has them, the post-attention norm written as
# `post_attention_norm`; dense first layers' ffn_gate / up / down, then DeepSeek-V3's router (with
# exp_probs_b), stacked experts and shared experts. The MTP block (`blk.{N}`, past the decoder's N layers: a
# whole layer plus `nextn.*`) gets the HF names GLM's checkpoints give it, which the name map leaves unread.
ARCHES["glm4moe"] = Arch(
    "Glm4MoeForCausalLM",
    "model.layers.{i}.",
    MODEL,
    [
        *NORMS[:1],
        ("post_attention_layernorm.weight", ("post_attention_norm.weight",), SAME),
        *ATTENTION,
        *[(f"{{a}}{x}_norm.weight", (f"attn_{x}_norm.weight",), SAME) for x in "qk"],
        *SWIGLU,
        ("mlp.gate.weight", ("ffn_gate_inp.weight",), SAME),
        ("mlp.gate.e_score_correction_bias", ("exp_probs_b.bias",), SAME),
        *[
            (f"mlp.shared_experts.{x}_proj.weight", (f"ffn_{x}_shexp.weight",), SAME)
            for x in ("gate", "up", "down")
        ],
        *[
            (f"{hf}.weight", (f"nextn.{gguf}.weight",), SAME)
            for hf, gguf in (
                ("eh_proj", "eh_proj"),
                ("enorm", "enorm"),
                ("hnorm", "hnorm"),
                ("embed_tokens", "embed_tokens"),
                ("shared_head.norm", "shared_head_norm"),
                ("shared_head.head", "shared_head_head"),
            )
        ],
    ],
    [(f"mlp.experts.{{e}}.{x}_proj.weight", f"ffn_{x}_exps.weight") for x in ("gate", "up", "down")],
    {"a": "self_attn.", "f": "mlp."},
    permuted=False,
)
# Phi-3 / Phi-4 (the converter's Phi3MiniModel): q/k/v and gate | up stored fused as HF holds them (attn_qkv;
# ffn_up with 2I rows, gate first: llama.cpp splits it in its graph), NEOX rope (q/k rows as HF keeps them).
ARCHES["phi3"] = Arch(
    "Phi3ForCausalLM",
    "model.layers.{i}.",
    MODEL,
    [
        *NORMS,
        ("{a}qkv_proj.weight", ("attn_qkv.weight",), SAME),
        ("{a}o_proj.weight", ("attn_output.weight",), SAME),
        ("{f}gate_up_proj.weight", ("ffn_up.weight",), SAME),
        ("{f}down_proj.weight", ("ffn_down.weight",), SAME),
    ],
    [],
    {"a": "self_attn.", "f": "mlp."},
    permuted=False,
)
# GPT-OSS (the converter's GptOssModel): NEOX rope (q/k rows as HF keeps them), q/k/v/o biases, the
# sinks `attn_sinks`, the post-attention norm written as `post_attention_norm`, the router with its bias,
# the experts split into gate / up / down stacks (MXFP4 where the checkpoint's were) with their biases; the
# HF names are transformers' but for the experts' weights, given per expert (the name map reads both).
ARCHES["gpt-oss"] = Arch(
    "GptOssForCausalLM",
    "model.layers.{i}.",
    MODEL,
    [
        *NORMS[:1],
        ("post_attention_layernorm.weight", ("post_attention_norm.weight",), SAME),
        *ATTENTION,
        ("{a}sinks", ("attn_sinks.weight",), SAME),
        *[(f"mlp.router.{k}", (f"ffn_gate_inp.{k}",), SAME) for k in ("weight", "bias")],
        ("mlp.experts.gate_up_proj_bias", ("ffn_gate_exps.bias", "ffn_up_exps.bias"), INTERLEAVE),
        ("mlp.experts.down_proj_bias", ("ffn_down_exps.bias",), SAME),
    ],
    [(f"mlp.experts.{{e}}.{x}_proj.weight", f"ffn_{x}_exps.weight") for x in ("gate", "up", "down")],
    {"a": "self_attn.", "f": "mlp."},
    permuted=False,
)
# Gemma 4 (the converter's Gemma4Model): Gemma 3's names with plain (w) norms stored as they are, q/k/v as
# HF holds them (a shared-KV layer has attn_q only, a K = V layer no attn_v), the per-layer inputs (global
# per_layer_token_embd / per_layer_model_proj / per_layer_proj_norm; per layer inp_gate, proj, post_norm) and
# the layer scalar (layer_output_scale), and the MoE layers' router (ffn_gate_inp, its .scale, the
# per-expert scales as ffn_down_exps.scale) and stacked experts. The full layers' proportional rope is
# `rope_freqs` (read by detection: 1 for the turning pairs, 1e30 for the still ones).
ARCHES["gemma4"] = Arch(
    "Gemma4ForCausalLM",
    "model.layers.{i}.",
    {
        **MODEL,
        "per_layer_token_embd": "model.embed_tokens_per_layer.weight",
        "per_layer_model_proj": "model.per_layer_model_projection.weight",
        "per_layer_proj_norm": "model.per_layer_projection_norm.weight",
    },
    [
        *[(hf, gguf, SAME) for hf, gguf, _ in _GEMMA],
        ("per_layer_input_gate.weight", ("inp_gate.weight",), SAME),
        ("per_layer_projection.weight", ("proj.weight",), SAME),
        ("post_per_layer_input_norm.weight", ("post_norm.weight",), SAME),
        ("layer_scalar", ("layer_output_scale.weight",), SAME),
        # the MoE variant: the router, 3-D experts as HF stacks them, the side-by-side branches' norms
        ("router.proj.weight", ("ffn_gate_inp.weight",), SAME),
        ("router.scale", ("ffn_gate_inp.scale",), SAME),
        ("router.per_expert_scale", ("ffn_down_exps.scale",), SAME),
        ("experts.gate_up_proj", ("ffn_gate_up_exps.weight",), SAME),
        ("experts.down_proj", ("ffn_down_exps.weight",), SAME),
        ("pre_feedforward_layernorm_2.weight", ("pre_ffw_norm_2.weight",), SAME),
        ("post_feedforward_layernorm_1.weight", ("post_ffw_norm_1.weight",), SAME),
        ("post_feedforward_layernorm_2.weight", ("post_ffw_norm_2.weight",), SAME),
    ],
    [],
    {"a": "self_attn.", "f": "mlp."},
    permuted=False,
)
