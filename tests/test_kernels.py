"""The C kernels (blazr.kernels): the builds, the weight formats, a recorded decode step's replay and the
dispatch between the kernels and their torch references.

Every check runs twice: on the library built for this host (`-march=native`, AVX-512 paths where the CPU
has them) and on a second build with `-march=x86-64` (the portable scalar fallbacks, as on a CI machine
without AVX-512). Tolerances are derived, not guessed (tests/kernel_checks.py says how).

The kernels' equivalence tests live by family beside this file: test_kernels_linear.py (the linear
kernels), test_kernels_linear_threads.py (tuning knobs, thread balancing, GEMM passes: no bit changes),
test_kernels_attention.py (norms, RoPE, KV write, paged attention, softcap), test_kernels_mamba2.py,
test_kernels_elementwise.py (embedding, add, activations), test_kernels_conv.py, test_kernels_mamba1.py,
test_kernels_moe_mla.py, test_kernels_sample.py; the helpers they share are tests/kernel_checks.py's.
"""

from __future__ import annotations

from collections.abc import Callable

import gguf
import numpy as np
import pytest
import torch

from blazr.kernels import build, ops
from blazr.kernels.quant import BLOCK_KINDS, QuantizedWeight, dequantize, quantize
from tests.kernel_checks import GGML, _weights

# The libraries under test (`native`, `other_build`: each build of other paths, `lib`: each build in turn) are
# tests/conftest.py's.


def test_native_build_uses_the_cpu_simd(native: ops.Kernels) -> None:
    flags = build.cpu_flags().split()
    if "avx512bw" in flags and "avx512vl" in flags:
        assert "avx512" in native.features
        assert ("avx512_vnni" in native.features) == ("avx512_vnni" in flags)
    assert ("avx2" in native.features) == {"avx2", "fma", "f16c"}.issubset(flags)
    # the highest ISA level this CPU runs selects native's paths (so the tests' level builds cover the rest)
    assert native.features == list(build.runnable_levels()[-1].paths)


def test_build_is_cached_by_hash(tmp_path) -> None:
    flags = ("-O1", "-fopenmp")
    path = build.build(flags, out_dir=tmp_path)
    mtime = path.stat().st_mtime_ns
    assert build.build(flags, out_dir=tmp_path) == path and path.stat().st_mtime_ns == mtime
    assert build.library_path(("-O2", "-fopenmp"), out_dir=tmp_path) != path
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary files left behind


# ---------------------------------------------------------------- weight formats


@pytest.mark.parametrize("kind", BLOCK_KINDS)
def test_quantize_matches_gguf_bytes(kind: str) -> None:
    w = _weights(37, 256)
    qw = quantize(w, kind)
    ref = gguf.quants.quantize(w.numpy(), GGML[kind])
    assert qw.data.shape == (3, 16 * ref.shape[1])  # row-packed: ⌈37/16⌉ groups, the same bytes per row
    assert np.array_equal(qw.ggml_blocks().numpy(), ref)
    assert np.array_equal(dequantize(qw).numpy(), gguf.quants.dequantize(ref, GGML[kind]))


def test_quantized_weight_checks_shapes() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        QuantizedWeight("q4_0", torch.zeros(2, 18, dtype=torch.uint8), 2, 40)
    with pytest.raises(ValueError, match=r"expected torch\.uint8"):
        QuantizedWeight("q4_1", torch.zeros(2, 40, dtype=torch.uint8), 2, 64)  # ggml order, not packed
    raw = gguf.quants.quantize(_weights(4, 64).numpy(), GGML["q4_1"])
    qw = QuantizedWeight.from_ggml("Q4_1", torch.from_numpy(raw).flatten(), 4, 64)
    assert qw.kind == "q4_1" and qw.data.shape == (1, 16 * 40)
    assert np.array_equal(qw.ggml_blocks().numpy(), raw)
    with pytest.raises(ValueError, match="expected 160 uint8 bytes"):
        QuantizedWeight.from_blocks("q4_1", torch.zeros(4, 39, dtype=torch.uint8), 4, 64)


