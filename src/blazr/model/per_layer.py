"""Gemma 4's per-layer input embeddings (PLE): a second, narrow input per layer, made once per forward from
the token ids and the scaled token embeddings, and gated into each layer's residual after its feed-forward.

Model side (`PerLayerInputs`, held by the CausalLM as `per_layer_inputs`):

    ids_part  = embed[ids] · sqrt(P)                          [T, L·P] → [T, L, P]
    ctx_part  = norm((proj(e) · D^-½) as [T, L, P])            e: the scaled token embeddings [T, D]
    inputs    = (ctx_part + ids_part) · 2^-½                   [T, L, P]; layer l reads inputs[:, l]

Layer side (`PerLayerGate`, held by each Block as `per_layer`), after the feed-forward's residual add:

    x = x + post_norm(proj(act(gate(x)) · inputs_l))           gate [P, D], proj [D, P]

Both multipliers sqrt(P) and D^-½ follow transformers: sqrt(P) rounded to the table's dtype (its
embed_scale tensor), D^-½ a float. Weights: `embed` [V', L·P] — an nn.Embedding, or on the CPU kernels a
QuantizedEmbedding whose lookups read only their rows (loading/tables.py `per_layer_table`: the table
is most of a Gemma 4 checkpoint, 2.35B entries at E2B) —, `proj.weight` [L·P, D], `norm.weight` [P]; per
layer `gate.weight` [P, D], `proj.weight` [D, P], `post_norm.weight` [D].

Every step is a kernel op on float32 CPU rows (`ops.embedding` / `embedding_rows`, the linears, `add`,
`rms_norm`, `activation`, `mul`: each its torch expression's bits), so a decode step stays one recorded
plan; elsewhere the ops' torch references run.

Shapes: T tokens, D hidden, L layers, P per-layer width, V' the per-layer table's vocabulary.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from blazr.config import PerLayerInputConfig
from blazr.kernels import ops
from blazr.model.embedding import QuantizedEmbedding
from blazr.model.norm import make_norm
from blazr.model.qlinear import Linear


class PerLayerInputs(nn.Module):
    """The [T, L, P] per-layer inputs of one forward."""

    def __init__(self, cfg: PerLayerInputConfig, hidden_size: int, num_layers: int) -> None:
        super().__init__()
        self.cfg, self.num_layers = cfg, num_layers
        self.embed: nn.Embedding | QuantizedEmbedding = nn.Embedding(cfg.vocab_size, num_layers * cfg.size)
        self.proj = Linear(hidden_size, num_layers * cfg.size, bias=False)
        self.norm = make_norm(cfg.norm, cfg.size)
        self.proj_scale = hidden_size**-0.5
        # sqrt(P) as a number of each table dtype (transformers multiplies by a tensor of the table's dtype)
        self.embed_scales = {
            dtype: float(torch.tensor(math.sqrt(cfg.size), dtype=dtype, device="cpu"))
            for dtype in (torch.float32, torch.bfloat16, torch.float16)
        }

    def forward(self, input_ids: torch.Tensor, embeddings: torch.Tensor, *, decode: bool) -> torch.Tensor:
        """input_ids [T], embeddings [T, D] (the scaled token embeddings) → [T, L, P]."""
        T, L, P = input_ids.shape[0], self.num_layers, self.cfg.size
        embed = self.embed
        if isinstance(embed, QuantizedEmbedding):  # its rows widened to float32
            ids_part = embed(input_ids, self.embed_scales[torch.float32])
        else:
            ids_part = ops.embedding(input_ids, embed.weight, self.embed_scales[embed.weight.dtype])
        ctx = self.proj(embeddings, decode=decode)  # [T, L·P]
        ctx = ops.add(ctx, None, alpha=self.proj_scale, out=ctx)
        ctx = self.norm(ctx.view(T * L, P))  # each layer's [P] normed
        out = ops.add(ctx, ids_part.view(T * L, P), out=ctx)
        return ops.add(out, None, alpha=2.0**-0.5, out=out).view(T, L, P)


class PerLayerGate(nn.Module):
    """One layer's use of its per-layer input: x + post_norm(proj(act(gate(x)) · input))."""

    def __init__(self, cfg: PerLayerInputConfig, hidden_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.gate = Linear(hidden_size, cfg.size, bias=False)
        self.proj = Linear(cfg.size, hidden_size, bias=False)
        self.post_norm = make_norm(cfg.norm, hidden_size)

    def forward(self, x: torch.Tensor, per_layer_input: torch.Tensor, *, decode: bool) -> torch.Tensor:
        """x [T, D], per_layer_input [T, P] (rows may be strided: a layer's view of [T, L, P]) → the new
        residual [T, D]."""
        h = ops.mul(ops.activation(self.gate(x, decode=decode), self.cfg.activation), per_layer_input)
        return ops.add(x, self.post_norm(self.proj(h, decode=decode)))
