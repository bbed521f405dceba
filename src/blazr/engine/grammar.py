"""Constrained decoding: what a request's output must match, and the per-sequence matchers that say which
tokens may come next.

In:  `StructuredOutput` (one kind: `json_schema` (+ `strict`), `json_object`, `regex`, `choice`, `grammar` in
     Lark or GBNF/EBNF) on `SamplingParams.structured`; the model's tokenizer.
Out: `GrammarCompiler.compile(spec)` validates a spec (BlazrError, one line → HTTP 400) and caches it;
     `GrammarCompiler.matcher(spec, end_ids)` gives a sequence its own `GrammarMatcher`;
     `fill_bitmasks` + `apply_token_bitmask` are what the sampler runs for the constrained rows of a batch.

The grammar library is llguidance (benchmarks/grammar.py and NOTES §24: ~1 ms to compile a JSON schema where
xgrammar takes 0.1–1.2 s on this CPU, per-token masks of the same order). Its tokenizer is built from blazr's
own token bytes; control tokens (those `decode` drops) are special, so text never matches them.

End of output: once the grammar is satisfied, the sequence's end ids (its stop ids; the tokenizer's EOS ids
when it has none, e.g. `ignore_eos`) are allowed, and they are the only tokens allowed once the grammar cannot
go on — so a constrained sequence finishes with "stop". While `min_tokens` is not reached they stay masked
unless nothing else is possible.

Output formatting (a choice, made for small models): JSON is written compactly the way `json.dumps` writes it
(", " and ": ", no other whitespace); an object schema with `properties` but no `additionalProperties`
(nor `patternProperties` / `unevaluatedProperties`) admits no other keys — what xgrammar's `strict_mode`,
vLLM's default, does; and numbers have bounded digits (`narrow_schema`: llama.cpp's JSON grammars bound
them to 16 for the same reason — SmolLM2 otherwise writes a latitude's decimals until max_tokens). All three
only narrow what is valid, never widen it (engine/json_schema.py, which the tool-call grammars share).
`strict: true` makes llguidance refuse a schema keyword it does not implement (otherwise it is ignored,
best effort, as OpenAI's non-strict mode).

Bitmask shapes: B constrained rows, V vocabulary (the model's rows), W = ceil(V / 32) int32 words per row;
bit t % 32 of word t // 32 set = token t allowed.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import llguidance
import numpy as np
import torch

from blazr.chat_template import literal_pattern
from blazr.engine.json_schema import JSON_OPTIONS, narrow_schema
from blazr.errors import BlazrError

if TYPE_CHECKING:
    from blazr.tokenizer import Tokenizer

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")
CACHE_SIZE = 256  # compiled specs kept (a template matcher each, a few hundred KB at most)
# [256, 8] float32: for each byte value, the additive mask of its 8 tokens (bit set 0.0, clear -inf)
_BYTE_BIAS = np.where(
    np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little") == 1, 0.0, -np.inf
).astype(np.float32)


@dataclass(frozen=True)
class ThinkFirst:
    """The output may reason before the constrained part: free text up to `end` (`</think>`), then
    whitespace, then the grammar. `opened`: the prompt already opened the block (DeepSeek-R1's and Qwen3's
    templates write `<think>` themselves), so the output starts inside it; otherwise the block is optional
    and starts with `start` when the model takes it (without it, the grammar holds from the first
    character, whitespace included)."""

    start: str = "<think>"
    end: str = "</think>"
    opened: bool = False
    lark: str = ""  # a format's own block, when its markers are control tokens (harmony: server/harmony.py):
    # Lark for what precedes the answer on its first line, its rules on the next ones (start / end unused)


@dataclass
class StructuredOutput:
    """What one request's output must match: exactly one kind is given.

    json_schema: a JSON schema (a dict, or its JSON text); `strict` refuses keywords llguidance does not
    implement. json_object: any JSON object. regex: the whole output matches it (Rust `regex` syntax). choice:
    the output is one of these strings. grammar: a Lark grammar (llguidance's dialect, with `%json`) or a
    GBNF / EBNF one (llama.cpp's `root ::= …`). `think`: the grammar holds only after a reasoning block
    (the server sets it with --reasoning-parser)."""

    json_schema: dict[str, Any] | str | None = None
    strict: bool = False
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    think: ThinkFirst | None = None

    def __post_init__(self) -> None:
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            found = ", ".join(given) or "none"
            raise BlazrError(f"structured output: give exactly one of {', '.join(KINDS)}; got {found}")
        if isinstance(self.json_schema, str):
            try:
                self.json_schema = json.loads(self.json_schema)
            except ValueError as e:
                raise BlazrError(f"structured output json_schema: not valid JSON ({e})") from None
        checks = [
            (self.json_schema is None or isinstance(self.json_schema, dict), "json_schema must be an object"),
            (self.regex is None or isinstance(self.regex, str), "regex must be a string"),
            (
                self.grammar is None or (isinstance(self.grammar, str) and self.grammar.strip()),
                "grammar is empty",
            ),
            (
                self.choice is None
                or (
                    isinstance(self.choice, list)
                    and self.choice
                    and all(isinstance(c, str) for c in self.choice)
                ),
                "choice must be a non-empty list of strings",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise BlazrError(f"structured output: {message}")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @cached_property
    def key(self) -> str:
        """A canonical text of the spec: equal specs compile once."""
        t = self.think
        think = None if t is None else [t.start, t.end, t.opened, t.lark]
        return json.dumps([self.kind, self.strict, getattr(self, self.kind), think], sort_keys=True)


def to_grammar(spec: StructuredOutput) -> str:
    """The llguidance grammar (its JSON form) for `spec`; not yet checked (`GrammarCompiler.compile` does)."""
    grammar = _answer_grammar(spec)
    return grammar if spec.think is None else _after_thinking(grammar, spec.think, spec.kind)


def _after_thinking(grammar: str, think: ThinkFirst, kind: str) -> str:
    """`grammar` behind a reasoning block: a Lark start rule whose free text runs lazily to the end marker
    (llguidance's `stop=`), then whitespace, then the answer grammar as a named sub-grammar (`@answer`: its
    rules and lexer stay its own, so a client's Lark names cannot clash with these)."""
    parts = grammar_parts(grammar)
    if len(parts) != 1:  # (no kind makes several: a part's `@N` references would shift)
        raise BlazrError(f"structured output {kind}: a grammar of several parts cannot follow reasoning")
    answer = {**parts[0], "name": "answer"}
    # the whitespace belongs to the block (the reasoning parser drops it after `end`): with no block, the
    # answer starts the output, as it would without reasoning, and is the whole content
    if think.lark:
        head, _, rules = think.lark.partition("\n")
        lark = f"start: {head} answer\n{rules}\nanswer: @answer\n"
        return json.dumps({"grammars": [{"lark_grammar": lark}, answer]})
    block = "think WS" if think.opened else f"({json.dumps(think.start)} think WS)?"
    lark = (
        f"start: {block} answer\n"
        f"think[stop={json.dumps(think.end)}]: /(.|\\n)*/\n"
        "WS: /[ \\t\\r\\n]*/\n"
        "answer: @answer\n"
    )
    return json.dumps({"grammars": [{"lark_grammar": lark}, answer]})


def grammar_parts(grammar: str) -> list[dict[str, Any]]:
    """The parts (llguidance's `GrammarWithLexer` objects) of a grammar in either form llguidance takes, read
    as it reads them (`TopLevelGrammar::from_lark_or_grammar_list`): text whose first non-blank character is
    `{` is the JSON form (`{"grammars": [...]}`: what `grammar_from_json_schema` and `grammar_from_regex`
    return); any other text is one Lark grammar (what `grammar_from_lark` and `grammar_from("grammar", …)`
    — GBNF converted to Lark — return)."""
    if not grammar.lstrip().startswith("{"):
        return [{"lark_grammar": grammar}]
    try:
        parts = json.loads(grammar).get("grammars")
    except (ValueError, AttributeError):
        parts = None
    if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
        raise BlazrError("structured output: the grammar is not llguidance's JSON form")
    return parts


def _answer_grammar(spec: StructuredOutput) -> str:
    M = llguidance.LLMatcher
    try:
        if spec.kind == "json_schema":
            options = {**JSON_OPTIONS, "lenient": not spec.strict}
            return M.grammar_from_json_schema(narrow_schema(spec.json_schema), overrides=options)  # type: ignore[arg-type]
        if spec.kind == "json_object":
            return M.grammar_from_json_schema({"type": "object"}, overrides=JSON_OPTIONS)  # type: ignore[arg-type]
        if spec.kind == "regex":
            return M.grammar_from_regex(spec.regex or "")
        if spec.kind == "choice":
            return M.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in spec.choice or ()))
        return llguidance.grammar_from("grammar", spec.grammar or "")
    except ValueError as e:
        raise BlazrError(f"structured output {spec.kind}: {one_line(str(e))}") from None


def one_line(message: str) -> str:
    """llguidance's multi-line errors (source echo, carets) as one line: the first line and the cause."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    if not lines:
        return "invalid"
    cause = [ln for ln in lines[1:] if ln.startswith("error:")]
    return " ".join([lines[0], *cause[:1]])


class GrammarMatcher:
    """One sequence's place in its grammar: the tokens allowed next (`fill`), moved on by each sampled token
    (`advance`). `end_ids` are the tokens that end the output once the grammar is satisfied."""

    def __init__(self, inner: llguidance.LLMatcher, end_ids: frozenset[int], eos_ids: frozenset[int]) -> None:
        self._inner = inner
        self.end_ids = end_ids
        self._eos_ids = eos_ids
        self._foreign_eos = sorted(eos_ids - end_ids)  # llguidance's own EOS, not an end for this sequence
        self._end = sorted(end_ids)
        self.is_done = False  # an end token was taken

    def fork(self) -> GrammarMatcher:
        """An independent copy at the same place (n > 1: each sample its own matcher)."""
        twin = GrammarMatcher(self._inner.deep_copy(), self.end_ids, self._eos_ids)
        twin.is_done = self.is_done
        return twin

    def fill(self, row: np.ndarray, allow_end: bool = True) -> None:
        """Write the allowed tokens into `row` ([W] uint32, contiguous). `allow_end` False (min_tokens not
        reached) keeps the end ids out unless nothing else is possible."""
        inner = self._inner
        if self.is_done:
            row.fill(0)
        else:
            inner.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
            if inner.is_error():
                raise BlazrError(f"structured output: the grammar failed: {one_line(inner.get_error())}")
        for t in self._foreign_eos:
            row[t >> 5] &= ~np.uint32(1 << (t & 31))
        stopped = self.is_done or inner.is_stopped()
        can_end = stopped or inner.is_accepting()
        for t in self._end:
            if can_end and (allow_end or stopped):
                row[t >> 5] |= np.uint32(1 << (t & 31))
            else:
                row[t >> 5] &= ~np.uint32(1 << (t & 31))

    def advance(self, token: int) -> None:
        """Take the sampled token; BlazrError if the grammar does not allow it (the mask should have)."""
        if token in self.end_ids and (self._inner.is_accepting() or self._inner.is_stopped()):
            self.is_done = True
            return
        if self.is_done or not self._inner.consume_token(token):
            reason = one_line(self._inner.get_error()) if self._inner.is_error() else "after the end"
            raise BlazrError(f"structured output: token {token} does not fit the grammar ({reason})")


class GrammarCompiler:
    """Compiles and caches structured-output specs for one model. Thread-safe: the server validates on its
    event loop while the engine thread makes matchers. The llguidance tokenizer (~0.2 s for 50k tokens) is
    built on the first structured request."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = frozenset(t for t in tokenizer.eos_token_ids if 0 <= t < vocab_size)
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._templates: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._ll_tokenizer is None:
                self._ll_tokenizer = build_ll_tokenizer(self.tokenizer, self.vocab_size)
            return self._ll_tokenizer

    def compile(self, spec: StructuredOutput) -> llguidance.LLMatcher:
        """The template matcher of `spec` (compiled, checked and warmed once); BlazrError if it is invalid."""
        with self._lock:
            template = self._templates.get(spec.key)
            if template is not None:
                self._templates.move_to_end(spec.key)
                return template
        grammar = to_grammar(spec)
        template = llguidance.LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        if template.is_error():
            error = one_line(template.get_error())
            if spec.kind != "grammar":  # positions point into the Lark llguidance generated, not the request
                error = re.sub(r"^at \d+\(\d+\): ", "", error)
            raise BlazrError(f"structured output {spec.kind}: {error}")
        warm = np.empty(words(self.vocab_size), dtype=np.uint32)
        template.unsafe_compute_mask_ptr(warm.ctypes.data, warm.nbytes)  # builds the lexer's first states
        if template.is_error():
            raise BlazrError(f"structured output {spec.kind}: {one_line(template.get_error())}")
        with self._lock:
            self._templates[spec.key] = template
            while len(self._templates) > CACHE_SIZE:
                self._templates.popitem(last=False)
        return template

    def matcher(self, spec: StructuredOutput, end_ids: frozenset[int]) -> GrammarMatcher:
        """A fresh matcher for one sequence; `end_ids`: its stop ids (the tokenizer's EOS ids when empty)."""
        ends = frozenset(t for t in end_ids or self.eos_ids if 0 <= t < self.vocab_size)
        if not ends:
            raise BlazrError(
                "structured output needs an end token: the tokenizer has no EOS; give stop_token_ids"
            )
        return GrammarMatcher(self.compile(spec).deep_copy(), ends, self.eos_ids)


def build_ll_tokenizer(tokenizer: Tokenizer, vocab_size: int) -> llguidance.LLTokenizer:
    """llguidance's view of the vocabulary: every token's bytes (ids past the tokenizer, or holes in it, are
    empty and never allowed); control tokens special (never text); EOS as the tokenizer says.

    Its tokenize callback (how llguidance finds the canonical tokens of text a grammar forces) recognises
    added *text* tokens — Qwen's `<tool_call>`, say — as the model's tokenizer does, so a forced
    `<tool_call>` is offered as that one token, the way the model learned to write it, not spelled in
    pieces; control tokens stay out of text."""
    n = min(tokenizer.vocab_size, vocab_size)
    eos = sorted(i for i in tokenizer.eos_token_ids if i < vocab_size) or [0]
    control = {i for i in tokenizer.special_tokens.values() if i < n and tokenizer.decode([i]) == ""}
    text_tokens = {s: i for s, i in tokenizer.special_tokens.items() if i < n and i not in control and s}
    pattern = re.compile(literal_pattern(text_tokens)) if text_tokens else None

    class Vocabulary:  # llguidance's TokenizerWrapper protocol
        eos_token_id = eos[0]
        bos_token_id = tokenizer.bos_token_id

        def __init__(self) -> None:
            self.tokens = [tokenizer.token_bytes(i) for i in range(n)]
            self.special_token_ids = sorted(control)

        def __call__(self, text: str) -> list[int]:
            if not isinstance(text, str):  # llguidance then passes only valid UTF-8, as str
                raise TypeError("text")
            if pattern is None:
                return tokenizer.encode_ordinary(text)
            ids: list[int] = []
            pos = 0
            for match in pattern.finditer(text):
                ids += tokenizer.encode_ordinary(text[pos : match.start()])
                ids.append(text_tokens[match.group(0)])
                pos = match.end()
            return ids + tokenizer.encode_ordinary(text[pos:])

    return llguidance.LLTokenizer(
        llguidance.TokenizerWrapper(Vocabulary()), n_vocab=vocab_size, eos_token=eos
    )


# ------------------------------------------------------------------------------------------- bitmasks


def words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def fill_bitmasks(matchers: Sequence[tuple[GrammarMatcher, bool]], vocab_size: int) -> torch.Tensor:
    """[(matcher, allow_end)] × B → bitmask [B, W] int32 on the CPU, row i from matcher i."""
    bitmask = np.empty((len(matchers), words(vocab_size)), dtype=np.uint32)
    for i, (m, allow_end) in enumerate(matchers):
        m.fill(bitmask[i], allow_end)
    return torch.from_numpy(bitmask.view(np.int32))


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int]) -> None:
    """In place: logits[rows[i], t] = -inf where bit t of bitmask[i] is 0; other rows untouched.
    logits [N, V] float; bitmask [B, W] int32 on the CPU, B = len(rows).

    On the CPU without branches (a masked_fill over a mixed mask costs 2–4× more): each byte of the bitmask
    picks its 8 tokens' additive mask (0.0 / -inf) from a 256-row table, one gather, then one add to the
    logits (x + 0.0 == x exactly): ~25 µs a row at V = 49k. Elsewhere the bitmask travels (V / 8 bytes a
    row) and is unpacked there (`apply_token_bitmask_reference`)."""
    B, V = len(rows), logits.shape[-1]
    if logits.device.type != "cpu" or logits.dtype != torch.float32:
        masked = logits[list(rows)]
        apply_token_bitmask_reference(masked, bitmask.to(logits.device, non_blocking=True))
        logits[list(rows)] = masked
        return
    bytes_ = bitmask.numpy().view(np.uint8)  # [B, 4W], little-endian: byte k holds tokens 8k … 8k + 7
    bias = torch.from_numpy(np.take(_BYTE_BIAS, bytes_, axis=0).reshape(B, -1)[:, :V])  # [B, V]
    if logits.shape[0] == B and list(rows) == list(range(B)):
        logits.add_(bias)
    else:
        logits.index_add_(0, torch.tensor(rows, dtype=torch.long), bias)


def apply_token_bitmask_reference(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Plain PyTorch, any device: logits [B, V] masked in place by bitmask [B, W] (same device)."""
    B, V = logits.shape
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).view(B, -1)[:, :V].bool()  # [B, W, 32] → [B, V]
    logits.masked_fill_(~allowed, float("-inf"))
