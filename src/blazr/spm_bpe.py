"""SentencePiece BPE without the dummy prefix: llama.cpp's SPM tokenizer for a GGUF vocabulary with
`tokenizer.ggml.add_space_prefix = false` (Gemma 2 / 3's 256k vocabularies), which splintr's SpmTokenizer
cannot run (it always prepends the word boundary `▁`, and strips one leading space on decode).

Encoding, as llama.cpp's `llm_tokenizer_spm` with its fragment partition:
  1. the text is split at the vocabulary's user-defined pieces (whitespace runs, newline runs …), each
     matched whole wherever it occurs, longest first — llama.cpp always matches them, special or not;
  2. each remaining fragment has its spaces replaced by `▁` (no prefix), starts as one symbol per
     character, and repeatedly merges the adjacent pair whose concatenation is a vocabulary piece of the
     highest score (ties: leftmost first);
  3. a final symbol that is not a piece is written as its UTF-8 bytes' `<0xNN>` pieces (byte fallback).
Control tokens are the caller's to match (tokenizer.py's splitter) and to drop on decode.
Decoding: `▁` → space, `<0xNN>` → that byte, the bytes joined and read as UTF-8 (U+FFFD where invalid).

It offers the part of splintr's tokenizer interface tokenizer.py uses; `streaming_decoder` raises, so
tokenizer.StreamDecoder re-decodes a sliding window instead. Pure Python: about 1 µs per character (51k
characters of README.md in 0.06 s).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Sequence

WORD_BOUNDARY = "▁"
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class PrefixlessSpm:
    """SPM-BPE over `tokens` / `scores` (merge priority: higher merges first); `user_defined`: the ids of
    the pieces matched whole in the text before merging."""

    def __init__(self, tokens: Sequence[str], scores: Sequence[float], user_defined: Sequence[int] = ()):
        if len(tokens) != len(scores):
            raise ValueError(f"{len(tokens)} tokens but {len(scores)} scores")
        self._tokens = list(tokens)
        self._scores = [float(s) for s in scores]
        self._ids: dict[str, int] = {}
        for i, t in enumerate(self._tokens):
            self._ids.setdefault(t, i)  # a duplicated piece resolves to its first id, as llama.cpp's
        self._bytes: dict[int, int] = {}  # byte value → its `<0xNN>` piece's id
        for i, t in enumerate(self._tokens):
            if (m := _BYTE_PIECE.fullmatch(t)) is not None:
                self._bytes.setdefault(int(m.group(1), 16), i)
        self._unk = self._ids.get("<unk>")
        pieces = sorted({self._tokens[i] for i in user_defined if self._tokens[i]}, key=len, reverse=True)
        self._user = re.compile("|".join(map(re.escape, pieces))) if pieces else None

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def encode_ordinary(self, text: str) -> list[int]:
        """Ids of `text` (user-defined pieces matched, no control token, no BOS)."""
        ids: list[int] = []
        pos = 0
        for m in self._user.finditer(text) if self._user is not None else ():
            self._encode_fragment(text[pos : m.start()], ids)
            ids.append(self._ids[m.group(0)])
            pos = m.end()
        self._encode_fragment(text[pos:], ids)
        return ids

    encode_raw = encode_ordinary  # control tokens are matched by the caller

    def _encode_fragment(self, text: str, out: list[int]) -> None:
        if not text:
            return
        text = text.replace(" ", WORD_BOUNDARY)
        n = len(text)
        start = list(range(n))  # symbol i covers text[start[i] : start[i] + size[i]]; size 0: merged away
        size = [1] * n
        prev = list(range(-1, n - 1))
        nxt = [*range(1, n), -1]
        ids, scores = self._ids, self._scores
        heap: list[tuple[float, int, int, int]] = []  # (-score, left, right, merged length)

        def push(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            piece = text[start[left] : start[right] + size[right]]
            if (i := ids.get(piece)) is not None:
                heapq.heappush(heap, (-scores[i], left, right, len(piece)))

        for i in range(1, n):
            push(i - 1, i)
        while heap:
            _, left, right, length = heapq.heappop(heap)
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != length:
                continue  # stale: a side was merged into something else meanwhile
            size[left] += size[right]
            size[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            push(prev[left], left)
            push(left, nxt[left])
        i = 0
        while i != -1:
            piece = text[start[i] : start[i] + size[i]]
            if (tid := ids.get(piece)) is not None:
                out.append(tid)
            elif len(self._bytes) == 256:
                out.extend(self._bytes[b] for b in piece.encode())
            elif self._unk is not None:
                out.append(self._unk)
            i = nxt[i]

    def decode_token_bytes(self, id: int) -> bytes:
        """The bytes token `id` stands for: `▁` as a space, a `<0xNN>` piece as its byte."""
        if not 0 <= id < len(self._tokens):
            raise ValueError(f"token id {id} out of range")
        piece = self._tokens[id]
        if (m := _BYTE_PIECE.fullmatch(piece)) is not None:
            return bytes([int(m.group(1), 16)])
        return piece.replace(WORD_BOUNDARY, " ").encode()

    def decode(self, ids: Sequence[int]) -> str:
        return b"".join(self.decode_token_bytes(int(i)) for i in ids).decode("utf-8", errors="replace")

    decode_with_special = decode  # control tokens are the caller's to drop

    def streaming_decoder(self) -> None:
        raise ValueError("PrefixlessSpm has no native streaming decoder")

    streaming_decoder_with_special = streaming_decoder
