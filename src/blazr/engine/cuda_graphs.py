"""GraphDecoder: the decode steps of a pure-attention model replayed as captured CUDA graphs — one launch per
step instead of ~15 kernel launches per layer (small-batch decode on a GPU is launch-bound).

A graph is captured lazily per (batch bucket, key bucket): the batch B rounded up to a power of two
(≤ max_num_seqs rounded up), the longest sequence to a power of two ≥ MIN_KEYS (≤ the kv_indices width).
Each KV group (state/layout.py: a sliding window's layers own a pool) has its own slot and kv_indices
buffers and its own padding slot. Inside the graph each decode row attends to the bucket's keys with the
positions past its own length (and outside its sliding window) masked off — the eager decode path's masked
attention, the mask computed in the graph from the static `seq_lens` buffer. Padding rows (B below its
bucket) decode token 0 at position 0 into the padding slot of each group, a cache slot the runner reserves,
so they touch no real sequence's cache. Each replay copies the step's ids / positions / slots / block-table
indices / lengths into static buffers and returns a view of the graph's logits buffer, valid until the next
replay.

The capture mechanism is a parameter: `torch.cuda.CUDAGraph` on CUDA; tests pass an eager stand-in that
re-runs the captured function on replay, so bucketing, padding and masking are tested on the CPU.

Shapes: B sequences, Bg its bucket, Lg key bucket, Lmax kv_indices width, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from blazr.config import EngineConfig, ModelConfig
from blazr.model import mixers
from blazr.model.model import CausalLM
from blazr.state.batch import ForwardBatch, pad_kv_indices
from blazr.state.kv_cache import ModelCache

MIN_KEYS = 64  # smallest key bucket


class Replay(Protocol):
    def replay(self) -> None: ...


Capture = Callable[[Callable[[], torch.Tensor]], tuple[Replay, torch.Tensor]]


def cuda_capture(fn: Callable[[], torch.Tensor]) -> tuple[Replay, torch.Tensor]:
    """Capture `fn` as a CUDA graph (after warm-up runs on a side stream, as torch requires); returns the
    graph and its output tensor, which every replay overwrites."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def _bucket(n: int, lo: int = 1) -> int:
    """The power of two ≥ max(n, lo)."""
    return max(lo, 1 << (n - 1).bit_length())


def is_supported(cfg: ModelConfig) -> bool:
    """Every layer holds mixers of kinds a graph may hold (an allow-list: `MixerSpec.graph_windows`, GQA
    attention today — no Mamba2 state, no MLA) and a dense MLP (no data-dependent MoE routing)."""
    return all(
        layer.mixers
        and all(mixers.spec_of(m).graph_windows is not None for m in layer.mixers)
        and layer.moe is None
        and layer.mlp is not None
        for layer in cfg.layers
    )


