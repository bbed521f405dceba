"""`empty_huge` (kernels/hugepages.py): the buffer torch.empty gives; with BLAZR_HUGEPAGES=1 its whole pages
advised huge on Linux kernels with transparent huge pages — the VMA holding a large buffer carries the `hg`
flag (VM_HUGEPAGE) afterwards —, without it left as torch gives it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

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


def test_empty_huge_is_torch_empty_with_huge_pages_advised(monkeypatch: pytest.MonkeyPatch) -> None:
    thp = Path("/sys/kernel/mm/transparent_hugepage").is_dir()  # a Linux kernel built with THP
    monkeypatch.delenv("BLAZR_HUGEPAGES", raising=False)
    plain = empty_huge(MIN_BYTES, dtype=torch.bfloat16)
    if thp:
        assert "hg" not in _vma_flags(plain.data_ptr() + MIN_BYTES)
    monkeypatch.setenv("BLAZR_HUGEPAGES", "1")
    small = empty_huge(3, 5, dtype=torch.float32)
    assert small.shape == (3, 5) and small.dtype == torch.float32 and small.is_contiguous()
    big = empty_huge(MIN_BYTES, dtype=torch.bfloat16)  # 2 · MIN_BYTES bytes
    assert big.shape == (MIN_BYTES,) and big.dtype == torch.bfloat16
    big.fill_(1.5)  # writable, whole
    assert float(big.float().sum()) == 1.5 * MIN_BYTES
    if thp:
        assert "hg" in _vma_flags(big.data_ptr() + MIN_BYTES)
