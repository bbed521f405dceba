"""Fault injection for the containment tests: make one request fail at a chosen stage of the engine.

A request carries a marker among its `stop` strings (a string no model ever writes), and the patched
stage raises when it meets that request:

    FORWARD  ModelRunner.run raises for any step that holds the request (a bug in the model's forward)
    SAMPLE   the engine's sampler raises for any batch holding the request's row
    DETOK    the request's detokenizer raises on its first generated token
    FATAL    the scheduler raises (a bookkeeping bug: the engine loop cannot go on)

`installed()` patches in-process (a context manager); `python -m tests.faults serve …` runs `blazr serve`
with the faults installed, for the end-to-end tests.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

FORWARD = "\U0001f4a3forward"
SAMPLE = "\U0001f4a3sample"
DETOK = "\U0001f4a3detok"
FATAL = "\U0001f4a3fatal"


class InjectedFault(RuntimeError):
    """What every injected fault raises (its text must never reach a client)."""


def _marked(seqs: Any, marker: str) -> bool:
    return any(marker in s.params.stop for s in seqs)


@contextlib.contextmanager
def installed() -> Iterator[None]:
    from blazr.engine import engine as engine_module
    from blazr.engine.detokenizer import Detokenizer
    from blazr.engine.runner import ModelRunner
    from blazr.engine.scheduler import Scheduler

    run, sample, add, schedule = ModelRunner.run, engine_module.sample, Detokenizer.add, Scheduler.schedule

    def faulty_run(self: ModelRunner, sched: Any) -> Any:
        if _marked(sched.seqs, FORWARD):
            raise InjectedFault("injected forward fault in /internal/path.py")
        return run(self, sched)

    def faulty_sample(logits: Any, rows: Any) -> Any:
        if _marked(rows, SAMPLE):
            raise InjectedFault("injected sampling fault in /internal/path.py")
        return sample(logits, rows)

    def faulty_add(self: Detokenizer, token_id: int, check_stop: bool = True) -> tuple[str, bool]:
        if DETOK in self.stop:
            raise InjectedFault("injected detokenizer fault in /internal/path.py")
        return add(self, token_id, check_stop)

    def faulty_schedule(self: Scheduler) -> Any:
        if _marked([*self.waiting, *self.running], FATAL):
            raise InjectedFault("injected scheduler fault in /internal/path.py")
        return schedule(self)

    ModelRunner.run = faulty_run  # type: ignore[method-assign]
    engine_module.sample = faulty_sample  # type: ignore[assignment]
    Detokenizer.add = faulty_add  # type: ignore[method-assign]
    Scheduler.schedule = faulty_schedule  # type: ignore[method-assign]
    try:
        yield
    finally:
        ModelRunner.run = run  # type: ignore[method-assign]
        engine_module.sample = sample
        Detokenizer.add = add  # type: ignore[method-assign]
        Scheduler.schedule = schedule  # type: ignore[method-assign]


if __name__ == "__main__":
    from blazr.cli import main

    with installed():
        code = main(sys.argv[1:])
    sys.exit(code)
