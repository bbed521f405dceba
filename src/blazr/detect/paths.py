"""Where the weights are: the weight files of a path (single file of any name, shards + index, one GGUF or one
split GGUF's parts). What a `--model` argument names — the embedded default, a local path, a hub name — is
blazr/model_ref.py's (it imports no torch)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any, Literal

from blazr.errors import CheckpointError
from blazr.loading.gguf_split import split_paths
from blazr.loading.safetensors import shard_files

log = logging.getLogger("blazr.detect")

_SHARD = re.compile(r"model-(\d+)-of-(\d+)\.safetensors")


def find_weight_files(path: Path) -> tuple[Literal["safetensors", "gguf"], list[Path]]:
    """The weight files of a checkpoint path (a file, or a directory holding one checkpoint)."""
    if path.is_file():
        if path.suffix == ".gguf":
            return "gguf", [path]
        if path.suffix == ".safetensors":
            return "safetensors", [path]
        if path.name.endswith(".safetensors.index.json"):
            return "safetensors", shard_files(path)
        raise CheckpointError(
            f"{path}: expected a .safetensors or .gguf file, found {path.suffix or 'no suffix'}"
        )
    if (path / "model.safetensors").is_file():
        return "safetensors", [path / "model.safetensors"]
    indexes = sorted(path.glob("*.safetensors.index.json"))
    if indexes:
        return "safetensors", shard_files(indexes[0])
    shards = sorted(p for p in path.glob("*.safetensors") if _SHARD.fullmatch(p.name))
    if shards:
        total = int(_SHARD.fullmatch(shards[0].name).group(2))
        if len(shards) != total:
            raise CheckpointError(
                f"{path}: expected {total} shards model-*-of-{total:05d}.safetensors, found {len(shards)}"
            )
        return "safetensors", shards
    singles = sorted(path.glob("*.safetensors"))
    if len(singles) == 1:
        return "safetensors", singles
    ggufs = sorted(path.glob("*.gguf"))
    if not singles and (len(ggufs) == 1 or (ggufs and split_paths(ggufs[0]) == ggufs)):
        return "gguf", ggufs[:1]  # one file, or the first part of the one split set (loading/gguf_split.py)
    found = sorted(p.name for p in path.iterdir())[:8]
    if len(singles) > 1 or len(ggufs) > 1:
        raise CheckpointError(
            f"{path}: several checkpoints and no model.safetensors or index json; pass one file: "
            + ", ".join(p.name for p in (singles or ggufs)[:6])
        )
    raise CheckpointError(
        f"no weights in {path}: expected model.safetensors, model-0000i-of-0000n.safetensors, "
        f"one *.safetensors or one *.gguf; found {found or 'an empty directory'}"
    )


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise CheckpointError(f"{path}: invalid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data
