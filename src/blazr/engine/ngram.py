"""NgramIndex: prompt lookup — draft tokens for one sequence by continuing an earlier occurrence of its last
few tokens (vLLM's `ngram`, llama.cpp's `ngram-simple`), no extra model.

The index maps every n-gram (n in [n_min, n_max]) of the sequence's tokens to the end of its latest
occurrence, updated as tokens arrive (amortised O(n_max − n_min + 1) per token). A lookup tries the longest
suffix first; a match ending at e continues as tokens[e], tokens[e + 1], …, and where that runs into the
suffix itself (a repeating pattern of period p = L − e) it goes on periodically — "x y x y x" drafts "y x y x"
rather than only "y". The current suffix is never matched against itself: the index holds the n-grams that
end before the last token.

Shapes: L tokens so far, k drafted tokens.
"""

from __future__ import annotations


class NgramIndex:
    """Latest occurrences of the n-grams of one growing token sequence (its own copy of the tokens)."""

    def __init__(self, n_min: int, n_max: int) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError(f"n-gram sizes {n_min} … {n_max}: expected 1 ≤ min ≤ max")
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], int] = {}  # n-gram → end (exclusive) of its latest occurrence
        self._indexed = 0  # the n-grams whose end is ≤ this are in _ends

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: list[int]) -> None:
        """The sequence grew by `tokens`."""
        self.tokens.extend(tokens)

    def propose(self, k: int) -> list[int]:
        """Up to k tokens that continue the sequence as the latest earlier occurrence of its longest
        recurring suffix did; [] when no suffix of n_min tokens or more recurs."""
        tokens, size = self.tokens, len(self.tokens)
        if k <= 0 or size <= self.n_min:
            return []
        for e in range(self._indexed + 1, size):  # the n-grams that end before the last token
            for n in range(self.n_min, min(self.n_max, e) + 1):
                self._ends[tuple(tokens[e - n : e])] = e
        self._indexed = max(self._indexed, size - 1)
        for n in range(min(self.n_max, size - 1), self.n_min - 1, -1):
            e = self._ends.get(tuple(tokens[size - n :]))
            if e is None:
                continue
            period = size - e
            return [tokens[e + (i % period)] for i in range(k)]
        return []
