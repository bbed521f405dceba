"""Renames for HF `Zamba2ForCausalLM`: a Mamba2 layer's `input_layernorm` and `mamba.`; a hybrid layer's
`mamba_decoder.{input_layernorm, mamba}`, its call's output `linear` and adapters (under the hybrid layer
that holds the called block, `shared_transformer.self_attn.linear_{q,k,v}_adapter_list.{j}` and
`shared_transformer.feed_forward.gate_up_proj_adapter_list.{j}`, j the call's index among the hybrid
layers); shared block b (`shared_blocks.{b}`) under the hybrid layer that first calls it
(`shared_transformer.{input_layernorm, self_attn.*_proj, pre_ff_layernorm, feed_forward.*}`); final norm
`final_layernorm`."""

from __future__ import annotations

from blazr.config import ModelConfig, Zamba2SharedConfig
from blazr.loading.names import NameMap

L = r"layers\.(\d+)\."
M = r"model.layers.\1."


def zamba2_names(cfg: ModelConfig) -> NameMap:
    names = (
        NameMap()
        .add(r"embed_tokens\.weight", "model.embed_tokens.weight")
        .add(r"norm\.weight", "model.final_layernorm.weight")
        .add(r"lm_head\.weight", "lm_head.weight")
    )
    calls = [
        (i, m)
        for i, layer in enumerate(cfg.layers)
        for m in layer.mixers
        if isinstance(m, Zamba2SharedConfig)
    ]
    holders: dict[int, int] = {}  # block → the hybrid layer that first calls it
    for j, (i, m) in enumerate(calls):
        holders.setdefault(m.block, i)
        h = f"model.layers.{holders[m.block]}.shared_transformer."
        li = rf"layers\.{i}\."
        names.add(li + r"mixer_norm\.weight", f"model.layers.{i}.mamba_decoder.input_layernorm.weight")
        names.add(li + r"mamba\.(.+)", rf"model.layers.{i}.mamba_decoder.mamba.\1")
        names.add(li + r"shared\.linear\.weight", f"model.layers.{i}.linear.weight")
        names.add(li + r"shared\.([qkv])_adapter\.(.+)", rf"{h}self_attn.linear_\1_adapter_list.{j}.\2")
        ff = f"{h}feed_forward.gate_up_proj_adapter_list.{j}."
        names.add(li + r"shared\.gate_up_adapter\.(.+)", ff + r"\1")
    for b, i in holders.items():
        h = f"model.layers.{i}.shared_transformer."
        sb = rf"shared_blocks\.{b}\."
        names.add(sb + r"input_norm\.weight", h + "input_layernorm.weight")
        names.add(sb + r"ffn_norm\.weight", h + "pre_ff_layernorm.weight")
        names.add(sb + r"attn\.(.+)", h + r"self_attn.\1")
        names.add(sb + r"mlp\.(.+)", h + r"feed_forward.\1")
    return names.add(L + r"mixer_norm\.weight", M + "input_layernorm.weight").add(
        L + r"mamba\.(.+)", M + r"mamba.\2"
    )


NAME_MAPS = {"Zamba2ForCausalLM": zamba2_names}
