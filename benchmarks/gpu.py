"""CUDA speed table: blazr with captured CUDA graphs vs blazr eager vs transformers, bf16, one GPU.

The model is SmolLM2-135M's architecture (Llama: 30 layers, hidden 576, 9 / 3 heads, vocab 49152, tied
embeddings) — by default with random weights, built here by transformers (speed does not depend on the
values, and nothing is downloaded) —, `--model PATH`, or `--family A,B,…`: random bf16 weights at the
published shapes of `benchmarks/hybrid_peers.py` (qwen3.5-0.8b, kimi-linear-scaled-0.88b, lfm2-350m,
mamba-130m, …), one table each. A model whose mixers no CUDA graph may hold (engine/cuda_graphs.py:
recurrent state, MoE routing) has no graphs row. Measured, each the median of --repeats runs after a
warm-up, with the same prompts for every engine:

    prefill tok/s      a --prompt-len prompt processed once (time to the first token)
    decode tok/s       tokens 2..--gen generated after it
    batch N tok/s      aggregate decode rate of N concurrent sequences (--batch-prompt-len prompts)

Also checked (printed): blazr's greedy tokens with graphs against its eager ones, and its bf16 logits
against transformers' on the same weights. Not part of `make test`; run on a CUDA machine:

    python benchmarks/gpu.py [--model PATH | --family NAMES] [--prompt-len 512] [--gen 128] \
        [--batches 1,4,16,64]

`--device cpu` runs the same paths on the CPU (no graphs rows): a check of the script where no GPU is.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks.hybrid_peers, tests.tiny

SMOLLM2 = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    tie_word_embeddings=True,
    rope_theta=100000.0,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
)


def random_smollm2(out: Path) -> Path:
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMOLLM2)).to(torch.bfloat16)
    model.save_pretrained(out)
    return out


def random_family(name: str, out: Path, device: str) -> Path:
    """transformers' model of `name` (benchmarks/hybrid_peers.MODELS) at its shape, random weights as
    hybrid_peers builds them (`random_model`, made on `device`), saved in bfloat16 to `out`."""
    from benchmarks.hybrid_peers import MODELS, random_model

    arch, cfg, _ = MODELS[name]
    random_model(arch, cfg, device).to(torch.bfloat16).save_pretrained(out)
    return out


def _sync_time() -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def _median(run: Callable[[], tuple[float, float]], repeats: int) -> tuple[float, float]:
    run()  # warm-up (graph capture, cuBLAS workspaces)
    a, b = zip(*(run() for _ in range(repeats)), strict=True)
    return statistics.median(a), statistics.median(b)


def blazr_single(llm, ids: list[int], gen: int, repeats: int) -> tuple[float, float]:
    from blazr import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=gen, ignore_eos=True)

    def run() -> tuple[float, float]:
        t0, first = _sync_time(), None
        for _ in llm.stream_ids(ids, params):
            if first is None:
                first = _sync_time()
        end = _sync_time()
        return len(ids) / (first - t0), (gen - 1) / (end - first)

    return _median(run, repeats)


def blazr_batch(llm, prompts: list[list[int]], gen: int, repeats: int) -> float:
    """Aggregate decode tok/s: all prompts prefilled first, then the decode steps timed."""
    from blazr import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=gen, ignore_eos=True)
    eng = llm.engine

    def run() -> tuple[float, float]:
        for i, p in enumerate(prompts):
            eng.add_request(f"b{time.monotonic_ns()}-{i}", p, params)
        while any(not s.output_ids for r in eng.requests.values() for s in r.seqs):
            eng.step()
        t0, tokens = _sync_time(), 0
        while eng.has_unfinished():
            tokens += sum(len(o.token_ids) for o in eng.step())
        return tokens / (_sync_time() - t0), 0.0

    return _median(run, repeats)[0]


def transformers_single(
    path: Path, ids: list[int], gen: int, repeats: int, device: str
) -> tuple[float, float]:
    """transformers' prefill (one forward) and decode (`generate` of `gen` tokens, less that prefill) — its
    own cache handling for every architecture (a hybrid's cache class, Mamba's cache_params)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device).eval()
    x = torch.tensor([ids], device=device)

    @torch.inference_mode()
    def run() -> tuple[float, float]:
        t0 = _sync_time()
        model(input_ids=x)
        prefill = _sync_time() - t0
        t1 = _sync_time()
        model.generate(x, max_new_tokens=gen, min_new_tokens=gen, do_sample=False)
        return len(ids) / prefill, (gen - 1) / (_sync_time() - t1 - prefill)

    return _median(run, repeats)


@torch.inference_mode()
def logits_vs_transformers(llm, path: Path, ids: list[int]) -> str:
    """blazr's prefill logits (its dtype on its device: bf16 on CUDA) and transformers' in bf16, each against
    transformers in float32 on the same weights and prompt — the float model judges both."""
    from transformers import AutoModelForCausalLM

    from blazr.state.batch import ForwardBatch

    device = llm.device
    x = torch.tensor([ids], device=device)
    got = {}
    for dtype in (torch.float32, torch.bfloat16):
        ref_model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        got[dtype] = ref_model(input_ids=x).logits[0].float()
        del ref_model
    batch = ForwardBatch.prefill([len(ids)], device)
    ours = llm.model.compute_logits(llm.model(x[0], batch, None), decode=False).float()
    ref = got[torch.float32]

    def judged(logits: torch.Tensor) -> str:
        err = float((logits - ref).abs().max() / ref.std())
        top1 = float((logits.argmax(-1) == ref.argmax(-1)).float().mean())
        return f"max |Δlogit| {err:.3f} × logit std, top-1 {top1:.3f}"

    return (
        f"against transformers float32 over {len(ids)} positions — blazr ({llm.dtype}): {judged(ours)}; "
        f"transformers bf16: {judged(got[torch.bfloat16])}"
    )