class GraphDecoder:
    """Static input buffers for up to `max_seqs` decode rows and one captured graph per bucket."""

    def __init__(
        self,
        model: CausalLM,
        cache: ModelCache,
        max_seqs: int,
        max_len: int,
        pad_slots: tuple[int, ...],
        capture: Capture,
        device: torch.device,
    ) -> None:
        self.model, self.cache, self.capture = model, cache, capture
        self.max_len, self.pad_slots = max_len, pad_slots  # a padding slot per KV group
        self.max_seqs, self.max_bucket = max_seqs, _bucket(max_seqs)
        Bm, dev = self.max_bucket, device
        self.ids = torch.zeros(Bm, dtype=torch.long, device=dev)
        self.positions = torch.zeros(Bm, dtype=torch.long, device=dev)
        self.seq_lens = torch.ones(Bm, dtype=torch.long, device=dev)
        self.group_slots = [torch.full((Bm,), p, dtype=torch.long, device=dev) for p in pad_slots]
        self.group_kv_indices = [
            torch.full((Bm, max_len), p, dtype=torch.long, device=dev) for p in pad_slots
        ]
        self.cols = torch.arange(max_len, device=dev)
        specs = [(mixers.spec_of(m), m) for layer in model.cfg.layers for m in layer.mixers]
        # the sliding windows (None: none) of the decode masks the mixers read, as is_supported found declared
        self.windows = sorted({w for spec, m in specs for w in spec.graph_windows(m)}, key=str)
        self._graphs: dict[tuple[int, int], tuple[Replay, torch.Tensor]] = {}
        self.num_runs = 0

    @classmethod
    def create(
        cls,
        model: CausalLM,
        cache: ModelCache,
        engine_cfg: EngineConfig,
        pad_slots: tuple[int, ...] | None,
        device: torch.device,
        capture: Capture | None = None,
    ) -> GraphDecoder | None:
        """The decoder for `model`, or None when graphs are off (`engine_cfg.cuda_graphs`), there are no
        padding slots (one per KV group), no capture mechanism (not CUDA) or the model is not one a graph
        may hold."""
        if capture is None and torch.device(device).type == "cuda":
            capture = cuda_capture
        if not engine_cfg.cuda_graphs or capture is None or pad_slots is None or not is_supported(model.cfg):
            return None
        bs = engine_cfg.block_size
        max_len = -(-engine_cfg.max_model_len // bs) * bs
        return cls(model, cache, engine_cfg.max_num_seqs, max_len, pad_slots, capture, device)

    @property
    def buckets(self) -> list[tuple[int, int]]:
        """The (batch, keys) buckets captured so far."""
        return sorted(self._graphs)

    def _step(self, Bg: int, Lg: int) -> torch.Tensor:
        """One decode forward of the first Bg static rows over Lg keys (what the graph records)."""
        lens = self.seq_lens[:Bg, None]  # [Bg, 1]
        cols = self.cols[None, :Lg]  # [1, Lg]
        masks = {}
        for w in self.windows:
            mask = cols < lens
            if w is not None:
                mask = mask & (cols > lens - 1 - w)
            masks[(Bg, w)] = mask[:, None, None, :]  # [Bg, 1, 1, Lg]
        batch = ForwardBatch(
            positions=self.positions[:Bg],
            query_lens=(1,) * Bg,
            context_lens=(0,) * Bg,  # unused by decode rows: the masks above say which keys count
            num_decodes=Bg,
            logits_indices=torch.arange(Bg, device=self.ids.device),
            slot_mapping=self.group_slots[0][:Bg],
            kv_indices=self.group_kv_indices[0][:Bg, :Lg],
            groups=tuple(
                (sm[:Bg], kv[:Bg, :Lg])
                for sm, kv in zip(self.group_slots[1:], self.group_kv_indices[1:], strict=True)
            ),
            _masks=masks,
        )
        hidden = self.model(self.ids[:Bg], batch, self.cache)
        return self.model.compute_logits(hidden, decode=True)  # [Bg, V]

    def _graph(self, Bg: int, Lg: int) -> tuple[Replay, torch.Tensor]:
        entry = self._graphs.get((Bg, Lg))
        if entry is None:
            entry = self._graphs[(Bg, Lg)] = self.capture(lambda: self._step(Bg, Lg))
        return entry

    def run(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        state_slots: torch.Tensor | None = None,
        groups: tuple[tuple[torch.Tensor, torch.Tensor], ...] = (),
    ) -> torch.Tensor:
        """One decode step of B sequences (same arguments as DecodePlan.run, CPU tensors; no state slots:
        graphs capture pure-attention models). Returns the logits [B, V] — a view of the graph's output,
        valid until the next run."""
        assert state_slots is None, "graph decode covers pure-attention models (no recurrent state)"
        B, width = kv_indices.shape
        if not (0 < B <= self.max_bucket and width <= self.max_len):
            raise ValueError(
                f"graph decode: {B} sequences × {width} slots, at most {self.max_bucket} × {self.max_len}"
            )
        Bg, Lg = _bucket(B), min(self.max_len, _bucket(width, MIN_KEYS))
        self.ids[:B].copy_(ids)
        self.positions[:B].copy_(positions)
        self.seq_lens[:B].copy_(seq_lens)
        for (sm, kv), dst_sm, dst_kv, pad in zip(
            ((slot_mapping, kv_indices), *groups), self.group_slots, self.group_kv_indices, self.pad_slots,
            strict=True,
        ):  # fmt: skip
            dst_sm[:B].copy_(sm)
            # torch attention reads all Lg columns (masked): past each row's length, its own first slot
            dst_kv[:B, :Lg].copy_(pad_kv_indices(kv, seq_lens, Lg))
            if Bg > B:  # padding rows write to and read only the padding slot
                dst_sm[B:Bg] = pad
                dst_kv[B:Bg, :Lg] = pad
        if Bg > B:  # padding rows: token 0 at position 0
            self.ids[B:Bg] = 0
            self.positions[B:Bg] = 0
            self.seq_lens[B:Bg] = 1
        graph, out = self._graph(Bg, Lg)
        graph.replay()
        self.num_runs += 1
        return out[:B]
