"""`exit_now(status)`: end the process without the interpreter's teardown, after flushing logging and
stdio — for a process that holds nothing left to write and a thread that cannot be stopped part-way (a
tensor-parallel rank after its loop; a server stopped while its model was still loading, whose loader
would otherwise be killed inside torch by the interpreter's exit: `std::terminate`, status 134)."""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def exit_now(status: int) -> NoReturn:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
