"""Fixtures shared by the kernel tests: the C kernel library built for this host (`native`), one build per
ISA level of blazr.kernels.build this CPU can execute (`scalar`, `avx2`, `avx512`, `avx512_vnni`: each
the SIMD paths some x86-64 CPU selects, so one host runs what another host's build would), `generic` (the
portable scalar build), and `lib`, each distinct build in turn — the level whose paths equal native's runs
as native. The run's summary lists the builds exercised and the paths this CPU cannot run. And, for
every test, a quantization cache of the session's own (`--quantize` loads write and map their weights
there, never in the user's ~/.cache), llama.cpp's converter kept loaded between conversions, and one fixed
day for the chat templates that print today's date."""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Iterator

import pytest

from blazr.kernels import build, ops

# what each test module makes under the temporary directory removed when the module ends
pytest_plugins = ["tests.tmp_cleanup"]


@pytest.fixture(scope="session", autouse=True)
def session_quant_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """BLAZR_QUANT_CACHE and its disk floor for the session (subprocesses inherit them); its writes joined at
    the end."""
    from blazr.loading import quant_cache

    # the tests' cache files are a few MiB: the default floor (5 % of the disk) would make their writes
    # depend on how full the host's disk is
    settings = {
        "BLAZR_QUANT_CACHE": str(tmp_path_factory.mktemp("quant-cache")),
        "BLAZR_QUANT_CACHE_MIN_FREE_GB": "0.5",
    }
    before = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    yield
    quant_cache.wait()
    for name, value in before.items():
        if value is None:
            del os.environ[name]
        else:
            os.environ[name] = value


@pytest.fixture(scope="session", autouse=True)
def converter_workers() -> Iterator[None]:
    """GGUF fixtures convert tiny checkpoints in workers that import llama.cpp's converter once
    (tests/llama_cpp_convert.py `KEEP_WORKERS`: the same files, ~0.7 s a conversion instead of ~3)."""
    from tests import llama_cpp_convert

    llama_cpp_convert.KEEP_WORKERS = True
    yield
    llama_cpp_convert.KEEP_WORKERS = False


class _FixedDay(datetime.datetime):
    """datetime whose `now` is one fixed day (2026-11-27, a day the whole suite passed)."""

    @classmethod
    def now(cls, tz: datetime.tzinfo | None = None) -> _FixedDay:
        return cls(2026, 11, 27, 12, 0, 0, tzinfo=tz)


@pytest.fixture(scope="session", autouse=True)
def fixed_day() -> Iterator[None]:
    """Templates that print today's date (GPT-OSS's `Current date: …` through `strftime_now`) render the same
    prompt on every day the suite runs: a tiny random model's greedy choice (test_server_harmony: the
    analysis channel or a tool call) must not change with the calendar — on 2026-11-28 it did."""
    from blazr import chat_template

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(chat_template, "datetime", _FixedDay)
        yield


LEVELS = {level.name: level for level in build.runnable_levels()}
# the highest runnable level selects the paths -march=native selects: it runs as `native`
LIB_BUILDS = ["native", *list(LEVELS)[:-1]]
_EXERCISED: dict[str, list[str]] = {}  # build → its SIMD paths, as the tests loaded it


@pytest.fixture(scope="session")
def native() -> ops.Kernels:
    k = ops.kernels()
    assert k is not None, "kernel library unavailable (no C compiler, or BLAZR_KERNELS=0)"
    _EXERCISED["native"] = k.features
    return k


@pytest.fixture(scope="session")
def isa_build(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], ops.Kernels]]:
    """name → the library built at that ISA level (built once per session). The levels' directories sit in
    one made now, while the fixture is set up, so the module sweep (tests/tmp_cleanup.py) keeps them: a
    library built lazily in a directory of its own was swept with the first module that asked for it, and
    `BLAZR_ISA`'s test, reading the file again, built it a second time (~25 s)."""
    made: dict[str, ops.Kernels] = {}
    root = tmp_path_factory.mktemp("kernels")

    def get(name: str) -> ops.Kernels:
        if name not in made:
            level = LEVELS[name]
            try:
                path = build.build(level.build_flags(), out_dir=root / name)
            except build.BuildError as e:
                pytest.fail(f"the {name} build failed: {e}")
            k = ops.Kernels(build.open_library(path))
            assert k.features == list(level.paths), (name, k.features)  # the level selects its paths
            made[name] = k
            _EXERCISED[name] = k.features
        return made[name]

    yield get


@pytest.fixture(scope="session")
def generic(isa_build: Callable[[str], ops.Kernels]) -> ops.Kernels:
    """The portable build: no SIMD path (the scalar fallbacks)."""
    return isa_build("scalar")


@pytest.fixture(params=LIB_BUILDS)
def lib(request: pytest.FixtureRequest, isa_build: Callable[[str], ops.Kernels]) -> ops.Kernels:
    return request.getfixturevalue("native") if request.param == "native" else isa_build(request.param)


@pytest.fixture(params=LIB_BUILDS[1:])
def other_build(request: pytest.FixtureRequest, isa_build: Callable[[str], ops.Kernels]) -> ops.Kernels:
    """Each runnable build whose paths differ from native's, in turn (for bit-for-bit comparisons)."""
    return isa_build(request.param)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Which kernel builds ran on this CPU, and which paths it cannot run."""
    if not _EXERCISED:
        return
    ran = ", ".join(f"{name} [{' '.join(paths) or 'scalar'}]" for name, paths in _EXERCISED.items())
    missing = [level.name for level in build.isa_levels() if not level.runs_here()]
    tw = terminalreporter
    tw.write_sep("-", "blazr kernel builds")
    tw.write_line(f"cpu: {build.cpu_model()}")
    tw.write_line(f"builds exercised: {ran}")
    tw.write_line(f"levels this CPU cannot run: {', '.join(missing) or 'none'}")
    tw.write_line(f"ISA extensions no kernel uses (nothing to test): {', '.join(build.UNUSED_ISAS)}")
