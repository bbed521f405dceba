"""`intra_op_threads(n)`: run a block on n torch intra-op threads (the kernels' OpenMP thread count), then
restore the count it found — for tests whose results must not depend on, or must exercise, the thread
count."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def intra_op_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
