"""Renames for Qwen3-Next and Qwen3.5 / 3.6 (dense, MoE, and the text model of the `…ForConditionalGeneration`
checkpoints under `model.language_model.`): gated DeltaNet under `linear_attn.`, gated attention under
`self_attn.`, the MoE under `mlp.` (experts per expert or as transformers 5's fused 3-D tensors, the shared
expert and its gate).

Row moves (`RowOrder`, so a GGUF's quantized rows move as stored):
- gated attention: q_proj holds per head [q_h; gate_h]; blazr's qkv_proj takes q's rows and the gate's apart;
- Qwen3.5's DeltaNet: in_proj_qkv [q | k | v] gives blazr's q / k / v parts; in_proj_z, in_proj_b, in_proj_a;
- Qwen3-Next's DeltaNet: in_proj_qkvz holds per key head g [q_g; k_g; v_g; z_g] (v_g, z_g: its Hv/Hk value
  heads) and in_proj_ba per key head [b_g; a_g]; blazr's in_proj_qkvz / in_proj_ba are [q | k | v | z] /
  [b | a].
"""

from __future__ import annotations

import re

import torch

from blazr.config import AttentionConfig, GatedDeltaNetConfig, ModelConfig
from blazr.loading.names import NameMap, RowOrder

L = r"layers\.(\d+)\."


def picked(index: torch.Tensor, source_rows: int) -> RowOrder:
    """The rows `index` of a stored tensor of `source_rows` rows."""
    return RowOrder(lambda t: t[index], source_rows)


def _gate_rows(a: AttentionConfig, part: str) -> RowOrder:
    """q's (part "q") or the gate's rows of q_proj [H·2·Dh]: per head [q_h; gate_h]."""
    H, Dh = a.num_heads, a.head_dim
    rows = torch.arange(2 * H * Dh).view(H, 2, Dh)[:, 0 if part == "q" else 1].flatten()
    return picked(rows, 2 * H * Dh)


def _qkvz_rows(d: GatedDeltaNetConfig) -> RowOrder:
    """blazr's [q | k | v | z] rows from Qwen3-Next's per-key-head [q_g; k_g; v_g; z_g]."""
    Hk, Dk, r, Dv = d.num_k_heads, d.head_k_dim, d.num_v_heads // d.num_k_heads, d.head_v_dim
    group = torch.arange(Hk * (2 * Dk + 2 * r * Dv)).view(Hk, -1)
    q, k, v, z = group.split([Dk, Dk, r * Dv, r * Dv], dim=1)
    order = torch.cat([q.flatten(), k.flatten(), v.flatten(), z.flatten()])
    return RowOrder(lambda t: t[order])


def _ba_rows(d: GatedDeltaNetConfig) -> RowOrder:
    """blazr's [b | a] rows from Qwen3-Next's per-key-head [b_g; a_g]."""
    r = d.num_v_heads // d.num_k_heads
    b, a = torch.arange(2 * d.num_v_heads).view(d.num_k_heads, 2 * r).split([r, r], dim=1)
    order = torch.cat([b.flatten(), a.flatten()])
    return RowOrder(lambda t: t[order])


def _qkv_part(d: GatedDeltaNetConfig, part: str) -> RowOrder:
    """blazr's q, k or v part: its rows of Qwen3.5's in_proj_qkv [q | k | v]."""
    Kd = d.key_dim
    start, n = {"q": (0, Kd), "k": (Kd, Kd), "v": (2 * Kd, d.value_dim)}[part]
    return picked(torch.arange(start, start + n), 2 * Kd + d.value_dim)


def qwen3_next_names(cfg: ModelConfig, prefix: str = "model.") -> NameMap:
    M = prefix + r"layers.\1."

    def attention(m: re.Match[str]) -> AttentionConfig:
        a = cfg.layers[int(m.group(1))].mixer(AttentionConfig)
        assert a is not None
        return a

    def deltanet(m: re.Match[str]) -> GatedDeltaNetConfig:
        d = cfg.layers[int(m.group(1))].mixer(GatedDeltaNetConfig)
        assert d is not None
        return d

    return (
        NameMap()
        .add(r"embed_tokens\.weight", prefix + "embed_tokens.weight")
        .add(r"norm\.weight", prefix + "norm.weight")
        .add(r"lm_head\.weight", "lm_head.weight")
        .add(L + r"mixer_norm\.weight", M + "input_layernorm.weight")
        .add(L + r"ffn_norm\.weight", M + "post_attention_layernorm.weight")
        # gated attention: q and the gate from q_proj's rows
        .add(L + r"attn\.q_proj\.(weight|bias)", M + r"self_attn.q_proj.\2",
             lambda m: _gate_rows(attention(m), "q"))
        .add(L + r"attn\.q_gate\.(weight|bias)", M + r"self_attn.q_proj.\2",
             lambda m: _gate_rows(attention(m), "g"))
        .add(L + r"attn\.(.+)", M + r"self_attn.\2")
        # DeltaNet: Qwen3-Next's fused, interleaved projections, else Qwen3.5's
        .add(L + r"deltanet\.in_proj_qkvz\.weight", M + "linear_attn.in_proj_qkvz.weight",
             lambda m: _qkvz_rows(deltanet(m)))
        .add(L + r"deltanet\.in_proj_ba\.weight", M + "linear_attn.in_proj_ba.weight",
             lambda m: _ba_rows(deltanet(m)))
        .add(L + r"deltanet\.(q|k|v)_proj\.weight", M + "linear_attn.in_proj_qkv.weight",
             lambda m: _qkv_part(deltanet(m), m.group(2)))
        .add(L + r"deltanet\.(z|b|a)_proj\.weight", M + r"linear_attn.in_proj_\2.weight")
        .add(L + r"deltanet\.(.+)", M + r"linear_attn.\2")
        # feed-forward
        .add(L + r"mlp\.(.+)", M + r"mlp.\2")
        .add(L + r"moe\.router\.weight", M + "mlp.gate.weight")
        .add(L + r"moe\.experts\.(gate_up_proj|down_proj)", M + r"mlp.experts.\2")
        .add(L + r"moe\.experts\.(\d+)\.(.+)", M + r"mlp.experts.\2.\3")
        .add(L + r"moe\.shared\.(.+)", M + r"mlp.shared_expert.\2")
        .add(L + r"moe\.shared_gate\.weight", M + "mlp.shared_expert_gate.weight")
        .ignore("model.visual.", "mtp.")  # the vision tower (detection says so once), the MTP head
    )  # fmt: skip


NAME_MAPS = {
    "Qwen3NextForCausalLM": qwen3_next_names,
    "Qwen3_5ForCausalLM": qwen3_next_names,
    "Qwen3_5MoeForCausalLM": qwen3_next_names,
    "Qwen3_5ForConditionalGeneration": lambda cfg: qwen3_next_names(cfg, "model.language_model."),
    "Qwen3_5MoeForConditionalGeneration": lambda cfg: qwen3_next_names(cfg, "model.language_model."),
}
