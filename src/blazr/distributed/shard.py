"""What one tensor-parallel rank holds: its per-rank model config, and each checkpoint tensor's slice.

The per-rank config is the model with its split dimensions divided by the world size, so the layers build
and run unchanged on their shard:
- mixers: as each kind's spec declares (`MixerSpec.shard` / `.slice`, beside its module: attention splits
  heads and KV heads, MLA heads with its latent replicated, Mamba2 heads and, where they divide, groups);
- MLP and shared experts: the intermediate width split (gate/up column-parallel, down row-parallel);
- routed experts: expert parallel — each rank holds E / world whole experts, the router is replicated
  (model/moe.py masks the other ranks' experts); a latent MoE's projections are replicated, `latent_up`'s
  bias on rank 0 only (each rank projects its own experts' partial sum back);
- embedding and lm_head: vocab-parallel, the vocabulary padded to a multiple of the world size;
- Zamba2's shared blocks (`shared_blocks.{b}.…`, held once): split as a transformer block
  (model/zamba2_shared.py `slice_block`), each layer's call splitting its adapters to match;
- replicated: Gemma 4's per-layer inputs (table, projections, gates: they act on the whole hidden state),
  routers (with Gemma 4's input and per-expert scales), norms.
Row-parallel outputs (o_proj, down_proj, experts, out_proj) are partial sums: the block all-reduces each
mixer's and each feed-forward's output once (model/block.py). A row-parallel bias is added by rank 0 only
(the others hold zeros), so the sum counts it once (distributed/split.py).

`slice_tensor(name, full, cfg, rank, world)` cuts a full checkpoint tensor (blazr's internal name, full
shape) to the rank's piece; names not listed are replicated.
"""

from __future__ import annotations

import re
from dataclasses import replace

import torch

from blazr.config import LayerConfig, ModelConfig, Zamba2SharedConfig
from blazr.distributed.split import check_divisible, rank0_only, slice_mlp, split_block
from blazr.model import mixers, zamba2_shared

_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_SHARED_BLOCK = re.compile(r"^shared_blocks\.(\d+)\.(.+)$")  # Zamba2's blocks, held once, called by layers


def padded_vocab(vocab_size: int, world: int) -> int:
    """The vocabulary rounded up to a multiple of `world` (vocab-parallel rows per rank: this / world)."""
    return -(-vocab_size // world) * world


def shard_config(cfg: ModelConfig, world: int) -> ModelConfig:
    """The per-rank model: every split dimension divided by `world` (UnsupportedError naming the first that
    does not divide)."""
    if world == 1:
        return cfg
    return cfg.with_(layers=tuple(_shard_layer(layer, i, world) for i, layer in enumerate(cfg.layers)))


def _shard_layer(layer: LayerConfig, i: int, world: int) -> LayerConfig:
    where = f"layer {i}'s"
    changes: dict[str, object] = {
        "mixers": tuple(mixers.spec_of(m).shard(m, world, where) for m in layer.mixers)
    }
    if (f := layer.mlp) is not None:
        check_divisible(f.intermediate_size, world, f"{where} MLP width")
        changes["mlp"] = replace(f, intermediate_size=f.intermediate_size // world)
    if (e := layer.moe) is not None:
        check_divisible(e.num_experts, world, f"{where} experts")
        shared = e.shared
        if shared is not None:
            check_divisible(shared.intermediate_size, world, f"{where} shared-expert width")
            shared = replace(shared, intermediate_size=shared.intermediate_size // world)
        changes["moe"] = replace(e, shared=shared)
    return replace(layer, **changes)


def slice_tensor(name: str, full: torch.Tensor, cfg: ModelConfig, rank: int, world: int) -> torch.Tensor:
    """Rank `rank`'s piece of parameter `name` (its full tensor `full`, of the full model `cfg`)."""
    if world == 1:
        return full
    if name in ("embed_tokens.weight", "lm_head.weight"):
        rows = padded_vocab(cfg.vocab_size, world) // world
        out = full.new_zeros(rows, *full.shape[1:])
        start = rank * rows
        end = min(start + rows, cfg.vocab_size)
        if end > start:
            out[: end - start] = full[start:end]
        return out
    if (b := _SHARED_BLOCK.match(name)) is not None:
        piece = zamba2_shared.slice_block(
            _shared_block_config(cfg, int(b.group(1))), b.group(2), full, rank, world
        )
        return full if piece is None else piece.contiguous()
    m = _LAYER.match(name)
    if m is None:
        return full
    layer, rest = cfg.layers[int(m.group(1))], m.group(2)
    piece = _slice_layer(rest, full, layer, rank, world)
    return full if piece is None else piece.contiguous()


def _shared_block_config(cfg: ModelConfig, block: int) -> Zamba2SharedConfig:
    """The (full) config of a call of Zamba2 shared block `block`: its sizes are the block's."""
    return next(
        m
        for layer in cfg.layers
        for m in layer.mixers
        if isinstance(m, Zamba2SharedConfig) and m.block == block
    )


def _slice_layer(
    rest: str, t: torch.Tensor, layer: LayerConfig, rank: int, world: int
) -> torch.Tensor | None:
    """The piece of layer parameter `rest`; None: replicated."""
    prefix, _, leaf = rest.partition(".")
    if (mixer := mixers.mixer_at(layer, prefix)) is not None:
        spec, cfg = mixer
        return spec.slice(cfg, leaf, t, rank, world)
    if prefix == "mlp" or (prefix == "moe" and leaf.startswith("shared.")):
        leaf = leaf.removeprefix("shared.")
        f = layer.mlp if prefix == "mlp" else layer.moe.shared  # type: ignore[union-attr]
        assert f is not None
        return slice_mlp(leaf, t, f.intermediate_size, rank, world)
    if prefix == "moe" and leaf.startswith("experts."):
        return split_block(t, 0, rank, world)  # [E, …]: whole experts
    if prefix == "moe" and leaf == "latent_up.bias":
        return rank0_only(t, rank)  # each rank projects its experts' part back; the parts are summed
    return None
