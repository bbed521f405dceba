"""DraftModelSource: speculative decoding's drafts from a smaller model that shares the target's vocabulary
(`--speculative draft --draft-model PATH`, llama.cpp's `--model-draft`).

The draft model runs in its own engine (its own weights, cache and prefix cache; speculation off). Each
step, every sequence that drafts becomes one greedy request of the draft engine — its prompt the sequence's
tokens so far, `n` tokens to generate — and the engine runs until all are done, so the sequences of a step
are drafted in one batch. The draft engine's prefix cache keeps what it computed for a sequence's earlier
tokens (full blocks, and for recurrent draft models their snapshots), so a step's request computes only the
tokens since the last full block before its n decode steps; nothing per sequence is kept here.

Greedy drafts make the verification exact whatever the target samples (engine/speculative.py).
"""

from __future__ import annotations

import itertools
import logging

from blazr.engine.engine import LLMEngine
from blazr.engine.sampling import SamplingParams
from blazr.engine.sequence import Sequence
from blazr.errors import BlazrError

log = logging.getLogger("blazr.engine")


class DraftModelSource:
    """Greedy drafts from the draft model's engine (see the module docstring)."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._ids = itertools.count()

    def propose(self, wants: list[tuple[Sequence, int]]) -> list[list[int]]:
        eng = self.engine
        rids: list[str | None] = []
        for seq, n in wants:
            rid = f"draft-{seq.seq_id}-{next(self._ids)}"
            params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, skip_special_tokens=False)
            try:
                eng.add_request(rid, seq.prompt_ids + seq.output_ids, params)
            except BlazrError as e:  # e.g. the draft engine's queue is full: this sequence decodes plainly
                log.debug("no draft for sequence %d: %s", seq.seq_id, e)
                rid = None
            rids.append(rid)
        out: dict[str, list[int]] = {rid: [] for rid in rids if rid is not None}
        while eng.has_unfinished():
            for o in eng.step():
                if o.request_id in out and o.finish_reason != "error":
                    out[o.request_id] += o.token_ids
        return [out[rid] if rid is not None else [] for rid in rids]

    def forget(self, seq: Sequence) -> None:
        """Nothing is kept per sequence (the draft engine's prefix cache holds what can be reused)."""
