"""`empty_huge` (kernels/hugepages.py): the buffer torch.empty gives; with BLAZR_HUGEPAGES=1 its whole pages
advised huge on Linux kernels with transparent huge pages — the VMA holding a large buffer carries the `hg`
flag (VM_HUGEPAGE) afterwards —, without it left as torch gives it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from blazr.kernels import hugepages
from blazr.kernels.hugepages import MIN_BYTES, empty_huge


def _vma_flags(address: int) -> list[str]:
    """The VmFlags of the mapping of this process that holds `address`."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def test_empty_huge_advises_only_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without BLAZR_HUGEPAGES=1 no advice is given; with it, one call over the buffer's whole pages."""
    calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(
        hugepages, "_MADVISE", lambda start, length, advice: calls.append((start, length, advice)) or 0
    )
    monkeypatch.delenv("BLAZR_HUGEPAGES", raising=False)
    empty_huge(MIN_BYTES, dtype=torch.bfloat16)
    assert not calls
    monkeypatch.setenv("BLAZR_HUGEPAGES", "1")
    t = empty_huge(MIN_BYTES, dtype=torch.bfloat16)
    assert len(calls) == 1, calls
    start, length, advice = calls[0]
    assert advice == hugepages.MADV_HUGEPAGE and start % hugepages.PAGE == 0 and length % hugepages.PAGE == 0
    assert t.data_ptr() <= start and start + length <= t.data_ptr() + 2 * MIN_BYTES
    empty_huge(3, 5, dtype=torch.float32)  # below MIN_BYTES: no call
    assert len(calls) == 1


def test_empty_huge_is_torch_empty_with_huge_pages_advised(monkeypatch: pytest.MonkeyPatch) -> None:
    thp = Path("/sys/kernel/mm/transparent_hugepage").is_dir()  # a Linux kernel built with THP
    monkeypatch.setenv("BLAZR_HUGEPAGES", "1")
    small = empty_huge(3, 5, dtype=torch.float32)
    assert small.shape == (3, 5) and small.dtype == torch.float32 and small.is_contiguous()
    big = empty_huge(MIN_BYTES, dtype=torch.bfloat16)  # 2 · MIN_BYTES bytes
    assert big.shape == (MIN_BYTES,) and big.dtype == torch.bfloat16
    big.fill_(1.5)  # writable, whole
    assert float(big.float().sum()) == 1.5 * MIN_BYTES
    if thp:
        assert "hg" in _vma_flags(big.data_ptr() + MIN_BYTES)
