"""One residual block of a hybrid model: pre-norm mixer(s), then pre-norm feed-forward.

    h = norm(x);  x = x + r · post_norm(Σ mixer(h))    (the layer's mixers, in order; FalconH1 runs two)
    x = x + r · ffn_post_norm(ffn(ffn_norm(x)))         (MLP | MoE; absent in Mamba2 blocks)

A mixer whose config `is_input_addend` (Zamba2's shared transformer call) reads the un-normed x and the
token embeddings e instead, and its output joins the other mixers' input rather than the residual:

    h = norm(x + Σ addend(x, e));  x = x + r · post_norm(Σ mixer(h))

Each norm is optional (LayerConfig): most models have the pre-norms only; OLMo-Hybrid's attention blocks
the post-norms only. Gemma 4 then adds its per-layer input (`per_layer`, model/per_layer.py) and scales the
whole result by the learned scalar `out_scale` (`has_output_scale`):

    x = x + post_norm(proj(act(gate(x)) · per_layer_input));  x = out_scale · x

A Gemma 4 MoE layer runs its MLP and its MoE side by side, each with its own post-norm:

    x = x + r · ffn_post_norm(mlp_post_norm(mlp(ffn_norm(x))) + moe_post_norm(moe(x)))

r is the model's residual multiplier (1 except Granite). Each mixer is built by its kind's spec
(model/mixers.py) and held under the kind's prefix (`attn`, `mla`, `mamba`), the name its parameters carry.
Shapes: x [T, D].
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from blazr.config import LayerConfig, PerLayerInputConfig
from blazr.kernels import ops
from blazr.model import mixers
from blazr.model.mixer_spec import RopeFor
from blazr.model.mlp import MLP
from blazr.model.moe import MoE
from blazr.model.norm import make_norm
from blazr.model.per_layer import PerLayerGate
from blazr.state.batch import ForwardBatch
from blazr.state.kv_cache import LayerCache

if TYPE_CHECKING:
    from blazr.distributed.group import TPGroup


class Block(nn.Module):
    def __init__(
        self,
        cfg: LayerConfig,
        hidden_size: int,
        rope_for: RopeFor,
        residual_multiplier: float = 1.0,
        tp: TPGroup | None = None,
        per_layer_input: PerLayerInputConfig | None = None,
    ) -> None:
        """`rope_for`: the model's shared rotary tables. `tp`: the block is one tensor-parallel shard (cfg
        holds the shard's sizes, distributed/shard.py): the mixers' and the feed-forward's outputs are
        partial sums, all-reduced once each. `per_layer_input`: the model's per-layer inputs (Gemma 4),
        gated in after the feed-forward."""
        super().__init__()
        self.cfg = cfg
        self.residual_multiplier = residual_multiplier
        self.tp = tp
        self.mixer_names = tuple(mixers.spec_of(m).prefix for m in cfg.mixers)
        self.addend_names = tuple(
            n for n, m in zip(self.mixer_names, cfg.mixers, strict=True) if m.is_input_addend
        )
        for name, m in zip(self.mixer_names, cfg.mixers, strict=True):
            self.add_module(name, mixers.build(m, hidden_size, rope_for, tp))
        self.mlp = MLP(cfg.mlp, hidden_size) if cfg.mlp is not None else None
        self.moe = MoE(cfg.moe, hidden_size, tp) if cfg.moe is not None else None
        norms = {"mixer_norm": cfg.norm, "mixer_post_norm": cfg.post_norm} if self.mixer_names else {}
        if self.mlp is not None or self.moe is not None:
            norms |= {"ffn_norm": cfg.ffn_norm, "ffn_post_norm": cfg.ffn_post_norm}
        if self.mlp is not None and self.moe is not None:  # side by side (Gemma 4)
            norms |= {"mlp_post_norm": cfg.mlp_post_norm, "moe_post_norm": cfg.moe_post_norm}
        for name, norm in norms.items():
            if norm is not None:
                self.add_module(name, make_norm(norm, hidden_size))
        self.per_layer = PerLayerGate(per_layer_input, hidden_size) if per_layer_input is not None else None
        self.out_scale = nn.Parameter(torch.ones(1)) if cfg.has_output_scale else None

    def forward(
        self,
        x: torch.Tensor,
        batch: ForwardBatch,
        cache: LayerCache | None,
        embeddings: torch.Tensor | None = None,
        per_layer_input: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x [T, D]; `embeddings` [T, D]: the token embeddings, for an input-addend mixer (else None);
        `per_layer_input` [T, P]: this layer's per-layer input (Gemma 4; else None)."""
        x = self._mix_and_feed(x, batch, cache, embeddings)
        if self.per_layer is not None:
            assert per_layer_input is not None, "a per-layer gate reads the layer's per-layer input"
            x = self.per_layer(x, per_layer_input, decode=batch.is_decode_only)
        if self.out_scale is not None:  # in place: x is this block's own sum here
            x = ops.mul(x, self.out_scale.view(1, 1).expand(x.shape[0], 1))
        return x

    def _mix_and_feed(
        self,
        x: torch.Tensor,
        batch: ForwardBatch,
        cache: LayerCache | None,
        embeddings: torch.Tensor | None,
    ) -> torch.Tensor:
        """The mixers' and the feed-forward's residual adds."""
        r = self.residual_multiplier
        if self.mixer_names:
            h = x
            for name in self.addend_names:
                assert embeddings is not None, "an input-addend mixer reads the token embeddings"
                h = _add(h, self._reduce(getattr(self, name)(x, batch, cache, embeddings)))
            h = self._norm("mixer_norm", h)
            out = None
            for name in self.mixer_names:
                if name not in self.addend_names:
                    y = getattr(self, name)(h, batch, cache)
                    out = y if out is None else _add(out, y)
            if out is not None:
                x = _add(x, self._norm("mixer_post_norm", self._reduce(out)), r)
        if self.mlp is not None and self.moe is not None:  # side by side; the MoE norms its own input
            # each output whole before its own post-norm (a norm of a rank's partial sum is not a part of it)
            y = self.mlp(self._norm("ffn_norm", x), decode=batch.is_decode_only)
            y = self._norm("mlp_post_norm", self._reduce(y))
            y = _add(y, self._norm("moe_post_norm", self._reduce(self.moe(x, batch))))
            return _add(x, self._norm("ffn_post_norm", y), r)
        if self.mlp is not None:
            y = self.mlp(self._norm("ffn_norm", x), decode=batch.is_decode_only)
        elif self.moe is not None:
            y = self.moe(self._norm("ffn_norm", x), batch)
        else:
            return x
        return _add(x, self._norm("ffn_post_norm", self._reduce(y)), r)

    def _norm(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """x through the block's norm `name`, or x itself when the block has none there."""
        norm = getattr(self, name, None)
        return x if norm is None else norm(x)

    def _reduce(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.tp is None else self.tp.all_reduce(y)


def _add(x: torch.Tensor, y: torch.Tensor, r: float = 1.0) -> torch.Tensor:
    """x + r · y: the kernel op on float32 CPU rows, torch elsewhere."""
    if ops.cpu_f32(x):
        return ops.add(x, y, beta=r)
    return x + y * r if r != 1.0 else x + y
