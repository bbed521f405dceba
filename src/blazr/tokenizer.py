"""Tokenizer: splintr behind one small interface — vocabulary selection, special tokens, chat, streaming.

In:  a `TokenizerSource` (what the checkpoint offers: a vocab name, a tokenizer dir, GGUF metadata, the
     model's vocab_size, EOS/BOS ids from generation_config) -> `load_tokenizer` -> `Tokenizer`.
Out: ids for raw prompts (`encode`, specials written in the text are recognised, like HF/vLLM), for chats
     (`encode_chat`, message content never becomes control tokens, see chat_template.py), and text back
     (`decode`, `stream()` for incremental detokenizing, `token_text`/`token_bytes` for logprobs).

Selection, first that applies:
  1. `vocab_name` — any name `splintr.Tokenizer.from_pretrained` accepts;
  2. `tokenizer_dir/tokenizer.json` (+ tokenizer_config.json, chat_template.jinja beside it);
  3. GGUF vocabulary metadata: `gpt2` (byte-level BPE) is rebuilt as an HF tokenizer.json in memory with
     llama.cpp's pre-tokenizer for `tokenizer.ggml.pre`; `llama` (SentencePiece BPE) uses splintr's
     SpmTokenizer, llama.cpp's algorithm — or, where the vocabulary has no dummy prefix (Gemma), which
     SpmTokenizer always adds, spm_bpe.PrefixlessSpm;
  4. the model's vocab_size: <=100350 cl100k_base, <=128400 llama3, <=129300 deepseek_v3 (129280 rows),
     <=200100 o200k_base.
Chat template: `chat_template_file` > chat_template.jinja > tokenizer_config.json > GGUF > a fallback
(oxidizr agent tokens, Llama-3, DeepSeek-V3 or ChatML, from the vocabulary's markers).

splintr facts this adapter is built around (splintr-rs 0.22):
  - `encode`/`encode_ordinary` apply the tokenizer.json post_processor (a BOS, say). We drop a
    post_processor that adds ids before loading, so `encode_raw` (specials matched) and `encode_ordinary`
    (none matched) are both untemplated, and place BOS ourselves (iff add_bos).
  - `vocab_size` includes splintr's own agent tokens (`base_vocab_size(name)` excludes them), and bundled
    vocabularies have holes (llama3 128011-128255, 128262-128299) where `decode` raises "out of range".
  - bundled vocabularies' `decode` raises on ids that end mid-character; from_json ones give U+FFFD.
  - `special_tokens()` lists every added token, special or not; `decode` drops only special ones.
  - `streaming_decoder()` refuses tokenizer.json decoders it cannot run per token (Llama-2's trailing
    `Strip`); `StreamDecoder` then re-decodes a sliding window instead.
  - `SpmTokenizer` knows no control tokens: we match them, and drop them on decode.
"""

from __future__ import annotations

import logging
import re
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import splintr

from blazr.chat_template import ChatTemplate, literal_pattern, template_from_tokenizer_config
from blazr.errors import BlazrError
from blazr.spm_bpe import PrefixlessSpm
from blazr.vocab import TokenizerFiles, Vocab, bundled, from_gguf, from_tokenizer_json

log = logging.getLogger(__name__)

# Largest model vocab_size (embedding rows, padding included) each bundled vocabulary is picked for.
VOCAB_BY_SIZE: tuple[tuple[int, str], ...] = (
    (100350, "cl100k_base"),
    (128400, "llama3"),
    (129300, "deepseek_v3"),
    (200100, "o200k_base"),
)
# Markers that end an assistant turn; those a chat template writes are stop ids.
END_OF_TURN_TOKENS = (
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<｜end▁of▁sentence｜>",
    "<|end▁of▁sentence|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
    "<|EOT|>",
    "<|return|>",
)
HARMONY_MESSAGE_END, HARMONY_TURN_ENDS = "<|end|>", ("<|return|>", "<|call|>")  # GPT-OSS's harmony format


