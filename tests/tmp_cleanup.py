"""A pytest plugin (tests/conftest.py `pytest_plugins`) that bounds the suite's disk: the directories a
module-, class- or function-scoped fixture makes under the session's base temporary directory are removed
when that fixture is torn down, after its own teardown.

The suite's tiny checkpoints carry real vocabularies (a 128k-token embedding is 30-60 MiB), so its
checkpoints and GGUFs came to ~7 GiB kept to the end of a session, and a host with less free disk failed
hundreds of tests at once. Removed with their fixtures, the disk holds about one module's at a time.
Session fixtures keep theirs to the end; a test's own `tmp_path` follows `tmp_path_retention_policy` in
pyproject.toml (removed when the test passes, kept when it fails)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

_BASETEMP: list[Path] = []  # the session's base temporary directory, once known


@pytest.fixture(scope="session", autouse=True)
def session_basetemp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's base temporary directory, for `pytest_fixture_setup` below."""
    _BASETEMP.append(tmp_path_factory.getbasetemp())
    return _BASETEMP[0]


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest) -> Iterator[object]:
    """Removes what a fixture other than a session one (or pytest's own `tmp_path`) makes under the base
    temporary directory when that fixture is torn down."""
    if fixturedef.scope == "session" or fixturedef.argname in ("tmp_path", "tmpdir") or not _BASETEMP:
        return (yield)
    base = _BASETEMP[0]
    made: set[str] = set()
    # registered before the fixture runs, so it runs after the fixture's own teardown (finalizers run last
    # in, first out)
    fixturedef.addfinalizer(lambda: [shutil.rmtree(base / name, ignore_errors=True) for name in made])
    before = set(os.listdir(base))
    try:
        return (yield)
    finally:
        made.update(set(os.listdir(base)) - before)
