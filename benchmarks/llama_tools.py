"""llama.cpp's own programs as benchmark peers: `llama-server` (benchmarks/serve.py, speculative.py) and
`llama-batched-bench` (hybrid_batched.py), built once from the llama.cpp that the installed
llama-cpp-python's sdist vendors (`make test` / `make bench` unpack it under .venv/llama-cpp-sdist) into
benchmarks/.cache/llama-server/build — one CMake tree for every target.

    python benchmarks/llama_tools.py llama-batched-bench     # builds it when missing, prints its path

$CMAKE_ARGS is passed to CMake (the Makefile sets it as for llama-cpp-python: AVX-512 without AMX where the
host has AMX, which the vendored llama.cpp mis-builds for).
"""

from __future__ import annotations

import glob
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "benchmarks" / ".cache" / "llama-server" / "build"
TARGETS = ("llama-server", "llama-batched-bench")


def build(target: str) -> Path:
    """The path of llama.cpp's `target` (one of TARGETS), built first when missing (a few minutes)."""
    if target not in TARGETS:
        raise ValueError(f"unknown llama.cpp target {target!r} (known: {', '.join(TARGETS)})")
    binary = BUILD / "bin" / target
    if binary.exists():
        return binary
    sources = sorted(
        glob.glob(str(ROOT / ".venv" / "llama-cpp-sdist" / "llama_cpp_python-*" / "vendor" / "llama.cpp"))
    )
    if not sources:
        raise SystemExit(
            "llama.cpp sources not found: run `make .venv/.installed-test` (it unpacks the sdist)"
        )
    print(f"building {target} from {sources[-1]} (once, a few minutes) …", file=sys.stderr, flush=True)
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF"]
    flags += ["-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON"]
    flags += ["-DBUILD_SHARED_LIBS=OFF", *shlex.split(os.environ.get("CMAKE_ARGS", ""))]
    subprocess.run(
        ["cmake", "-S", sources[-1], "-B", str(BUILD), *flags], check=True, stdout=subprocess.DEVNULL
    )
    jobs = str(os.cpu_count() or 2)
    subprocess.run(["cmake", "--build", str(BUILD), "--target", target, "-j", jobs], check=True)
    return binary


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in TARGETS:
        raise SystemExit(f"usage: python benchmarks/llama_tools.py {{{'|'.join(TARGETS)}}}")
    print(build(sys.argv[1]))