@dataclass(frozen=True)
class TokenizerSource:
    """What a checkpoint offers for building its tokenizer (the caller reads config files and GGUF)."""

    vocab_name: str | None = None
    tokenizer_dir: Path | None = None  # may hold tokenizer.json, tokenizer_config.json, chat_template.jinja
    gguf_metadata: Mapping[str, Any] | None = None  # plain-python GGUF KV metadata
    vocab_size: int = 0  # the model's embedding rows
    eos_token_ids: tuple[int, ...] = ()  # from generation_config.json / config.json
    bos_token_id: int | None = None
    add_bos_token: bool | None = None  # None = let the tokenizer files decide; default False
    is_oxidizr: bool = False  # fallback chat template uses splintr agent tokens
    chat_template_file: Path | None = None  # --chat-template FILE; wins over every other template


class Tokenizer:
    """One vocabulary: encode/decode, the chat template, BOS/EOS policy. Build it with `load_tokenizer`."""

    def __init__(
        self,
        backend: Any,
        *,
        name: str,
        added_tokens: Mapping[str, int],
        control_ids: frozenset[int],
        bos_token_id: int | None,
        eos_token_ids: frozenset[int],
        add_bos: bool,
        chat_template: ChatTemplate,
        model_vocab_size: int = 0,
        strip_flags: Mapping[str, tuple[bool, bool]] | None = None,
    ):
        self.name = name
        self.vocab_size: int = backend.vocab_size
        self.bos_token_id = bos_token_id
        self.add_bos = bool(add_bos)
        self._backend = backend
        self._added = dict(added_tokens)
        self._added_by_id = {i: s for s, i in self._added.items()}
        self._base_eos = frozenset(eos_token_ids)
        self._bos_text, self._eos_text = chat_template.bos_token, chat_template.eos_token
        self.chat_template = chat_template  # also adds the template's end-of-turn marker to eos_token_ids
        self._control_ids = control_ids
        # SpmTokenizer neither matches nor drops control tokens; AnyTokenizer does both itself.
        self._is_spm = isinstance(backend, splintr.SpmTokenizer | PrefixlessSpm)
        # Added tokens past the model's embedding rows (splintr agent tokens on a base-vocab model) are never
        # matched in text: they would index past the embedding.
        usable = {s: i for s, i in self._added.items() if model_vocab_size <= 0 or i < model_vocab_size}
        self._splitter = _SpecialSplitter(usable, strip_flags or {})
        self._native_encode = not self._is_spm and len(usable) == len(self._added)
        self._known: dict[int, bool] = {}
        self._max_token_chars: int | None = None
        self._decoders = {skip: _DecoderPool(backend, skip) for skip in (True, False)}

    def __repr__(self) -> str:
        return f"Tokenizer({self.name!r}, vocab_size={self.vocab_size}, template={self.chat_template.name!r})"

    @property
    def chat_template(self) -> ChatTemplate:
        """The template `encode_chat` renders with. Assigning one (`--chat-template FILE`) renders it with
        this tokenizer's BOS/EOS strings unless it carries its own, and adds its end-of-turn marker to
        `eos_token_ids`."""
        return self._chat_template

    @chat_template.setter
    def chat_template(self, template: ChatTemplate) -> None:
        if not template.bos_token and not template.eos_token:
            template = template.with_tokens(bos_token=self._bos_text, eos_token=self._eos_text)
        self._chat_template = template
        eos = self._base_eos | _end_of_turn_ids(template, self._added)
        end = self._added.get(HARMONY_MESSAGE_END)
        if _is_harmony(template) and end is not None:  # (a GGUF may name <|end|> its end-of-turn token)
            eos -= {end}
        self.eos_token_ids: frozenset[int] = eos

    @property
    def special_tokens(self) -> Mapping[str, int]:
        """Every added token (control markers and user-defined ones) by its text."""
        return MappingProxyType(self._added)

    def encode(self, text: str) -> list[int]:
        """A raw prompt: special tokens written in the text ARE recognised; BOS prepended iff add_bos."""
        ids = self._backend.encode_raw(text) if self._native_encode else self._splitter.encode(self, text, ())
        return self._with_bos(ids)

    def encode_ordinary(self, text: str) -> list[int]:
        """Plain text: never produces control tokens, no BOS."""
        return list(self._backend.encode_ordinary(text))

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> list[int]:
        """A conversation through the chat template; no message content ever becomes a control token.

        BOS: the template writes it where it wants one (`{{ bos_token }}`, as with HF); if add_bos is set and
        the rendered ids do not already start with it, it is prepended (llama.cpp's behaviour), never twice.
        """
        rendered = self.chat_template.render_protected(
            messages, self._added.keys(), add_generation_prompt, **template_kwargs
        )
        ids = self._splitter.encode(self, rendered.text, rendered.protected)
        if self.add_bos and self.bos_token_id is not None and ids[:1] == [self.bos_token_id]:
            return ids
        return self._with_bos(ids)

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """Text of `ids`; control tokens dropped unless skip_special=False; unknown ids skipped."""
        ids = [int(i) for i in ids]
        ids = [i for i in ids if 0 <= i < self.vocab_size]
        if skip_special and self._is_spm:
            ids = [i for i in ids if i not in self._control_ids]
        fn = self._backend.decode if skip_special else self._backend.decode_with_special
        try:
            return fn(ids)
        except ValueError:
            pass
        ids = [i for i in ids if self._is_known(i)]
        try:
            return fn(ids)
        except ValueError:  # bytes ending mid-character: bundled vocabularies raise instead of U+FFFD
            parts = (self._raw_bytes(i, skip_special) for i in ids)
            return b"".join(parts).decode("utf-8", errors="replace")

    def stream(self, skip_special: bool = True) -> StreamDecoder:
        """An incremental decoder for one sequence: `.add(id) -> str`, `.flush() -> str`."""
        return StreamDecoder(self, skip_special)

    def token_bytes(self, id: int) -> bytes:
        """The bytes one token stands for; an added token's own text; b'' for an id the vocab lacks."""
        return self._raw_bytes(int(id), skip_special=False)

    def max_token_chars(self) -> int:
        """The most characters one token can stand for (its byte length bounds them): a text of more than
        `n × max_token_chars()` characters cannot fit in n tokens. Computed once (~0.1 s per 100k ids)."""
        if self._max_token_chars is None:
            longest = max(
                (len(self._raw_bytes(i, skip_special=False)) for i in range(self.vocab_size)), default=1
            )
            added = max((len(s) for s in self._added), default=1)
            self._max_token_chars = max(longest, added, 1)
        return self._max_token_chars

    def token_text(self, id: int) -> str:
        """Display text of one token (OpenAI logprobs 'token'); a partial UTF-8 character becomes U+FFFD."""
        return self.token_bytes(id).decode("utf-8", errors="replace")

    def _with_bos(self, ids: list[int]) -> list[int]:
        if self.add_bos and self.bos_token_id is not None:
            return [self.bos_token_id, *ids]
        return list(ids)

    def _raw_bytes(self, id: int, skip_special: bool) -> bytes:
        if id in self._added_by_id:
            return b"" if skip_special and id in self._control_ids else self._added_by_id[id].encode()
        if not 0 <= id < self.vocab_size:
            return b""
        try:
            return self._backend.decode_token_bytes(id)
        except ValueError:
            return b""

    def _is_known(self, id: int) -> bool:
        if id not in self._known:
            try:
                self._backend.decode_with_special([id])
                self._known[id] = True
            except ValueError as exc:
                self._known[id] = "out of range" not in str(exc)
        return self._known[id]


