"""Split GGUFs — llama.cpp's `gguf-split` parts `name-00001-of-0000N.gguf` … — opened as one file.

Every part is a GGUF of its own with `split.no` (0-based), `split.count` and `split.tensors.count`; the first
holds the model's metadata and each tensor lies wholly in one part. `open_gguf` opens a one-file GGUF as a
`GGUFFile`, and a split one (given any part) as `GGUFParts`: each part memory-mapped, the first part's
metadata, the union of the tensors, and every `GGUFFile` read method answered by the part that holds the
tensor (`span` / `holds` by the part whose map holds the address), so loaders, mapped weights and the
quantization cache (keyed on `paths`, every part) see one checkpoint.

In: the path of any part. Out: a `GGUFFile` or `GGUFParts`, or a one-line `CheckpointError` naming the
missing, extra or inconsistent part.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from blazr.errors import CheckpointError
from blazr.loading.gguf import GGUFFile

_PART = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


def split_paths(path: Path) -> list[Path]:
    """Every part of the split set `path` belongs to, by name, in order (just `path` if it is not named as a
    part)."""
    m = _PART.match(path.name)
    if m is None:
        return [path]
    count = int(m["count"])
    return [path.with_name(f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def open_gguf(path: str | Path) -> GGUFFile | GGUFParts:
    """A one-file GGUF, or every part of a split one as a single file."""
    path = Path(path)
    paths = split_paths(path)
    first = GGUFFile(paths[0]) if paths[0].is_file() else None
    count = int(first.metadata.get("split.count") or 1) if first is not None else len(paths)
    if first is not None and count <= 1 and len(paths) == 1:
        return first
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise CheckpointError(f"{path}: part of a {len(paths)}-part split GGUF; missing {', '.join(missing)}")
    if count != len(paths):
        raise CheckpointError(f"{paths[0]}: split.count is {count} but the file names say {len(paths)} parts")
    return GGUFParts([first, *(GGUFFile(p) for p in paths[1:])])


class GGUFParts:
    """The parts of a split GGUF behind `GGUFFile`'s read interface (see the module docstring)."""

    def __init__(self, parts: list[Any]) -> None:
        self.parts: list[GGUFFile] = parts
        self.path = parts[0].path
        self.paths = tuple(p.path for p in parts)
        self.metadata: dict[str, Any] = parts[0].metadata
        self._owner: dict[str, GGUFFile] = {}
        for i, part in enumerate(parts):
            no, count = part.metadata.get("split.no"), part.metadata.get("split.count")
            if (no, count) != (i, len(parts)):
                raise CheckpointError(
                    f"{part.path}: expected split.no {i} of split.count {len(parts)}, found {no} of {count}"
                )
            for name in part.tensor_names:
                if name in self._owner:
                    raise CheckpointError(f"{part.path}: tensor {name!r} is also in {self._owner[name].path}")
                self._owner[name] = part
        expected = self.metadata.get("split.tensors.count")
        if expected is not None and int(expected) != len(self._owner):
            raise CheckpointError(
                f"{self.path}: split.tensors.count is {expected}, the parts hold {len(self._owner)} tensors"
            )
        self.tensor_names: list[str] = list(self._owner)

    def _part(self, name: str) -> GGUFFile:
        part = self._owner.get(name)
        if part is None:
            some = ", ".join(self.tensor_names[:3])
            raise CheckpointError(
                f"{self.path}: no tensor named {name!r} in its {len(self.parts)} parts "
                f"({len(self.tensor_names)} tensors: {some}, ...)"
            )
        return part

    def tensor_type(self, name: str) -> str:
        return self._part(name).tensor_type(name)

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        return self._part(name).tensor_shape(name)

    def raw(self, name: str) -> torch.Tensor:
        return self._part(name).raw(name)

    def read(self, name: str) -> torch.Tensor:
        return self._part(name).read(name)

    def load(self, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self._part(name).load(name, dtype)

    def release(self, name: str) -> None:
        self._part(name).release(name)

    def prefetch(self) -> None:
        for part in self.parts:
            part.prefetch()

    def holds(self, t: torch.Tensor) -> bool:
        return any(part.holds(t) for part in self.parts)

    def span(self, address: int, num_bytes: int) -> torch.Tensor:
        for part in self.parts:
            try:
                return part.span(address, num_bytes)
            except ValueError:
                continue
        raise ValueError(f"span of {num_bytes} bytes at {address:#x}: outside every part of {self.path}")

    def __repr__(self) -> str:
        return f"GGUFParts({str(self.path)!r}, {len(self.parts)} parts, {len(self.tensor_names)} tensors)"
