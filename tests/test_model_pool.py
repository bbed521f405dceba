"""`ModelPool` (server/model_pool.py) in-process, with a fake loader whose loads a test can hold back: the
orderings a real server only shows by chance — requests that arrive while their model loads share that one
load, other models answer while one loads, a load waits for room while every loaded model is in use, the
least recently used idle model is the one unloaded, sleep after idling (and Ollama's keep_alive), a failed
load refused at once and tried again later, the cache budget each load is given."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from blazr.server import model_pool
from blazr.server.errors import APIError
from blazr.server.model_pool import ModelPool
from blazr.server.options import ServerConfig

GiB = 1 << 30


@dataclass
class FakeEngine:
    num_unfinished_seqs: int = 0
    is_stopped: bool = False

    def shutdown(self) -> None:
        self.is_stopped = True


@dataclass
class FakeFormat:
    def describe(self) -> str:
        return "fake"


@dataclass
class FakeServing:
    name: str
    engine: FakeEngine = field(default_factory=FakeEngine)
    format: FakeFormat = field(default_factory=FakeFormat)
    details: dict[str, Any] = field(default_factory=dict)

    def close(self) -> None:
        pass


class Loader:
    """Starts fake models; `hold(name)` makes that model's next loads wait until `let_go(name)`."""

    def __init__(self, fail: tuple[str, ...] = ()) -> None:
        self.calls: list[tuple[str, float | None]] = []  # (model, the cache budget it was given in GiB)
        self.gates: dict[str, threading.Event] = {}
        self.fail = set(fail)

    def hold(self, name: str) -> None:
        self.gates[name] = threading.Event()

    def let_go(self, name: str) -> None:
        self.gates.pop(name).set()

    def __call__(self, one: ServerConfig) -> tuple[FakeServing, int]:
        name = one.served_model_names[0]
        self.calls.append((name, one.engine.cache_memory_gib))
        gate = self.gates.get(name)
        if gate is not None:
            assert gate.wait(10), "held too long"
        if name in self.fail:
            raise OSError(f"{one.load.model}: no weights in it")
        return FakeServing(name), GiB  # each holds 1 GiB of cache


def _pool(loader: Loader, names: tuple[str, ...] = ("a", "b", "c"), **config: Any) -> ModelPool:
    cfg = ServerConfig.of(cache_memory_gib=6.0, **config)
    return ModelPool(cfg, {n: f"/models/{n}" for n in names}, loader)  # type: ignore[arg-type]


async def _until(predicate: Any) -> None:
    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never happened")


def test_requests_during_a_load_share_it_and_other_models_keep_serving():
    loader = Loader()
    pool = _pool(loader)

    async def run() -> None:
        entry_b, _ = await pool.acquire("b")
        pool.release(entry_b)
        loader.hold("a")
        waiting = [asyncio.create_task(pool.acquire("a")) for _ in range(3)]
        await _until(lambda: pool.entries["a"].state == "loading" and loader.calls[-1][0] == "a")
        # while a loads, b answers at once
        entry, serving = await asyncio.wait_for(pool.acquire("b"), 1)
        assert serving.name == "b"
        pool.release(entry)
        loader.let_go("a")
        got = await asyncio.wait_for(asyncio.gather(*waiting), 5)
        assert {s.name for _, s in got} == {"a"} and len({id(s) for _, s in got}) == 1
        assert [c[0] for c in loader.calls] == ["b", "a"]  # one load of a for the three requests
        assert pool.entries["a"].num_in_use == 3

    asyncio.run(run())


def test_lru_unload_waits_for_room_and_never_takes_a_model_in_use():
    loader = Loader()
    pool = _pool(loader, max_loaded_models=2)

    async def run() -> None:
        a, _ = await pool.acquire("a")
        b, served_b = await pool.acquire("b")
        pool.release(b)
        # a is in use, b idle: c's load unloads b (not a, though a was used first)
        c, _ = await pool.acquire("c")
        assert served_b.engine.is_stopped
        assert {e.name: e.state for e in pool.entries.values()} == {
            "a": "loaded",
            "b": "unloaded",
            "c": "loaded",
        }
        # both loaded models in use: b's load waits for one of them to be released
        wait_b = asyncio.create_task(pool.acquire("b"))
        await asyncio.sleep(0.2)
        assert not wait_b.done() and pool.entries["b"].state == "loading"
        pool.release(c)
        b, _ = await asyncio.wait_for(wait_b, 5)
        assert pool.entries["c"].state == "unloaded" and pool.entries["a"].state == "loaded"
        assert pool.entries["b"].num_loads == 2
        pool.release(a)
        pool.release(b)

    asyncio.run(run())


