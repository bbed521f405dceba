"""Renames for HF `MambaForCausalLM` / `FalconMambaForCausalLM` (`backbone.` prefix, `embeddings` / `norm_f`,
each block's norm beside its `mixer`, whose parameter names blazr's `Mamba1` shares), and the Mamba1 mixer's
own leaves for every family that holds one (Jamba too): `A` is made from the checkpoint's `A_log` at load
(A = −exp(A_log), in float32), Jamba's norm weights are `{dt,b,c}_layernorm.weight`."""

from __future__ import annotations

import re

import torch

from blazr.config import ModelConfig
from blazr.loading.names import NameMap, Transform

L = r"layers\.(\d+)\."


def _minus_exp(m: re.Match[str]) -> Transform:
    return lambda t: -torch.exp(t.float())


def add_mamba1_mixer(names: NameMap, layer: str, module: str) -> NameMap:
    """The rules of a Mamba1 mixer whose HF tensors are `{layer}{module}…` (`layer`: the HF layer prefix with
    `\\1` for the index, e.g. `backbone.layers.\\1.`)."""
    p = layer + module
    return (
        names.add(L + r"mamba1\.A", p + "A_log", _minus_exp)
        .add(L + r"mamba1\.(dt|b|c)_norm", p + r"\2_layernorm.weight")
        .add(L + r"mamba1\.(.+)", p + r"\2")
    )


def mamba1_names(cfg: ModelConfig) -> NameMap:
    names = (
        NameMap()
        .add(r"embed_tokens\.weight", "backbone.embeddings.weight")
        .add(r"norm\.weight", "backbone.norm_f.weight")
        .add(r"lm_head\.weight", "lm_head.weight")
        .add(L + r"mixer_norm\.weight", r"backbone.layers.\1.norm.weight")
    )
    return add_mamba1_mixer(names, r"backbone.layers.\1.", "mixer.")


NAME_MAPS = {"MambaForCausalLM": mamba1_names, "FalconMambaForCausalLM": mamba1_names}
