"""Replicas on Ray Serve (issue 17): what 1 vs 2 replicas cost and give on this machine.

    python benchmarks/replicas.py [--model PATH] [--concurrency 1,4,16] [--num-prompts 32]
                                  [--input-len 128] [--output-len 64] [--json FILE]

Three servers of the same model (default: the embedded SmolLM2-135M), one after another, each measured by
`blazr bench` (streamed /v1/completions, `ignore_eos`, new prompts per level) at every concurrency level:
  serve     plain `blazr serve --num-threads 2` (no Ray): the baseline;
  ray 1×2   `blazr serve --ray --num-replicas 1 --num-threads 2`: the cost of Ray's proxy + ingress hop;
  ray 2×1   `blazr serve --ray --num-replicas 2 --num-threads 1`: two engines of one core each.
Startup = from spawning the command to GET /health answering 200. Memory = PSS (shared pages split between
the processes that map them) from /proc/PID/smaps_rollup, summed over the server's process tree after the
run: per replica (the `ray::ServeReplica:…BlazrReplica` processes), the ingress, and the rest of Ray
(GCS, raylet, the Serve controller and proxy, agents). Reported, never asserted; one round (the machine
may be shared: check `ps aux --sort=-%cpu | head` first).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.host import host_line  # noqa: E402
from benchmarks.run import log, versions  # noqa: E402
from benchmarks.serve import Server  # noqa: E402
from tests.server_util import descendants  # noqa: E402

from blazr.distributed.worker import free_port  # noqa: E402

MiB = 1 << 20
SETUPS = {
    "serve": ["--num-threads", "2"],
    "ray 1×2": ["--ray", "--num-replicas", "1", "--num-threads", "2"],
    "ray 2×1": ["--ray", "--num-replicas", "2", "--num-threads", "1"],
}


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants."""
    return [pid, *descendants(pid)]


def _pss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()
    except OSError:
        return ""


def memory(pid: int) -> dict[str, Any]:
    """PSS in MiB: each replica, the ingress, the rest of Ray, the total."""
    replicas, ingress, rest = [], 0, 0
    total = 0
    for p in _tree(pid):
        pss, name = _pss(p), _name(p)
        total += pss
        if "BlazrReplica" in name:
            replicas.append(round(pss / MiB))
        elif "BlazrIngress" in name:
            ingress += pss
        elif p != pid:
            rest += pss
    return {
        "replicas_mib": sorted(replicas),
        "ingress_mib": round(ingress / MiB),
        "ray_rest_mib": round(rest / MiB),
        "main_process_mib": round(_pss(pid) / MiB),
        "total_mib": round(total / MiB),
    }


def run_setup(name: str, flags: list[str], args: argparse.Namespace, seed: int) -> dict[str, Any]:
    port = free_port()
    cmd = [sys.executable, "-m", "blazr", "serve", "--cpu", "--host", "127.0.0.1", "--port", str(port)]
    cmd += [*(["--model", args.model] if args.model else []), *flags]
    log(f"{name}: {' '.join(cmd[2:])}")
    t0 = time.perf_counter()
    server = Server(name.replace(" ", "-").replace("×", "x"), cmd, port)
    try:
        server.wait_ready()
        startup = time.perf_counter() - t0
        log(f"{name}: ready in {startup:.1f}s")
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            bench = [sys.executable, "-m", "blazr", "bench", "--base-url", server.url]
            bench += ["--concurrency", args.concurrency, "--num-prompts", str(args.num_prompts)]
            bench += ["--input-len", str(args.input_len), "--output-len", str(args.output_len)]
            bench += ["--seed", str(seed), "--json", out.name]
            done = subprocess.run(bench, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"blazr bench failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
            log(done.stdout)
            levels = json.loads(Path(out.name).read_text())["results"]
        mem = memory(server.proc.pid)
    finally:
        t1 = time.perf_counter()
        server.stop()
        stop_s = time.perf_counter() - t1
    # the 1-minute load average after the run: well above the server's own cores means something else ran
    load = os.getloadavg()[0]
    return {
        "name": name,
        "startup_s": startup,
        "stop_s": stop_s,
        "memory": mem,
        "levels": levels,
        "load": load,
    }


def table(results: list[dict[str, Any]]) -> str:
    levels = [lv["concurrency"] for lv in results[0]["levels"]]
    head = "| setup | startup s | " + " | ".join(f"out tok/s @{c}" for c in levels)
    head += " | " + " | ".join(f"TTFT ms @{c}" for c in levels) + " | PSS per replica MiB | total PSS MiB |"
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        tps = " | ".join(f"{lv['output_throughput']:.1f}" for lv in r["levels"])
        ttft = " | ".join(f"{lv['median_ttft_ms']:.0f}" for lv in r["levels"])
        mem = r["memory"]
        per = ", ".join(str(m) for m in mem["replicas_mib"]) or f"{mem['main_process_mib']} (one process)"
        rows.append(f"| {r['name']} | {r['startup_s']:.1f} | {tps} | {ttft} | {per} | {mem['total_mib']} |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="checkpoint (default: the embedded SmolLM2)")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--setups", default=",".join(SETUPS), help="which of: " + ", ".join(SETUPS))
    p.add_argument("--json", default=None, metavar="FILE")
    args = p.parse_args()
    log(f"{host_line()}\n{versions()}")
    results = [
        run_setup(name, SETUPS[name], args, seed=1000 + i) for i, name in enumerate(args.setups.split(","))
    ]
    print(table(results))
    for r in results:
        print(
            f"{r['name']}: memory {r['memory']}, stopped in {r['stop_s']:.1f}s, load average {r['load']:.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
