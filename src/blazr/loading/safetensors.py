"""Memory-mapped safetensors checkpoints: one file (any name) or HF shards with an index json.

`SafetensorsCheckpoint` maps every tensor name to its file, validates every header up front (truncated or
corrupt files fail here with one line naming the file), and loads tensors lazily one at a time from the
mmap, so a checkpoint is never held in memory twice.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from blazr.errors import CheckpointError

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def shard_files(index_path: Path) -> list[Path]:
    """The shard files named by a `*.safetensors.index.json`, each checked to exist."""
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{index_path}: not a valid safetensors index ({e})") from None
    files = []
    for name in sorted(set(weight_map.values())):
        path = index_path.parent / name
        if not path.is_file():
            raise CheckpointError(
                f"{index_path}: shard {name} is listed but missing from {index_path.parent}"
            )
        files.append(path)
    return files


class SafetensorsCheckpoint:
    """Tensor names → shapes/dtypes and lazy loads across one or more safetensors files."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files
        self._handles = {}
        self._where: dict[str, Path] = {}
        for path in files:
            try:
                handle = safe_open(str(path), framework="pt")
            except (SafetensorError, OSError) as e:
                raise CheckpointError(f"{path}: corrupt or truncated safetensors file ({e})") from None
            self._handles[path] = handle
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if name in self._where:
                    raise CheckpointError(f"{path}: tensor {name} also appears in {self._where[name]}")
                self._where[name] = path

    @property
    def names(self) -> set[str]:
        return set(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handles[self._where[name]].get_slice(name).get_shape())

    def dtype(self, name: str) -> torch.dtype:
        return _DTYPES[self._handles[self._where[name]].get_slice(name).get_dtype()]

    def load(self, name: str) -> torch.Tensor:
        return self._handles[self._where[name]].get_tensor(name)

    def file_of(self, name: str) -> Path:
        return self._where[name]
