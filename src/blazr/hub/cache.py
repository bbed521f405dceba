"""What `blazr ls` lists and `blazr rm` removes: hub models in huggingface_hub's cache and the files of
blazr's quantization cache (loading/quant_cache.py).

- Hub models come from `scan_cache_dir` (model repositories only); each cached snapshot (one per commit
  pulled) gives one row per GGUF quant — `org/name:QUANT`, its file(s) summed, the
  path of the (first) file — or one row for a safetensors checkpoint (`org/name`, the snapshot directory);
  unfinished downloads (`blobs/*.incomplete`) are rows of kind `partial`.
- `remove_model("org/name")` deletes the repository's cache folder; `remove_model("org/name:QUANT")`
  deletes that quant's snapshot links and the blobs no other link uses (with its unfinished downloads left
  alone: their quant is not known). `remove_quantized` deletes quantization-cache files by name (all of
  them when none is named). Nothing asks; a name that is not cached is a one-line error listing what is.

In: names. Out: `Entry` rows (name, kind, bytes, path) and the bytes removed.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from blazr.errors import CheckpointError
from blazr.hub.download import storage_folder
from blazr.hub.names import ModelName, gguf_quants, is_model_gguf, matches_quant, split_info
from blazr.hub.pull import cached_snapshot


@dataclass(frozen=True)
class Entry:
    """One row of `blazr ls`."""

    name: str
    kind: str  # gguf | safetensors | partial | quantized
    size: int
    path: Path


def _quant_files(files: list[str], quant: str) -> list[str]:
    """The model GGUFs of `quant` (a tag, or the file name of a GGUF without one, as `gguf_quants` gives)."""
    return [
        f
        for f in files
        if is_model_gguf(f)
        and (split_info(f)[1] == quant.upper() or matches_quant(f, quant) or f.rsplit("/", 1)[-1] == quant)
    ]


def hub_entries() -> list[Entry]:
    """Cached hub models: a row per GGUF quant or safetensors checkpoint, and unfinished downloads."""
    from huggingface_hub import constants, scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(constants.HF_HUB_CACHE)  # its default is the value when it was imported
    except CacheNotFound:
        return []
    rows: list[Entry] = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id.lower()):
        if repo.repo_type != "model":
            continue
        for revision in sorted(repo.revisions, key=lambda r: r.last_modified):
            snapshot = revision.snapshot_path
            files = sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file())
            for quant in gguf_quants(files):
                parts = _quant_files(files, quant)
                size = sum((snapshot / f).stat().st_size for f in parts)
                rows.append(Entry(f"{repo.repo_id}:{quant}", "gguf", size, snapshot / parts[0]))
            if not gguf_quants(files) and files:
                size = sum((snapshot / f).stat().st_size for f in files)
                rows.append(Entry(repo.repo_id, "safetensors", size, snapshot))
        for partial in sorted((repo.repo_path / "blobs").glob("*.incomplete")):
            rows.append(Entry(repo.repo_id, "partial", partial.stat().st_size, partial))
    return rows


def quantized_entries() -> list[Entry]:
    """The quantization cache's files (`--quantize int8 / int4 / bf16` results, a GGUF's re-laid K-quants),
    by file name."""
    directory = _quant_cache_dir()
    if directory is None or not directory.is_dir():
        return []
    from blazr.loading.quant_cache import SUFFIX

    return [Entry(p.name, "quantized", p.stat().st_size, p) for p in sorted(directory.glob(f"*{SUFFIX}"))]


def _quant_cache_dir() -> Path | None:
    from blazr.loading.quant_cache import cache_dir

    return cache_dir()


def _cached_names() -> str:
    names = [e.name for e in hub_entries() if e.kind != "partial"]
    return ", ".join(dict.fromkeys(names)) or "none"


def remove_model(name: ModelName) -> int:
    """Delete a cached repository, or one quant of it; the bytes freed."""
    storage = storage_folder(name.repo_id)
    if not storage.is_dir():
        raise CheckpointError(f"{name.repo_id} is not cached; cached models: {_cached_names()}")
    if name.quant is None:
        size = sum(p.stat().st_size for p in storage.rglob("*") if p.is_file() and not p.is_symlink())
        shutil.rmtree(storage)
        return size
    links = []
    snapshots = storage / "snapshots"
    for snapshot in snapshots.iterdir() if snapshots.is_dir() else []:
        for p in snapshot.rglob("*"):
            if (p.is_file() or p.is_symlink()) and _quant_files([str(p.relative_to(snapshot))], name.quant):
                links.append(p)
    return _remove_links(name, storage, links)


def _remove_links(name: ModelName, storage: Path, links: list[Path]) -> int:
    if not links:
        cached = cached_snapshot(name.repo_id)
        quants = ", ".join(gguf_quants(cached[1])) if cached else ""
        raise CheckpointError(f"{name} is not cached; cached quants of {name.repo_id}: {quants or 'none'}")
    blobs = {p.resolve() for p in links if p.is_symlink()}
    size = sum(p.stat().st_size for p in links if p.exists() and not p.is_symlink())
    for p in links:
        p.unlink()
    still_used = {p.resolve() for p in (storage / "snapshots").rglob("*") if p.is_symlink()}
    for blob in blobs - still_used:
        if blob.is_file():
            size += blob.stat().st_size
            blob.unlink()
    for d in sorted((storage / "snapshots").rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()
    return size


def remove_quantized(names: list[str]) -> int:
    """Delete quantization-cache files by name (every one when `names` is empty); the bytes freed."""
    entries = quantized_entries()
    chosen = entries if not names else [e for e in entries if e.name in names or str(e.path) in names]
    missing = [n for n in names if not any(n in (e.name, str(e.path)) for e in entries)]
    if missing:
        have = ", ".join(e.name for e in entries) or "none"
        raise CheckpointError(
            f"not in the quantization cache ({_quant_cache_dir()}): {missing[0]}; files: {have}"
        )
    size = 0
    for e in chosen:
        size += e.size
        e.path.unlink(missing_ok=True)
    return size
