"""Model names — `org/name` and `org/name:QUANT` — and the files of a repository that a name selects.

GGUF repositories hold one file (or one split set) per quantization; a name picks one the way llama.cpp's
`-hf org/name[:QUANT]` does (common/download.cpp `find_best_model`):
- the quant tag is matched case-insensitively as `QUANT` followed by `.` or `-` in a model GGUF's path,
  after the start or a `-` `.` `_` `/`: `m-Q4_K_M.gguf`, `m.Q4_K_M.gguf`, `m-Q4_K_M-00001-of-00003.gguf`,
  `Q4_K_M/m-Q4_K_M-00001-of-00002.gguf`, `m-UD-Q4_K_XL.gguf` (tag `UD-Q4_K_XL` or `Q4_K_XL`);
- without a tag: Q4_K_M, else Q8_0, else the first model GGUF in path order (llama-server's choice);
- a split GGUF (`-0000i-of-0000N.gguf`) selects all N parts, the first one first;
- model GGUFs exclude the sidecars llama.cpp skips: mmproj, imatrix, mtp-, eagle3-, dflash-, dspark-.
A repository with model GGUFs is read as a GGUF repository (as `-hf`, even where safetensors lie beside
them). A safetensors repository (no model GGUF) selects its root-level weights (*.safetensors + index),
JSON files (config, generation_config, tokenizer*, special_tokens_map, modules.json), chat templates
(*.jinja) and tokenizer vocab files (tokenizer.model, merges.txt, vocab.txt) — nothing in sub-folders
(original/, onnx/), no .bin / .pt / .onnx / .msgpack / .h5.

In: a name string, or a name and a repository's file listing (paths relative to the repo). Out: a
`ModelName`, a `Selection` (kind, files, the file a loader opens), or a one-line `CheckpointError` that
lists the quants the repository has.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from blazr.errors import CheckpointError

DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")
_NAME = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<quant>[A-Za-z0-9][\w-]*))?$")
_SPLIT = re.compile(r"^(.+)-(\d{5})-of-(\d{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
_SIDECARS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
_ROOT_EXTRAS = ("tokenizer.model", "merges.txt", "vocab.txt")


@dataclass(frozen=True)
class ModelName:
    """A hub repository id and an optional GGUF quantization tag (as the user wrote it)."""

    repo_id: str
    quant: str | None = None

    def __str__(self) -> str:
        return self.repo_id + (f":{self.quant}" if self.quant else "")


@dataclass(frozen=True)
class Selection:
    """The files of a repository a name needs: `primary` is the one a loader opens (a GGUF, or the first
    part of a split one); None for a safetensors repository (the loader opens the directory)."""

    kind: Literal["gguf", "safetensors"]
    files: tuple[str, ...]
    primary: str | None
    quant: str | None = None


def looks_like_name(text: str) -> bool:
    """Whether `text` has the shape of `org/name[:QUANT]` (and is not a relative or home path)."""
    return bool(_NAME.match(text)) and not text.startswith((".", "/", "~"))


def parse_name(text: str) -> ModelName:
    """`org/name` or `org/name:QUANT`, or a one-line error saying what a name looks like."""
    m = _NAME.match(text.strip())
    if m is None or text.startswith((".", "/", "~")):
        raise CheckpointError(
            f"bad model name {text!r}: expected org/name or org/name:QUANT (e.g. "
            "bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M)"
        )
    return ModelName(m["repo"], m["quant"])


def split_info(path: str) -> tuple[str, str, int, int]:
    """(prefix with the tag, TAG upper-cased or "", part index, part count) of a GGUF path."""
    prefix = path[: -len(".gguf")] if path.lower().endswith(".gguf") else path
    index = count = 1
    m = _SPLIT.match(prefix)
    if m:
        prefix, index, count = m[1], int(m[2]), int(m[3])
    tag = _TAG.search(prefix)
    return prefix, tag[1].upper() if tag else "", index, count


def is_model_gguf(path: str) -> bool:
    """A GGUF holding a model (not a projector, imatrix or draft sidecar)."""
    if not path.lower().endswith(".gguf"):
        return False
    base = path.rsplit("/", 1)[-1].lower()
    return not any(s in base for s in _SIDECARS)


def gguf_quants(files: list[str]) -> list[str]:
    """The quant tags of a listing's model GGUFs, in path order without repeats."""
    tags = [split_info(f)[1] or f.rsplit("/", 1)[-1] for f in sorted(files) if is_model_gguf(f)]
    return list(dict.fromkeys(tags))


def matches_quant(path: str, quant: str) -> bool:
    """Whether a model GGUF's path carries `quant` (see the module docstring)."""
    pattern = rf"(?:^|[-._/]){re.escape(quant)}[.-]"
    return is_model_gguf(path) and re.search(pattern, path, re.IGNORECASE) is not None


def split_parts(files: list[str], first: str) -> list[str]:
    """All parts of `first`'s split set (just `first` when it is not split), in part order."""
    prefix, _, _, count = split_info(first)
    if count <= 1:
        return [first]
    parts = [
        f for f in files if is_model_gguf(f) and split_info(f)[0] == prefix and split_info(f)[3] == count
    ]
    return sorted(parts, key=lambda f: split_info(f)[2])


def _first_part(files: list[str], quant: str | None) -> str | None:
    for f in sorted(files):
        if is_model_gguf(f) and (quant is None or matches_quant(f, quant)) and split_info(f)[2] == 1:
            return f
    return None


def select_gguf(repo: str, files: list[str], quant: str | None) -> Selection:
    """The chosen quant's file(s): `quant`, else Q4_K_M, else Q8_0, else the first model GGUF."""
    for tag in [quant] if quant else DEFAULT_QUANTS:
        first = _first_part(files, tag)
        if first is not None:
            break
    else:
        first = None if quant else _first_part(files, None)
    if first is None:
        quants = gguf_quants(files)
        if not quants:
            raise CheckpointError(f"{repo}: no model GGUF files")
        raise CheckpointError(f"{repo} has no {quant} GGUF; quants there: {', '.join(quants)}")
    parts = split_parts(files, first)
    count = split_info(first)[3]
    if len(parts) != count:
        raise CheckpointError(f"{repo}: {first} is part 1 of {count} but {len(parts)} parts are listed")
    return Selection("gguf", tuple(parts), first, quant or split_info(first)[1] or None)


def select_safetensors(repo: str, files: list[str]) -> Selection:
    """Root-level weights, JSON configs, tokenizer files and chat templates (see the module docstring)."""
    root = [f for f in files if "/" not in f]
    weights = [f for f in root if f.endswith(".safetensors")]
    if not weights:
        raise CheckpointError(
            f"{repo}: no GGUF or root-level .safetensors weights (found {', '.join(sorted(files)[:8])})"
        )
    keep = [f for f in root if f.endswith((".safetensors", ".json", ".jinja")) or f in _ROOT_EXTRAS]
    return Selection("safetensors", tuple(sorted(keep)), None)


def select_files(name: ModelName, files: list[str]) -> Selection:
    """What `name` selects from a repository listing: a GGUF quant when the repository has model GGUFs
    (or a quant is asked), else its safetensors checkpoint."""
    if name.quant or any(is_model_gguf(f) for f in files):
        if not any(is_model_gguf(f) for f in files):
            raise CheckpointError(
                f"{name}: {name.repo_id} has no GGUF files (a safetensors repository): "
                f"use {name.repo_id} without :{name.quant}"
            )
        return select_gguf(name.repo_id, files, name.quant)
    return select_safetensors(name.repo_id, files)