class _DecoderPool:
    """splintr's streaming decoders of one tokenizer (skipping special tokens, or not), kept for reuse.

    For a tokenizer.json or GGUF vocabulary splintr builds each decoder with a copy of the vocabulary:
    SmolLM2's 49152 tokens took 5.3 ms and 2.5 MB a decoder on the Zen 3 VM (a bundled vocabulary's
    decoders share it: ~1 µs). Made for each sequence, that was 5 ms of the engine loop per admitted
    request. A decoder comes back reset when its `StreamDecoder` is collected (finished, aborted or
    preempted alike); at most KEEP idle ones are kept. None where splintr cannot stream the vocabulary's
    decoder (then `StreamDecoder` re-decodes a window)."""

    KEEP = 32

    def __init__(self, backend: Any, skip_special: bool) -> None:
        self._make = backend.streaming_decoder if skip_special else backend.streaming_decoder_with_special
        self._idle: list[Any] = []
        self._streams: bool | None = None  # unknown until the first is made

    def take(self) -> Any:
        try:
            return self._idle.pop()  # atomic: the engine's thread takes, any thread may give back
        except IndexError:
            pass
        if self._streams is False:
            return None
        try:
            decoder = self._make()
        except ValueError:
            self._streams = False
            return None
        self._streams = True
        return decoder

    def give_back(self, decoder: Any) -> None:
        decoder.reset()
        if len(self._idle) < self.KEEP:
            self._idle.append(decoder)


