"""Vocabularies: the splintr backend a checkpoint's tokenizer comes from, plus what the vocabulary itself
says about added/control tokens, BOS and EOS.

Three sources: a bundled splintr vocabulary by name; a HF `tokenizer.json` (with tokenizer_config.json
beside it); a GGUF vocabulary (`tokenizer.ggml.*`), where byte-level BPE (`gpt2`) is rebuilt as an HF
tokenizer.json in memory with llama.cpp's pre-tokenizer regexes for `tokenizer.ggml.pre`, SentencePiece
(`llama`) uses splintr's SpmTokenizer, and Gemma 4's SentencePiece-style BPE (`gemma4`: merges over raw UTF-8
with spaces as `▁`, byte fallback) is rebuilt as an HF tokenizer.json too. `tokenizer.py` chooses among them
and wraps the result.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import splintr

from blazr.errors import BlazrError, CheckpointError, UnsupportedError
from blazr.spm_bpe import PrefixlessSpm

log = logging.getLogger(__name__)

_BOS_CANDIDATES = ("<|begin_of_text|>", "<｜begin▁of▁sentence｜>", "<s>", "<bos>")
_GGUF_CONTROL, _GGUF_UNKNOWN, _GGUF_USER_DEFINED = 3, 2, 4


# GGUF `tokenizer.ggml.pre` -> the regex splits llama.cpp applies before byte-level BPE (llama-vocab.cpp),
# each applied to the pieces of the one before. GPT-2's is what ByteLevel(use_regex=True) uses.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEEPSEEK_V3_SPLITS = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)


def _family(splits: tuple[str, ...], *names: str) -> dict[str, tuple[str, ...]]:
    return dict.fromkeys(names, splits)


GGUF_PRE_SPLITS: Mapping[str, tuple[str, ...]] = {
    **_family((_GPT2_SPLIT,), "gpt2", "gpt-2", "default", "mpt", "olmo", "jais", "phi-2", "trillion"),
    **_family(
        (r"\p{N}", _GPT2_SPLIT),
        "smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b",
    ),
    **_family(
        (_LLAMA3_SPLIT,),
        "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "dbrx",
        "smaug-bpe", "chatglm-bpe",
    ),
    **_family((_QWEN2_SPLIT,), "qwen2", "deepseek-r1-qwen", "stablelm2", "megrez", "hunyuan"),
    **_family((_QWEN35_SPLIT,), "qwen35"),
    **_family((_GPT4O_SPLIT,), "gpt-4o", "llama4", "minimax-m2"),
    **_family((_TEKKEN_SPLIT,), "tekken"),
    **_family(_DEEPSEEK_V3_SPLITS, "deepseek-v3"),
}  # fmt: skip
# llama.cpp sets ignore_merges (a whole pre-token found in the vocab is taken as is) and add_bos for these.
_LLAMA3_LIKE = frozenset(
    {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"}
)


def _json_bytes(doc: Mapping[str, Any]) -> bytes:
    """A tokenizer document as compact UTF-8 JSON for splintr, by orjson: every GGUF load builds one, and at
    a 49k vocabulary orjson takes 4-6 ms where the stdlib's fastest settings took 30-130 ms (same bytes)."""
    return orjson.dumps(doc)


def build_gguf_tokenizer_json(metadata: Mapping[str, Any]) -> bytes:
    """An HF tokenizer.json for a GGUF byte-level BPE vocabulary (see `_bpe_tokenizer_json`)."""
    tokens = _strings(metadata, "tokenizer.ggml.tokens")
    return _bpe_tokenizer_json(metadata, tokens, _token_types(metadata, len(tokens)))


