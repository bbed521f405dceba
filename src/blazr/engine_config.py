"""The engine's settings: `EngineConfig` (serving limits, cache layout, fast paths) and its optional
`SpeculativeConfig` — frozen, validated, each default written once here.

Each field's `option(...)` metadata is its command-line description: config_flags.py turns the fields into
`blazr generate | chat | serve` flags, `LLM(...)` keyword arguments and `serve run key=value` options, so a
new field is a new flag everywhere without another edit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from blazr.config_flags import non_negative_int, option, positive_float, positive_int

SpeculativeMethod = Literal["ngram", "draft"]


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (engine/speculative.py): each step a decoding sequence may carry up to
    `num_speculative_tokens` drafted tokens, verified in the same forward. `method` "ngram": drafts continue
    the latest earlier occurrence of the sequence's last `ngram_max` … `ngram_min` tokens (prompt lookup, no
    extra model); "draft": a smaller model sharing the vocabulary (`draft_model`) drafts them greedily.
    `adaptive`: each sequence's draft length follows its recent acceptance (and drafting stops while it
    does not pay)."""

    method: SpeculativeMethod = option(
        "ngram",
        flag="--speculative",
        switch=True,
        help="speculative decoding: ngram drafts from the prompt and output (prompt lookup), draft from "
        "--draft-model; greedy output is unchanged, sampled output keeps its distribution (off by default)",
    )
    num_speculative_tokens: int = option(
        4,
        parse=positive_int,
        metavar="K",
        help="drafted tokens a sequence may carry in one step (adaptive per sequence)",
    )
    ngram_min: int = option(
        2, parse=positive_int, flag="--speculative-ngram-min", metavar="N", help="shortest n-gram matched"
    )
    ngram_max: int = option(
        4, parse=positive_int, flag="--speculative-ngram-max", metavar="N", help="longest n-gram matched"
    )
    draft_model: str | None = option(
        None, metavar="PATH", requires="draft", help="the draft model of --speculative draft"
    )
    adaptive: bool = option(
        True, flag="--speculative-adaptive", help="each sequence's draft length follows its acceptance"
    )

    def __post_init__(self) -> None:
        if self.method not in ("ngram", "draft"):
            raise ValueError(f"speculative method {self.method!r}: expected ngram or draft")
        if not 1 <= self.num_speculative_tokens <= 16:
            raise ValueError(f"num_speculative_tokens {self.num_speculative_tokens}: expected 1 … 16")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"n-gram sizes {self.ngram_min} … {self.ngram_max}: expected 1 ≤ min ≤ max")
        if self.method == "draft" and self.draft_model is None:
            raise ValueError("speculative method 'draft' needs a draft model (--draft-model PATH)")
        if self.method != "draft" and self.draft_model is not None:
            raise ValueError(f"a draft model is given with method {self.method!r}; it needs method 'draft'")


@dataclass(frozen=True)
class EngineConfig:
    """Engine limits and fast paths. `max_num_batched_tokens` is the per-step token budget that chunks
    prefills; `num_kv_blocks=0` sizes the paged pool for `max_num_seqs × max_model_len` tokens, capped by the
    cache memory budget (`cache_memory_gib`, None: a share of the memory available, state/budget.py); past
    that, sequences are preempted and recomputed. `enable_prefix_caching`: reuse the cache of earlier
    requests' common prefixes (engine/cache_manager.py); recurrent state is snapshotted every
    `state_snapshot_interval` blocks along a sequence, plus the prompt's last block boundary and the latest
    one reached. `max_model_len` None: the model's context limit, at most 4096 (`resolved`)."""

    max_num_seqs: int = option(16, parse=positive_int, help="sequences batched together per step")
    max_model_len: int | None = option(
        None,
        parse=positive_int,
        help="context limit, prompt + completion (default: the model's, at most 4096)",
    )
    max_num_batched_tokens: int = option(
        512, parse=positive_int, help="token budget per step; longer prompts are prefilled in chunks"
    )
    block_size: int = option(16, parse=positive_int, metavar="TOKENS", help="tokens per paged KV-cache block")
    num_kv_blocks: int = option(
        0,
        parse=non_negative_int,
        metavar="N",
        help="paged KV-cache blocks (0: sized from --max-num-seqs, --max-model-len and --cache-memory)",
    )
    cache_memory_gib: float | None = option(
        None,
        parse=positive_float,
        flag="--cache-memory",
        metavar="GIB",
        help="memory for the KV / recurrent-state cache in GiB (default: half of the memory available "
        "after loading the weights); it must hold one --max-model-len sequence",
    )
    max_waiting: int = option(
        256, parse=positive_int, help="requests allowed to wait for a slot; past it the server answers 503"
    )
    fused_decode: bool = option(
        True, help="CPU decode steps of pure-attention models run as one recorded kernel plan"
    )
    cuda_graphs: bool = option(
        True, help="CUDA decode steps of pure-attention models run as captured CUDA graphs"
    )
    enable_prefix_caching: bool = option(
        True,
        flag="--prefix-cache",
        help="reuse the cache of earlier prompts' common prefixes (--no-prefix-cache: off)",
    )
    state_snapshot_interval: int = option(
        8,
        parse=positive_int,
        metavar="BLOCKS",
        help="prefix caching of recurrent state: a snapshot every this many blocks",
    )
    num_state_snapshots: int = option(
        0,
        parse=non_negative_int,
        metavar="N",
        help="snapshot slots for recurrent state (0: a share of the cache budget)",
    )
    speculative: SpeculativeConfig | None = None  # speculative decoding (None: off)

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_waiting"):
            _at_least(name, getattr(self, name), 1)
        for name in ("num_kv_blocks", "num_state_snapshots"):
            _at_least(name, getattr(self, name), 0)
        _at_least("state_snapshot_interval", self.state_snapshot_interval, 1)
        if self.max_model_len is not None:
            _at_least("max_model_len", self.max_model_len, 1)
        if self.cache_memory_gib is not None and not self.cache_memory_gib > 0:
            raise ValueError(f"cache_memory_gib {self.cache_memory_gib}: expected a size in GiB > 0")

    def resolved(self, model_max_len: int) -> EngineConfig:
        """This config with `max_model_len` set: the model's context limit, at most 4096, when None."""
        if self.max_model_len is not None:
            return self
        from dataclasses import replace

        return replace(self, max_model_len=min(model_max_len, 4096))

    @property
    def num_speculative_tokens(self) -> int:
        """Drafted tokens a sequence may carry in one step (0: speculation off)."""
        return self.speculative.num_speculative_tokens if self.speculative is not None else 0


def _at_least(name: str, value: int, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} {value!r}: expected an integer ≥ {low}")
