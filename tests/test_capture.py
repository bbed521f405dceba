"""kernels/capture.py: a captured plan replays exactly what the function computed, with its intermediates
packed into the arena by live range (fewer bytes than all of them), still right after the arena grows for
a larger plan; a torch op that computes — or a view op that had to copy — fails the capture, naming it."""

from __future__ import annotations

import pytest
import torch

from blazr.kernels import ops
from blazr.kernels.capture import Arena, _layout, capture


@pytest.fixture(autouse=True)
def _needs_kernels() -> None:
    assert ops.kernels() is not None, "the C kernel library is unavailable"


def _chain(x: torch.Tensor, w: torch.Tensor, n: int) -> list[torch.Tensor]:
    """n RMSNorms and residual adds in a row: h = h + rms_norm(h), each step a fresh tensor."""
    h = x
    for _ in range(n):
        h = ops.add(h, ops.rms_norm(h, w, 1e-6), beta=0.5)
    return [h]


def test_replay_equals_the_function_and_packs_the_intermediates() -> None:
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 256, generator=g), torch.rand(256, generator=g) + 0.5
    arena = Arena()
    plan = capture(lambda: _chain(x, w, 12), arena)
    assert len(plan) == 24
    # 24 outputs of 3 KiB were allocated; at most three are live at once (h, its norm, the new h).
    assert arena.nbytes <= 3 * x.nbytes + 3 * 64
    for _ in range(2):  # new input values, same buffers
        x.copy_(torch.randn(3, 256, generator=g))
        (got,) = plan.run()
        assert torch.equal(got, _chain(x, w, 12)[0])


def test_a_larger_plan_grows_the_arena_and_rebinds_the_others() -> None:
    g = torch.Generator().manual_seed(1)
    w = torch.rand(64, generator=g) + 0.5
    small_x, big_x = torch.randn(1, 64, generator=g), torch.randn(16, 64, generator=g)
    arena = Arena()
    small = capture(lambda: _chain(small_x, w, 3), arena)
    before = arena.buffer.data_ptr(), arena.nbytes
    big = capture(lambda: _chain(big_x, w, 3), arena)
    assert arena.nbytes > before[1]
    (got_big,) = big.run()
    assert torch.equal(got_big, _chain(big_x, w, 3)[0])
    (got_small,) = small.run()  # its pointers now point into the new buffer
    assert torch.equal(got_small, _chain(small_x, w, 3)[0])
    assert got_small.data_ptr() >= arena.buffer.data_ptr()


def test_an_output_stays_whole_until_the_end() -> None:
    """An output computed early must not share bytes with what later calls write."""
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(2, 128, generator=g), torch.rand(128, generator=g)

    def fn() -> list[torch.Tensor]:
        first = ops.rms_norm(x, w, 1e-6)
        return [first, *_chain(first, w, 5)]

    plan = capture(fn, Arena())
    first, last = plan.run()
    want_first, want_last = fn()
    assert torch.equal(first, want_first) and torch.equal(last, want_last)


def test_layout_never_overlaps_live_blocks() -> None:
    import random

    rng = random.Random(3)
    for _ in range(50):
        blocks = []
        for _ in range(rng.randrange(1, 30)):
            first = rng.randrange(0, 40)
            blocks.append((first, first + rng.randrange(0, 10), rng.randrange(1, 5000)))
        offsets, total = _layout(blocks)
        assert total % 64 == 0 and all(o % 64 == 0 for o in offsets)
        for i, (f1, l1, s1) in enumerate(blocks):
            assert offsets[i] + s1 <= total
            for j, (f2, l2, s2) in enumerate(blocks[:i]):
                if f1 <= l2 and f2 <= l1:  # live at the same time
                    assert offsets[i] + s1 <= offsets[j] or offsets[j] + s2 <= offsets[i]


def test_a_torch_op_fails_the_capture_naming_it() -> None:
    x, w = torch.randn(2, 64), torch.ones(64)
    with pytest.raises(ops.UnsupportedInput, match=r"aten\.mul\.Tensor runs in torch"):
        capture(lambda: [ops.rms_norm(x * 2, w, 1e-6)], Arena())


@pytest.mark.parametrize("inference", [True, False])
def test_a_copying_view_fails_the_capture(inference: bool) -> None:
    """`reshape` of a transposed tensor copies: seen as aten.reshape that did not alias (inference mode) or
    as the aten.clone it decomposes into."""
    x, w = torch.randn(4, 64), torch.ones(64)
    copying = r"copies its input|clone"
    with torch.inference_mode(inference), pytest.raises(ops.UnsupportedInput, match=copying):
        capture(lambda: [ops.rms_norm(x.t().reshape(-1).view(4, 64), w, 1e-6)], Arena())


def test_views_and_in_place_kernels_are_fine() -> None:
    x, w = torch.randn(4, 64), torch.rand(64)

    def fn() -> list[torch.Tensor]:
        h = ops.rms_norm(x, w, 1e-6)
        half = h.view(8, 32)[::2]  # a strided view, read by nothing: fine
        del half
        return [ops.add(h, h, out=h)]  # in place

    (got,) = capture(fn, Arena()).run()
    torch.testing.assert_close(got, 2 * ops.rms_norm_reference(x, w, 1e-6), rtol=1e-6, atol=1e-6)
