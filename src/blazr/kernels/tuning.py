"""Host tuning of the C kernels: the variant of each microarchitecture-dependent kernel form that runs fastest
on this CPU, measured once per CPU model and library build, cached, and set at every load.

The best form of some kernels depends on the core, not on the ISA the compiler saw — 256- or 512-bit
registers on AMD's double-pumped AVX-512 (Zen 4) against full-width (Zen 5, Sapphire Rapids), the number of
weight streams a core's prefetchers follow. The C code reads such a choice at run time from its tuning knobs
(csrc/blazr_kernels.h `BLZ_TUNE_*`, `Kernels.set_tune`); every value of a knob computes the same bits, so the
choice changes the speed and nothing else (the tests run every value). As oneDNN and FBGEMM dispatch, the
choice is made on the host that runs it: `apply()` times each knob's values on representative work (cold
weights at 1B-model shapes, alternating rounds, the best round of each — the least disturbed) and keeps a
value only when it beats the library's default by more than `MARGIN`. The result is written to
`<kernel cache dir>/tuning-<key>.json`, keyed by the library file (its hash covers the sources, compiler,
flags and, for -march=native, the CPU's flags), the CPU model and the thread count, and later loads read it
(~0.1 ms). While other work loads the cores (`busy()`) nothing is measured — timings then are noise (1-4 GB/s
where the quiet host reads 40-50, and the "winner" chosen by it a 1.6x slower form) — and the build's defaults
run until a load finds the host quiet; a choice forced on a busy host is marked and measured again then.

- `apply(k)`: the cached choice set on library `k`, measured first when there is none (~6 s once on 2 cores;
  `python -m blazr.kernels.build`, which `make install` runs, measures it at install). Called by
  `ops.kernels()` on the default library.
- Choices above the C knobs, kept in `CHOICES` for the code that reads them: the float32 prefill's GEMM
  (`f32_prefill`, loading/quantize.py), whether the loader re-lays each K-quant kind in 16-row groups
  (`kpack_q4_k`, `kpack_q6_k` on VNNI builds, `kpack_q4_k` on AVX2 ones: kernels/kquant_packed.py `wanted`,
  `packs_on`), on AVX2 builds whether it codes float
  rows (`coded_bf16`, `coded_f32`: kernels/coded.py) and re-lays a GGUF's Q8_0 in the row-packed layout
  (`q8pack_q8_0g`: kernels/q8_packed.py) — chosen like a knob, the loader's default kept unless the other
  form reads MARGIN faster; both forms give the same bits.
- `BLAZR_TUNE=off` keeps the defaults; `BLAZR_TUNE=force` measures again.
- `python -m blazr.kernels.tuning [--force]` measures and prints the table.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from blazr.kernels import build
from blazr.kernels.bindings import Kernels
from blazr.kernels.quant import QuantizedWeight

FORMAT = 8  # bumped when the file's meaning changes (2: + the float32 prefill GEMM's choice; 3: k1_zmm
# measured after streams_k; 4: + the K-quant layouts' choice, kpack_*; 5: + streams_z, coded_bf16 / coded_f32;
# 6: + q8pack, and the stream knobs of AVX2 builds; 7: + streams_kx, kpack_q4_k on AVX2 builds; 8: + k6_rows)
MARGIN = 0.03  # a value other than the default must be this much faster to be kept
ROUNDS = 5
MIN_TIME = 0.01  # seconds of each timing (a pass over the weights repeated)
# 1B-model shapes (Llama-3.2-1B: qkv, o, gate|up, down): [N, K]
SHAPES = ((3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192))
PREFILL_ROWS = 256  # a prompt chunk's rows for the float32 prefill GEMM's choice
KPACK_PROBES = ("q4_k", "q6_k")  # K-quant kinds whose layout is chosen (q5_k follows q4_k: the same walk)
CODED_PROBES = ("bf16", "f32")  # float kinds whose coded form (kernels/coded.py) is chosen or not
Q8PACK_PROBES = ("q8_0g",)  # a GGUF's Q8_0, re-laid in the row-packed layout or not (kernels/q8_packed.py)
# host choices made above the C knobs, as measured or read by the last `apply` (name → value)
CHOICES: dict[str, str] = {}


@dataclass(frozen=True)
class Knob:
    """One knob: its values in the order tried (the first that this build refuses ends the list) and the
    weight kinds whose one-row decode linear measures it."""

    name: str
    values: tuple[int, ...]
    kinds: tuple[str, ...]


KNOBS = (
    # the float walkers (f32, f16, bf16, Q8_0 as stored against fp32 x): at 1-8 x rows on AVX-512 builds, at
    # one on AVX2 ones (Zen 3, cold: f32 / bf16 / f16 / the Q8_0 head 1.16-1.41x from 1 stream to 4, §76)
    Knob("streams_f", (4, 2, 1), ("bf16",)),
    Knob("streams_q", (4, 2, 1), ("q4_0", "q4_1")),  # Zen 5: Q4_1 in 4 streams at half Q4_0's GB/s
    Knob("streams_q8g", (4, 2, 1), ("q8_0g",)),
    # streams_k before k1_zmm, which is measured at the stream count the host will run: the 512-bit sums pay
    # at 4 streams a thread and not at 1 (Zen 5, the probe: 33.0 against 31.6 GB/s at 4, 37.1 against 38.9
    # at 1; the 1B Q4_K_M decode step at 1 stream favoured either form by 5-8 % as the VM's rate moved)
    Knob("streams_k", (4, 2, 1), ("q4_k", "q6_k")),
    Knob("k1_zmm", (0, 1), ("q4_k", "q6_k")),
    Knob("streams_b32", (4, 2, 1), ("q5_0",)),
    Knob("streams_z", (4, 2, 1), ("bf16z",)),  # coded bf16 (csrc/linear_coded.c): Zen 5 reads 1 stream best
    Knob("streams_kx", (4, 2, 1), ("q4_kx",)),  # Q4_K's 16-row groups on AVX2 without VNNI (csrc/linear_kx.c)
    # Q6_K's one-row walk, after streams_k and k1_zmm (the tile walk, 0, runs at their choice): its rows one
    # at a time in 1, 2 or 4 streams (Zen 3, cold: in 2 streams 1.4-1.8x the tiles' GB/s; NOTES §74)
    Knob("k6_rows", (0, 1, 2, 4), ("q6_k",)),
)


def kpack_probes(features: list[str]) -> tuple[str, ...]:
    """The probed K-quant kinds whose layout a library with `features` chooses: those its group path runs
    (kernels/kquant_packed.py `packs_on`)."""
    from blazr.kernels import kquant_packed

    return tuple(kind for kind in KPACK_PROBES if kquant_packed.packs_on(kind, features))


def _weight(kind: str, n: int, k: int, g: torch.Generator) -> QuantizedWeight:
    """A random weight of `kind` made fast (random block bytes with a normal f16 scale; small floats): only
    the speed of reading it is measured."""
    from blazr.kernels import mxfp4, q5_0
    from blazr.kernels.kquant import random_bytes, random_kquant
    from blazr.kernels.quant import BLOCK_BYTES, FLOAT_KINDS, MXFP4, Q5_0, Q8_0G, quantize

    if kind in ("q4_k", "q5_k", "q6_k"):
        return random_kquant(kind, n, k, g)
    if kind == "q4_kx":
        from blazr.kernels import kquant_packed

        return kquant_packed.pack(random_kquant("q4_k", n, k, g))
    if kind == "bf16z":
        from blazr.kernels import coded

        packed = coded.pack(_weight("bf16", n, k, g))
        assert packed is not None  # uniform values: a few exponents a row
        return packed
    if kind in FLOAT_KINDS:
        return quantize(torch.empty(n, k).uniform_(-0.05, 0.05, generator=g).to(FLOAT_KINDS[kind]), kind)
    if kind in (MXFP4, Q5_0):
        blocks = (mxfp4 if kind == MXFP4 else q5_0).random_blocks(n, k, g)
        return QuantizedWeight.from_blocks(kind, blocks.reshape(n * k // 32, -1), n, k)
    bs = BLOCK_BYTES["q8_0" if kind == Q8_0G else kind]
    blocks = random_bytes((n * k // 32, bs), g)
    blocks[:, :2] = torch.tensor([0.01], dtype=torch.float16).view(torch.uint8)  # d (Q4_1: m after it)
    return QuantizedWeight.from_blocks(kind, blocks, n, k)


def _l3_bytes() -> int:
    try:
        text = Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
        return int(text[:-1]) << {"K": 10, "M": 20}[text[-1]]
    except (OSError, ValueError, KeyError):
        return 64 << 20


def _decode_weights(kind: str, g: torch.Generator) -> list[list[QuantizedWeight]]:
    """Enough copies of the 1B shapes in `kind` to leave the last-level cache (what a decode step reads)."""
    one = [_weight(kind, n, kk, g) for n, kk in SHAPES]
    size = sum(w.nbytes for w in one)
    copies = -(-3 * _l3_bytes() // size)  # ≥ 3× the last-level cache: every pass reads from memory
    return [one] + [[_weight(kind, n, kk, g) for n, kk in SHAPES] for _ in range(copies - 1)]


def _decode_pass(k: Kernels, weights: list[list[QuantizedWeight]]) -> tuple[Callable[[], None], int]:
    """A pass of one-row linears over `weights` (copies of SHAPES) and the bytes it reads."""
    g = torch.Generator().manual_seed(1)  # not the global generator: tuning runs inside a user's process
    xs = [torch.randn(1, kk, generator=g) for _, kk in SHAPES]

    def run() -> None:
        for ws in weights:
            for w, x in zip(ws, xs, strict=True):
                k.linear(x, w)

    return run, sum(w.nbytes for ws in weights for w in ws)


def _best_rates(variants: dict[Any, Callable[[], None]], nbytes: int) -> dict[Any, float]:
    """GB/s of each variant (a pass reading `nbytes`): ROUNDS alternating rounds, each timing at least
    MIN_TIME, the best round of each (the least disturbed)."""
    first = next(iter(variants.values()))
    t0 = time.perf_counter()
    first()
    reps = max(1, round(MIN_TIME / max(time.perf_counter() - t0, 1e-6)))
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(ROUNDS):
        for name, run in variants.items():
            t0 = time.perf_counter()
            for _ in range(reps):
                run()
            best[name] = min(best[name], (time.perf_counter() - t0) / reps)
    return {name: nbytes / t / 1e9 for name, t in best.items()}


def _accepted(k: Kernels, knob: Knob) -> tuple[int, ...]:
    """The knob's values this build takes."""
    ok = []
    for v in knob.values:
        try:
            with k.tuned(**{knob.name: v}):
                ok.append(v)
        except ValueError:
            break
    return tuple(ok)


