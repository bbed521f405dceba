"""One hub file into huggingface_hub's cache, resumable across runs.

huggingface_hub's `hf_hub_download` (2.x) retries a dropped transfer within one call, but it writes to a
process-unique temporary name that it deletes on failure: an interrupted pull (Ctrl-C, a lost network)
starts a 20 GB file again. Here the bytes go to `<cache>/models--org--name/blobs/<etag>.incomplete` (the
cache's documented layout; the name older huggingface_hub versions used, which `scan_cache_dir` reports as
an incomplete download) under an exclusive lock; a dropped connection is resumed at once with
`Range: bytes=N-` while it makes progress, and a later run resumes what an earlier one left. A complete
file (its size checked against the hub's) is renamed to `blobs/<etag>` and linked as
`snapshots/<commit>/<path>`, so huggingface_hub, `scan_cache_dir` and `HF_HUB_OFFLINE` see it as their own.

The hub's routes used: HEAD `/{repo}/resolve/{commit}/{path}` (`get_hf_file_metadata`: ETag or
X-Linked-Etag, the size, X-Repo-Commit, a Location to follow), then GET on the same URL (redirects
followed; the Authorization header is not forwarded to another host).

In: repo id, file path, commit, whether to show a progress bar. Out: the snapshot path of the file.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote

import httpx
from huggingface_hub import constants, get_hf_file_metadata
from huggingface_hub.file_download import repo_folder_name
from huggingface_hub.utils import build_hf_headers

from blazr import progress
from blazr.errors import CheckpointError

_RETRIES = 5  # immediate resumes of one transfer, each after an attempt that made progress

try:  # huggingface_hub 2.x speaks httpx2; 0.x speaks requests (whose errors are OSErrors)
    import httpx2

    NETWORK_ERRORS: tuple[type[BaseException], ...] = (OSError, httpx.TransportError, httpx2.TransportError)
except ImportError:  # pragma: no cover - depends on the installed huggingface_hub
    NETWORK_ERRORS = (OSError, httpx.TransportError)


def storage_folder(repo_id: str) -> Path:
    """The cache folder of a model repository: `<HF_HUB_CACHE>/models--org--name`."""
    return Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")


def download_file(repo_id: str, filename: str, commit: str, *, show: bool | None = None) -> Path:
    """`filename` of `repo_id` at `commit` in the cache (fetched or resumed if missing): its snapshot path.
    `show`: a progress bar (None: blazr/progress.py's policy)."""
    storage = storage_folder(repo_id)
    pointer = storage / "snapshots" / commit / filename
    if pointer.exists():
        return pointer
    url = f"{constants.ENDPOINT}/{repo_id}/resolve/{quote(commit, safe='')}/{quote(filename)}"
    meta = get_hf_file_metadata(url)
    if not meta.etag:
        raise CheckpointError(f"{repo_id}/{filename}: the hub answered without an ETag ({url})")
    blob = storage / "blobs" / meta.etag
    if not blob.exists():
        blob.parent.mkdir(parents=True, exist_ok=True)
        _fetch(url, blob, meta.size, f"{repo_id}/{filename}", show)
    pointer.parent.mkdir(parents=True, exist_ok=True)
    tmp = pointer.with_name(pointer.name + f".{os.getpid()}.link")
    tmp.unlink(missing_ok=True)
    os.symlink(os.path.relpath(blob, pointer.parent), tmp)
    os.replace(tmp, pointer)
    return pointer


def _fetch(url: str, blob: Path, size: int | None, what: str, show: bool | None) -> None:
    """GET `url` into `blob` through `<blob>.incomplete`, resuming what is there."""

    partial = blob.with_name(blob.name + ".incomplete")
    with open(partial, "ab") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CheckpointError(f"{what}: another process is downloading it ({partial})") from None
        have = f.tell()
        if size is not None and have > size:
            f.truncate(0)
            have = 0
        bar = progress.bar(size, what.rsplit("/", 1)[-1][-40:], "B", show=show, initial=have)
        with bar:
            for attempt in range(_RETRIES + 1):
                if size is not None and have == size:
                    break
                start = have
                try:
                    have = _get(url, f, have, bar, what)
                except NETWORK_ERRORS as e:
                    have = f.tell()
                    if have > start and attempt < _RETRIES:
                        continue  # the connection dropped after some bytes: ask the rest at once
                    raise CheckpointError(
                        f"{what}: download interrupted at {have} of {size or '?'} bytes "
                        f"({str(e) or type(e).__name__}); "
                        "run the same command again to resume"
                    ) from None
                if size is None:
                    break
        if size is not None and have != size:
            raise CheckpointError(
                f"{what}: downloaded {have} bytes, the hub says {size}; run again to resume"
            )
        os.replace(partial, blob)  # still under the lock: no other pull appends to a renamed file


def _get(url: str, f: BinaryIO, have: int, bar: Any, what: str) -> int:
    """One GET from byte `have` appended to `f` (restarted when the server ignores the Range): bytes held."""
    headers = build_hf_headers()
    headers["Accept-Encoding"] = "identity"
    if have:
        headers["Range"] = f"bytes={have}-"
    timeout = httpx.Timeout(constants.HF_HUB_DOWNLOAD_TIMEOUT, connect=constants.HF_HUB_ETAG_TIMEOUT)
    with httpx.stream("GET", url, headers=headers, follow_redirects=True, timeout=timeout) as r:
        if r.status_code >= 400:
            raise CheckpointError(
                f"{what}: HTTP {r.status_code} from {url} with {have} bytes downloaded; "
                "run the same command again to resume"
            )
        if have and r.status_code != 206:  # the whole file again: start over
            f.truncate(0)
            f.seek(0)
            bar.reset(total=bar.total)
            have = 0
        for chunk in r.iter_bytes():  # as received: a chunk size would hold back bytes a drop then loses
            f.write(chunk)
            have += len(chunk)
            bar.update(len(chunk))
        f.flush()
    return have