class StreamDecoder:
    """Incremental detokenizer for one sequence: `"".join(add(i) for i in ids) + flush() == decode(ids)`.

    Uses splintr's streaming decoder (it holds back bytes until a UTF-8 character completes). For a
    tokenizer.json whose decoder splintr cannot run per token, it re-decodes a sliding window instead:
    text is released once it no longer ends in U+FFFD (the approach of vLLM's incremental detokenizer).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True):
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._drop = tokenizer._control_ids if skip_special and tokenizer._is_spm else frozenset()
        pool = tokenizer._decoders[skip_special]
        self._native = pool.take()
        if self._native is not None:  # back to the pool when this decoder goes
            weakref.finalize(self, pool.give_back, self._native).atexit = False
        self._ids: list[int] = []
        self._prefix = 0  # window start: ids before it are settled
        self._read = 0  # ids before it have been emitted

    def add(self, token_id: int) -> str:
        """Feed one id; returns the text it completes ('' while a character or word is still partial)."""
        token_id = int(token_id)
        if token_id in self._drop:
            return ""
        if self._native is not None:
            return self._native.add_token(token_id) or ""
        self._ids.append(token_id)
        decode = self._tokenizer.decode
        before = decode(self._ids[self._prefix : self._read], self._skip_special)
        after = decode(self._ids[self._prefix :], self._skip_special)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        """The text still held back (an incomplete character becomes U+FFFD); the decoder is then reset."""
        if self._native is not None:
            return self._native.flush() or ""
        decode = self._tokenizer.decode
        before = decode(self._ids[self._prefix : self._read], self._skip_special)
        after = decode(self._ids[self._prefix :], self._skip_special)
        self._ids, self._prefix, self._read = [], 0, 0
        return after[len(before) :]


def load_tokenizer(source: TokenizerSource) -> Tokenizer:
    """Build the tokenizer a checkpoint calls for; see the module docstring for the order."""
    files = TokenizerFiles.read(source.tokenizer_dir)
    meta = source.gguf_metadata
    if source.vocab_name:
        vocab = bundled(source.vocab_name)
    elif files.tokenizer_json is not None:
        vocab = from_tokenizer_json(files)
    elif meta is not None and meta.get("tokenizer.ggml.model"):
        vocab = from_gguf(meta)
    elif source.vocab_size > 0:
        vocab = bundled(vocab_for_size(source.vocab_size))
    else:
        raise BlazrError(
            "no tokenizer: expected --vocab NAME, a tokenizer.json, a GGUF vocabulary or a model vocab_size"
        )

    bos_id = source.bos_token_id if source.bos_token_id is not None else vocab.bos_id
    add_bos = source.add_bos_token if source.add_bos_token is not None else bool(vocab.add_bos)
    if add_bos and bos_id is None:
        raise BlazrError(f"{vocab.name}: add_bos_token is set but the vocabulary has no BOS token")
    by_id = {i: s for s, i in vocab.added.items()}
    bos_text = vocab.bos_text if vocab.bos_text is not None else by_id.get(bos_id, "")
    eos_text = vocab.eos_text
    if eos_text is None:
        eos_text = by_id.get(vocab.eos_ids[0], "") if vocab.eos_ids else ""
    template = _choose_template(source, files, meta, vocab, bos_text, eos_text)

    eos = {int(i) for i in source.eos_token_ids} | set(vocab.eos_ids)
    return Tokenizer(
        vocab.backend,
        name=vocab.name,
        added_tokens=vocab.added,
        control_ids=vocab.control_ids,
        bos_token_id=bos_id,
        eos_token_ids=frozenset(eos),
        add_bos=add_bos,
        chat_template=template,
        model_vocab_size=source.vocab_size,
        strip_flags=vocab.strip_flags,
    )


def vocab_for_size(vocab_size: int) -> str:
    """The bundled splintr vocabulary for a model with `vocab_size` embedding rows."""
    for limit, name in VOCAB_BY_SIZE:
        if vocab_size <= limit:
            return name
    raise BlazrError(
        f"model vocab_size {vocab_size}: no bundled vocabulary fits (largest is o200k_base, <= 200100 rows); "
        "pass --vocab NAME or provide tokenizer.json"
    )


# ----------------------------------------------------------------------------------------------------


def _choose_template(
    source: TokenizerSource,
    files: TokenizerFiles,
    meta: Mapping[str, Any] | None,
    vocab: Vocab,
    bos_text: str,
    eos_text: str,
) -> ChatTemplate:
    tokens = {"bos_token": bos_text, "eos_token": eos_text}
    if source.chat_template_file is not None:
        return ChatTemplate.from_file(source.chat_template_file, **tokens)
    if files.jinja is not None:
        return ChatTemplate.from_file(files.jinja, **tokens)
    text = template_from_tokenizer_config(files.config) if files.config else None
    if text is not None:
        return ChatTemplate(text, name="tokenizer_config.json", **tokens)
    gguf_template = meta.get("tokenizer.chat_template") if meta is not None else None
    if isinstance(gguf_template, bytes):
        gguf_template = gguf_template.decode("utf-8")
    if isinstance(gguf_template, str):
        return ChatTemplate(gguf_template, name="gguf", **tokens)
    if source.is_oxidizr:
        kind = "oxidizr"
    elif "<|start_header_id|>" in vocab.added:
        kind = "llama3"
    elif "<｜User｜>" in vocab.added:
        kind = "deepseek_v3"
    else:
        kind = "chatml"
    return ChatTemplate.fallback(kind, **tokens)


class _SpecialSplitter:
    """Finds added tokens in text (outside protected spans) and encodes the rest with `encode_ordinary`.

    Text between two matches is encoded as one run even where it mixes template text and protected client
    text, so BPE merges across that seam exactly as HF's encoding of the whole prompt does.
    """

    def __init__(self, added: Mapping[str, int], strip_flags: Mapping[str, tuple[bool, bool]]):
        self._ids = dict(added)
        self._flags = {s: f for s, f in strip_flags.items() if s in self._ids}
        self._re = re.compile(literal_pattern(self._ids)) if self._ids else None

    def encode(self, tokenizer: Tokenizer, text: str, protected: Sequence[tuple[int, int]]) -> list[int]:
        ids: list[int] = []
        run: list[str] = []
        for piece in self._pieces(text, protected):
            if isinstance(piece, int):
                if run:
                    ids.extend(tokenizer.encode_ordinary("".join(run)))
                    run = []
                ids.append(piece)
            else:
                run.append(piece)
        if run:
            ids.extend(tokenizer.encode_ordinary("".join(run)))
        return ids

    def _pieces(self, text: str, protected: Sequence[tuple[int, int]]) -> Iterator[str | int]:
        pos = 0
        for start, end in [*protected, (len(text), len(text))]:
            yield from self._scan(text, pos, start)
            yield text[start:end]
            pos = end

    def _scan(self, text: str, pos: int, end: int) -> Iterator[str | int]:
        """Pieces of text[pos:end]: plain strings and added-token ids (HF lstrip/rstrip honoured)."""
        while self._re is not None and (match := self._re.search(text, pos, end)):
            start, stop = match.span()
            lstrip, rstrip = self._flags.get(match.group(0), (False, False))
            if lstrip:
                while start > pos and text[start - 1].isspace():
                    start -= 1
            if rstrip:
                while stop < end and text[stop].isspace():
                    stop += 1
            yield text[pos:start]
            yield self._ids[match.group(0)]
            pos = stop
        yield text[pos:end]


def _end_of_turn_ids(template: ChatTemplate, added: Mapping[str, int]) -> frozenset[int]:
    """Ids of the end-of-turn markers a template writes (its source spells them, or its eos_token is one)."""
    written = [t for t in END_OF_TURN_TOKENS if t in template.source]
    if template.eos_token and "eos_token" in template.source:
        written.append(template.eos_token)
    if _is_harmony(template):  # <|end|> ends one message of the turn; <|return|> or <|call|> the turn
        written = [t for t in written if t != HARMONY_MESSAGE_END] + list(HARMONY_TURN_ENDS)
    return frozenset(added[t] for t in written if t in added)


def _is_harmony(template: ChatTemplate) -> bool:
    """GPT-OSS's harmony format: messages in channels (server/harmony.py)."""
    return "<|channel|>" in template.source