def _bpe_tokenizer_json(metadata: Mapping[str, Any], tokens: list[str], types: list[int]) -> bytes:
    """An HF tokenizer.json for a GGUF byte-level BPE vocabulary (`tokenizer.ggml.model == "gpt2"`).

    NORMAL tokens are already spelled in GPT-2's byte alphabet (any that is not gets respelled); CONTROL (3)
    and UNKNOWN (2) tokens become special added tokens, USER_DEFINED (4) ones non-special added tokens, all
    matched in text as written, as llama.cpp does. No post_processor: BOS is the Tokenizer's business.
    """
    merges: list[Any] = _strings(metadata, "tokenizer.ggml.merges")
    # HF's "a b" merge strings are what GGUF stores; split them only where a token holds a space (one C-level
    # count decides: splitting 49k merges in Python was a quarter of the build).
    if "\n".join(merges).count(" ") != len(merges):
        merges = [m.split(" ", 1) for m in merges]
    pre = str(metadata.get("tokenizer.ggml.pre") or "default")
    splits = GGUF_PRE_SPLITS.get(pre)
    if splits is None:
        log.warning("GGUF tokenizer.ggml.pre=%r is not known to blazr; splitting text like GPT-2", pre)
        splits = (_GPT2_SPLIT,)

    added_kinds = (_GGUF_CONTROL, _GGUF_UNKNOWN, _GGUF_USER_DEFINED)
    added = [
        {"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": kind != _GGUF_USER_DEFINED}
        for i, kind in enumerate(types)
        if kind in added_kinds
    ]  # fmt: skip
    alphabet = _byte_alphabet()
    spelled = set(alphabet.values())
    keys = tokens
    if not set("".join(tokens)) <= spelled:  # a NORMAL token written as text: spell its bytes
        keys = [
            t if kind in added_kinds or set(t) <= spelled else "".join(alphabet[b] for b in t.encode())
            for t, kind in zip(tokens, types, strict=True)
        ]
    # the first id of a repeated spelling wins: the reversed pairs let later (lower) ids overwrite
    vocab = dict(zip(reversed(keys), range(len(keys) - 1, -1, -1), strict=True))
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                *(
                    {"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False}
                    for r in splits
                ),
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": pre in _LLAMA3_LIKE or pre == "tekken",
            "vocab": vocab,
            "merges": merges,
        },
    }
    return _json_bytes(doc)


def _spm_bpe_tokenizer_json(metadata: Mapping[str, Any], tokens: list[str], types: list[int]) -> bytes:
    """An HF tokenizer.json for a GGUF SentencePiece-style BPE vocabulary (`tokenizer.ggml.model ==
    "gemma4"`), as llama.cpp runs it (LLAMA_VOCAB_PRE_TYPE_GEMMA4): spaces become `▁` (no prefix), the text
    is split into runs of newlines and runs of anything else, BPE merges (their rank order) run on raw UTF-8
    characters, and a piece outside the vocabulary falls back to its bytes' `<0xNN>` tokens. Added tokens as
    in `_bpe_tokenizer_json`. (llama.cpp takes a whole newline run as one token where the vocabulary has it,
    merges or not; here the merges decide.)"""
    merges: list[Any] = _strings(metadata, "tokenizer.ggml.merges")
    if "\n".join(merges).count(" ") != len(merges):
        merges = [m.split(" ", 1) for m in merges]
    added_kinds = (_GGUF_CONTROL, _GGUF_UNKNOWN, _GGUF_USER_DEFINED)
    added = [
        {"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": kind != _GGUF_USER_DEFINED}
        for i, kind in enumerate(types)
        if kind in added_kinds
    ]  # fmt: skip
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        "pre_tokenizer": {
            "type": "Split",
            "pattern": {"Regex": r"[^\n]+|[\n]+"},
            "behavior": "Isolated",
            "invert": False,
        },
        "post_processor": None,
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": dict(zip(reversed(tokens), range(len(tokens) - 1, -1, -1), strict=True)),
            "merges": merges,
        },
    }
    return _json_bytes(doc)


@dataclass
class Vocab:
    """A loaded backend plus what the vocabulary itself says about specials, BOS and EOS."""

    backend: Any
    name: str
    added: dict[str, int]
    control_ids: frozenset[int]
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    add_bos: bool | None = None
    bos_text: str | None = None
    eos_text: str | None = None
    strip_flags: dict[str, tuple[bool, bool]] = field(default_factory=dict)


