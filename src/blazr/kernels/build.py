"""Build and load the C kernel library (`csrc/*.c` → one shared object), cached per source and host.

The library is compiled on the host that runs it (`-O3 -march=native -fopenmp`), so its SIMD paths match
the CPU; every SIMD path has a portable fallback in the C code, and when compilation fails blazr keeps
working on the torch references in `ops.py`.

- Cache file: `<dir>/kernels-<hash>.so`, dir = `$BLAZR_KERNEL_DIR` or `$XDG_CACHE_HOME/blazr` (default
  `~/.cache/blazr`); the hash covers the sources, compiler and its version, flags, `platform.machine()` and
  (for `-march=native`) the CPU's feature flags, so a shared home directory never serves a library built
  for another CPU. Written atomically (temporary file + rename), so concurrent builders are safe.
- `python -m blazr.kernels.build` builds it (the Makefile's install step); `load()` builds on first use.
- `BLAZR_KERNELS=0` disables the library: `load()` returns None and `available()` is False.
- `BLAZR_ISA=scalar|avx2|avx512|avx512_vnni` builds the library at that level of `ISA_LEVELS` instead of
  `-march=native` (`default_flags`): a host of that level's paths, run and measured on this one.

The C code picks its SIMD paths at compile time (`BLZ_AVX2`, `BLZ_AVX512`, `BLZ_VNNI` in
csrc/blazr_kernels.h), so a host runs only the paths its own CPU selects. `ISA_LEVELS` names one build per
path set that some x86-64 CPU selects (scalar, AVX2, AVX-512, AVX-512 + VNNI); the tests run the kernel
equivalence checks on every level this CPU can execute (`runnable_levels`), so one host exercises what
another host's build would run. `python -m blazr.kernels.build --levels` lists them for this CPU.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blazr import progress

CSRC = Path(__file__).parent / "csrc"
DEFAULT_FLAGS: tuple[str, ...] = ("-O3", "-march=native", "-fopenmp")
# Always added: position-independent, C dialect, only BLZ_EXPORT symbols visible, no implicit FMA
# contraction (scalar and SIMD paths then round the same way).
_BASE_FLAGS = ("-fPIC", "-std=gnu11", "-fvisibility=hidden", "-ffp-contract=off", "-Wall")
ABI_VERSION = 18  # must equal BLZ_ABI_VERSION in csrc/blazr_kernels.h


class BuildError(RuntimeError):
    """The compiler is missing or rejected the sources; the message carries its output."""


def compiler() -> str:
    """The C compiler: `$CC`, else the first of cc / gcc / clang on PATH."""
    if cc := os.environ.get("CC"):
        return cc
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return name
    raise BuildError("no C compiler found (set CC, or install gcc)")


def cache_dir() -> Path:
    """`$BLAZR_KERNEL_DIR`, else `$XDG_CACHE_HOME/blazr` (default `~/.cache/blazr`); a per-user directory
    under the system temp dir when that one cannot be created or written (read-only home)."""
    if d := os.environ.get("BLAZR_KERNEL_DIR"):
        return Path(d)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    path = Path(base) / "blazr"
    try:
        path.mkdir(parents=True, exist_ok=True)
        if os.access(path, os.W_OK):
            return path
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / f"blazr-kernels-{os.getuid() if hasattr(os, 'getuid') else 0}"


def _sources() -> list[Path]:
    return sorted([*CSRC.glob("*.c"), *CSRC.glob("*.h")])


def cpu_flags() -> str:
    """The CPU feature list of /proc/cpuinfo ('' where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def cpu_model() -> str:
    """The CPU as /proc/cpuinfo names it, with its vendor, family, model and stepping (a VM may show only
    "AMD EPYC"; family 25 is Zen 3 / Zen 4, 26 Zen 5), e.g. "AMD EPYC (AuthenticAMD family 26 model 2
    stepping 1)"; platform.processor() elsewhere."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor only
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" not in fields:
        return name
    ident = " ".join(f"{k} {fields[k]}" for k in ("cpu family", "model", "stepping") if k in fields)
    return f"{name} ({fields.get('vendor_id', '?')} {ident.replace('cpu family', 'family')})"


@dataclass(frozen=True)
class IsaLevel:
    """One build of the library: its compiler flags (`-march=…`), the /proc/cpuinfo flags a CPU needs to
    run it, and the SIMD paths it compiles in (`features()` of the built library)."""

    name: str
    flags: tuple[str, ...]
    needs: frozenset[str]
    paths: tuple[str, ...]

    def runs_here(self) -> bool:
        """Whether this CPU can execute the build (it has every instruction set the build may use)."""
        return self.needs <= set(cpu_flags().split())

    def build_flags(self) -> tuple[str, ...]:
        return ("-O3", *self.flags, "-fopenmp")


_V3 = frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"})  # x86-64-v3
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}  # x86-64-v4
# One build per set of csrc's SIMD paths (BLZ_AVX2, BLZ_AVX512, BLZ_VNNI), lowest first. No kernel uses
# AVX512_BF16, AVX512_FP16 or AMX: a CPU with them runs the highest level below.
ISA_LEVELS: tuple[IsaLevel, ...] = (
    IsaLevel("scalar", ("-march=x86-64",), frozenset(), ()),
    IsaLevel("avx2", ("-march=x86-64-v3",), _V3, ("avx2",)),
    IsaLevel("avx512", ("-march=x86-64-v4",), _V4, ("avx512", "avx2")),
    IsaLevel("avx512_vnni", ("-march=x86-64-v4", "-mavx512vnni"), _V4 | {"avx512_vnni"},
             ("avx512", "avx512_vnni", "avx2")),
)  # fmt: skip
UNUSED_ISAS = ("avx512_bf16", "avx512_fp16", "amx_tile")  # on some CPUs; no kernel path uses them


def isa_levels() -> tuple[IsaLevel, ...]:
    """The builds of distinct SIMD paths for this machine's architecture: x86-64's four levels, elsewhere
    the portable build alone."""
    if platform.machine().lower() in ("x86_64", "amd64"):
        return ISA_LEVELS
    return (IsaLevel("scalar", (), frozenset(), ()),)


def runnable_levels() -> tuple[IsaLevel, ...]:
    """The levels this CPU can execute, lowest first (the last one selects the paths -march=native does)."""
    return tuple(level for level in isa_levels() if level.runs_here())


def usable_cpus() -> set[int] | None:
    """The CPUs this process may run on (its CPU affinity), or None where the OS does not tell."""
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None


def usable_cores() -> int:
    """How many cores this process may run on (its CPU affinity where the OS tells it)."""
    cpus = usable_cpus()
    return len(cpus) if cpus is not None else os.cpu_count() or 1


def _compiler_version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildError(f"C compiler {cc!r} does not run: {e}") from e


def library_path(flags: tuple[str, ...] = DEFAULT_FLAGS, out_dir: Path | None = None) -> Path:
    """Where the library for these flags lives (whether or not it is built yet)."""
    cc = compiler()
    h = hashlib.sha256()
    for src in _sources():
        h.update(src.name.encode() + b"\0" + src.read_bytes() + b"\0")
    h.update("\0".join((cc, _compiler_version(cc), *_BASE_FLAGS, *flags, platform.machine())).encode())
    if any(f.endswith("=native") for f in flags):
        h.update(cpu_flags().encode())
    return (out_dir or cache_dir()) / f"kernels-{h.hexdigest()[:16]}.so"


def build(flags: tuple[str, ...] = DEFAULT_FLAGS, out_dir: Path | None = None, force: bool = False) -> Path:
    """Compile the library (unless cached) and return its path. Sources compile in parallel, then link."""
    path = library_path(flags, out_dir)
    if path.exists() and not force:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    cc = compiler()
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".build-") as tmp:
        objs, procs = [], []
        for src in _sources():
            if src.suffix != ".c":
                continue
            obj = Path(tmp) / (src.stem + ".o")
            cmd = [cc, *_BASE_FLAGS, *flags, "-c", str(src), "-o", str(obj)]
            procs.append((cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
            objs.append(str(obj))
        with progress.bar(len(procs) + 1, f"compiling blazr kernels ({path.stem})", "file") as bar:
            for cmd, proc in procs:
                out = proc.communicate()[0].decode(errors="replace")
                if proc.returncode != 0:
                    raise BuildError(f"kernel compile failed: {' '.join(cmd)}\n{out}")
                bar.update(1)
            tmp_so = Path(tmp) / path.name
            cmd = [cc, "-shared", *flags, *objs, "-o", str(tmp_so), "-lm"]
            res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise BuildError(f"kernel link failed: {' '.join(cmd)}\n{res.stdout}{res.stderr}")
        os.replace(tmp_so, path)  # atomic: readers see the old file or the complete new one
    return path


_lock = threading.Lock()
_state: dict[str, Any] = {}  # "lib": the CDLL or None, "name": its file name


def is_disabled() -> bool:
    """True when `BLAZR_KERNELS=0` (or false/off/no) asks for the torch reference path."""
    return os.environ.get("BLAZR_KERNELS", "1").strip().lower() in ("0", "false", "off", "no")


def open_library(path: Path) -> ctypes.CDLL:
    """Open a built library and check its ABI version. torch must be imported first so that the library
    binds to the libgomp torch already loaded (one OpenMP thread pool for both)."""
    import torch  # noqa: F401

    lib = ctypes.CDLL(str(path))
    lib.blz_abi_version.restype = ctypes.c_int
    if (v := lib.blz_abi_version()) != ABI_VERSION:
        raise BuildError(f"{path}: kernel ABI version {v}, expected {ABI_VERSION}")
    return lib


def default_flags() -> tuple[str, ...]:
    """The default library's flags: DEFAULT_FLAGS (`-march=native`), or the flags of the ISA level that
    `BLAZR_ISA` names (scalar, avx2, avx512, avx512_vnni) — at most the CPU's own paths, as oneDNN's
    ONEDNN_MAX_CPU_ISA: to run, and measure, what a host of that level runs. A level this CPU cannot execute,
    or an unknown name, is a BuildError that says which levels it can."""
    want = os.environ.get("BLAZR_ISA", "").strip().lower()
    if not want or want == "native":
        return DEFAULT_FLAGS
    runnable = {level.name: level for level in runnable_levels()}
    if want not in runnable:
        what = "this CPU cannot run it" if want in {x.name for x in isa_levels()} else "no such level"
        raise BuildError(f"BLAZR_ISA={want}: {what}; levels here: native, {', '.join(runnable)}")
    return runnable[want].build_flags()


def _build_with_fallback() -> Path:
    """Build with `default_flags()`; if the compiler has no OpenMP (clang without libomp), build without it
    (the kernels then run on one thread) rather than give up."""
    flags = default_flags()
    try:
        return build(flags)
    except BuildError as first:
        try:
            return build(tuple(f for f in flags if f != "-fopenmp"))
        except BuildError:
            raise first from None


def load() -> ctypes.CDLL | None:
    """The kernel library for this host, built on first use; None when disabled or when the build fails
    (a warning says why, once per process)."""
    if "lib" in _state:
        return _state["lib"]
    with _lock:
        if "lib" not in _state:
            lib = None
            if not is_disabled():
                try:
                    path = _build_with_fallback()
                    lib = open_library(path)
                    _state["name"] = path.name
                except (BuildError, OSError) as e:
                    warnings.warn(
                        f"blazr kernels unavailable, using the torch reference path: {e}", stacklevel=2
                    )
            _state["lib"] = lib
    return _state["lib"]


def loaded_name() -> str:
    """The file name of the library in use (`kernels-<hash>.so`: its hash covers the sources, compiler,
    flags and CPU), or "" when none is."""
    load()
    return _state.get("name", "")


def available() -> bool:
    """Whether the C kernels are in use (built, loaded and not disabled)."""
    return load() is not None


def reset() -> None:
    """Forget the loaded library so the next `load()` re-reads `BLAZR_KERNELS` (for tests)."""
    with _lock:
        _state.clear()


def features(lib: ctypes.CDLL) -> list[str]:
    """The SIMD paths compiled into a library."""
    lib.blz_features.restype = ctypes.c_int
    bits = lib.blz_features()
    return [name for bit, name in ((1, "avx512"), (2, "avx512_vnni"), (8, "avx2")) if bits & bit]


def main() -> int:
    """`python -m blazr.kernels.build [--force] [--strict] [--levels]`: build and report. A failed build exits
    0 (blazr falls back to torch) unless --strict. --levels lists the ISA levels and whether this CPU runs
    each."""
    if "--levels" in sys.argv:
        print(f"cpu: {cpu_model()}")
        for level in isa_levels():
            where = "runs here" if level.runs_here() else "not on this CPU"
            print(f"  {level.name:12s} {' '.join(level.flags) or '(portable)':32s} {where}")
        print(f"  unused by any kernel: {', '.join(UNUSED_ISAS)}")
        return 0
    try:
        path = build(default_flags(), force=True) if "--force" in sys.argv else _build_with_fallback()
        lib = open_library(path)
    except (BuildError, OSError) as e:
        print(f"blazr kernels: build failed, blazr will use the torch reference path.\n{e}", file=sys.stderr)
        return 1 if "--strict" in sys.argv else 0
    print(f"blazr kernels: {path} (simd: {', '.join(features(lib)) or 'scalar fallback'})")
    from blazr.kernels import ops  # the host's kernel variants, measured once (kernels/tuning.py)

    if (k := ops.kernels()) is not None:
        from blazr.kernels.tuning import KNOBS

        chosen = ", ".join(f"{n.name}={k.get_tune(n.name)}" for n in KNOBS)
        print(f"blazr kernels tuned for this host: {chosen}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
