"""Host tuning of the C kernels (kernels/tuning.py): measured once per CPU model and library build, cached,
read back at later loads; off and forced on request; a damaged or foreign file measured anew. (That every
value of every knob gives the same bits is test_kernels_linear_threads.py's
test_tuning_knobs_change_no_bit.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blazr.kernels import build, ops, tuning
from blazr.loading.quantize import kernel_prefill_f32


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Tuning on small shapes, one round, its files in tmp_path, on a host taken as quiet (a test sets
    `busy` where it matters); the library's knobs restored after."""
    k = ops.kernels()  # loaded (and tuned) from the real cache directory first
    assert k is not None
    monkeypatch.setattr(tuning, "SHAPES", ((64, 256), (32, 512)))
    monkeypatch.setattr(tuning, "ROUNDS", 1)
    monkeypatch.setattr(tuning, "_l3_bytes", lambda: 1 << 16)
    monkeypatch.setattr(build, "cache_dir", lambda: tmp_path)
    monkeypatch.delenv("BLAZR_TUNE", raising=False)
    monkeypatch.setattr(tuning, "busy", lambda: False)
    monkeypatch.setattr(tuning, "CHOICES", dict(tuning.CHOICES))
    before = {knob.name: k.get_tune(knob.name) for knob in tuning.KNOBS}
    yield tmp_path
    for name, value in before.items():
        k.set_tune(name, value)


def _file(directory: Path) -> Path:
    (path,) = directory.glob("tuning-*.json")
    return path