def test_a_load_queued_behind_another_cannot_unload_it_before_its_requests_get_it():
    loader = Loader()
    pool = _pool(loader, max_loaded_models=1)

    async def run() -> None:
        loader.hold("a")
        want_a = [asyncio.create_task(pool.acquire("a")) for _ in range(2)]
        await _until(lambda: loader.calls)
        want_b = asyncio.create_task(pool.acquire("b"))  # its load queues behind a's
        await asyncio.sleep(0.05)
        loader.let_go("a")
        # (without the waiters counted, a and b would unload each other for ever: thrash)
        got_a = await asyncio.wait_for(asyncio.gather(*want_a), 5)
        assert pool.entries["a"].num_loads == 1 and not want_b.done()  # b waits for room
        for entry, _ in got_a:
            pool.release(entry)
        await asyncio.wait_for(want_b, 5)
        assert pool.entries["a"].state == "unloaded" and [c[0] for c in loader.calls] == ["a", "b"]

    asyncio.run(run())


def test_of_idle_models_the_least_recently_used_is_unloaded():
    loader = Loader()
    pool = _pool(loader, max_loaded_models=2)

    async def run() -> None:
        for name in ("a", "b", "a"):  # b is now the least recently used
            pool.release((await pool.acquire(name))[0])
        pool.release((await pool.acquire("c"))[0])
        assert {e.name: e.state for e in pool.entries.values()} == {
            "a": "loaded",
            "b": "unloaded",
            "c": "loaded",
        }

    asyncio.run(run())


def test_the_cache_budget_is_shared_by_the_loaded_models():
    loader = Loader()
    pool = _pool(loader, max_loaded_models=3)  # --cache-memory 6: the total

    async def run() -> None:
        for name in ("a", "b", "c"):
            pool.release((await pool.acquire(name))[0])

    asyncio.run(run())
    # a: 6 GiB over 3 models; b: (6 - 1 held) over 2; c: (6 - 2 held) over 1
    assert loader.calls == [("a", 2.0), ("b", 2.5), ("c", 4.0)]


def test_idle_models_sleep_and_keep_alive_overrides_the_server():
    loader = Loader()
    pool = _pool(loader, sleep_idle_seconds=0.2)

    async def run() -> None:
        timer = asyncio.create_task(pool.run_idle_timer())
        a, _ = await pool.acquire("a")
        b, _ = await pool.acquire("b")
        b.keep_alive = float("inf")  # Ollama's keep_alive -1: never
        pool.release(b)
        await asyncio.sleep(0.5)
        assert pool.entries["a"].state == "loaded"  # in use: never put to sleep
        pool.release(a)
        await _until(lambda: pool.entries["a"].state == "sleeping")
        assert pool.entries["b"].state == "loaded"
        a, serving = await pool.acquire("a")  # the next request reloads it
        assert serving.name == "a" and pool.entries["a"].num_loads == 2
        pool.release(a)
        await pool.close()
        timer.cancel()

    asyncio.run(run())


def test_a_failed_load_is_refused_at_once_then_tried_again(monkeypatch):
    loader = Loader(fail=("b",))
    pool = _pool(loader)

    async def run() -> None:
        for _ in range(2):
            with pytest.raises(APIError) as e:
                await pool.acquire("b")
            assert e.value.status == 503 and "no weights in it" in e.value.message
            assert "/models/b" not in e.value.message  # the path shown as the model's name
        assert [c[0] for c in loader.calls] == ["b"]  # the second was refused without loading
        monkeypatch.setattr(model_pool, "RETRY_FAILED_S", 0.0)
        loader.fail.clear()
        entry, serving = await pool.acquire("b")
        assert serving.name == "b" and entry.error is None
        with pytest.raises(APIError) as e:
            await pool.acquire("nope")
        assert e.value.status == 404

    asyncio.run(run())
