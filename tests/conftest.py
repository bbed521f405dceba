"""Fixtures shared by the kernel tests: the C kernel library built for this host (`native`), a second build
with `-march=x86-64` (`generic`: the portable scalar fallbacks, as on a CI machine without the host's SIMD
paths), and `lib`, each of them in turn. And, for every test, a quantization cache of the session's own
(`--quantize` loads write and map their weights there, never in the user's ~/.cache)."""

from __future__ import annotations

import os
import platform
from collections.abc import Iterator

import pytest

from blazr.kernels import build, ops


@pytest.fixture(scope="session", autouse=True)
def session_quant_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """BLAZR_QUANT_CACHE for the session (subprocesses inherit it); its writes joined at the end."""
    from blazr.loading import quant_cache

    before = os.environ.get("BLAZR_QUANT_CACHE")
    os.environ["BLAZR_QUANT_CACHE"] = str(tmp_path_factory.mktemp("quant-cache"))
    yield
    quant_cache.wait()
    if before is None:
        del os.environ["BLAZR_QUANT_CACHE"]
    else:
        os.environ["BLAZR_QUANT_CACHE"] = before


@pytest.fixture(scope="session")
def native() -> ops.Kernels:
    k = ops.kernels()
    assert k is not None, "kernel library unavailable (no C compiler, or BLAZR_KERNELS=0)"
    return k


@pytest.fixture(scope="session")
def generic(tmp_path_factory: pytest.TempPathFactory) -> ops.Kernels:
    is_x86 = platform.machine().lower() in ("x86_64", "amd64")
    flags = ("-O3", "-march=x86-64", "-fopenmp") if is_x86 else ("-O3", "-fopenmp")  # no SIMD paths
    try:
        path = build.build(flags, out_dir=tmp_path_factory.mktemp("kernels"))
    except build.BuildError as e:
        pytest.fail(f"no C compiler: {e}")
    k = ops.Kernels(build.open_library(path))
    assert k.features == [], "the x86-64 build must not contain AVX-512 paths"
    return k


@pytest.fixture(params=["native", "generic"])
def lib(request: pytest.FixtureRequest) -> ops.Kernels:
    return request.getfixturevalue(request.param)