def measure(path: Path, label: str, vocab: str | None, args: argparse.Namespace) -> str:
    """The table of one model: blazr with graphs (where a graph may hold every layer) and eager, then
    transformers; returns it as markdown, with the checks above it."""
    from blazr import LLM, SamplingParams
    from blazr.config import EngineConfig
    from blazr.detect import inspect_checkpoint
    from blazr.engine.cuda_graphs import is_supported

    batches = [int(b) for b in args.batches.split(",")]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 49000, (args.prompt_len,), generator=g).tolist()
    plen = args.batch_prompt_len
    prompts = [torch.randint(100, 49000, (plen,), generator=g).tolist() for _ in range(max(batches))]
    cpu = args.device == "cpu"

    def load(graphs: bool) -> LLM:
        cfg = EngineConfig(
            max_num_seqs=max(batches),
            max_model_len=max(args.prompt_len, args.batch_prompt_len) + args.gen + 16,
            max_num_batched_tokens=4096,
            cuda_graphs=graphs,
            enable_prefix_caching=False,  # the prefill rounds repeat one prompt
            cache_memory_gib=4.0,
        )
        return LLM(path, vocab=vocab, engine_config=cfg, cpu=cpu)

    rows: list[tuple[str, float, float, list[float]]] = []
    greedy: dict[str, list[list[int]]] = {}
    parity = "not measured"
    engines = [("blazr, eager", False)]
    graphable = not cpu and is_supported(inspect_checkpoint(path, vocab_name=vocab).config)
    if graphable:
        engines.insert(0, ("blazr, CUDA graphs", True))
    for name, graphs in engines:
        llm = load(graphs)
        assert (llm.runner.graphs is not None) == graphs, "graph decoder not created"
        params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
        greedy[name] = [r.outputs[0].token_ids for r in llm.generate(prompts[:8], params)]
        pf, dec = blazr_single(llm, ids, args.gen, args.repeats)
        agg = [blazr_batch(llm, prompts[:n], args.gen, args.repeats) for n in batches]
        rows.append((name, pf, dec, agg))
        summary = f"prefill {pf:.0f}, decode {dec:.1f}, batches {[round(a) for a in agg]}"
        print(f"# {label}, {name}: {summary}", file=sys.stderr)
        if graphs:
            print(f"# graphs captured (batch, keys): {llm.runner.graphs.buckets}", file=sys.stderr)
        if name == "blazr, eager":
            try:
                parity = logits_vs_transformers(llm, path, ids[:64])
            except Exception as e:  # transformers' model could not run here: blazr's rows still count
                parity = f"not measured: transformers failed ({type(e).__name__}: {e})"
        del llm
        if not cpu:
            torch.cuda.empty_cache()
    try:
        pf, dec = transformers_single(path, ids, args.gen, args.repeats, args.device)
        rows.append(("transformers (eager, generate)", pf, dec, []))
    except Exception as e:
        print(f"# {label}, transformers failed: {type(e).__name__}: {e}", file=sys.stderr)
    lines = [f"model: {label}"]
    if graphable:
        same = sum(a == b for a, b in zip(*greedy.values(), strict=True))
        lines.append(
            f"greedy tokens, graphs vs eager: {same}/{len(greedy['blazr, eager'])} sequences of 32 identical"
        )
    else:
        lines.append("no CUDA graphs: a layer holds a mixer or MoE no graph may hold (engine/cuda_graphs.py)")
    lines.append(f"prefill logits {parity}\n")
    cols = " | ".join(f"batch {n} tok/s" for n in batches)
    lines.append(f"| engine | prefill tok/s | decode tok/s | {cols} |")
    lines.append("|---|" + "---:|" * (2 + len(batches)))
    for name, pf, dec, agg in rows:
        cells = [f"{a:.0f}" for a in agg] or ["–"] * len(batches)
        lines.append(f"| {name} | {pf:.0f} | {dec:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--family", default="", help="hybrid_peers.MODELS names, comma-separated")
    ap.add_argument("--vocab", default="cl100k_base", help="tokenizer for a checkpoint without one")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--batch-prompt-len", type=int, default=128)
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device (--device cpu checks the script's paths on the CPU)", file=sys.stderr)
        return 1
    import transformers

    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"{where}, torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"single sequence: prompt {args.prompt_len}, {args.gen} generated; batches: prompts of "
          f"{args.batch_prompt_len}, {args.gen} generated each; median of {args.repeats}\n")  # fmt: skip
    tmp = Path(tempfile.mkdtemp())
    if args.family:
        failed = 0
        for name in args.family.split(","):
            try:
                path = random_family(name, tmp / name, args.device)
                print(measure(path, f"{name} shape, random bf16 weights", args.vocab, args), flush=True)
            except (
                Exception
            ) as e:  # one family's failure (a transformers without its class) ends only its table
                failed += 1
                print(f"model: {name}: FAILED {type(e).__name__}: {e}\n", flush=True)
                import traceback

                traceback.print_exc()
        return 1 if failed else 0
    path = args.model or random_smollm2(tmp / "smollm2-random")
    label = "SmolLM2-135M architecture, random bf16 weights" if args.model is None else str(args.model)
    print(measure(path, label, None if args.model else args.vocab, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
