"""CausalLM: embedding → blocks → final norm → lm head, for every architecture blazr runs.

Parameters carry blazr's internal names (see loading/names.py for the renames from each format):
`embed_tokens.weight`, `layers.{i}.{mixer_norm,attn,mla,mamba,ffn_norm,mlp,moe}.…` (a mixer under its kind's
prefix, model/mixers.py), `norm.weight`, `lm_head.weight` (absent when tied); Zamba2's shared transformer
blocks `shared_blocks.{b}.…` (model/zamba2_shared.py). The math is pure: `forward(input_ids, batch, cache)`.

Gemma 4: the per-layer inputs (`per_layer_inputs`, model/per_layer.py) are made once per forward and layer
i reads its slice; a model whose layers share KV (`AttentionConfig.kv_source`) runs a cache-less forward
through a scratch cache of one slot per token (`_scratch_cache`), as the sharing layers read keys from a
cache.

On the CPU kernels a GGUF's token table may stay as stored (model/embedding.py, loading/tables.py).
On float32 CPU activations every step of a decode-only batch is a kernel op (`kernels/ops.py`: embedding,
norms, linears, attention / Mamba2 steps, residual adds), so that `engine/decode_plan.py` can record this
very forward as one replayable plan; other steps, dtypes and devices run the torch code beside them.

Shapes: input_ids [T]; hidden [T, D]; logits [n, V] float32.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from torch import nn

from blazr.config import ModelConfig, RopeConfig, Zamba2SharedConfig
from blazr.kernels import ops
from blazr.model.block import Block
from blazr.model.embedding import QuantizedEmbedding
from blazr.model.mixers import cache_layout
from blazr.model.norm import make_norm
from blazr.model.per_layer import PerLayerInputs
from blazr.model.qlinear import Linear
from blazr.model.rope import RotaryEmbedding
from blazr.model.zamba2_shared import bind_calls, shared_blocks
from blazr.state.batch import ForwardBatch, pad_kv_indices
from blazr.state.kv_cache import ModelCache

if TYPE_CHECKING:
    from blazr.distributed.group import TPGroup


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_len: int | None = None, tp: TPGroup | None = None) -> None:
        """`tp`: this model is one tensor-parallel shard (`cfg` is the shard's config, see
        distributed/shard.py); the embedding and lm_head then hold this rank's rows of the padded
        vocabulary (vocab-parallel): a lookup is all-reduced, the logits are all-gathered."""
        super().__init__()
        self.cfg = cfg
        self.tp = tp
        vocab = cfg.vocab_size if tp is None else -(-cfg.vocab_size // tp.world)
        # rope tables for the positions the engine can reach (its max_model_len), not the checkpoint's whole
        # context: Kimi-Linear declares 1M positions (256 MB of tables), Llama 3.1 128k (64 MB)
        max_len = max_len or cfg.max_position_embeddings
        ropes: dict[RopeConfig, RotaryEmbedding] = {}  # one table per distinct rope, shared by layers

        def rope_for(rope_cfg: RopeConfig | None) -> RotaryEmbedding | None:
            if rope_cfg is None:
                return None
            if rope_cfg not in ropes:
                ropes[rope_cfg] = RotaryEmbedding(rope_cfg, max_len)
            return ropes[rope_cfg]

        self.embed_tokens: nn.Embedding | QuantizedEmbedding = nn.Embedding(vocab, cfg.hidden_size)
        self.layers = nn.ModuleList(
            Block(layer, cfg.hidden_size, rope_for, cfg.residual_multiplier, tp, cfg.per_layer_input)
            for layer in cfg.layers
        )
        self.per_layer_inputs = (
            PerLayerInputs(cfg.per_layer_input, cfg.hidden_size, cfg.num_layers)
            if cfg.per_layer_input is not None
            else None
        )
        self.shares_kv = any(m.cache_source is not None for layer in cfg.layers for m in layer.mixers)
        # Zamba2: transformer blocks held once, called by several layers on (x, token embeddings)
        self.reads_embeddings = any(m.is_input_addend for layer in cfg.layers for m in layer.mixers)
        if any(isinstance(m, Zamba2SharedConfig) for layer in cfg.layers for m in layer.mixers):
            self.shared_blocks = shared_blocks(cfg, rope_for)
            bind_calls(self.layers, self.shared_blocks)
        self.norm = make_norm(cfg.final_norm, cfg.hidden_size)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, vocab, bias=False)

    def forward(
        self, input_ids: torch.Tensor, batch: ForwardBatch, cache: ModelCache | None = None
    ) -> torch.Tensor:
        embed, scale = self.embed_tokens, self.cfg.embedding_multiplier
        if self.tp is not None:
            x = self._embed_sharded(input_ids, self.tp) * scale
        elif isinstance(embed, QuantizedEmbedding):
            x = embed(input_ids, scale)
        elif ops.cpu_f32(embed.weight):
            x = ops.embedding(input_ids, embed.weight, scale)
        else:
            x = self.embed_tokens(input_ids)
            if self.cfg.is_embedding_multiplier_rounded:  # the multiplier as a number of x's dtype (Gemma)
                scale = float(torch.tensor(scale, dtype=x.dtype))
            if scale != 1.0:
                x = x * scale
        embeddings = None  # a copy of its own (a kernel op, for a plan): the layers' adds write x in place
        if self.reads_embeddings:
            embeddings = ops.copy_rows(x, torch.empty_like(x))
        per_layer = (
            None
            if self.per_layer_inputs is None
            else self.per_layer_inputs(input_ids, x, decode=batch.is_decode_only)
        )  # [T, L, P]
        if cache is None and self.shares_kv:
            batch, cache = self._scratch_cache(batch, x.dtype)
        for i, layer in enumerate(self.layers):
            layer_cache = cache.layer(i) if cache is not None else None
            layer_batch = batch.for_group(cache.group(i)) if cache is not None else batch  # its KV group's
            x = layer(x, layer_batch, layer_cache, embeddings, None if per_layer is None else per_layer[:, i])
        return self.norm(x)

    def _scratch_cache(self, batch: ForwardBatch, dtype: torch.dtype) -> tuple[ForwardBatch, ModelCache]:
        """A cache of one slot per token of a cache-less batch of whole prompts, and the batch addressing
        it (token t at slot t), for layers that read another layer's keys from a cache (KV sharing)."""
        assert not any(batch.context_lens), "a cache-less batch holds whole prompts"
        device = batch.positions.device
        T, starts, lens = batch.num_tokens, batch.query_starts, batch.query_lens
        rows = [torch.arange(s, s + n, device=device) for s, n in zip(starts, lens, strict=True)]
        width = max(lens, default=0)
        kv_indices = torch.stack([torch.cat([r, r.new_zeros(width - len(r))]) for r in rows])
        seq_lens = torch.tensor(lens, device=device)
        scratch = replace(
            batch,
            slot_mapping=torch.arange(T, device=device),
            kv_indices=pad_kv_indices(kv_indices, seq_lens),
            groups=(),  # one addressing for every KV group: token t at slot t of each
            _views={},
            _masks={},
        )
        return scratch, ModelCache(cache_layout(self.cfg), T, 0, dtype, device)

    def _embed_sharded(self, input_ids: torch.Tensor, tp: TPGroup) -> torch.Tensor:
        """Vocab-parallel lookup: this rank's rows, zeros for ids it does not hold, summed over ranks."""
        rows = self.embed_tokens.num_embeddings
        local = input_ids - tp.rank * rows
        here = (local >= 0) & (local < rows)
        x = self.embed_tokens(torch.where(here, local, 0)) * here[:, None]
        return tp.all_reduce(x)

    def compute_logits(self, hidden: torch.Tensor, *, decode: bool) -> torch.Tensor:
        """hidden [n, D] → float32 logits [n, V]; `decode`: the forward's batch was decode-only."""
        if self.lm_head is None:
            logits = torch.nn.functional.linear(hidden, self.embed_tokens.weight).float()
        else:
            logits = self.lm_head(hidden, decode=decode).float()
        if self.tp is not None:  # every rank's vocabulary rows, then the padding dropped
            logits = self.tp.all_gather(logits, dim=-1)[:, : self.cfg.vocab_size]
        scale = self.cfg.logits_scale
        if scale != 1.0:
            logits = ops.add(logits, None, scale) if logits.is_cpu else logits * scale
        cap = self.cfg.final_logit_softcap
        if cap is not None:  # in place: `logits` is this call's own tensor
            logits = ops.softcap(logits.contiguous(), cap)
        return logits
