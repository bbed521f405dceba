"""tests/tmp_cleanup.py, run in a pytest session of its own: a module fixture's directory is gone once the
next module runs, a function fixture's once its test ends, after each fixture's own teardown has used it; a
session fixture's stays to the end; a failing test keeps its tmp_path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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


@pytest.fixture
def per_test(tmp_path_factory):
    d = tmp_path_factory.mktemp("per-test")
    (d / "w").write_text("x")
    return d
"""

MODULE_A = """
from conftest import record


def test_a(per_module, per_test, kept, tmp_path):
    record(event="a", module=str(per_module), test=str(per_test), kept=str(kept))


def test_a_after(per_module, per_test):
    record(event="a after", module_there=per_module.exists())


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


def test_fixture_directories_go_with_their_fixtures(tmp_path: Path) -> None:
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
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "1 failed, 3 passed" in run.stdout, run.stdout + run.stderr
    events = {e["event"]: e for e in map(json.loads, log.read_text().splitlines())}
    a = events["a"]
    assert events["module teardown"]["sees_own_file"]  # removed only after the fixture's teardown
    assert events["a after"]["module_there"]  # a module fixture's directory lives through its module
    assert not Path(a["module"]).exists()  # ...and is gone after it
    assert not Path(a["test"]).exists()  # a function fixture's directory is gone after its test
    assert events["b"]["kept_there"] and Path(a["kept"]).exists()  # a session fixture's stays
    assert (Path(events["failing"]["tmp"]) / "w").exists()  # a failing test's tmp_path is kept
