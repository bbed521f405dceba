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
import shutil
import tempfile
from collections.abc import Callable, Iterator

import pytest

from blazr.kernels import build, ops
from tests.smollm2_reference import RUN_SHARED

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


# The modules that took longest on a 2-core host (`pytest --durations`, benchmarks/NOTES.md §69), heaviest
# first. They run first, so under `make test`'s two workers (`-n 2 --dist loadfile`) the light modules fill
# in at the end and the workers finish together instead of one running a long module alone.
HEAVY_FIRST = (
    "test_cli.py",
    "test_tensor_parallel.py",
    "test_server_openapi.py",
    "test_ray_serve.py",
    "test_decode_plan.py",
    "test_server_robust.py",
    "test_server_sampling.py",
    "test_multi_model.py",
    "test_server_structured.py",
    "test_llama_cpp.py",
    "test_server.py",
    "test_smollm2.py",  # after test_llama_cpp: by then transformers' SmolLM2 is saved for it (~30 s less)
)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist's workers (`make test`: two on two cores), OpenMP threads that spin while they wait
    (torch's and the kernels') take the core from the other worker's; sleeping at once cut the suite's CPU
    time 2986 → 2552 s and its wall 1637 → 1458 s (§69). Set here, in the controller, before it starts the
    workers, so they and every process they start inherit it; a value the caller set is kept."""
    if getattr(config.option, "numprocesses", None):
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if not hasattr(config, "workerinput") and RUN_SHARED not in os.environ:  # the controller, or a lone run
        shared = tempfile.mkdtemp(prefix="blazr-test-run-")
        os.environ[RUN_SHARED] = shared  # the workers inherit it (tests/smollm2_reference.py)

        def remove() -> None:
            shutil.rmtree(shared, ignore_errors=True)
            os.environ.pop(RUN_SHARED, None)

        config.add_cleanup(remove)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """HEAVY_FIRST's modules first, in its order; every module's own tests in their order."""
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest as collected


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A worker of a distributed run (pytest-xdist) hands its builds to the controller, which prints them."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        out["blazr_exercised"] = dict(_EXERCISED)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """The controller's side of pytest_sessionfinish: each worker's builds joined."""
    for name, paths in getattr(node, "workeroutput", {}).get("blazr_exercised", {}).items():
        _EXERCISED.setdefault(name, list(paths))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Which kernel builds ran on this CPU, and which paths it cannot run."""
    if not _EXERCISED:
        return
    order = {name: i for i, name in enumerate(LIB_BUILDS)}
    names = sorted(_EXERCISED, key=lambda name: order.get(name, len(order)))
    ran = ", ".join(f"{name} [{' '.join(_EXERCISED[name]) or 'scalar'}]" for name in names)
    missing = [level.name for level in build.isa_levels() if not level.runs_here()]
    tw = terminalreporter
    tw.write_sep("-", "blazr kernel builds")
    tw.write_line(f"cpu: {build.cpu_model()}")
    tw.write_line(f"builds exercised: {ran}")
    tw.write_line(f"levels this CPU cannot run: {', '.join(missing) or 'none'}")
    tw.write_line(f"ISA extensions no kernel uses (nothing to test): {', '.join(build.UNUSED_ISAS)}")
