"""CUDA speed table: blazr with captured CUDA graphs vs blazr eager vs transformers, bf16, one GPU.

The model is SmolLM2-135M's architecture (Llama: 30 layers, hidden 576, 9 / 3 heads, vocab 49152, tied
embeddings) — by default with random weights, built here by transformers (speed does not depend on the
values, and nothing is downloaded) — or `--model PATH`. Measured, each the median of --repeats runs after a
warm-up, with the same prompts for every engine:

    prefill tok/s      a --prompt-len prompt processed once (time to the first token)
    decode tok/s       tokens 2..--gen generated after it
    batch N tok/s      aggregate decode rate of N concurrent sequences (--batch-prompt-len prompts)

Also checked (printed): blazr's greedy tokens with graphs against its eager ones, and its bf16 logits
against transformers' on the same weights. Not part of `make test`; run on a CUDA machine:

    python benchmarks/gpu.py [--model PATH] [--prompt-len 512] [--gen 128] [--batches 1,4,16,64]
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


def _sync_time() -> float:
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


def transformers_single(path: Path, ids: list[int], gen: int, repeats: int) -> tuple[float, float]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    x = torch.tensor([ids], device="cuda")

    @torch.inference_mode()
    def run() -> tuple[float, float]:
        t0 = _sync_time()
        out = model(input_ids=x, use_cache=True)
        tok = out.logits[:, -1:].argmax(-1)
        t1 = _sync_time()
        past = out.past_key_values
        for _ in range(gen - 1):
            out = model(input_ids=tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        return len(ids) / (t1 - t0), (gen - 1) / (_sync_time() - t1)

    return _median(run, repeats)


@torch.inference_mode()
def logits_vs_transformers(llm, path: Path, ids: list[int]) -> str:
    """blazr's prefill logits against transformers' on the same weights and prompt (both bf16 on CUDA)."""
    from transformers import AutoModelForCausalLM

    from blazr.state.batch import ForwardBatch

    ref_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    ref = ref_model(input_ids=torch.tensor([ids], device="cuda")).logits[0].float()
    del ref_model
    x = torch.tensor(ids, device="cuda")
    batch = ForwardBatch.prefill([len(ids)], "cuda")
    ours = llm.model.compute_logits(llm.model(x, batch, None), decode=False).float()
    err = float((ours - ref).abs().max() / ref.std())
    top1 = float((ours.argmax(-1) == ref.argmax(-1)).float().mean())
    return f"max |Δlogit| {err:.3f} × logit std, top-1 agreement {top1:.3f} over {len(ids)} positions"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--vocab", default="cl100k_base", help="tokenizer for a checkpoint without one")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--batch-prompt-len", type=int, default=128)
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 1
    from blazr import LLM, SamplingParams
    from blazr.config import EngineConfig

    path = args.model or random_smollm2(Path(tempfile.mkdtemp()) / "smollm2-random")
    batches = [int(b) for b in args.batches.split(",")]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 49000, (args.prompt_len,), generator=g).tolist()
    plen = args.batch_prompt_len
    prompts = [torch.randint(100, 49000, (plen,), generator=g).tolist() for _ in range(max(batches))]

    def load(graphs: bool) -> LLM:
        cfg = EngineConfig(
            max_num_seqs=max(batches),
            max_model_len=max(args.prompt_len, args.batch_prompt_len) + args.gen + 16,
            max_num_batched_tokens=4096,
            cuda_graphs=graphs,
            enable_prefix_caching=False,  # the prefill rounds repeat one prompt
        )
        return LLM(path, vocab=None if args.model else args.vocab, engine_config=cfg)

    rows: list[tuple[str, float, float, list[float]]] = []
    greedy: dict[str, list[list[int]]] = {}
    for name, graphs in (("blazr, CUDA graphs", True), ("blazr, eager", False)):
        llm = load(graphs)
        assert (llm.runner.graphs is not None) == graphs, "graph decoder not created"
        params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
        greedy[name] = [r.outputs[0].token_ids for r in llm.generate(prompts[:8], params)]
        pf, dec = blazr_single(llm, ids, args.gen, args.repeats)
        agg = [blazr_batch(llm, prompts[:n], args.gen, args.repeats) for n in batches]
        rows.append((name, pf, dec, agg))
        summary = f"prefill {pf:.0f}, decode {dec:.1f}, batches {[round(a) for a in agg]}"
        print(f"# {name}: {summary}", file=sys.stderr)
        if graphs:
            print(f"# graphs captured (batch, keys): {llm.runner.graphs.buckets}", file=sys.stderr)
            parity = logits_vs_transformers(llm, path, ids[:64])
        del llm
        torch.cuda.empty_cache()
    pf, dec = transformers_single(path, ids, args.gen, args.repeats)
    rows.append(("transformers (eager, DynamicCache)", pf, dec, []))
    same = sum(a == b for a, b in zip(*greedy.values(), strict=True))
    import transformers

    gpu = torch.cuda.get_device_name()
    print(f"{gpu}, torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"model: {'SmolLM2-135M architecture, random bf16 weights' if args.model is None else args.model}")
    print(f"single sequence: prompt {args.prompt_len}, {args.gen} generated; batches: prompts of "
          f"{args.batch_prompt_len}, {args.gen} generated each; median of {args.repeats}")  # fmt: skip
    print(f"greedy tokens, graphs vs eager: {same}/{len(greedy['blazr, eager'])} sequences of 32 identical")
    print(f"blazr vs transformers, bf16 logits: {parity}\n")
    cols = " | ".join(f"batch {n} tok/s" for n in batches)
    head = f"| engine | prefill tok/s | decode tok/s | {cols} |"
    print(head)
    print("|---|" + "---:|" * (2 + len(batches)))
    for name, pf, dec, agg in rows:
        cells = [f"{a:.0f}" for a in agg] or ["–"] * len(batches)
        print(f"| {name} | {pf:.0f} | {dec:.1f} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