@dataclass
class TokenizerFiles:
    """The tokenizer files in a checkpoint directory (each None when absent)."""

    tokenizer_json: Path | None = None
    config: dict[str, Any] | None = None
    jinja: Path | None = None

    @classmethod
    def read(cls, directory: Path | None) -> TokenizerFiles:
        if directory is None:
            return cls()
        directory = Path(directory)
        files = cls()
        if (directory / "tokenizer.json").is_file():
            files.tokenizer_json = directory / "tokenizer.json"
        if (directory / "chat_template.jinja").is_file():
            files.jinja = directory / "chat_template.jinja"
        config_path = directory / "tokenizer_config.json"
        if config_path.is_file():
            files.config = _read_json(config_path)
        return files


def bundled(name: str) -> Vocab:
    try:
        backend = splintr.Tokenizer.from_pretrained(name)
    except ValueError as exc:
        supported = (
            str(exc).partition("Supported:")[2].strip() or "cl100k_base, o200k_base, llama3, deepseek_v3"
        )
        raise BlazrError(f"unknown vocabulary {name!r}; expected one of: {supported}") from None
    added = dict(backend.special_tokens())
    bos = next((added[t] for t in _BOS_CANDIDATES if t in added), None)
    eos = backend.eos_token_id
    return Vocab(
        backend, name, added, frozenset(added.values()), bos_id=bos, eos_ids=() if eos is None else (eos,)
    )


def from_tokenizer_json(files: TokenizerFiles) -> Vocab:
    path = files.tokenizer_json
    assert path is not None
    doc = _read_json(path)
    bos_from_template = _leading_special(doc.get("post_processor"))
    try:
        if _adds_tokens(doc.get("post_processor")):
            doc["post_processor"] = None  # BOS is ours to place; see the module docstring
            backend = splintr.from_json_bytes(_json_bytes(doc))
        else:
            backend = splintr.from_json(str(path))
    except ValueError as exc:
        raise CheckpointError(f"{path}: splintr cannot load it: {exc}") from None
    added: dict[str, int] = {}
    control: set[int] = set()
    flags: dict[str, tuple[bool, bool]] = {}
    for entry in doc.get("added_tokens") or []:
        added[entry["content"]] = int(entry["id"])
        if entry.get("special", True):
            control.add(int(entry["id"]))
        if entry.get("lstrip") or entry.get("rstrip"):
            flags[entry["content"]] = (bool(entry.get("lstrip")), bool(entry.get("rstrip")))

    config = files.config or {}
    bos_text, eos_text = _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
    bos_id = added.get(bos_text, bos_from_template) if bos_text else bos_from_template
    eos_id = added.get(eos_text, backend.eos_token_id) if eos_text else backend.eos_token_id
    add_bos = config.get("add_bos_token")
    if add_bos is None:
        add_bos = bos_from_template is not None
    return Vocab(
        backend,
        "tokenizer.json",
        added,
        frozenset(control),
        bos_id=bos_id,
        eos_ids=() if eos_id is None else (eos_id,),
        add_bos=bool(add_bos),
        bos_text=bos_text,
        eos_text=eos_text,
        strip_flags=flags,
    )


