"""Renames for HF GPT-OSS (`GptOssForCausalLM`): Llama's attention names with the sinks `self_attn.sinks`, the
router `mlp.router.{weight,bias}`, and transformers' fused expert tensors, turned into blazr's layout at load:
`mlp.experts.gate_up_proj` [E, D, 2I] (gate and up columns interleaved: gate = [..., ::2], up = [..., 1::2])
→ `moe.experts.gate_up_proj` [E, 2I, D] with the gate rows first; `down_proj` [E, I, D] → [E, D, I]; the
biases `gate_up_proj_bias` [E, 2I] de-interleaved the same way → `up_bias`, `down_proj_bias` → `down_bias`.
MXFP4 checkpoints' `*_blocks` / `*_scales` arrive as those float tensors (loading/safetensors.py). A GGUF
(loading/gguf_hf.py) gives the experts per expert, `mlp.experts.N.{gate,up,down}_proj.weight`, which blazr
stacks (`unfuse`), kept as stored where the kernels run their type."""

from __future__ import annotations

import torch

from blazr.config import ModelConfig
from blazr.loading.names import NameMap, Reshaping
from blazr.loading.names.llama import llama_names

L = r"layers\.(\d+)\."
M = r"model.layers.\1."


def deinterleave(t: torch.Tensor, dim: int) -> torch.Tensor:
    """[…, 2I, …] with gate / up alternating along `dim` → [gate rows; up rows] along `dim`."""
    n = t.shape[dim]
    order = torch.cat([torch.arange(0, n, 2), torch.arange(1, n, 2)])
    return t.index_select(dim, order)


def _swap_last(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (*shape[:-2], shape[-1], shape[-2])


GATE_UP = Reshaping(lambda t: deinterleave(t.transpose(-1, -2), -2), _swap_last)
DOWN = Reshaping(lambda t: t.transpose(-1, -2), _swap_last)


def _bias(t: torch.Tensor) -> torch.Tensor:
    return deinterleave(t, -1)


def gpt_oss_names(cfg: ModelConfig) -> NameMap:
    return (
        llama_names()
        .add(L + r"moe\.router\.(weight|bias)", M + r"mlp.router.\2")
        .add(L + r"moe\.experts\.gate_up_proj", M + "mlp.experts.gate_up_proj", lambda m: GATE_UP)
        .add(L + r"moe\.experts\.down_proj", M + "mlp.experts.down_proj", lambda m: DOWN)
        .add(L + r"moe\.experts\.up_bias", M + "mlp.experts.gate_up_proj_bias", lambda m: _bias)
        .add(L + r"moe\.experts\.down_bias", M + "mlp.experts.down_proj_bias")
        .add(L + r"moe\.experts\.(\d+)\.(.+)", M + r"mlp.experts.\2.\3")  # per expert: from a GGUF
    )


NAME_MAPS = {"GptOssForCausalLM": gpt_oss_names}
