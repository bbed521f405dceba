"""Gemma 4's per-layer input embeddings (PLE): a second, narrow input per layer, made once per forward from
the token ids and the scaled token embeddings, and gated into each layer's residual after its feed-forward.

Model side (`PerLayerInputs`, held by the CausalLM as `per_layer_inputs`):

    ids_part  = embed[ids] · sqrt(P)                          [T, L·P] → [T, L, P]
    ctx_part  = norm((proj(e) · D^-½) as [T, L, P])            e: the scaled token embeddings [T, D]
    inputs    = (ctx_part + ids_part) · 2^-½                   [T, L, P]; layer l reads inputs[:, l]

Layer side (`PerLayerGate`, held by each Block as `per_layer`), after the feed-forward's residual add:

    x = x + post_norm(proj(act(gate(x)) · inputs_l))           gate [P, D], proj [D, P]

Both multipliers sqrt(P) and D^-½ follow transformers: sqrt(P) rounded to the table's dtype (its
embed_scale tensor), D^-½ a float. Weights: `embed.weight` [V', L·P], `proj.weight` [L·P, D], `norm.weight`
[P]; per layer `gate.weight` [P, D], `proj.weight` [D, P], `post_norm.weight` [D].

Shapes: T tokens, D hidden, L layers, P per-layer width, V' the per-layer table's vocabulary.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from blazr.config import PerLayerInputConfig
from blazr.kernels import ops
from blazr.model.norm import make_norm
from blazr.model.qlinear import Linear


class PerLayerInputs(nn.Module):
    """The [T, L, P] per-layer inputs of one forward."""

    def __init__(self, cfg: PerLayerInputConfig, hidden_size: int, num_layers: int) -> None:
        super().__init__()
        self.cfg, self.num_layers = cfg, num_layers
        self.embed = nn.Embedding(cfg.vocab_size, num_layers * cfg.size)
        self.proj = Linear(hidden_size, num_layers * cfg.size, bias=False)
        self.norm = make_norm(cfg.norm, cfg.size)
        self.proj_scale = hidden_size**-0.5

    def forward(self, input_ids: torch.Tensor, embeddings: torch.Tensor, *, decode: bool) -> torch.Tensor:
        """input_ids [T], embeddings [T, D] (the scaled token embeddings) → [T, L, P]."""
        T, L, P = input_ids.shape[0], self.num_layers, self.cfg.size
        table = self.embed(input_ids)
        ids_part = table * float(torch.tensor(math.sqrt(P), dtype=table.dtype))
        ctx_part = self.norm((self.proj(embeddings, decode=decode) * self.proj_scale).view(T, L, P))
        return (ctx_part + ids_part.view(T, L, P)) * 2.0**-0.5


class PerLayerGate(nn.Module):
    """One layer's use of its per-layer input: x + post_norm(proj(act(gate(x)) · input))."""

    def __init__(self, cfg: PerLayerInputConfig, hidden_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.gate = Linear(hidden_size, cfg.size, bias=False)
        self.proj = Linear(cfg.size, hidden_size, bias=False)
        self.post_norm = make_norm(cfg.norm, hidden_size)

    def forward(self, x: torch.Tensor, per_layer_input: torch.Tensor, *, decode: bool) -> torch.Tensor:
        """x [T, D], per_layer_input [T, P] → the new residual [T, D]."""
        h = ops.activation(self.gate(x, decode=decode), self.cfg.activation) * per_layer_input
        return x + self.post_norm(self.proj(h, decode=decode))
