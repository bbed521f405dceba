"""ForwardBatch: everything one model step needs to know about the sequences it runs.

Tokens of all sequences are laid out flat (T = Σ query_lens), decodes first, then prefills (or prefill
chunks). Each sequence has `context_lens[b]` tokens already in the cache and adds `query_lens[b]` new ones.
Cache addressing is by flat slot: new token t is written at `slot_mapping[t]`; the keys of sequence b live at
`kv_indices[b, :seq_lens[b]]` (for the decode rows also as a tensor, `decode_lens`, which the kernels read).

KV groups (state/layout.py): `slot_mapping` and `kv_indices` address the first group's pools; each further
group (a sliding window's) has its own pair in `groups[g - 1]`, and `for_group(g)` is the batch a layer of
group g receives. A sliding group's `kv_indices` stay indexed by absolute position (the kernels' contract is
unchanged: row b's keys are columns [0, seq_len) and the window masks all but the last W): positions whose
blocks the group no longer holds point at the first slot of the first block it holds, which is written and
which the window's mask leaves unread.
Recurrent (Mamba2) state lives in `state_slots[b]`; `state_saves` asks for copies of it at points inside
the step (prefix-cache snapshots).

Shapes: T tokens, B sequences, Bd = num_decodes, Lmax = max seq_len.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch


@dataclass
class ForwardBatch:
    positions: torch.Tensor  # [T] long, absolute positions
    query_lens: tuple[int, ...]  # [B]
    context_lens: tuple[int, ...]  # [B]
    num_decodes: int  # the first Bd sequences have query_len 1
    logits_indices: torch.Tensor  # [n] rows of the flat hidden state that become logits
    slot_mapping: torch.Tensor | None = None  # [T] flat cache slot of each new token
    kv_indices: torch.Tensor | None = None  # [B, Lmax] flat cache slot of each position (padding: 0)
    state_slots: torch.Tensor | None = None  # [B] recurrent-state slot of each sequence
    decode_lens: torch.Tensor | None = None  # [Bd] long seq_lens of the decode rows (for the kernels)
    # (row b, offset k, snapshot slot): copy row b's recurrent state after its first k new tokens (0 < k <
    # query_lens[b]) into that slot — prefix-cache snapshots that fall inside a prefill chunk
    state_saves: tuple[tuple[int, int, int], ...] = ()
    # KV groups 1.. (sliding windows): (slot_mapping [T], kv_indices [B, Lmax]) each; () when one group
    groups: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()
    _views: dict[int, ForwardBatch] = field(default_factory=dict, repr=False)
    _masks: dict[tuple[int, int | None], torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    @property
    def seq_lens(self) -> tuple[int, ...]:
        return tuple(c + q for c, q in zip(self.context_lens, self.query_lens, strict=True))

    @property
    def query_starts(self) -> tuple[int, ...]:
        starts, total = [], 0
        for q in self.query_lens:
            starts.append(total)
            total += q
        return tuple(starts)

    @property
    def has_cache(self) -> bool:
        return self.slot_mapping is not None

    @property
    def is_decode_only(self) -> bool:
        """Every sequence adds one token (the layers' kernel decode paths apply)."""
        return self.num_decodes == self.num_seqs > 0

    def for_group(self, g: int) -> ForwardBatch:
        """The batch as KV group g's layers see it: its slot_mapping and kv_indices (the same batch for g = 0
        or a batch of one group). Memoised; the decode masks are shared."""
        if g == 0 or not self.groups:
            return self
        view = self._views.get(g)
        if view is None:
            slot_mapping, kv_indices = self.groups[g - 1]
            view = self._views[g] = replace(
                self,
                slot_mapping=slot_mapping,
                kv_indices=kv_indices,
                groups=(),
                _views={},
                _masks=self._masks,
            )
        return view

    def decode_mask(self, window: int | None = None) -> torch.Tensor:
        """Boolean mask [Bd, 1, 1, Lmax_d]: True where decode row b may attend key position j
        (j < seq_len, and within the sliding window if any). Memoised per step."""
        key = (self.num_decodes, window)
        if key not in self._masks:
            seq_lens = self.seq_lens[: self.num_decodes]  # the host's lengths: no device read, no copy
            lens = self.decode_lens
            if lens is None:
                lens = torch.tensor(seq_lens, device=self.positions.device)
            cols = torch.arange(max(seq_lens), device=lens.device)
            mask = cols[None, :] < lens[:, None]
            if window is not None:
                mask &= cols[None, :] > (lens[:, None] - 1 - window)
            self._masks[key] = mask[:, None, None, :]
        return self._masks[key]

    def decode_part(self) -> ForwardBatch:
        """The first Bd sequences (tokens [:Bd]) as a batch of their own."""
        return self.select(0, self.num_decodes)

    def prefill_part(self) -> ForwardBatch:
        """The prefill sequences (tokens [Bd:]) as a batch of their own."""
        return self.select(self.num_decodes, self.num_seqs)

    def select(self, b0: int, b1: int) -> ForwardBatch:
        """Sequences [b0, b1) — their tokens, cache addressing and decode count — as a batch."""
        if (b0, b1) == (0, self.num_seqs):
            return self
        starts = self.query_starts
        end = starts[b1] if b1 < self.num_seqs else self.num_tokens
        tokens = slice(starts[b0] if b0 < self.num_seqs else end, end)
        nd = max(0, min(b1, self.num_decodes) - b0)
        return ForwardBatch(
            positions=self.positions[tokens],
            query_lens=self.query_lens[b0:b1],
            context_lens=self.context_lens[b0:b1],
            num_decodes=nd,
            logits_indices=self.logits_indices[:0],
            slot_mapping=None if self.slot_mapping is None else self.slot_mapping[tokens],
            kv_indices=None if self.kv_indices is None else self.kv_indices[b0:b1],
            state_slots=None if self.state_slots is None else self.state_slots[b0:b1],
            decode_lens=None if self.decode_lens is None else self.decode_lens[b0 : b0 + nd],
            state_saves=tuple((b - b0, k, dst) for b, k, dst in self.state_saves if b0 <= b < b1),
            groups=tuple((sm[tokens], kv[b0:b1]) for sm, kv in self.groups),
        )

    @staticmethod
    def prefill(num_tokens_per_seq: list[int], device: torch.device | str = "cpu") -> ForwardBatch:
        """A cache-less batch of whole prompts (for tests and reference forwards): logits at every token."""
        positions = torch.cat([torch.arange(n, device=device) for n in num_tokens_per_seq])
        total = int(positions.shape[0])
        return ForwardBatch(
            positions=positions,
            query_lens=tuple(num_tokens_per_seq),
            context_lens=(0,) * len(num_tokens_per_seq),
            num_decodes=0,
            logits_indices=torch.arange(total, device=device),
        )


def pad_kv_indices(idx: torch.Tensor, seq_lens: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """kv_indices [B, L] → [B, width] (default L) where every column at or past row b's length holds the row's
    position-0 slot, which is always written: a masked read of a padded column (torch attention reads them
    all) then never meets uninitialised pool memory (NaN · 0 = NaN; state/kv_cache.py)."""
    B, L = idx.shape
    width = L if width is None else width
    if L == 0:
        return idx.new_zeros(B, width)
    first = idx[:, :1]
    out = first.expand(B, width).clone()
    is_live = torch.arange(L, device=idx.device)[None, :] < seq_lens.to(idx.device)[:, None]  # [B, L]
    out[:, :L] = torch.where(is_live, idx, first)
    return out
