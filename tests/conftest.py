"""Fixtures shared by the kernel tests: the C kernel library built for this host (`native`), a second build
with `-march=x86-64` (`generic`: the portable scalar fallbacks, as on a CI machine without the host's SIMD
paths), and `lib`, each of them in turn."""

from __future__ import annotations

import platform

import pytest

from blazr.kernels import build, ops


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
