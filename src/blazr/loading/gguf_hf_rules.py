"""The vocabulary of the GGUF → HF name tables (loading/gguf_hf_attention.py, loading/gguf_hf_hybrid.py):
the ops that make an HF tensor from its GGUF sources, a rule (HF tail, GGUF tails, op), an architecture's
`Arch` (HF architecture, layer prefix, global names, rules, stacked experts, module prefixes, whether q/k rows
were permuted), and the rules and global names several families share (Llama-style attention, SwiGLU, MLA,
the pre-norms, Granite's fused-expert feed-forward).

In: nothing (constants). Out: the op names, `Rule`, `Arch` and the shared rule lists, read by the family
tables and by loading/gguf_hf.py's `GGUFView`, which carries the ops out.

A rule is (HF tail, GGUF tails, op); `{a}` is the attention module's HF prefix, `{m}` the Mamba2 / DeltaNet
mixer's, `{f}` the feed-forward's. Rules whose GGUF tensors are all present apply.
"""

from __future__ import annotations

from dataclasses import dataclass

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

Rule = tuple[str, tuple[str, ...], str]

ATTENTION: list[Rule] = [
    *[(f"{{a}}{x}_proj.{k}", (f"attn_{x}.{k}",), QK) for x in "qk" for k in ("weight", "bias")],
    *[(f"{{a}}v_proj.{k}", (f"attn_v.{k}",), SAME) for k in ("weight", "bias")],
    *[(f"{{a}}o_proj.{k}", (f"attn_output.{k}",), SAME) for k in ("weight", "bias")],
]
SWIGLU: list[Rule] = [
    (f"{{f}}{x}_proj.{k}", (f"ffn_{x}.{k}",), SAME)
    for x in ("gate", "up", "down")
    for k in ("weight", "bias")
]
MLA: list[Rule] = [
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
class Arch:
    hf_architecture: str
    layer: str  # HF prefix of layer N
    globals: dict[str, str]  # GGUF global tensor → HF name
    rules: list[Rule]
    experts: list[tuple[str, str]]  # (HF per-expert tail with {e}, GGUF stacked tail) → EXPERT recipes
    modules: dict[str, str]  # the {a} / {m} / {f} prefixes
    permuted: bool  # q/k rows permuted by the converter (LlamaModel's undo_permute)


MODEL = {
    "token_embd": "model.embed_tokens.weight",
    "output_norm": "model.norm.weight",
    "output": "lm_head.weight",
}
GRANITE_FFN: list[Rule] = [
    ("block_sparse_moe.router.layer.weight", ("ffn_gate_inp.weight",), SAME),
    ("block_sparse_moe.input_linear.weight", ("ffn_gate_exps.weight", "ffn_up_exps.weight"), CAT_EXPERTS),
    ("block_sparse_moe.output_linear.weight", ("ffn_down_exps.weight",), SAME),
    ("shared_mlp.input_linear.weight", ("ffn_gate_shexp.weight", "ffn_up_shexp.weight"), CAT),
    ("shared_mlp.output_linear.weight", ("ffn_down_shexp.weight",), SAME),
    ("shared_mlp.input_linear.weight", ("ffn_gate.weight", "ffn_up.weight"), CAT),  # no experts
    ("shared_mlp.output_linear.weight", ("ffn_down.weight",), SAME),
]
NORMS: list[Rule] = [
    ("input_layernorm.weight", ("attn_norm.weight",), SAME),
    ("post_attention_layernorm.weight", ("ffn_norm.weight",), SAME),
]
