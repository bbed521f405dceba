"""GGUF → HF names of the state-space and linear-attention families and their hybrids: per llama.cpp
architecture (mamba2, granitehybrid, nemotron_h / nemotron_h_moe, falcon-h1, qwen3next / qwen35 / qwen35moe,
kimi-linear, lfm2 / lfm2moe, mamba, jamba), which GGUF tensors make each HF tensor and by which op — the
inverse of `convert_hf_to_gguf.py`'s names for them.

In: the shared rules and `Arch` of loading/gguf_hf_rules.py. Out: `ARCHES` (llama.cpp architecture → its
`Arch`) and `OUTPUT_NORM_OFFSET` (those whose output norm is a (1 + w) norm stored as 1 + w), merged with
the attention families' by loading/gguf_hf.py.
"""

from __future__ import annotations

from blazr.loading.gguf_hf_rules import (
    A_LOG,
    ATTENTION,
    CONV,
    FLAT,
    GRANITE_FFN,
    MLA,
    MODEL,
    NORMS,
    OFFSET,
    ROW,
    SAME,
    SWIGLU,
    Arch,
    Rule,
)

_MAMBA: list[Rule] = [
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
_RELU2: list[Rule] = [  # NemotronH's ungated MLP
    (f"{{f}}{x}_proj.{k}", (f"ffn_{x}.{k}",), SAME) for x in ("up", "down") for k in ("weight", "bias")
]
_BACKBONE = {
    "token_embd": "backbone.embeddings.weight",
    "output_norm": "backbone.norm_f.weight",
    "output": "lm_head.weight",
}

ARCHES: dict[str, Arch] = {
    "mamba2": Arch(
        "Mamba2ForCausalLM",
        "backbone.layers.{i}.",
        _BACKBONE,
        [("norm.weight", ("attn_norm.weight",), SAME), *_MAMBA],
        [],
        {"m": "mixer."},
        permuted=False,
    ),
    "granitehybrid": Arch(
        "GraniteMoeHybridForCausalLM",
        "model.layers.{i}.",
        MODEL,
        [*NORMS, *_MAMBA, *ATTENTION, *GRANITE_FFN],
        [],
        {"a": "self_attn.", "m": "mamba."},
        permuted=True,
    ),
    "nemotron_h": Arch(
        "NemotronHForCausalLM",
        "backbone.layers.{i}.",
        _BACKBONE,
        [("norm.weight", ("attn_norm.weight",), SAME), *_MAMBA, *ATTENTION, *_RELU2],
        [],
        {"a": "mixer.", "m": "mixer.", "f": "mixer."},
        permuted=True,
    ),
    "nemotron_h_moe": Arch(
        "NemotronHForCausalLM",
        "backbone.layers.{i}.",
        _BACKBONE,
        [
            ("norm.weight", ("attn_norm.weight",), SAME),
            *_MAMBA,
            *ATTENTION,
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
    "falcon-h1": Arch(
        "FalconH1ForCausalLM",
        "model.layers.{i}.",
        {**MODEL, "output_norm": "model.final_layernorm.weight"},
        [
            ("input_layernorm.weight", ("attn_norm.weight",), SAME),
            ("pre_ff_layernorm.weight", ("ffn_norm",), SAME),  # the converter writes it without ".weight"
            ("pre_ff_layernorm.weight", ("ffn_norm.weight",), SAME),
            *_MAMBA,
            *ATTENTION,
            *SWIGLU,
        ],
        [],
        {"a": "self_attn.", "m": "mamba.", "f": "feed_forward."},
        permuted=False,  # NEOX rope: q/k rows as HF keeps them
    ),
}
# Qwen3-Next / Qwen3.5 (the converter's Qwen3NextModel, Qwen3_5TextModel): (1 + w) norms stored as 1 + w;
# gated attention's q_proj rows [q_h; gate_h] as HF keeps them (NEOX rope: no permutation); the DeltaNet's
# in_proj_qkv / in_proj_z / in_proj_b / in_proj_a as stored — Qwen3.5's value heads in llama.cpp's tiled order
# (detection says so: detect/gguf_hybrid.py) — and, for qwen3next, attn_qkv / attn_gate (the converter's
# split of in_proj_qkvz) read under Qwen3.5's names, which blazr's Qwen3-Next names take as well (its
# interleaved in_proj_ba stays one tensor, ssm_ba); A = −exp(A_log) back to A_log, conv1d [C, K] → [C, 1, K].
_QWEN3_NEXT: list[Rule] = [
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
_QWEN_GLOBALS = {**MODEL, "output_norm": "model.norm.weight"}
ARCHES.update(
    {
        gguf_arch: Arch(
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
_KIMI_LINEAR: list[Rule] = [
    *NORMS,
    *MLA,
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
ARCHES["kimi-linear"] = Arch(
    "KimiLinearForCausalLM",
    "model.layers.{i}.",
    MODEL,
    _KIMI_LINEAR,
    [
        (f"block_sparse_moe.experts.{{e}}.{w}.weight", f"ffn_{x}_exps.weight")
        for x, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))
    ],
    {"a": "self_attn."},
    permuted=False,
)
OUTPUT_NORM_OFFSET = {"qwen3next", "qwen35", "qwen35moe"}  # the output norm is a (1 + w) norm too
# The short-conv and Mamba1 families (llama.cpp's lfm2 / lfm2moe, mamba — Mamba and Falcon-Mamba — and jamba).
_LFM2: list[Rule] = [
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
_MAMBA1: list[Rule] = [  # ssm_a holds A = −exp(A_log) [Di, N]
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
    lfm2=Arch(
        "Lfm2ForCausalLM",
        "model.layers.{i}.",
        {**MODEL, "token_embd_norm": "model.embedding_norm.weight"},
        _LFM2,
        [],
        {},
        permuted=False,  # NEOX rope: q/k rows as HF keeps them
    ),
    lfm2moe=Arch(
        "Lfm2MoeForCausalLM",
        "model.layers.{i}.",
        {**MODEL, "token_embd_norm": "model.embedding_norm.weight"},
        _LFM2,
        [
            (f"feed_forward.experts.{{e}}.{w}.weight", f"ffn_{x}_exps.weight")
            for x, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))
        ],
        {},
        permuted=False,
    ),
    mamba=Arch(
        "MambaForCausalLM",  # Falcon-Mamba too: detection reads ssm.dt_b_c_rms
        "backbone.layers.{i}.",
        _BACKBONE,
        [("norm.weight", ("attn_norm.weight",), SAME), *_MAMBA1],
        [],
        {"m": "mixer."},
        permuted=False,
    ),
    jamba=Arch(
        "JambaForCausalLM",
        "model.layers.{i}.",
        {**MODEL, "output_norm": "model.final_layernorm.weight"},
        [
            *NORMS[:1],
            ("pre_ff_layernorm.weight", ("ffn_norm.weight",), SAME),
            *_MAMBA1,
            *ATTENTION,
            *SWIGLU,
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