def _decode_layers(lib: ops.Kernels, st: dict, layers: list[dict]) -> torch.Tensor:
    """A small decode step through the kernel methods, on the static buffers in st; returns the logits."""
    B, H, Hkv, D = st["B"], st["H"], st["Hkv"], st["D"]
    qkv, h, xn = st["qkv"], st["h"], st["xn"]
    for layer, (kp, vp) in zip(layers, st["pools"], strict=True):
        lib.rms_norm(h, layer["norm"], 1e-5, out=xn)
        lib.linear(xn, layer["qkv"], out=qkv)
        lib.rope_neox(qkv[:, : (H + Hkv) * D].view(B, H + Hkv, D), st["pos"], st["cos"], st["sin"], D)
        k, v = qkv[:, H * D : (H + Hkv) * D].view(B, Hkv, D), qkv[:, (H + Hkv) * D :].view(B, Hkv, D)
        lib.kv_write(k, v, st["slot"], kp, vp)
        q = qkv[:, : H * D].view(B, H, D)
        lib.paged_attention_decode(q, kp, vp, st["idx"], st["lens"], D**-0.5, out=st["attn"])
        lib.linear(st["attn"].view(B, H * D), layer["o"], residual=h, out=h)
        lib.rms_norm(h, layer["norm"], 1e-5, out=xn)
        lib.linear(xn, layer["gate_up"], swiglu=True, out=st["act"])
        lib.linear(st["act"], layer["down"], residual=h, out=h)
    return lib.linear(h, st["head"], out=st["logits"])


