"""tests/tmp_cleanup.py, run in a pytest session of its own: what a module makes (by a module fixture, by a
lazy getter that fixture hands out, by a function fixture) is gone once the next module runs, and only after
the module fixture's own teardown has used it; a session fixture's directory stays to the end, also when the
fixture is first set up in the middle of a module; a failing test keeps its tmp_path; the run's summary
reports the disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = """
import json, os
from pathlib import Path
import pytest

pytest_plugins = ["tests.tmp_cleanup"]
LOG = Path(os.environ["CLEANUP_LOG"])


def record(**kv):
    with LOG.open("a") as f:
        f.write(json.dumps(kv) + "\\n")


@pytest.fixture(scope="session")
def kept(tmp_path_factory):
    d = tmp_path_factory.mktemp("kept")
    (d / "w").write_text("x")
    return d


@pytest.fixture(scope="module")
def per_module(tmp_path_factory):
    d = tmp_path_factory.mktemp("per-module")
    (d / "w").write_text("x")
    yield d
    record(event="module teardown", sees_own_file=(d / "w").exists())


@pytest.fixture(scope="module")
def getter(tmp_path_factory):
    made = {}

    def get(name):
        if name not in made:
            made[name] = tmp_path_factory.mktemp(name)
        return made[name]

    return get


@pytest.fixture
def per_test(tmp_path_factory):
    d = tmp_path_factory.mktemp("per-test")
    (d / "w").write_text("x")
    return d
"""

MODULE_A = """
from conftest import record


def test_a(per_module, per_test, getter, tmp_path):
    record(event="a", module=str(per_module), test=str(per_test), lazy=str(getter("lazy")))


def test_a_after(per_module, getter, kept):
    # `kept` is first set up here, in the middle of the module
    there = dict(module_there=per_module.exists(), lazy_there=getter("lazy").exists())
    record(event="a after", kept=str(kept), **there)


def test_fails(tmp_path):
    record(event="failing", tmp=str(tmp_path))
    (tmp_path / "w").write_text("x")
    raise AssertionError("kept on purpose")
"""

MODULE_B = """
from pathlib import Path

from conftest import record


def test_b(kept):
    record(event="b", kept_there=(kept / "w").exists())
"""


@pytest.mark.parametrize("workers", [0, 2], ids=["one-process", "two-workers"])
def test_fixture_directories_go_with_their_fixtures(tmp_path: Path, workers: int) -> None:
    """Alone and as `make test` runs it (pytest-xdist, `-n 2 --dist loadfile`: each module on one worker,
    each worker sweeping its own base directory; the summary joins the workers')."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_a.py").write_text(MODULE_A)
    (tmp_path / "test_b.py").write_text(MODULE_B)
    log = tmp_path / "log.jsonl"
    base = tmp_path / "base"
    env = {**os.environ, "CLEANUP_LOG": str(log), "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
    run = subprocess.run(
        [
            sys.executable,
            *("-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(base)),
            *("-o", "tmp_path_retention_policy=failed", "--rootdir", str(tmp_path)),
            *("test_a.py", "test_b.py"),
            *(("-n", str(workers), "--dist", "loadfile") if workers else ()),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "1 failed, 3 passed" in run.stdout, run.stdout + run.stderr
    # the summary: one line per worker in a distributed run
    lines = [f"temporary files: gw{i}: at most" for i in range(workers)] or ["temporary files: at most"]
    for line in [*lines, "disk free:"]:
        assert line in run.stdout, run.stdout
    events = {e["event"]: e for e in map(json.loads, log.read_text().splitlines())}
    a, after = events["a"], events["a after"]
    assert events["module teardown"]["sees_own_file"]  # removed only after the fixture's teardown
    assert after["module_there"] and after["lazy_there"]  # a module's directories live through it
    for made in ("module", "lazy", "test"):
        assert not Path(a[made]).exists(), made  # ...and are gone after it
    assert events["b"]["kept_there"] and Path(after["kept"]).exists()  # a session fixture's stays
    assert (Path(events["failing"]["tmp"]) / "w").exists()  # a failing test's tmp_path is kept