def measure(k: Kernels, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Time every knob's values on this host (each knob with the others at the values chosen before it), then
    the choices made above the knobs (the K-quant layouts, the float32 prefill GEMM), and return {"knobs":
    {name: value}, "gbps": {name: {value: GB/s}}, "choices": {name: choice}, "gflops": …, "kpack_gbps": …};
    the knobs are left at the chosen values."""
    g = torch.Generator().manual_seed(0)
    chosen: dict[str, int] = {}
    rates: dict[str, dict[str, float]] = {}
    made: dict[str, list[list[QuantizedWeight]]] = {}
    for knob in KNOBS:
        values = _accepted(k, knob)
        default = k.tune_defaults[knob.name]
        if len(values) < 2:
            chosen[knob.name] = default
            continue
        passes = [_decode_pass(k, made.setdefault(kind, _decode_weights(kind, g))) for kind in knob.kinds]

        def run(v: int, passes: list[tuple[Callable[[], None], int]] = passes, name: str = knob.name) -> None:
            with k.tuned(**{name: v}):
                for one, _ in passes:
                    one()

        rate = _best_rates({v: partial(run, v) for v in values}, sum(b for _, b in passes))
        best = max(rate, key=rate.__getitem__)
        chosen[knob.name] = best if rate[best] > rate[default] * (1 + MARGIN) else default
        rates[knob.name] = {str(v): round(r, 2) for v, r in rate.items()}
        k.set_tune(knob.name, chosen[knob.name])
        if log:
            cells = ", ".join(f"{v}: {r:.1f} GB/s" for v, r in rate.items())
            log(f"  {knob.name}: {cells} → {chosen[knob.name]}")
    choices: dict[str, str] = {}
    above: dict[str, dict[str, dict[str, float]]] = {"kpack": {}, "coded": {}, "q8pack": {}}  # kind → rates
    for prefix, probes, path, choose, unit in (
        ("kpack", kpack_probes(k.features), "avx2", _kpack, "GB/s"),
        ("coded", CODED_PROBES, "avx2", _coded, "G weights/s"),
        ("q8pack", Q8PACK_PROBES, "avx2", _q8pack, "GB/s"),
    ):
        for kind in probes if path in k.features else ():
            name = f"{prefix}_{kind}"
            choices[name], above[prefix][kind] = choose(k, made.get(kind) or _decode_weights(kind, g))
            if log:
                cells = ", ".join(f"{v}: {r:.1f} {unit}" for v, r in above[prefix][kind].items())
                log(f"  {name}: {cells} → {choices[name]}")
    choice, gflops = _f32_prefill(k, g)
    if log:
        log(f"  f32_prefill: kernel {gflops['kernel']:.0f}, sgemm {gflops['sgemm']:.0f} GFLOP/s → {choice}")
    choices["f32_prefill"] = choice
    return {"knobs": chosen, "gbps": rates, "choices": choices, "gflops": gflops,
            "kpack_gbps": above["kpack"], "coded_gws": above["coded"],
            "q8pack_gbps": above["q8pack"]}  # fmt: skip


def _kpack(k: Kernels, stored: list[list[QuantizedWeight]]) -> tuple[str, dict[str, float]]:
    """A K-quant's one-row decode pass over cold weights as stored (linear_k.c) against the same weights
    re-laid in 16-row groups (linear_kx.c, kernels/kquant_packed.py): "groups", the loader's default where
    the build's group path runs the kind (`kquant_packed.packs_on`), unless the stored layout reads MARGIN
    faster here (Zen 5, 2 threads: the groups at 0.93-1.29x cold and 1.5-2.3x hot; an Emerald Rapids VM's 2
    threads read Q6_K at 16384 rows 0.78x, NOTES §57; Zen 3's AVX2 Q4_K 1.03-1.15x cold, NOTES §67)."""
    from blazr.kernels import kquant_packed

    return _stored_or(k, stored, "groups", kquant_packed.pack)  # GB/s: both layouts hold the same bytes


def _q8pack(k: Kernels, stored: list[list[QuantizedWeight]]) -> tuple[str, dict[str, float]]:
    """A GGUF's Q8_0 as stored (q8_0g) against the same weights in the row-packed layout
    (kernels/q8_packed.py), cold one-row decode passes at the tuned stream counts: "packed" only where it
    reads MARGIN faster — the stored layout is the loader's default, what an untuned host runs (Zen 3: packed
    in 4 streams 16.8-20.3 against 14-18 GB/s, NOTES §66)."""
    from blazr.kernels import q8_packed

    return _stored_or(k, stored, "packed", q8_packed.pack, default="stored")


def _coded(k: Kernels, stored: list[list[QuantizedWeight]]) -> tuple[str, dict[str, float]]:
    """A float kind's one-row decode pass over cold weights as stored against the same weights coded
    (linear_coded.c, kernels/coded.py), in weights a second: "coded", the loader's default on AVX2 builds,
    unless the stored kind reads MARGIN faster here. The coded pass reads 0.77x (bf16) / 0.88x (f32) the bytes
    but decodes them: it wins where the memory is the limit and loses where the memory outruns its decode (Zen
    5, 2 threads, the memory at 40-50 GB/s: bf16 1.2-1.4x, f32 1.1-1.15x; at 70-90 GB/s: bf16 1.1-1.3x, f32
    0.85-0.9x, NOTES §58)."""
    from blazr.kernels import coded

    return _stored_or(k, stored, "coded", coded.pack, per_weight=True)  # type: ignore[arg-type]


def _stored_or(
    k: Kernels,
    stored: list[list[QuantizedWeight]],
    alt: str,
    make: Callable[[QuantizedWeight], QuantizedWeight],
    per_weight: bool = False,
    default: str | None = None,
) -> tuple[str, dict[str, float]]:
    """Cold one-row decode passes over `stored` and over the same weights made `alt` by `make`: the
    `default` form (`alt` unless given: "stored") unless the other reads MARGIN faster here, and each form's
    rate — GB/s of the stored bytes, or (`per_weight`: forms of different sizes) G weights a second."""
    made = [[make(w) for w in ws] for ws in stored]
    (run_s, nbytes), (run_a, _) = _decode_pass(k, stored), _decode_pass(k, made)
    per = sum(w.out_features * w.in_features for ws in stored for w in ws) if per_weight else nbytes
    rate = _best_rates({alt: run_a, "stored": run_s}, per)
    default = default or alt
    other = "stored" if default == alt else alt
    choice = other if rate[other] > rate[default] * (1 + MARGIN) else default
    return choice, {name: round(r, 2) for name, r in rate.items()}


def _f32_prefill(k: Kernels, g: torch.Generator) -> tuple[str, dict[str, float]]:
    """Float32 prefill: the C panel GEMM (blz_linear_f32's many-row path) or torch's sgemm, whichever runs
    the 1B shapes at PREFILL_ROWS rows faster here (MKL's sgemm: 1.05-1.2x the panel on Sapphire Rapids,
    0.4-0.8x it on Zen 5). The build's rule (the panel where AVX-512 is absent) is the default, kept unless
    the other is MARGIN faster."""
    from blazr.kernels.quant import quantize

    ws = [torch.empty(n, kk).uniform_(-0.05, 0.05, generator=g) for n, kk in SHAPES]
    qs = [quantize(w, "f32") for w in ws]
    xs = [torch.randn(PREFILL_ROWS, kk, generator=g) for _, kk in SHAPES]
    runs = {
        "kernel": lambda: [k.linear(x, q, prefill=True) for x, q in zip(xs, qs, strict=True)],
        "sgemm": lambda: [torch.nn.functional.linear(x, w) for x, w in zip(xs, ws, strict=True)],
    }
    best = dict.fromkeys(runs, float("inf"))
    for run in runs.values():
        run()
    for _ in range(ROUNDS):
        for name, run in runs.items():
            t0 = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - t0)
    flops = 2 * PREFILL_ROWS * sum(n * kk for n, kk in SHAPES)
    gflops = {name: round(flops / t / 1e9, 1) for name, t in best.items()}
    default = "sgemm" if "avx512" in k.features else "kernel"
    other = "kernel" if default == "sgemm" else "sgemm"
    return (other if gflops[other] > gflops[default] * (1 + MARGIN) else default), gflops


def takes(env: str, name: str, value: str, default: str) -> bool:
    """Whether the loader takes form `value` of the choice `name` (`CHOICES`): environment variable `env`
    (0 / 1) decides when set, else host tuning's choice, `default` where nothing was measured."""
    forced = os.environ.get(env)
    if forced in ("0", "1"):
        return forced == "1"
    return CHOICES.get(name, default) == value


BUSY_WINDOW = 0.25  # seconds over which `busy` reads the cores' use


def _cpu_times() -> tuple[int, int, int] | None:
    """(busy, total) jiffies since boot of the CPUs this process may run on and their count, from /proc/stat;
    None where there is none."""
    try:
        with open("/proc/stat") as f:
            text = f.read()
    except OSError:
        return None
    return stat_times(text, build.usable_cpus())


def stat_times(text: str, cpus: set[int] | None) -> tuple[int, int, int]:
    """(busy, total) jiffies of /proc/stat's CPUs in `cpus` (None: all) and their count: a process pinned to
    some cores of a large shared host (taskset, a cgroup's cpuset) is not kept from measuring by others' work
    on the rest. Where the per-CPU lines are missing or none is in `cpus`, the machine's total line."""
    rows, listed = [], 0
    for line in text.splitlines():
        name, *values = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            listed += 1
            if cpus is None or int(name[3:]) in cpus:
                rows.append([int(v) for v in values])
    count = len(rows)
    if not rows:  # the total line: all `listed` CPUs (1 where none is listed)
        rows, count = [[int(v) for v in text.splitlines()[0].split()[1:]]], max(listed, 1)
    busy = total = 0
    for fields in rows:  # user nice system idle iowait irq softirq steal ...; guest time is counted in user
        total += sum(fields[:8])
        busy += sum(fields[:8]) - fields[3] - fields[4]
    return busy, total, count


def busy() -> bool:
    """Whether other work competes for the cores now — more than half the usable cores' worth of CPU in use
    over the last BUSY_WINDOW seconds (/proc/stat; elsewhere the 1-minute load average): a choice measured
    then is used but marked, and measured again at a load that finds the host quiet. The load average alone
    lags by a minute: right after the kernels compile (`make install`'s build, then its tuning) it still read
    busy on an idle host, so the tuning was never measured at install and an untuned process ran the
    defaults."""
    first = _cpu_times()
    if first is None:
        try:
            return os.getloadavg()[0] > 0.5 * build.usable_cores()
        except OSError:
            return False
    time.sleep(BUSY_WINDOW)
    second = _cpu_times()
    assert second is not None
    used, total = second[0] - first[0], second[1] - first[1]
    return total > 0 and used / total * second[2] > 0.5 * build.usable_cores()


def _key(k: Kernels) -> tuple[Path, dict[str, Any]]:
    name = build.loaded_name() or "library"
    ident = {"format": FORMAT, "library": name, "cpu": build.cpu_model(), "threads": torch.get_num_threads()}
    stem = Path(name).stem.removeprefix("kernels-")
    return build.cache_dir() / f"tuning-{stem}-t{ident['threads']}.json", ident


def apply(k: Kernels, force: bool = False, log: Callable[[str], None] | None = None) -> dict[str, int]:
    """Set the tuned knob values on `k`: read from the cache file, or measured and written (then also when
    `force` or `BLAZR_TUNE=force`, or when the file's choice was measured on a busy host and this one is
    quiet). `BLAZR_TUNE=off` leaves the defaults. Returns the values set."""
    mode = os.environ.get("BLAZR_TUNE", "on").strip().lower()
    if mode in ("0", "off", "false", "no"):
        return {}
    path, ident = _key(k)
    if not force and mode != "force":
        try:
            data = json.loads(path.read_text())
            if all(data.get(f) == v for f, v in ident.items()) and not (data.get("busy") and not busy()):
                for name, value in data["knobs"].items():
                    k.set_tune(name, value)
                CHOICES.update(data["choices"])
                return dict(data["knobs"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # absent, damaged, of another build, or measured on a busy host that is quiet now: anew
        if busy():
            return {}  # no timing worth keeping now: the defaults, measured by a load that finds it quiet
        marked = False
    else:
        marked = busy()
    result = {"busy": marked, **measure(k, log)}
    CHOICES.update(result["choices"])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({**ident, **result}, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache: measured again next time
    return dict(result["knobs"])


def main() -> int:
    """`python -m blazr.kernels.tuning [--force]`: measure (or read) this host's choice and print it."""
    from blazr.kernels import ops

    k = ops.kernels()  # tuned at first use (measured now if this host and build have no choice cached)
    if k is None:
        print("blazr kernels unavailable: nothing to tune", file=sys.stderr)
        return 1
    print(f"cpu: {build.cpu_model()}; library {build.loaded_name()}; threads {torch.get_num_threads()}")
    knobs = apply(k, force="--force" in sys.argv, log=print)
    path, _ = _key(k)
    if path.exists() and "--force" not in sys.argv:
        for name, rate in json.loads(path.read_text()).get("gbps", {}).items():
            print(f"  {name}: " + ", ".join(f"{v}: {r} GB/s" for v, r in rate.items()))
    print("tuned: " + (", ".join(f"{n}={v}" for n, v in knobs.items()) or "defaults (BLAZR_TUNE=off)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