def test_plan_replays_a_decode_step(native: ops.Kernels) -> None:
    """A recorded decode step replayed by one C call equals the eager calls, bit for bit, also after the
    inputs (activations, positions, slots, lengths) change in place between runs."""
    g = torch.Generator().manual_seed(11)
    B, H, Hkv, D, E, I, S, P = 3, 4, 2, 32, 128, 256, 64, 100
    layers = [
        {"norm": torch.rand(E, generator=g) + 0.5,
         "qkv": quantize(torch.randn((H + 2 * Hkv) * D, E, generator=g), "q4_1"),
         "o": quantize(torch.randn(E, H * D, generator=g) * 0.1, "q8_0"),
         "gate_up": quantize(torch.randn(2 * I, E, generator=g) * 0.1, "q4_0"),
         "down": quantize(torch.randn(E, I, generator=g) * 0.1, "bf16")}
        for _ in range(2)
    ]  # fmt: skip
    ang = torch.arange(P).float()[:, None] * (1e4 ** (-torch.arange(D // 2).float() / (D // 2)))

    def state() -> dict:
        return {
            "B": B, "H": H, "Hkv": Hkv, "D": D, "cos": ang.cos(), "sin": ang.sin(),
            "qkv": torch.empty(B, (H + 2 * Hkv) * D), "h": torch.empty(B, E), "xn": torch.empty(B, E),
            "attn": torch.empty(B, H, D), "act": torch.empty(B, I), "logits": torch.empty(B, 50),
            "pools": [(torch.zeros(S, Hkv, D), torch.zeros(S, Hkv, D)) for _ in layers],
            "pos": torch.zeros(B, dtype=torch.int64), "slot": torch.zeros(B, dtype=torch.int64),
            "idx": torch.arange(B * 20).reshape(B, 20), "lens": torch.zeros(B, dtype=torch.int64),
            "head": quantize(torch.randn(50, E, generator=torch.Generator().manual_seed(5)), "q8_0"),
        }  # fmt: skip

    eager, graph = state(), state()
    with native.record() as plan:
        _decode_layers(native, graph, layers)
    assert len(plan) == 2 * 9 + 1 and torch.equal(graph["pools"][0][0], torch.zeros(S, Hkv, D))  # not run
    h0 = torch.randn(B, E, generator=g)
    for step, lens in enumerate(([3, 1, 7], [4, 2, 8])):
        for st in (eager, graph):
            st["h"].copy_(h0 + step)
            st["lens"].copy_(torch.tensor(lens))
            st["pos"].copy_(st["lens"] - 1)
            st["slot"].copy_(st["idx"][torch.arange(B), st["lens"] - 1])
        want = _decode_layers(native, eager, layers)
        plan.run()
        assert torch.equal(graph["logits"], want) and torch.equal(graph["h"], eager["h"])


def test_recording_refuses_a_silent_fallback(native: ops.Kernels) -> None:
    qw = quantize(torch.randn(16, 64), "q4_0")
    with ops.record() as plan, pytest.raises(ops.UnsupportedInput):
        ops.linear(torch.randn(64, 4).T, qw)  # not contiguous: the reference would run now, not at replay
    assert len(plan) == 0


# ---------------------------------------------------------------- dispatch


def test_dispatch_uses_kernels_and_falls_back(native: ops.Kernels) -> None:
    qw = quantize(torch.randn(16, 64), "q4_0")
    x = torch.randn(4, 64)
    assert torch.equal(ops.linear(x, qw), native.linear(x, qw))
    xt = torch.randn(64, 4).T  # not contiguous → reference
    assert torch.equal(ops.linear(xt, qw), ops.linear_reference(xt, qw))
    xb = x.bfloat16()  # unsupported dtype → reference
    assert torch.equal(
        ops.rms_norm(xb, torch.ones(64), 1e-5), ops.rms_norm_reference(xb, torch.ones(64), 1e-5)
    )


def test_blazr_isa_builds_the_default_library_at_its_level(
    monkeypatch: pytest.MonkeyPatch, isa_build: Callable[[str], ops.Kernels]
) -> None:
    """`BLAZR_ISA` names the ISA level of the default library (here the one below native, found where the
    session built it: the same flags, the same file): its SIMD paths are the level's. Unset or `native`
    keep -march=native; a level this CPU cannot run, or an unknown name, leaves the torch references with a
    warning that names the levels it runs."""
    from pathlib import Path

    levels = build.runnable_levels()
    level = levels[-2] if len(levels) > 1 else levels[0]
    made = isa_build(level.name)
    monkeypatch.setenv("BLAZR_KERNEL_DIR", str(Path(made.lib._name).parent))
    monkeypatch.setenv("BLAZR_TUNE", "off")
    try:
        for value in ("", "native", " Native "):
            monkeypatch.setenv("BLAZR_ISA", value)
            assert build.default_flags() == build.DEFAULT_FLAGS
        monkeypatch.setenv("BLAZR_ISA", level.name.upper())
        ops.reset()
        k = ops.kernels()
        assert k is not None and k.features == list(level.paths)
        assert build.loaded_name() == Path(made.lib._name).name
        here = "levels here: native, " + ", ".join(x.name for x in levels)
        cannot = [(x.name, "this CPU cannot run it") for x in build.isa_levels() if not x.runs_here()]
        for value, why in [("avx9000", "no such level"), *cannot]:
            monkeypatch.setenv("BLAZR_ISA", value)
            ops.reset()
            with pytest.warns(UserWarning, match=f"BLAZR_ISA={value}: {why}; {here}"):
                assert ops.kernels() is None
    finally:
        monkeypatch.undo()
        ops.reset()


def test_kernels_disabled_uses_references(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLAZR_KERNELS", "0")
    ops.reset()
    try:
        assert not build.available() and ops.kernels() is None
        qw = quantize(torch.randn(16, 64), "q8_0")
        x = torch.randn(3, 64)
        assert torch.equal(ops.linear(x, qw), ops.linear_reference(x, qw))
        w = torch.randn(64)
        assert torch.equal(ops.rms_norm(x, w, 1e-6), ops.rms_norm_reference(x, w, 1e-6))
    finally:
        monkeypatch.undo()
        ops.reset()