def from_gguf(meta: Mapping[str, Any]) -> Vocab:
    model = str(meta.get("tokenizer.ggml.model"))
    tokens = _strings(meta, "tokenizer.ggml.tokens")
    types = _token_types(meta, len(tokens))
    pre = str(meta.get("tokenizer.ggml.pre") or "default")
    if model == "gpt2":
        backend = splintr.from_json_bytes(_bpe_tokenizer_json(meta, tokens, types))
        name, add_bos = f"gguf:{pre}", pre in _LLAMA3_LIKE
    elif model == "llama":
        prefix = meta.get("tokenizer.ggml.add_space_prefix")
        scores = [float(s) for s in _required(meta, "tokenizer.ggml.scores")]
        if prefix is not None and not bool(prefix):  # Gemma: splintr's SpmTokenizer always adds the prefix
            user = [i for i, k in enumerate(types) if k == _GGUF_USER_DEFINED]
            backend = PrefixlessSpm(tokens, scores, user)
        else:
            backend = splintr.SpmTokenizer(tokens, scores)
        name, add_bos = "gguf:llama", True
    elif model == "gemma4":
        backend = splintr.from_json_bytes(_spm_bpe_tokenizer_json(meta, tokens, types))
        name, add_bos = "gguf:gemma4", True
    else:
        raise UnsupportedError(
            f"GGUF tokenizer.ggml.model={model!r}: expected 'gpt2' (byte-level BPE), 'llama' (SPM) or "
            "'gemma4' (SPM-style BPE)"
        )
    kinds = (_GGUF_CONTROL, _GGUF_UNKNOWN, _GGUF_USER_DEFINED)
    added = {t: i for i, (t, k) in enumerate(zip(tokens, types, strict=True)) if k in kinds}
    control = frozenset(i for i, k in enumerate(types) if k in (_GGUF_CONTROL, _GGUF_UNKNOWN))
    eos = tuple(
        int(meta[k])
        for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
        if meta.get(k) is not None
    )
    bos = meta.get("tokenizer.ggml.bos_token_id")
    if meta.get("tokenizer.ggml.add_bos_token") is not None:
        add_bos = bool(meta["tokenizer.ggml.add_bos_token"])
    return Vocab(
        backend,
        name,
        added,
        control,
        bos_id=None if bos is None else int(bos),
        eos_ids=eos,
        add_bos=add_bos,
        bos_text=None if bos is None else tokens[int(bos)],
        eos_text=tokens[eos[0]] if eos else None,
    )


def _leading_special(processor: Mapping[str, Any] | None) -> int | None:
    """The id a tokenizer.json post_processor puts before the text (its BOS), if any."""
    if not processor:
        return None
    if processor.get("type") == "Sequence":
        for inner in processor.get("processors") or []:
            if (found := _leading_special(inner)) is not None:
                return found
        return None
    if processor.get("type") != "TemplateProcessing":
        return None
    single = processor.get("single") or []
    if single and "SpecialToken" in single[0]:
        name = single[0]["SpecialToken"]["id"]
        ids = (processor.get("special_tokens") or {}).get(name, {}).get("ids") or []
        return int(ids[0]) if ids else None
    return None


def _adds_tokens(processor: Mapping[str, Any] | None) -> bool:
    """Whether a tokenizer.json post_processor adds ids around the text (else it only fixes offsets)."""
    if not processor:
        return False
    kind = processor.get("type")
    if kind == "Sequence":
        return any(_adds_tokens(inner) for inner in processor.get("processors") or [])
    if kind == "TemplateProcessing":
        return any("SpecialToken" in item for item in processor.get("single") or [])
    return kind != "ByteLevel"


def _token_text(value: Any) -> str | None:
    """tokenizer_config's bos_token/eos_token: a string or an AddedToken dict."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: expected a readable JSON file ({exc})") from None


def _required(meta: Mapping[str, Any], key: str) -> Any:
    if meta.get(key) is None:
        raise CheckpointError(f"GGUF metadata: expected {key}, found none")
    return meta[key]


def _strings(meta: Mapping[str, Any], key: str) -> list[str]:
    """A GGUF string array as str (a reader may hand back bytes). GGUF arrays hold one type, so a list whose
    first item is a str (blazr's header parser's) is returned as it is: read only, never copied."""
    values = _required(meta, key)
    if isinstance(values, list) and (not values or type(values[0]) is str):
        return values
    return [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v) for v in values]


def _token_types(meta: Mapping[str, Any], count: int) -> list[int]:
    types = meta.get("tokenizer.ggml.token_type")
    types = [1] * count if types is None else [int(t) for t in types]
    if len(types) != count:
        raise CheckpointError(
            f"GGUF metadata: expected {count} tokenizer.ggml.token_type entries, found {len(types)}"
        )
    return types


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map (bytes that print as themselves keep their character)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table
