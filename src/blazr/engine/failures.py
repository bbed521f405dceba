"""What an engine failure is: the errors the engine raises (a full queue, a broken engine), which errors no
request can be blamed for (`is_fatal`), and how many failed forwards in a row mean the engine is broken
(engine/engine.py's module docstring says how failures are contained).
"""

from __future__ import annotations

import torch

from blazr.errors import BlazrError

MAX_CONSECUTIVE_FAILURES = 8  # failed forwards in a row (no success between) before the engine gives up


class QueueFullError(BlazrError):
    """The server holds as many requests as it admits; the client should retry later (HTTP 503)."""


class EngineBrokenError(RuntimeError):
    """The engine cannot go on (the device failed, or every forward fails): the process should exit."""


def is_fatal(error: BaseException) -> bool:
    """Errors that leave the engine unusable whatever request comes next: a failed CUDA context (every
    later kernel launch fails too), one that says so (`is_fatal = True`: a tensor-parallel step failed, the
    ranks are out of step) or a non-Exception (KeyboardInterrupt, SystemExit)."""
    if not isinstance(error, Exception) or getattr(error, "is_fatal", False):
        return True
    accelerator_error = getattr(torch, "AcceleratorError", ())
    if accelerator_error and isinstance(error, accelerator_error):
        return True
    text = str(error)
    return "CUDA error" in text or "device-side assert" in text
