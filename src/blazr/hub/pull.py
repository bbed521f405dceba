"""Resolve `org/name[:QUANT]` to local files: the cache first, else the hub (list the repository, select
with names.py, download the selection resumably with download.py).

- Cache first (`resolve`, what every command's `--model` and `LLM(...)` use): a name whose selection is
  complete in the cache is used without the network — with a quant, that quant's file(s); without one,
  Q4_K_M (another default needs the hub's listing to know it is the default), or a complete safetensors
  checkpoint.
- `pull` (the `blazr pull` command) always lists the repository, so it fetches what the cache lacks.
- Offline (`HF_HUB_OFFLINE=1`), or the hub unreachable: the cache's own listing is selected from the same
  way (a name without a quant then takes the cached Q4_K_M, Q8_0 or first GGUF); absent → one-line error
  naming what the cache has.
- A cached repository's files are those under `snapshots/<commit>/` of the commit `refs/main` names (the
  newest snapshot when there is no ref); `pull` writes that ref after the last file.

In: a `ModelName` (or its text). Out: `Pulled` — the selection, the path a loader opens (the GGUF, the first
part of a split one, or the snapshot directory) and the bytes on disk.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import constants

from blazr.errors import CheckpointError
from blazr.hub.download import NETWORK_ERRORS, download_file, storage_folder
from blazr.hub.names import ModelName, Selection, gguf_quants, parse_name, select_files

log = logging.getLogger("blazr.hub")

REVISION = "main"


@dataclass(frozen=True)
class Pulled:
    """A resolved name: its selection, the snapshot it lies in, the path to load, and its size in bytes."""

    name: ModelName
    selection: Selection
    snapshot: Path
    path: Path
    size: int
    from_cache: bool


def cached_snapshot(repo_id: str) -> tuple[Path, list[str]] | None:
    """The cached snapshot of a repository and its complete files (paths relative to it), or None."""
    snapshots = storage_folder(repo_id) / "snapshots"
    ref = storage_folder(repo_id) / "refs" / REVISION
    snapshot = snapshots / ref.read_text().strip() if ref.is_file() else None
    if snapshot is None or not snapshot.is_dir():
        found = sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime) if snapshots.is_dir() else []
        if not found:
            return None
        snapshot = found[-1]
    files = sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file())
    return snapshot, files


def _complete(selection: Selection, files: list[str], snapshot: Path) -> bool:
    """Whether a selection made from a cached listing is a whole checkpoint (shards of an index there)."""
    if selection.kind == "gguf":
        return True  # select_gguf already checked that every split part is listed
    if "config.json" not in files:
        return False
    for index in (f for f in selection.files if f.endswith(".safetensors.index.json")):
        try:
            shards = set(json.loads((snapshot / index).read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError):
            return False
        return shards <= set(files)
    return "model.safetensors" in files or sum(f.endswith(".safetensors") for f in selection.files) == 1


def _pulled(name: ModelName, selection: Selection, snapshot: Path, *, from_cache: bool) -> Pulled:
    size = sum((snapshot / f).stat().st_size for f in selection.files)
    path = snapshot / selection.primary if selection.primary else snapshot
    return Pulled(name, selection, snapshot, path, size, from_cache)


def from_cache(name: ModelName, *, strict: bool) -> Pulled | None:
    """`name` resolved from the cache alone, or None. `strict`: only what the hub's listing would select
    too (a quant asked for, Q4_K_M by default, or a safetensors checkpoint)."""
    cached = cached_snapshot(name.repo_id)
    if cached is None:
        return None
    snapshot, files = cached
    if strict and name.quant is None and gguf_quants(files):
        name = ModelName(name.repo_id, "Q4_K_M")
    try:
        selection = select_files(name, files)
    except CheckpointError:
        return None
    if not _complete(selection, files, snapshot):
        return None
    return _pulled(name, selection, snapshot, from_cache=True)


def _not_cached(name: ModelName, why: str) -> CheckpointError:
    cached = cached_snapshot(name.repo_id)
    quants = gguf_quants(cached[1]) if cached else []
    have = f"cached quants: {', '.join(quants)}" if quants else "nothing of it is cached"
    return CheckpointError(
        f"{name}: not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {why}; {have}"
    )


def pull(name: ModelName | str, *, show: bool | None = None, cache_first: bool = False) -> Pulled:
    """Resolve `name`, downloading what the cache lacks (see the module docstring); `show`: progress bars
    (None: blazr/progress.py's policy)."""
    name = parse_name(name) if isinstance(name, str) else name
    if cache_first:
        hit = from_cache(name, strict=True)
        if hit is not None:
            return hit
    if constants.is_offline_mode():
        hit = from_cache(name, strict=False)
        if hit is None:
            raise _not_cached(name, "HF_HUB_OFFLINE is set")
        return hit
    try:
        files, commit = _listing(name)
    except NETWORK_ERRORS as e:
        hit = from_cache(name, strict=False)
        if hit is None:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise _not_cached(name, f"the hub at {constants.ENDPOINT} is unreachable ({first})") from None
        log.warning("%s: the hub is unreachable, using the cached %s", name, hit.path)
        return hit
    selection = select_files(name, files)
    log.info("%s: %s", name, ", ".join(selection.files))
    try:
        for filename in selection.files:
            download_file(name.repo_id, filename, commit, show=show)
    except NETWORK_ERRORS as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"{name}: download failed ({first}); run again to resume") from None
    ref = storage_folder(name.repo_id) / "refs" / REVISION
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(commit)
    return _pulled(name, selection, storage_folder(name.repo_id) / "snapshots" / commit, from_cache=False)


def _listing(name: ModelName) -> tuple[list[str], str]:
    """The repository's file paths and its commit (GET /api/models/{repo}/revision/main)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        info = HfApi().model_info(name.repo_id, revision=REVISION)
    except GatedRepoError:
        raise CheckpointError(f"{name}: a gated repository; accept its terms and `hf auth login`") from None
    except RepositoryNotFoundError:
        raise CheckpointError(f"{name}: no repository {name.repo_id} on {constants.ENDPOINT}") from None
    if not info.sha or info.siblings is None:
        raise CheckpointError(f"{name}: the hub's answer has no commit or file list")
    return [s.rfilename for s in info.siblings], info.sha


def resolve(name: str) -> Path:
    """The local path of `org/name[:QUANT]`, cache first (what `resolve_model_path` calls)."""
    return pull(name, cache_first=True).path
