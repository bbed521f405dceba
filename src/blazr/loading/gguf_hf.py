"""A GGUF file seen as the HuggingFace checkpoint llama.cpp's converter made it from.

Owns, per llama.cpp architecture (`general.architecture`), which GGUF tensors make each HF tensor and how:
the inverse of `convert_hf_to_gguf.py`. Names (`blk.N.ssm_in.weight` → `backbone.layers.N.mixer.in_proj.
weight`), q/k rows un-permuted (llama.cpp's interleaved rotary pairs → HF's halves), `A = -exp(A_log)` back
to A_log, Mamba's `[H, 1]` / `[G, Di/G]` / `[C, K]` reshapes undone, (1 + w) norms stored as 1 + w back to w
(Qwen3-Next / Qwen3.5, Gemma 2 / 3; Gemma 4's are plain), split tensors joined (gate | up rows, Granite's
experts, DeepSeek's per-head k_b / v_b into kv_b_proj) and stacked experts sliced per expert.
With that, detection runs the HF builders and loading the HF name maps unchanged, and quantized linear
weights pass through as stored bytes (`load_raw`: only row-wise ops, so ggml blocks stay whole).

Multipliers the converter folds into weights (Falcon-H1's µP) stay folded: detection then sets them to 1.

Shape letters: E experts, H heads, L latent (kv_lora_rank), Dn / Dv MLA nope / value head dims, C channels,
K conv kernel, G groups, R rows, Q block bytes.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from blazr.errors import CheckpointError, UnsupportedError
from blazr.loading.gguf import GGUFFile, dequantize, unpermute_qk

log = logging.getLogger("blazr.loading")

# How a recipe makes its HF tensor from its GGUF sources.
SAME = "same"  # one tensor as stored
QK = "qk"  # one tensor, rows un-permuted per head (arg: heads)
A_LOG = "a_log"  # ssm_a [H, 1] = -exp(A_log) → A_log [H] (Mamba1: [Di, N] → A_log [Di, N])
FLAT = "flat"  # one tensor flattened to 1-D: ssm_d [H, 1] → D [H], ssm_norm [G, Di/G] → [Di]
CONV = "conv"  # ssm_conv1d [C, K] (Kimi-Linear: [1, C, 1, K]) → conv1d.weight [C, 1, K]
CAT = "cat"  # rows of several tensors concatenated (gate | up)
CAT_EXPERTS = "cat_experts"  # [E, I, C] × 2 → [E, 2I, C] (Granite's fused expert input)
EXPERT = "expert"  # expert `arg` of a stacked [E, R, C] tensor → [R, C]
KV_B = "kv_b"  # k_b [H, L, Dn], v_b [H, Dv, L] → kv_b_proj [H·(Dn + Dv), L], per head [k_bᵀ; v_b]
OFFSET = "offset"  # a (1 + w) norm the converter stored as 1 + w → w
ROW = "row"  # a one-row weight [1, C] (llama.cpp's quantizer writes it 1-D, [C])
INTERLEAVE = "interleave"  # [E, I] × 2 → [E, 2I], columns alternating (GPT-OSS's gate_up_proj_bias)
_ROWWISE = (SAME, QK, CAT, EXPERT, CAT_EXPERTS)  # ops whose stored bytes are whole rows: blocks pass through


@dataclass(frozen=True)
class Recipe:
    """One HF tensor: its GGUF sources, its HF shape, and the op that joins them."""

    sources: tuple[str, ...]
    shape: tuple[int, ...]
    op: str = SAME
    arg: int = 0


# ---------------------------------------------------------------------------------------------------------
# Per-architecture names. A rule is (HF tail, GGUF tails, op); `{a}` is the attention module's HF prefix,
# `{m}` the Mamba2 / DeltaNet mixer's, `{f}` the feed-forward's. Rules whose GGUF tensors are all present
# apply.
# ---------------------------------------------------------------------------------------------------------

_Rule = tuple[str, tuple[str, ...], str]

_MAMBA: list[_Rule] = [
    ("{m}in_proj.weight", ("ssm_in.weight",), SAME),
    ("{m}in_proj.bias", ("ssm_in.bias",), SAME),
    ("{m}conv1d.weight", ("ssm_conv1d.weight",), CONV),
    ("{m}conv1d.bias", ("ssm_conv1d.bias",), SAME),
    ("{m}dt_bias", ("ssm_dt.bias",), SAME),
    ("{m}A_log", ("ssm_a",), A_LOG),
    ("{m}D", ("ssm_d",), FLAT),
    ("{m}norm.weight", ("ssm_norm.weight",), FLAT),
    ("{m}out_proj.weight", ("ssm_out.weight",), SAME),
    ("{m}out_proj.bias", ("ssm_out.bias",), SAME),
]
_ATTENTION: list[_Rule] = [
    *[(f"{{a}}{x}_proj.{k}", (f"attn_{x}.{k}",), QK) for x in "qk" for k in ("weight", "bias")],
    *[(f"{{a}}v_proj.{k}", (f"attn_v.{k}",), SAME) for k in ("weight", "bias")],
    *[(f"{{a}}o_proj.{k}", (f"attn_output.{k}",), SAME) for k in ("weight", "bias")],
]
_SWIGLU: list[_Rule] = [
    (f"{{f}}{x}_proj.{k}", (f"ffn_{x}.{k}",), SAME)
    for x in ("gate", "up", "down")
    for k in ("weight", "bias")
]
_RELU2: list[_Rule] = [  # NemotronH's ungated MLP
    (f"{{f}}{x}_proj.{k}", (f"ffn_{x}.{k}",), SAME) for x in ("up", "down") for k in ("weight", "bias")
]
_MLA: list[_Rule] = [
    ("{a}q_proj.weight", ("attn_q.weight",), SAME),
    ("{a}q_a_proj.weight", ("attn_q_a.weight",), SAME),
    ("{a}q_a_layernorm.weight", ("attn_q_a_norm.weight",), SAME),
    ("{a}q_b_proj.weight", ("attn_q_b.weight",), SAME),
    ("{a}kv_a_proj_with_mqa.weight", ("attn_kv_a_mqa.weight",), SAME),
    ("{a}kv_a_layernorm.weight", ("attn_kv_a_norm.weight",), SAME),
    ("{a}kv_b_proj.weight", ("attn_k_b.weight", "attn_v_b.weight"), KV_B),
    ("{a}kv_b_proj.weight", ("attn_kv_b.weight",), SAME),  # older files keep kv_b whole
    ("{a}o_proj.weight", ("attn_output.weight",), SAME),
]


@dataclass(frozen=True)
class _Arch:
    hf_architecture: str
    layer: str  # HF prefix of layer N
    globals: dict[str, str]  # GGUF global tensor → HF name
    rules: list[_Rule]
    experts: list[tuple[str, str]]  # (HF per-expert tail with {e}, GGUF stacked tail) → EXPERT recipes
    modules: dict[str, str]  # the {a} / {m} / {f} prefixes
    permuted: bool  # q/k rows permuted by the converter (LlamaModel's undo_permute)


_MODEL = {
    "token_embd": "model.embed_tokens.weight",
    "output_norm": "model.norm.weight",
    "output": "lm_head.weight",
}
_BACKBONE = {
    "token_embd": "backbone.embeddings.weight",
    "output_norm": "backbone.norm_f.weight",
    "output": "lm_head.weight",
}
_GRANITE_FFN: list[_Rule] = [
    ("block_sparse_moe.router.layer.weight", ("ffn_gate_inp.weight",), SAME),
    ("block_sparse_moe.input_linear.weight", ("ffn_gate_exps.weight", "ffn_up_exps.weight"), CAT_EXPERTS),
    ("block_sparse_moe.output_linear.weight", ("ffn_down_exps.weight",), SAME),
    ("shared_mlp.input_linear.weight", ("ffn_gate_shexp.weight", "ffn_up_shexp.weight"), CAT),
    ("shared_mlp.output_linear.weight", ("ffn_down_shexp.weight",), SAME),
    ("shared_mlp.input_linear.weight", ("ffn_gate.weight", "ffn_up.weight"), CAT),  # no experts
    ("shared_mlp.output_linear.weight", ("ffn_down.weight",), SAME),
]
_NORMS: list[_Rule] = [
    ("input_layernorm.weight", ("attn_norm.weight",), SAME),
    ("post_attention_layernorm.weight", ("ffn_norm.weight",), SAME),
]

ARCHES: dict[str, _Arch] = {
    "llama": _Arch(  # Mixtral too: its converter writes a `llama` file with a router and stacked experts
        "LlamaForCausalLM",
        "model.layers.{i}.",
        _MODEL,
        [*_NORMS, *_ATTENTION, *_SWIGLU, ("block_sparse_moe.gate.weight", ("ffn_gate_inp.weight",), SAME)],
        [
            (f"block_sparse_moe.experts.{{e}}.{w}.weight", f"ffn_{x}_exps.weight")
            for x, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))
        ],
        {"a": "self_attn.", "f": "mlp."},
        permuted=True,
    ),
    "mamba2": _Arch(
        "Mamba2ForCausalLM",
        "backbone.layers.{i}.",
        _BACKBONE,
        [("norm.weight", ("attn_norm.weight",), SAME), *_MAMBA],
        [],
        {"m": "mixer."},
        permuted=False,
    ),
    "granitehybrid": _Arch(
        "GraniteMoeHybridForCausalLM",
        "model.layers.{i}.",
        _MODEL,
        [*_NORMS, *_MAMBA, *_ATTENTION, *_GRANITE_FFN],
        [],
        {"a": "self_attn.", "m": "mamba."},
        permuted=True,
    ),
    "nemotron_h": _Arch(
        "NemotronHForCausalLM",
        "backbone.layers.{i}.",
        _BACKBONE,
        [("norm.weight", ("attn_norm.weight",), SAME), *_MAMBA, *_ATTENTION, *_RELU2],
        [],
        {"a": "mixer.", "m": "mixer.", "f": "mixer."},
        permuted=True,
    ),
    "nemotron_h_moe": _Arch(
        "NemotronHForCausalLM",
        "backbone.layers.{i}.",
        _BACKBONE,
        [
            ("norm.weight", ("attn_norm.weight",), SAME),
            *_MAMBA,
            *_ATTENTION,
            *_RELU2,
            ("mixer.gate.weight", ("ffn_gate_inp.weight",), SAME),
            ("mixer.gate.e_score_correction_bias", ("exp_probs_b.bias",), SAME),
            *[
                (f"mixer.shared_experts.{x}_proj.weight", (f"ffn_{x}_shexp.weight",), SAME)
                for x in ("up", "down")
            ],
            # Nemotron 3 Super's latent MoE: hidden → latent before the experts, latent → hidden after
            ("mixer.fc1_latent_proj.weight", ("ffn_latent_down.weight",), SAME),
            ("mixer.fc2_latent_proj.weight", ("ffn_latent_up.weight",), SAME),
        ],
        [(f"mixer.experts.{{e}}.{x}_proj.weight", f"ffn_{x}_exps.weight") for x in ("up", "down")],
        {"a": "mixer.", "m": "mixer.", "f": "mixer."},
        permuted=True,
    ),
    "falcon-h1": _Arch(
        "FalconH1ForCausalLM",
        "model.layers.{i}.",
        {**_MODEL, "output_norm": "model.final_layernorm.weight"},
        [
            ("input_layernorm.weight", ("attn_norm.weight",), SAME),
            ("pre_ff_layernorm.weight", ("ffn_norm",), SAME),  # the converter writes it without ".weight"
            ("pre_ff_layernorm.weight", ("ffn_norm.weight",), SAME),
            *_MAMBA,
            *_ATTENTION,
            *_SWIGLU,
        ],
        [],
        {"a": "self_attn.", "m": "mamba.", "f": "feed_forward."},
        permuted=False,  # NEOX rope: q/k rows as HF keeps them
    ),
    "deepseek2": _Arch(
        "DeepseekV2ForCausalLM",  # V3 differs only in routing, which detection reads from metadata
        "model.layers.{i}.",
        _MODEL,
        [
            *_NORMS,
            *_MLA,
            *_SWIGLU,
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
# Qwen3-Next / Qwen3.5 (the converter's Qwen3NextModel, Qwen3_5TextModel): (1 + w) norms stored as 1 + w;
# gated attention's q_proj rows [q_h; gate_h] as HF keeps them (NEOX rope: no permutation); the DeltaNet's
# in_proj_qkv / in_proj_z / in_proj_b / in_proj_a as stored — Qwen3.5's value heads in llama.cpp's tiled order
# (detection says so: detect/gguf_hybrid.py) — and, for qwen3next, attn_qkv / attn_gate (the converter's
# split of in_proj_qkvz) read under Qwen3.5's names, which blazr's Qwen3-Next names take as well (its
# interleaved in_proj_ba stays one tensor, ssm_ba); A = −exp(A_log) back to A_log, conv1d [C, K] → [C, 1, K].
_QWEN3_NEXT: list[_Rule] = [
    ("input_layernorm.weight", ("attn_norm.weight",), OFFSET),
    ("post_attention_layernorm.weight", ("post_attention_norm.weight",), OFFSET),
    *[(f"self_attn.{x}_proj.weight", (f"attn_{x}.weight",), SAME) for x in "qkv"],
    ("self_attn.o_proj.weight", ("attn_output.weight",), SAME),
    *[(f"self_attn.{x}_norm.weight", (f"attn_{x}_norm.weight",), OFFSET) for x in "qk"],
    ("linear_attn.in_proj_qkv.weight", ("attn_qkv.weight",), SAME),
    ("linear_attn.in_proj_z.weight", ("attn_gate.weight",), SAME),
    ("linear_attn.in_proj_b.weight", ("ssm_beta.weight",), SAME),
    ("linear_attn.in_proj_a.weight", ("ssm_alpha.weight",), SAME),
    ("linear_attn.in_proj_ba.weight", ("ssm_ba.weight",), SAME),
    ("linear_attn.A_log", ("ssm_a",), A_LOG),
    ("linear_attn.dt_bias", ("ssm_dt.bias",), SAME),
    ("linear_attn.conv1d.weight", ("ssm_conv1d.weight",), CONV),
    ("linear_attn.norm.weight", ("ssm_norm.weight",), SAME),
    ("linear_attn.out_proj.weight", ("ssm_out.weight",), SAME),
    *[(f"mlp.{x}_proj.weight", (f"ffn_{x}.weight",), SAME) for x in ("gate", "up", "down")],
    ("mlp.gate.weight", ("ffn_gate_inp.weight",), SAME),
    *[
        (f"mlp.shared_expert.{x}_proj.weight", (f"ffn_{x}_shexp.weight",), SAME)
        for x in ("gate", "up", "down")
    ],
    ("mlp.shared_expert_gate.weight", ("ffn_gate_inp_shexp.weight",), ROW),
]
_QWEN3_NEXT_EXPERTS = [
    (f"mlp.experts.{{e}}.{x}_proj.weight", f"ffn_{x}_exps.weight") for x in ("gate", "up", "down")
]
_QWEN_GLOBALS = {**_MODEL, "output_norm": "model.norm.weight"}
ARCHES.update(
    {
        gguf_arch: _Arch(
            hf_arch, "model.layers.{i}.", _QWEN_GLOBALS, _QWEN3_NEXT, _QWEN3_NEXT_EXPERTS, {}, permuted=False
        )
        for gguf_arch, hf_arch in (
            ("qwen3next", "Qwen3NextForCausalLM"),
            ("qwen35", "Qwen3_5ForCausalLM"),
            ("qwen35moe", "Qwen3_5MoeForCausalLM"),
        )
    }
)
# Kimi-Linear (the converter's KimiLinearModel): KDA and MLA both under self_attn. — the KDA's q / k / v /
# output projections share MLA's GGUF names (attn_q, attn_output: each layer holds one kind), its convs
# [1, C, 1, K] → [C, 1, K], A = −exp(A_log) back to A_log, dt_bias stored as ssm_dt.bias; the dense MLP
# under mlp. (moonshotai's layout), the MoE under block_sparse_moe. with w1 / w3 / w2 experts.
_KIMI_LINEAR: list[_Rule] = [
    *_NORMS,
    *_MLA,
    *[(f"self_attn.{x}_proj.weight", (f"attn_{x}.weight",), SAME) for x in "kv"],
    *[(f"self_attn.{x}_conv1d.weight", (f"ssm_conv1d_{x}.weight",), CONV) for x in "qkv"],
    ("self_attn.A_log", ("ssm_a",), A_LOG),
    ("self_attn.dt_bias", ("ssm_dt.bias",), SAME),
    ("self_attn.b_proj.weight", ("ssm_beta.weight",), SAME),
    *[(f"self_attn.{x}_proj.weight", (f"ssm_{x}.weight",), SAME) for x in ("f_a", "f_b", "g_a", "g_b")],
    ("self_attn.o_norm.weight", ("ssm_norm.weight",), SAME),
    *[(f"mlp.{x}_proj.weight", (f"ffn_{x}.weight",), SAME) for x in ("gate", "up", "down")],
    ("block_sparse_moe.gate.weight", ("ffn_gate_inp.weight",), SAME),
    ("block_sparse_moe.gate.e_score_correction_bias", ("exp_probs_b.bias",), SAME),
    *[
        (f"block_sparse_moe.shared_experts.{x}_proj.weight", (f"ffn_{x}_shexp.weight",), SAME)
        for x in ("gate", "up", "down")
    ],
]
ARCHES["kimi-linear"] = _Arch(
    "KimiLinearForCausalLM",
    "model.layers.{i}.",
    _MODEL,
    _KIMI_LINEAR,
    [
        (f"block_sparse_moe.experts.{{e}}.{w}.weight", f"ffn_{x}_exps.weight")
        for x, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))
    ],
    {"a": "self_attn."},
    permuted=False,
)
_GLOBAL_OFFSET = {"qwen3next", "qwen35", "qwen35moe"}  # the output norm is a (1 + w) norm too
# The short-conv and Mamba1 families (llama.cpp's lfm2 / lfm2moe, mamba — Mamba and Falcon-Mamba — and jamba).
_LFM2: list[_Rule] = [
    ("operator_norm.weight", ("attn_norm.weight",), SAME),
    ("ffn_norm.weight", ("ffn_norm.weight",), SAME),
    ("conv.conv.weight", ("shortconv.conv.weight",), CONV),
    ("conv.in_proj.weight", ("shortconv.in_proj.weight",), SAME),
    ("conv.out_proj.weight", ("shortconv.out_proj.weight",), SAME),
    *[(f"self_attn.{x}_proj.weight", (f"attn_{x}.weight",), SAME) for x in "qkv"],
    ("self_attn.out_proj.weight", ("attn_output.weight",), SAME),
    *[(f"self_attn.{x}_layernorm.weight", (f"attn_{x}_norm.weight",), SAME) for x in "qk"],
    *[
        (f"feed_forward.{w}.weight", (f"ffn_{x}.weight",), SAME)
        for x, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))
    ],
    ("feed_forward.gate.weight", ("ffn_gate_inp.weight",), SAME),
    ("feed_forward.expert_bias", ("exp_probs_b.bias",), SAME),
]
_MAMBA1: list[_Rule] = [  # ssm_a holds A = −exp(A_log) [Di, N]
    ("{m}in_proj.weight", ("ssm_in.weight",), SAME),
    ("{m}in_proj.bias", ("ssm_in.bias",), SAME),
    ("{m}conv1d.weight", ("ssm_conv1d.weight",), CONV),
    ("{m}conv1d.bias", ("ssm_conv1d.bias",), SAME),
    ("{m}x_proj.weight", ("ssm_x.weight",), SAME),
    ("{m}dt_proj.weight", ("ssm_dt.weight",), SAME),
    ("{m}dt_proj.bias", ("ssm_dt.bias",), SAME),
    ("{m}A_log", ("ssm_a",), A_LOG),
    ("{m}D", ("ssm_d",), SAME),
    ("{m}out_proj.weight", ("ssm_out.weight",), SAME),
    ("{m}out_proj.bias", ("ssm_out.bias",), SAME),
    *[(f"{{m}}{x}_layernorm.weight", (f"ssm_{x}_norm.weight",), SAME) for x in ("dt", "b", "c")],  # Jamba
]
ARCHES.update(
    lfm2=_Arch(
        "Lfm2ForCausalLM",
        "model.layers.{i}.",
        {**_MODEL, "token_embd_norm": "model.embedding_norm.weight"},
        _LFM2,
        [],
        {},
        permuted=False,  # NEOX rope: q/k rows as HF keeps them
    ),
    lfm2moe=_Arch(
        "Lfm2MoeForCausalLM",
        "model.layers.{i}.",
        {**_MODEL, "token_embd_norm": "model.embedding_norm.weight"},
        _LFM2,
        [
            (f"feed_forward.experts.{{e}}.{w}.weight", f"ffn_{x}_exps.weight")
            for x, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))
        ],
        {},
        permuted=False,
    ),
    mamba=_Arch(
        "MambaForCausalLM",  # Falcon-Mamba too: detection reads ssm.dt_b_c_rms
        "backbone.layers.{i}.",
        _BACKBONE,
        [("norm.weight", ("attn_norm.weight",), SAME), *_MAMBA1],
        [],
        {"m": "mixer."},
        permuted=False,
    ),
    jamba=_Arch(
        "JambaForCausalLM",
        "model.layers.{i}.",
        {**_MODEL, "output_norm": "model.final_layernorm.weight"},
        [
            *_NORMS[:1],
            ("pre_ff_layernorm.weight", ("ffn_norm.weight",), SAME),
            *_MAMBA1,
            *_ATTENTION,
            *_SWIGLU,
            ("feed_forward.router.weight", ("ffn_gate_inp.weight",), SAME),
        ],
        [
            (f"feed_forward.experts.{{e}}.{x}_proj.weight", f"ffn_{x}_exps.weight")
            for x in ("gate", "up", "down")
        ],
        {"a": "self_attn.", "m": "mamba.", "f": "feed_forward."},
        permuted=False,  # NoPE
    ),
)
# Qwen2 / Qwen3 / Qwen3-MoE (the converter's Qwen2Model, Qwen3Model, Qwen3MoeModel): Llama's tensors with NEOX
# rope (q/k rows as HF keeps them), q/k biases (Qwen2), per-head q/k norms (Qwen3), and on Qwen3-MoE's sparse
# layers a router and stacked experts (its dense layers, `mlp_only_layers`, keep ffn_gate / up / down).
_QWEN: list[_Rule] = [
    *_NORMS,
    *_ATTENTION,
    *[(f"{{a}}{x}_norm.weight", (f"attn_{x}_norm.weight",), SAME) for x in "qk"],
    *_SWIGLU,
    ("mlp.gate.weight", ("ffn_gate_inp.weight",), SAME),
]
ARCHES.update(
    {
        gguf_arch: _Arch(
            hf_arch,
            "model.layers.{i}.",
            _MODEL,
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
    granite=_Arch(
        "GraniteForCausalLM",
        "model.layers.{i}.",
        _MODEL,
        [*_NORMS, *_ATTENTION, *_SWIGLU],
        [],
        {"a": "self_attn.", "f": "mlp."},
        permuted=True,
    ),
    granitemoe=_Arch(
        "GraniteMoeForCausalLM",  # GraniteMoeShared with shared experts (detection reads the metadata)
        "model.layers.{i}.",
        _MODEL,
        [*_NORMS, *_ATTENTION, *_GRANITE_FFN[:5]],
        [],
        {"a": "self_attn."},
        permuted=True,
    ),
)
# SmolLM3 (the converter's SmolLM3Model: LlamaModel's tensors and q/k permutation; its NoPE layers, every 4th,
# are llama.cpp's fixed step and SmolLM3's default, which detection assumes).
ARCHES["smollm3"] = dataclasses.replace(ARCHES["llama"], hf_architecture="SmolLM3ForCausalLM", experts=[])
# OLMo 2 / OLMo 3 (the converter's Olmo2Model): post-norm blocks, q/k norms over all heads, NEOX rope.
ARCHES["olmo2"] = _Arch(
    "Olmo2ForCausalLM",  # OLMo 3 where the file has sliding-window layers: detection reads the metadata
    "model.layers.{i}.",
    _MODEL,
    [
        ("post_attention_layernorm.weight", ("post_attention_norm.weight",), SAME),
        ("post_feedforward_layernorm.weight", ("post_ffw_norm.weight",), SAME),
        *_ATTENTION,
        *[(f"{{a}}{x}_norm.weight", (f"attn_{x}_norm.weight",), SAME) for x in "qk"],
        *_SWIGLU,
    ],
    [],
    {"a": "self_attn.", "f": "mlp."},
    permuted=False,
)
# Gemma 2 / Gemma 3 (the converter's Gemma2Model, Gemma3Model): sandwich norms, every one a (1 + w) norm
# stored as 1 + w (the output norm too), Gemma 3's per-head q/k norms; NEOX rope (q/k rows as HF keeps them).
_GEMMA: list[_Rule] = [
    ("input_layernorm.weight", ("attn_norm.weight",), OFFSET),
    ("post_attention_layernorm.weight", ("post_attention_norm.weight",), OFFSET),
    ("pre_feedforward_layernorm.weight", ("ffn_norm.weight",), OFFSET),
    ("post_feedforward_layernorm.weight", ("post_ffw_norm.weight",), OFFSET),
    *_ATTENTION,
    *[(f"{{a}}{x}_norm.weight", (f"attn_{x}_norm.weight",), OFFSET) for x in "qk"],
    *_SWIGLU,
]
ARCHES.update(
    {
        gguf_arch: _Arch(
            hf_arch, "model.layers.{i}.", _MODEL, _GEMMA, [], {"a": "self_attn.", "f": "mlp."}, False
        )
        for gguf_arch, hf_arch in (("gemma2", "Gemma2ForCausalLM"), ("gemma3", "Gemma3ForCausalLM"))
    }
)
_GLOBAL_OFFSET |= {"gemma2", "gemma3"}
# GLM-4.5 / 4.6 (the converter's Glm4MoeModel): Llama's tensors with NEOX rope (q/k rows as HF keeps
# them), q/k biases, per-head q/k norms where the model has them, the post-attention norm written as
# `post_attention_norm`; dense first layers' ffn_gate / up / down, then DeepSeek-V3's router (with
# exp_probs_b), stacked experts and shared experts. The MTP block (`blk.{N}`, past the decoder's N layers: a
# whole layer plus `nextn.*`) gets the HF names GLM's checkpoints give it, which the name map leaves unread.
ARCHES["glm4moe"] = _Arch(
    "Glm4MoeForCausalLM",
    "model.layers.{i}.",
    _MODEL,
    [
        *_NORMS[:1],
        ("post_attention_layernorm.weight", ("post_attention_norm.weight",), SAME),
        *_ATTENTION,
        *[(f"{{a}}{x}_norm.weight", (f"attn_{x}_norm.weight",), SAME) for x in "qk"],
        *_SWIGLU,
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
ARCHES["phi3"] = _Arch(
    "Phi3ForCausalLM",
    "model.layers.{i}.",
    _MODEL,
    [
        *_NORMS,
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
ARCHES["gpt-oss"] = _Arch(
    "GptOssForCausalLM",
    "model.layers.{i}.",
    _MODEL,
    [
        *_NORMS[:1],
        ("post_attention_layernorm.weight", ("post_attention_norm.weight",), SAME),
        *_ATTENTION,
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
ARCHES["gemma4"] = _Arch(
    "Gemma4ForCausalLM",
    "model.layers.{i}.",
    {
        **_MODEL,
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
_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")
# llama.cpp's rope factors (llama3's precomputed, LongRoPE's short / long): detection reads them as config
_IGNORED = ("rope_freqs.weight", "rope_factors_short.weight", "rope_factors_long.weight")


def supported_architectures() -> list[str]:
    return sorted(ARCHES)


class GGUFView:
    """The tensors of `gguf` under the HF names and shapes its converter read them from.

    `q_heads` / `kv_heads`: per layer, the attention heads of the layers whose q/k rows were permuted (0 for
    layers without attention); other layers and architectures ignore them.
    """

    def __init__(self, gguf: GGUFFile, q_heads: Sequence[int] = (), kv_heads: Sequence[int] = ()) -> None:
        arch_name = gguf.metadata.get("general.architecture")
        arch = ARCHES.get(str(arch_name))
        if arch is None:
            raise UnsupportedError(
                f"{gguf.path}: GGUF architecture {arch_name!r} is not supported "
                f"(supported: {', '.join(supported_architectures())})"
            )
        self.gguf = gguf
        self.path = gguf.path
        self.hf_architecture = arch.hf_architecture
        self._recipes: dict[str, Recipe] = {}
        used: set[str] = set()
        for name, hf in arch.globals.items():
            if f"{name}.weight" in gguf.tensor_names:
                op = OFFSET if name == "output_norm" and arch_name in _GLOBAL_OFFSET else SAME
                self._recipes[hf] = Recipe((f"{name}.weight",), gguf.tensor_shape(f"{name}.weight"), op)
                used.add(f"{name}.weight")
        by_layer: dict[int, set[str]] = {}
        for name in gguf.tensor_names:
            if m := _BLOCK.fullmatch(name):
                by_layer.setdefault(int(m.group(1)), set()).add(m.group(2))
        modules = {k: arch.modules.get(k, "") for k in "amf"}
        for i, tails in sorted(by_layer.items()):
            prefix = arch.layer.format(i=i)
            for hf_tail, gguf_tails, op in arch.rules:
                hf = prefix + hf_tail.format(**modules)
                if hf in self._recipes or not all(t in tails for t in gguf_tails):
                    continue
                sources = tuple(f"blk.{i}.{t}" for t in gguf_tails)
                heads = 0
                if op == QK:
                    heads = _at(q_heads if ".q_proj." in hf else kv_heads, i)
                    if not arch.permuted or heads == 0:
                        op = SAME
                self._recipes[hf] = self._recipe(sources, op, heads)
                used.update(sources)
            for hf_tail, gguf_tail in arch.experts:
                if gguf_tail not in tails:
                    continue
                src = f"blk.{i}.{gguf_tail}"
                E, R, C = self._shape3(src)
                for e in range(E):
                    self._recipes[prefix + hf_tail.format(e=e)] = Recipe((src,), (R, C), EXPERT, e)
                used.add(src)
        left = sorted(n for n in gguf.tensor_names if n not in used and not n.endswith(_IGNORED))
        if left:
            more = f" (+{len(left) - 5} more)" if len(left) > 5 else ""
            log.warning(
                "%s: %d GGUF tensors have no HF name and are ignored: %s%s",
                gguf.path,
                len(left),
                left[:5],
                more,
            )

    def _shape3(self, name: str) -> tuple[int, int, int]:
        shape = self.gguf.tensor_shape(name)
        if len(shape) != 3:
            raise CheckpointError(
                f"{self.path}: tensor {name!r}: expected 3 dims [E, R, C], found {list(shape)}"
            )
        return shape[0], shape[1], shape[2]

    def _recipe(self, sources: tuple[str, ...], op: str, heads: int) -> Recipe:
        shapes = [self.gguf.tensor_shape(s) for s in sources]
        first = shapes[0]
        if op == A_LOG and len(first) == 2 and first[1] > 1:  # Mamba1's A [Di, N]: as stored
            return Recipe(sources, first, op)
        if op in (A_LOG, FLAT):
            return Recipe(sources, (math.prod(first),), op)
        if op == ROW:
            return Recipe(sources, (1, math.prod(first)), op)
        if op == CONV:  # [C, K] (or Kimi-Linear's [1, C, 1, K]) → [C, 1, K]
            return Recipe(sources, (math.prod(first[:-1]), 1, first[-1]), op)
        if op == CAT:
            return Recipe(sources, (sum(s[0] for s in shapes), *first[1:]), op)
        if op == INTERLEAVE:
            return Recipe(sources, (first[0], 2 * first[1]), op)
        if op == CAT_EXPERTS:
            (E, R, C), (_, R2, _) = self._shape3(sources[0]), self._shape3(sources[1])
            return Recipe(sources, (E, R + R2, C), op)
        if op == KV_B:
            (H, L, Dn), (_, Dv, _) = self._shape3(sources[0]), self._shape3(sources[1])
            return Recipe(sources, (H * (Dn + Dv), L), op)
        return Recipe(sources, first, op, heads)

    @property
    def names(self) -> set[str]:
        return set(self._recipes)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._recipes[name].shape

    def sources(self, name: str) -> tuple[str, ...]:
        """The GGUF tensors HF tensor `name` is made from."""
        return self._recipes[name].sources

    def file_of(self, name: str) -> object:
        return f"{self.path} ({', '.join(self._recipes[name].sources)})"

    def _expert_rows(self, r: Recipe) -> torch.Tensor:
        """The stored bytes of expert `r.arg`: its R rows of the stacked [E·R, bytes per row]."""
        return self._arrange_rows(r, [self.gguf.raw(r.sources[0])])

    def load(self, name: str) -> torch.Tensor:
        """HF tensor `name` as float32, in HF layout (an expert dequantizes only its own rows)."""
        r = self._recipes[name]
        if r.op == EXPERT:
            return dequantize(self._expert_rows(r), self.gguf.tensor_type(r.sources[0]), r.shape)
        ts = [self.gguf.load(s, torch.float32) for s in r.sources]
        if r.op == SAME:
            return ts[0]
        if r.op == QK:
            return unpermute_qk(ts[0], r.arg)
        if r.op == A_LOG:
            return torch.log(-ts[0]).reshape(r.shape)
        if r.op == OFFSET:
            return ts[0] - 1
        if r.op in (FLAT, CONV, ROW):
            return ts[0].reshape(r.shape)
        if r.op == CAT:
            return torch.cat(ts)
        if r.op == INTERLEAVE:
            return torch.stack(ts, dim=-1).flatten(-2)
        if r.op == CAT_EXPERTS:
            return torch.cat(ts, dim=1)
        k_b, v_b = ts  # KV_B: [H, L, Dn], [H, Dv, L] → per head [Dn + Dv, L]
        return torch.cat([k_b.transpose(1, 2), v_b], dim=1).reshape(r.shape)

    def release(self, name: str) -> None:
        """Drop the mapped pages of HF tensor `name`'s sources (`GGUFFile.release`): call only once its bytes
        were copied (dequantized or repacked) and no view of them is kept."""
        for src in self._recipes[name].sources:
            self.gguf.release(src)

    def holds(self, t: torch.Tensor) -> bool:
        """Whether tensor `t` views the file's map (`GGUFFile.holds`)."""
        return self.gguf.holds(t)

    def span(self, address: int, num_bytes: int) -> torch.Tensor:
        """A view of the file's map (`GGUFFile.span`)."""
        return self.gguf.span(address, num_bytes)

    def load_raw(self, name: str) -> tuple[str, torch.Tensor]:
        """(ggml type, stored bytes [rows, bytes per row]) of HF tensor `name` when it is whole rows of GGUF
        tensors of one type (q/k rows un-permuted); else ("F32", its float32 bytes), which no quantized path
        takes as blocks."""
        r = self._recipes[name]
        types = {self.gguf.tensor_type(s) for s in r.sources}
        if r.op not in _ROWWISE or len(types) != 1:
            t = self.load(name)
            return "F32", t.reshape(-1, t.shape[-1]).view(torch.uint8)
        raw = self._arrange_rows(r, [self.gguf.raw(s) for s in r.sources])
        return types.pop(), raw.contiguous()  # one tensor's rows in order: a view of the file, no copy

    def row_addresses(self, name: str) -> tuple[str, torch.Tensor] | None:
        """(ggml type, int64 [rows]: the address of each row's stored bytes in the file's map, in HF row
        order) — `load_raw`'s rows without gathering them (for `pack_rows`) — when HF tensor `name` is whole
        rows of GGUF tensors of one type; else None. The map lives as long as this view."""
        r = self._recipes[name]
        types = {self.gguf.tensor_type(s) for s in r.sources}
        if r.op not in _ROWWISE or len(types) != 1:
            return None
        parts = []
        for s in r.sources:
            raw = self.gguf.raw(s)  # [R, bytes per row], contiguous
            parts.append((raw.data_ptr() + torch.arange(raw.shape[0]) * raw.stride(0)).unsqueeze(1))
        return types.pop(), self._arrange_rows(r, parts).reshape(-1)

    def _arrange_rows(self, r: Recipe, parts: list[torch.Tensor]) -> torch.Tensor:
        """The rows of a row-wise recipe from its sources' rows `parts` (each [R, X]: stored bytes, or row
        addresses as [R, 1])."""
        if r.op == EXPERT:  # expert `arg`: its R rows of the stacked [E·R, X]
            R = r.shape[0]
            return parts[0][r.arg * R : (r.arg + 1) * R]
        if r.op == QK:
            return unpermute_qk(parts[0], r.arg)
        if r.op == CAT_EXPERTS:  # per expert its gate rows, then its up rows
            E = r.shape[0]
            rows = [t.reshape(E, -1, t.shape[-1]) for t in parts]
            return torch.cat(rows, dim=1).reshape(-1, parts[0].shape[-1])
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def _at(values: Sequence[int], i: int) -> int:
    return int(values[i]) if i < len(values) else 0
