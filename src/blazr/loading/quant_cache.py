"""The quantization cache: what `--quantize int8 / int4 / bf16` made from a float checkpoint — and, under
`auto`, a GGUF's K-quants re-laid in 16-row groups (kernels/kquant_packed.py; the 8B Q4_K_M's 4.2 GB took
1.8-3.3 s to move, benchmarks/NOTES.md §57) —, kept in one file and mapped by every later load of the same
checkpoint in the same mode.

Quantizing in place is bound by work no layout can skip — a 1B bf16 checkpoint is 2.5 GB read and 1.24 G
values quantized into 1.1 GB of fresh memory, ≥ 0.57 s of CPU on 2 cores (benchmarks/NOTES.md §41) — while
a Q8_0 GGUF is mapped and used as stored. So the first load writes its quantized weights to a file (a
background thread, after the model is ready: the write is off the load's path) and every later load maps
that file and reads the weights where they lie, like a GGUF's (mistral.rs writes its ISQ weights to a UQFF
file on request; here it is automatic).

- Key: sha256 of the cache format, the mode, blazr's version, the kernel library's build hash (sources,
  compiler, flags, CPU: any change to the quantizer's C code makes a new key) and, per checkpoint file, its
  resolved path, size, mtime, ctime, inode and a hash of 16 samples of 64 KiB of its bytes (head, tail,
  14 spread between).
- Only weights made in fresh memory are kept (`put`): views of the checkpoint's map (`bf16` over bf16
  rows) are already free to load. An entry holds one weight by parameter name, with its kind and shape;
  `get` returns it only where both match what the loader asks for, so a changed choice of kind re-quantizes
  that weight and rewrites the file.
- File: `<dir>/<checkpoint dir>-<mode>-<key[:16]>.blzq`. Page 0 holds MAGIC, the index's offset and length;
  each weight's bytes start on a page boundary; the JSON index (format, key, entries) is last. Written to a
  temporary name, synced, then renamed: a reader sees a complete file or none. A file that does not parse,
  or whose key or sizes disagree, is a miss (one warning) and is replaced.
- Dir: `$BLAZR_QUANT_CACHE` (`0` / `off` disables it), default `quantized/` in the kernel cache dir
  (`~/.cache/blazr`). Bounded: before a write, the least recently used files go until the dir holds at most
  `$BLAZR_QUANT_CACHE_GB` (default 32) with the new one; a write that would leave less than
  `$BLAZR_QUANT_CACHE_MIN_FREE_GB` free on the disk (default max(2 GiB, 5 % of the disk)) is skipped.

In: the checkpoint's files and the mode (`open`), weights by parameter name (`get` / `put`). Out: mapped
`QuantizedWeight`s; `save` starts the background write, `wait` joins every write in flight.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import mmap
import os
import shutil
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from blazr import __version__, progress
from blazr.kernels import build
from blazr.kernels.quant import QuantizedWeight

log = logging.getLogger("blazr.loading")

FORMAT = 1  # bump when a quantizer outside the C library (kernels/quant.py's torch code) changes its bytes
MAGIC = b"BLZQCACH"
ALIGN = 4096
SUFFIX = ".blzq"
_HEADER = struct.Struct("<8sQQ")  # MAGIC, index offset, index length
_SAMPLE = 64 << 10
_NUM_SAMPLES = 14
_DTYPES = {
    str(d).removeprefix("torch."): d for d in (torch.uint8, torch.bfloat16, torch.float16, torch.float32)
}

_writes: list[threading.Thread] = []
_writes_lock = threading.Lock()


def cache_dir() -> Path | None:
    """The cache's directory, or None when `$BLAZR_QUANT_CACHE` turns it off."""
    setting = os.environ.get("BLAZR_QUANT_CACHE", "").strip()
    if setting.lower() in ("0", "off", "false", "no"):
        return None
    return Path(setting) if setting else build.cache_dir() / "quantized"


