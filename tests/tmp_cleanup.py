"""A pytest plugin (tests/conftest.py `pytest_plugins`) that bounds the suite's disk: what a test module
makes under the session's base temporary directory is removed when the module ends, after its fixtures'
own teardowns.

The suite's tiny checkpoints carry real vocabularies (a 128k-token embedding is 30-60 MiB), so its
checkpoints and GGUFs came to ~7 GiB kept to the end of a session, and a host with less free disk failed
hundreds of tests at once. Swept per module, the disk holds about one module's at a time. The sweep is by
module, not by fixture, because fixtures hand out lazy getters (`models(name)` builds a checkpoint the first
time a test asks), so the fixture being set up when a directory appears need not be the one that owns it.

Kept: what session (and package) fixtures make while they are set up, to the end of the session, and each
test's own `tmp_path`, which follows `tmp_path_retention_policy` in pyproject.toml (removed when the test
passes, kept when it fails). The run's header says the free disk where the temporary files go (under -q
only when it is short), and its summary how much the base directory held at most and how low the disk's free
space went, so a run that fills a disk says so."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

_BASETEMP: list[Path] = []  # the session's base temporary directory, once known
_KEPT: set[str] = set()  # top-level names the sweep leaves alone
# "start": free bytes on the base directory's disk; "peak": bytes under it; "low": free bytes — each with
# the module it was read after
_DISK: dict[str, tuple[int, str]] = {}


@pytest.fixture(scope="session", autouse=True)
def session_basetemp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's base temporary directory."""
    base = tmp_path_factory.getbasetemp()
    _BASETEMP.append(base)
    _DISK["start"] = (shutil.disk_usage(base).free, "")
    return base


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest) -> Iterator[object]:
    """What a session or package fixture or a test's tmp_path makes is kept from the module sweep."""
    wider = fixturedef.scope in ("session", "package")  # outlives the module that first sets it up
    if not _BASETEMP or not (wider or fixturedef.argname in ("tmp_path", "tmpdir")):
        return (yield)
    before = set(os.listdir(_BASETEMP[0]))
    try:
        return (yield)
    finally:
        _KEPT.update(set(os.listdir(_BASETEMP[0])) - before)


@pytest.fixture(scope="module", autouse=True)
def sweep_module_dirs(session_basetemp: Path, request: pytest.FixtureRequest) -> Iterator[None]:
    """Removes what the module made, at its end. Autouse and module-scoped, it is set up before the
    module's other module fixtures and so torn down after them."""
    before = set(os.listdir(session_basetemp))
    yield
    _note_disk(session_basetemp, request.node.nodeid)
    for name in set(os.listdir(session_basetemp)) - before - _KEPT:
        shutil.rmtree(session_basetemp / name, ignore_errors=True)


def _size(path: str) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:  # gone since listed (the quantization cache's background writes rename theirs)
        return 0


def _note_disk(base: Path, module: str) -> None:
    held = sum(_size(os.path.join(d, f)) for d, _, files in os.walk(base) for f in files)
    free = shutil.disk_usage(base).free
    if held > _DISK.get("peak", (-1, ""))[0]:
        _DISK["peak"] = (held, module)
    if free < _DISK.get("low", (free + 1, ""))[0]:
        _DISK["low"] = (free, module)


LOW_GIB = 3.0  # about what the suite's temporary files peak at (two workers: 1.47 + 0.72 GiB measured)


def _free_line(config: pytest.Config) -> tuple[str, bool]:
    where = Path(config.option.basetemp or tempfile.gettempdir())
    while not where.exists():
        where = where.parent
    free = shutil.disk_usage(where).free / 2**30
    low = free < LOW_GIB
    note = f" — less than the ~{LOW_GIB:.0f} GiB the suite's temporary files peak at" if low else ""
    return f"temporary files under {where}: {free:.1f} GiB free{note}", low


def pytest_report_header(config: pytest.Config) -> str:
    """The free disk where the temporary files go, at the top of the run (a run cut short still shows it)."""
    return _free_line(config)[0]


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under -q, which hides the header, the same line when the disk is short."""
    line, low = _free_line(session.config)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if low and reporter is not None and session.config.get_verbosity() < 0:
        reporter.write_line(line, yellow=True)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A worker of a distributed run (pytest-xdist) hands its readings to the controller to print."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None and "peak" in _DISK:
        out["blazr_disk"] = dict(_DISK)


_WORKERS: dict[str, dict[str, tuple[int, str]]] = {}  # the controller's: worker id → its _DISK


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """The controller's side of pytest_sessionfinish."""
    disk = getattr(node, "workeroutput", {}).get("blazr_disk")
    if disk:
        worker = getattr(node, "workerinput", {}).get("workerid", "?")
        _WORKERS[worker] = {name: tuple(reading) for name, reading in disk.items()}


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The base directory's peak (each worker's, in a distributed run) and the disk's free space, at the start
    and at its lowest."""
    runs = dict(sorted(_WORKERS.items())) or ({"": _DISK} if "peak" in _DISK else {})
    if not runs:
        return
    gib = 2**30
    tw = terminalreporter
    tw.write_sep("-", "blazr test disk")
    for worker, disk in runs.items():
        (peak, peak_at) = disk["peak"]
        who = f"{worker}: " if worker else ""
        tw.write_line(f"temporary files: {who}at most {peak / gib:.2f} GiB (at the end of {peak_at})")
    start = max(disk["start"][0] for disk in runs.values())
    low, low_at = min(disk["low"] for disk in runs.values())
    tw.write_line(
        f"disk free: {start / gib:.1f} GiB at the start, {low / gib:.1f} GiB at the lowest ({low_at})"
    )