def test_measured_once_then_read(small: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    k = ops.kernels()
    assert k is not None
    chosen = tuning.apply(k)
    assert set(chosen) == {knob.name for knob in tuning.KNOBS}
    data = json.loads(_file(small).read_text())
    assert data["cpu"] == build.cpu_model() and data["library"] == build.loaded_name()
    assert data["knobs"] == chosen and {k.get_tune(n) for n in chosen} <= {v for v in chosen.values()}
    for name, rates in data["gbps"].items():  # every value this build takes was timed
        assert {int(v) for v in rates} <= set(next(x for x in tuning.KNOBS if x.name == name).values)
    for name in chosen:  # scramble the knobs: a read sets the cached values back
        k.set_tune(name, 1 if name.startswith("streams") else 0)

    def no_measure(*_: object) -> None:
        raise AssertionError("a cached choice is read, not measured")

    monkeypatch.setattr(tuning, "measure", no_measure)
    assert tuning.apply(k) == chosen
    assert {n: k.get_tune(n) for n in chosen} == chosen


@pytest.mark.parametrize("damage", ["garbage", "other library", "other cpu", "other format", "no knobs"])
def test_foreign_or_damaged_file_is_measured_anew(small: Path, damage: str) -> None:
    k = ops.kernels()
    assert k is not None
    tuning.apply(k)
    path = _file(small)
    data = json.loads(path.read_text())
    if damage == "garbage":
        path.write_text("{not json")
    else:
        field = {"other library": "library", "other cpu": "cpu", "other format": "format"}
        if damage == "no knobs":
            del data["knobs"]
        else:
            data[field[damage]] = -1 if damage == "other format" else "something else"
        path.write_text(json.dumps(data))
    stamp = path.stat().st_mtime_ns
    tuning.apply(k)
    fresh = json.loads(path.read_text())
    assert path.stat().st_mtime_ns != stamp and fresh["library"] == build.loaded_name()
    assert fresh["format"] == tuning.FORMAT and "knobs" in fresh


def test_off_keeps_the_defaults_and_force_measures(small: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    k = ops.kernels()
    assert k is not None
    k.set_tune("streams_f", 1)
    monkeypatch.setenv("BLAZR_TUNE", "off")
    assert tuning.apply(k) == {} and k.get_tune("streams_f") == 1 and not list(small.glob("tuning-*"))
    monkeypatch.setenv("BLAZR_TUNE", "on")
    tuning.apply(k)
    calls: list[int] = []
    real = tuning.measure
    monkeypatch.setattr(tuning, "measure", lambda *a: calls.append(1) or real(*a))
    tuning.apply(k)
    assert calls == []  # cached
    monkeypatch.setenv("BLAZR_TUNE", "force")
    tuning.apply(k)
    assert calls == [1]


def test_unknown_knob_and_refused_value_are_clear_errors() -> None:
    k = ops.kernels()
    assert k is not None
    with pytest.raises(ValueError, match="unknown kernel tuning knob 'warp'"):
        k.set_tune("warp", 1)
    with pytest.raises(ValueError, match="'streams_f': 99 is not a value of this build"):
        k.set_tune("streams_f", 99)


def test_a_busy_host_keeps_the_defaults_until_it_is_quiet(
    small: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While other work loads the cores nothing is measured (the timings would be noise) and the defaults
    run; the first quiet load measures and keeps its choice, which later busy loads use. A choice forced on a
    busy host is marked and measured again by the first quiet load."""
    k = ops.kernels()
    assert k is not None
    calls: list[bool] = []
    real = tuning.measure
    monkeypatch.setattr(tuning, "measure", lambda *a: calls.append(tuning.busy()) or real(*a))
    monkeypatch.setattr(tuning, "busy", lambda: True)
    assert tuning.apply(k) == {} and calls == [] and not list(small.glob("tuning-*.json"))
    monkeypatch.setattr(tuning, "busy", lambda: False)
    chosen = tuning.apply(k)  # quiet: measured and kept
    assert calls == [False] and json.loads(_file(small).read_text())["busy"] is False
    monkeypatch.setattr(tuning, "busy", lambda: True)
    assert tuning.apply(k) == chosen and calls == [False]  # busy again: the quiet choice is used
    tuning.apply(k, force=True)  # forced while busy: measured, marked
    assert calls == [False, True] and json.loads(_file(small).read_text())["busy"] is True
    assert tuning.apply(k) and calls == [False, True]  # still busy: the marked choice is used
    monkeypatch.setattr(tuning, "busy", lambda: False)
    tuning.apply(k)  # quiet now: measured again, and the mark goes
    assert calls == [False, True, False] and json.loads(_file(small).read_text())["busy"] is False


def test_the_float32_prefill_gemm_is_chosen_on_this_host_and_followed(
    small: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The float32 prefill's GEMM — the C panel or torch's sgemm — is timed with the knobs, kept in the
    file beside its GFLOP/s, read back by a later load, and `kernel_prefill_f32` follows it."""
    k = ops.kernels()
    assert k is not None
    tuning.CHOICES.clear()
    tuning.apply(k)
    data = json.loads(_file(small).read_text())
    assert data["choices"]["f32_prefill"] in ("kernel", "sgemm")
    assert set(data["gflops"]) == {"kernel", "sgemm"}
    assert data["choices"] == tuning.CHOICES
    tuning.CHOICES.clear()
    tuning.apply(k)  # read back
    assert data["choices"] == tuning.CHOICES
    for choice in ("kernel", "sgemm"):
        monkeypatch.setitem(tuning.CHOICES, "f32_prefill", choice)
        assert kernel_prefill_f32() == (choice == "kernel" and "avx2" in k.features)


def _choice_kept_and_read_back(
    small: Path,
    k: ops.Kernels,
    generic: ops.Kernels,
    prefix: str,
    probes: tuple[str, ...],
    path: str,
    forms: set[str],
    rates_key: str,
) -> dict[str, str] | None:
    """Tuning's choice of form for each kind of `probes` (`{prefix}_{kind}`), on a build with `path`: measured
    after the knobs, kept in the file beside each form's rate, read back by a later load — the choices; a
    build without `path` has no such choice (None)."""
    names = {f"{prefix}_{kind}" for kind in probes}
    tuning.CHOICES.clear()
    tuning.apply(k)
    data = json.loads(_file(small).read_text())
    assert not names & set(tuning.measure(generic)["choices"])  # the portable build: nothing to choose
    if path not in k.features:
        assert not names & set(data["choices"]) and data[rates_key] == {}
        return None
    assert {data["choices"][name] for name in names} <= forms
    assert {kind: set(rates) for kind, rates in data[rates_key].items()} == {kind: forms for kind in probes}
    tuning.CHOICES.clear()
    tuning.apply(k)  # read back
    assert {name: tuning.CHOICES[name] for name in names} == {name: data["choices"][name] for name in names}
    return {name: data["choices"][name] for name in names}


def test_the_k_quant_layout_is_chosen_on_this_host_and_followed(
    small: Path, monkeypatch: pytest.MonkeyPatch, generic: ops.Kernels
) -> None:
    """On a build with a group path (AVX2: Q4_K; VNNI: Q4_K and Q6_K — `tuning.kpack_probes`), each probed
    K-quant kind's layout — 16-row groups or as stored — is timed after the knobs, kept in the file beside
    both layouts' GB/s, read back by a later load, and the loader's rule (`kquant_packed.wanted`) follows it;
    the portable build has no such choice."""
    from blazr.kernels import kquant_packed

    k = ops.kernels()
    assert k is not None
    monkeypatch.delenv("BLAZR_KPACK", raising=False)
    probes, features = tuning.kpack_probes(k.features), k.features
    vnni, avx2 = "avx512_vnni" in features, "avx2" in features
    assert probes == (("q4_k", "q6_k") if vnni else ("q4_k",) if avx2 else ())
    forms = {"groups", "stored"}
    chosen = _choice_kept_and_read_back(small, k, generic, "kpack", probes, "avx2", forms, "kpack_gbps")
    for kind in probes if chosen is not None else ():
        assert kquant_packed.wanted(kind) == (chosen[f"kpack_{kind}"] == "groups")


def test_the_coded_form_is_chosen_on_this_host_and_followed(
    small: Path, monkeypatch: pytest.MonkeyPatch, generic: ops.Kernels
) -> None:
    """On a build with the vector decode (AVX2, AVX-512), each float kind's coded form (kernels/coded.py) is
    timed against the stored kind after the knobs, kept in the file beside both rates (weights a second), read
    back by a later load, and the loader's rule (`coded.wanted`) follows it unless `BLAZR_CODED` decides; rows
    too short to gain are never coded; a build without the decode has no such choice."""
    from blazr.kernels import coded

    k = ops.kernels()
    assert k is not None
    monkeypatch.delenv("BLAZR_CODED", raising=False)
    chosen = _choice_kept_and_read_back(
        small, k, generic, "coded", tuning.CODED_PROBES, "avx2", {"coded", "stored"}, "coded_gws"
    )
    for kind in tuning.CODED_PROBES if chosen is not None else ():
        name = f"coded_{kind}"
        assert coded.wanted(kind, 2048) == (chosen[name] == "coded")
        monkeypatch.setitem(tuning.CHOICES, name, "stored")
        assert not coded.wanted(kind, 2048)
        monkeypatch.setenv("BLAZR_CODED", "1")
        assert coded.wanted(kind, 2048) and not coded.wanted(kind, 64)
        monkeypatch.setitem(tuning.CHOICES, name, "coded")
        monkeypatch.setenv("BLAZR_CODED", "0")
        assert not coded.wanted(kind, 2048)
        monkeypatch.delenv("BLAZR_CODED")


def test_the_q8_0_layout_is_chosen_on_this_host_and_followed(
    small: Path, monkeypatch: pytest.MonkeyPatch, generic: ops.Kernels
) -> None:
    """On a build with the AVX2 path, a GGUF's Q8_0 as stored is timed against the row-packed layout
    (kernels/q8_packed.py) after the knobs, kept in the file beside both layouts' GB/s, read back by a later
    load, and the loader's rule (`q8_packed.wanted`) follows it unless `BLAZR_Q8PACK` decides; a build without
    the path has no such choice."""
    from blazr.kernels import q8_packed

    k = ops.kernels()
    assert k is not None
    monkeypatch.delenv("BLAZR_Q8PACK", raising=False)
    chosen = _choice_kept_and_read_back(
        small, k, generic, "q8pack", tuning.Q8PACK_PROBES, "avx2", {"packed", "stored"}, "q8pack_gbps"
    )
    if chosen is not None:
        assert q8_packed.wanted() == (chosen["q8pack_q8_0g"] == "packed")
        for form in ("packed", "stored"):
            monkeypatch.setitem(tuning.CHOICES, "q8pack_q8_0g", form)
            assert q8_packed.wanted() == (form == "packed")


def test_busy_reads_the_cores_use_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """`busy` is the cores' use over a short window (/proc/stat), not the 1-minute load average, which still
    reads busy a minute after a compile has ended: more than half the usable cores' worth of CPU in use by
    anything is busy; where /proc/stat is missing the load average decides."""
    monkeypatch.setattr(tuning, "BUSY_WINDOW", 0.0)
    monkeypatch.setattr(tuning.build, "usable_cores", lambda: 2)
    monkeypatch.setattr(tuning.os, "getloadavg", lambda: (5.0, 5.0, 5.0))  # a minute of past work
    for after, want in ((100, False), (450, False), (550, True), (1000, True)):  # of 1000 jiffies, 2 CPUs
        reads = iter([(0, 1000, 2), (after, 2000, 2)])
        monkeypatch.setattr(tuning, "_cpu_times", lambda reads=reads: next(reads))
        assert tuning.busy() is want, after
    monkeypatch.setattr(tuning, "_cpu_times", lambda: None)
    assert tuning.busy() is True
    monkeypatch.setattr(tuning.os, "getloadavg", lambda: (0.2, 5.0, 5.0))
    assert tuning.busy() is False
    monkeypatch.undo()
    times = tuning._cpu_times()
    assert times is not None and 0 <= times[0] <= times[1] and times[2] >= 1  # this host's own counters


def test_busy_counts_the_cores_this_process_may_use() -> None:
    """/proc/stat read over the CPUs of the process's affinity: two other cores at full use on a shared host
    leave this one's pinned cores quiet; unpinned, they are two cores' worth of the four; without per-CPU
    lines the machine's total line counts for every CPU."""
    stat = "\n".join([
        "cpu  1150 0 50 800 100 0 0 0 0 0",
        "cpu0 50 0 0 450 0 0 0 0 0 0",
        "cpu1 50 0 0 350 100 0 0 0 0 0",  # iowait is idle
        "cpu2 550 0 0 0 0 0 0 0 0 0",
        "cpu3 500 0 50 0 0 0 0 0 0 0",
        "intr 123 4 5",
    ])  # fmt: skip
    assert tuning.stat_times(stat, {0, 1}) == (100, 1000, 2)
    assert tuning.stat_times(stat, None) == (1200, 2100, 4)
    assert tuning.stat_times(stat, {2}) == (550, 550, 1)
    assert tuning.stat_times(stat, {7}) == (1200, 2100, 4)  # none listed is ours: the total line
    assert tuning.stat_times("cpu  10 0 0 30 0 0 0 0 0 0\n", {0}) == (10, 40, 1)