def _file_identity(path: Path) -> str:
    """A file's resolved path, size, mtime, ctime (any write moves it; `touch -d` cannot set it back), inode
    and a hash of sampled bytes (a rewrite within the clock's granularity still changes the samples)."""
    st = path.stat()
    h = hashlib.sha256()
    with path.open("rb") as f:
        starts = {0, max(st.st_size - _SAMPLE, 0)}
        starts.update(st.st_size * (i + 1) // (_NUM_SAMPLES + 1) for i in range(_NUM_SAMPLES))
        for start in sorted(starts):
            f.seek(start)
            h.update(f.read(_SAMPLE))
    ids = (path.resolve(), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, h.hexdigest())
    return "\0".join(str(i) for i in ids)


def cache_key(files: Sequence[Path], mode: str) -> str:
    """The key of `files` quantized in `mode` by this blazr and this kernel library."""
    h = hashlib.sha256(f"{FORMAT}\0{mode}\0{__version__}\0{build.loaded_name()}".encode())
    for path in files:
        h.update(b"\0" + _file_identity(Path(path)).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class _Entry:
    kind: str
    out_features: int
    in_features: int
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


class QuantCache:
    """One checkpoint's cache file in one mode: the entries it holds (mapped, read-only in use) and the
    weights made by this load (`put`), written by `save`."""

    def __init__(self, path: Path, key: str) -> None:
        self.path, self.key = path, key
        self._entries: dict[str, _Entry] = {}
        self._map: torch.Tensor | None = None
        self._made: dict[str, QuantizedWeight] = {}
        self._hits: dict[str, QuantizedWeight] = {}
        self._read()

    @classmethod
    def open(cls, files: Sequence[Path], mode: str) -> QuantCache | None:
        """The cache of `files` in `mode`, or None when the cache is off or the files cannot be read. Its dir
        is made by the first write (`save`): a load that makes nothing to cache (a GGUF of Q8_0 / Q4_0
        tensors under `auto`) neither needs nor warns about it."""
        root = cache_dir()
        if root is None or not files:
            return None
        try:
            key = cache_key(files, mode)
        except OSError as e:
            log.warning("quantization cache off: %s", e)
            return None
        stem = Path(files[0]).resolve().parent.name or "model"
        return cls(root / f"{stem}-{mode}-{key[:16]}{SUFFIX}", key)

    @property
    def hits(self) -> int:
        """How many weights this load took from the file."""
        return len(self._hits)

    def _read(self) -> None:
        """Map the file and read its index; a missing file is an empty cache, a bad one a warning too."""
        try:
            with self.path.open("rb") as f:
                buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        except (FileNotFoundError, NotADirectoryError):  # no file yet (its dir may not exist either)
            return
        except (OSError, ValueError) as e:  # ValueError: an empty file cannot be mapped
            log.warning("quantization cache %s unreadable (%s): quantizing again", self.path, e)
            return
        try:
            entries = self._parse(buf)
        except (ValueError, KeyError, TypeError, struct.error) as e:
            log.warning("quantization cache %s is damaged (%s): quantizing again", self.path, e)
            return
        self._entries, self._map = entries, torch.frombuffer(buf, dtype=torch.uint8)
        with contextlib.suppress(OSError):
            os.utime(self.path)  # recently used: the last file evicted

    def _parse(self, buf: mmap.mmap) -> dict[str, _Entry]:
        magic, at, length = _HEADER.unpack_from(buf, 0)
        if magic != MAGIC:
            raise ValueError(f"magic {magic!r}, expected {MAGIC!r}")
        if at + length > len(buf):
            raise ValueError(f"index at {at} + {length} bytes past the file's end ({len(buf)} bytes)")
        index = json.loads(bytes(buf[at : at + length]))
        if index["format"] != FORMAT or index["key"] != self.key:
            raise ValueError("format or key differs from the file name's")
        entries = {}
        for name, e in index["entries"].items():
            entry = _Entry(**{**e, "shape": tuple(e["shape"])})
            size = math.prod(entry.shape) * _DTYPES[entry.dtype].itemsize
            if entry.nbytes != size or entry.offset % ALIGN or entry.offset + entry.nbytes > at:
                raise ValueError(f"entry {name}: {entry.nbytes} bytes at {entry.offset} do not fit")
            entries[name] = entry
        return entries

    def get(self, pname: str, kind: str, out_features: int, in_features: int) -> QuantizedWeight | None:
        """Parameter `pname` as cached — a view of the file's map — when the cache holds it in `kind` at
        [out_features, in_features]; else None."""
        e = self._entries.get(pname)
        if (
            e is None
            or self._map is None
            or (e.kind, e.out_features, e.in_features) != (kind, out_features, in_features)
        ):
            return None
        data = self._map[e.offset : e.offset + e.nbytes].view(_DTYPES[e.dtype]).view(e.shape)
        qw = QuantizedWeight(e.kind, data, e.out_features, e.in_features)
        self._hits[pname] = qw
        return qw

    def put(self, pname: str, qw: QuantizedWeight) -> None:
        """A weight this load made in fresh memory, for `save` to write."""
        self._made[pname] = qw

    def save(self) -> threading.Thread | None:
        """Write the file when this load made weights it did not hold (with every weight it did hold), on a
        background thread; None when there is nothing to write or no room for it."""
        if not self._made:
            return None
        items = {**self._hits, **self._made}
        nbytes = sum(_page_up(qw.data.numel() * qw.data.element_size()) for qw in items.values())
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            log.warning("quantization cache: %s; not written", e)
            return None
        if not _make_room(self.path, nbytes):
            return None
        log.info(
            "quantization cache: writing %d weights (%.2f GiB) to %s in the background",
            len(items), nbytes / 2**30, self.path,
        )  # fmt: skip
        thread = threading.Thread(
            target=_write, args=(self.path, self.key, list(items.items())), name="blazr-quant-cache"
        )
        with _writes_lock:
            _writes[:] = [t for t in _writes if t.is_alive()]
            _writes.append(thread)
        thread.start()
        return thread


def wait() -> None:
    """Join every cache write in flight (tests; a process exits only after them anyway: non-daemon)."""
    with _writes_lock:
        pending = list(_writes)
    for t in pending:
        t.join()


def _page_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _make_room(path: Path, nbytes: int) -> bool:
    """Evict the least recently used cache files until the dir holds at most `$BLAZR_QUANT_CACHE_GB` with
    `nbytes` more; False (a log line) when the cap or the disk cannot take the file."""
    cap = float(os.environ.get("BLAZR_QUANT_CACHE_GB", "32")) * 2**30
    if nbytes > cap:
        log.info("quantization cache: %.2f GiB exceeds BLAZR_QUANT_CACHE_GB; not written", nbytes / 2**30)
        return False
    try:
        stats = [(p, p.stat()) for p in path.parent.glob(f"*{SUFFIX}") if p != path]
        others = sorted((st.st_mtime_ns, st.st_blocks * 512, p) for p, st in stats)
        total = sum(size for _, size, _ in others)
        for _, size, old in others:
            if total + nbytes <= cap:
                break
            old.unlink(missing_ok=True)
            total -= size
            log.info("quantization cache: evicted %s (%.2f GiB)", old.name, size / 2**30)
        usage = shutil.disk_usage(path.parent)
    except OSError as e:
        log.warning("quantization cache: %s; not written", e)
        return False
    if usage.free - nbytes < _min_free(usage.total):
        log.info("quantization cache: %.1f GiB free on disk is too little; not written", usage.free / 2**30)
        return False
    return True


def _min_free(disk_bytes: int) -> int:
    """Bytes a cache write must leave free: `$BLAZR_QUANT_CACHE_MIN_FREE_GB`, else max(2 GiB, 5 % of it)."""
    setting = os.environ.get("BLAZR_QUANT_CACHE_MIN_FREE_GB", "").strip()
    if setting:
        try:
            return int(float(setting) * 2**30)
        except ValueError:
            log.warning("BLAZR_QUANT_CACHE_MIN_FREE_GB=%r is not a number; using the default", setting)
    return max(2 << 30, disk_bytes // 20)


def _write(path: Path, key: str, items: list[tuple[str, QuantizedWeight]]) -> None:
    """Write the cache file: every weight's bytes page-aligned, the index after them, the header last;
    synced, then renamed into place. A failure removes the temporary file and logs a warning."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_native_id()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        total = sum(qw.data.numel() * qw.data.element_size() for _, qw in items)
        bar = progress.bar(total, "writing the quantization cache", "B")
        try:
            at, entries = ALIGN, {}
            for name, qw in items:
                data = qw.data.contiguous()
                raw = data.view(-1).view(torch.uint8)
                _pwrite_all(fd, memoryview(raw.numpy()), at)
                bar.update(raw.numel())
                entries[name] = {
                    "kind": qw.kind,
                    "out_features": qw.out_features,
                    "in_features": qw.in_features,
                    "dtype": str(data.dtype).removeprefix("torch."),
                    "shape": list(data.shape),
                    "offset": at,
                    "nbytes": raw.numel(),
                }
                at = _page_up(at + raw.numel())
            index = json.dumps({"format": FORMAT, "key": key, "entries": entries}).encode()
            _pwrite_all(fd, memoryview(index), at)
            _pwrite_all(fd, memoryview(_HEADER.pack(MAGIC, at, len(index))), 0)
            os.fdatasync(fd)
        finally:
            bar.close()
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        log.warning("quantization cache: writing %s failed (%s)", path, e)
        tmp.unlink(missing_ok=True)


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)
