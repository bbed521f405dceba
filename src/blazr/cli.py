"""Command line: `blazr generate | serve | info | decode | chat | bench` — thin wrappers over the API.

Every command defaults to the embedded SmolLM2-135M-Instruct when `--model` is omitted. User errors
(bad paths, broken checkpoints, bad flags) print one line `error: …` to stderr and exit 1, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence

from blazr.errors import BlazrError


def _prefix_cache_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-prefix-cache",
        action="store_true",
        help="do not reuse the cache of earlier prompts' common prefixes (on by default)",
    )


def _common(p: argparse.ArgumentParser, *, weights: bool = True) -> None:
    p.add_argument(
        "--model",
        "-m",
        help="checkpoint dir, .safetensors/.gguf file or HF repo id (default: embedded SmolLM2)",
    )
    p.add_argument(
        "--vocab", help="tokenizer vocabulary name (cl100k_base, llama3, deepseek_v3, o200k_base, …)"
    )
    p.add_argument(
        "--log-level",
        default=os.environ.get("BLAZR_LOG", "warning"),
        help="debug|info|warning|error (env BLAZR_LOG)",
    )
    if weights:
        p.add_argument("--cpu", action="store_true", help="run on the CPU even when CUDA is available")
        p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
        p.add_argument("--max-model-len", type=int, default=None, help="context limit (prompt + completion)")
        p.add_argument(
            "--cache-memory",
            type=float,
            default=None,
            metavar="GIB",
            help="memory for the KV / recurrent-state cache in GiB (default: half of the memory available "
            "after loading the weights); it must hold one --max-model-len sequence",
        )
        p.add_argument(
            "--quantize",
            default="auto",
            choices=["auto", "none", "int8", "int4", "bf16"],
            help="linear weights on the CPU: auto keeps a GGUF's tensors as stored (Q4_0/Q4_1/Q8_0, "
            "K-quants, F16/BF16); int8 / int4 / bf16 convert any checkpoint at load (Q8_0 / Q4_1 blocks, "
            "bfloat16) and keep the result for later loads (BLAZR_QUANT_CACHE=DIR|off, default "
            "~/.cache/blazr/quantized); none keeps float weights",
        )
        p.add_argument(
            "--kv-cache-dtype",
            default="auto",
            choices=["auto", "float32", "bfloat16", "float16"],
            help="attention K/V cache element type: auto is float16 on the CPU with quantized or 16-bit "
            "weights (as llama.cpp), else the model dtype",
        )
        p.add_argument(
            "--tensor-parallel-size",
            "-tp",
            type=int,
            default=1,
            metavar="N",
            help="split the model over N ranks (torch.distributed: gloo on the CPU, NCCL on CUDA); blazr "
            "starts ranks 1..N-1 on this machine, or run every rank under torchrun (several nodes too)",
        )
        _prefix_cache_flag(p)
        _speculative_flags(p)


def _speculative_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--speculative",
        choices=["ngram", "draft"],
        default=None,
        help="speculative decoding: ngram drafts from the prompt and output (prompt lookup), draft from "
        "--draft-model; greedy output is unchanged, sampled output keeps its distribution (off by default)",
    )
    p.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=4,
        metavar="K",
        help="drafted tokens a sequence may carry in one step (default 4; adaptive per sequence)",
    )
    p.add_argument(
        "--draft-model", default=None, metavar="PATH", help="the draft model of --speculative draft"
    )


def _sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=100)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.9)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens")


def _params(args: argparse.Namespace):
    from blazr.engine.sampling import SamplingParams

    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        stop=list(args.stop),
        ignore_eos=args.ignore_eos,
    )


def _llm(args: argparse.Namespace, **kwargs):
    from blazr.config import speculative_from_flags
    from blazr.llm import LLM

    return LLM(
        args.model,
        vocab=args.vocab,
        cpu=args.cpu,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        cache_memory=args.cache_memory,
        quantize=args.quantize,
        kv_cache_dtype=args.kv_cache_dtype,
        enable_prefix_caching=not args.no_prefix_cache,
        show_progress=sys.stderr.isatty(),
        tensor_parallel_size=args.tensor_parallel_size,
        speculative=speculative_from_flags(args.speculative, args.num_speculative_tokens, args.draft_model),
        **kwargs,
    )


# ------------------------------------------------------------------------------------------ commands


def cmd_generate(args: argparse.Namespace) -> int:
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    llm = _llm(args)
    params = _params(args)
    prompt_ids = llm.tokenizer.encode(prompt)
    t0 = time.perf_counter()
    first = None
    n = 0
    reason = None
    for out in llm.stream_ids(prompt_ids, params):
        if first is None:
            first = time.perf_counter()
        n += len(out.token_ids)
        if out.text:
            sys.stdout.write(out.text)
            sys.stdout.flush()
        if out.finished:
            reason = out.finish_reason
    end = time.perf_counter()
    sys.stdout.write("\n")
    decode_s = end - (first or end)
    print(
        f"[{len(prompt_ids)} prompt tokens, {n} generated, finish={reason}; "
        f"prefill {len(prompt_ids) / max((first or end) - t0, 1e-9):.1f} tok/s, "
        f"decode {(n - 1) / decode_s if n > 1 and decode_s > 0 else 0:.1f} tok/s; "
        f"load {llm.load_seconds:.1f}s]",
        file=sys.stderr,
    )
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from blazr.config import EngineConfig
    from blazr.detect import inspect_checkpoint, resolve_model_path
    from blazr.info import describe

    ckpt = inspect_checkpoint(resolve_model_path(args.model), vocab_name=args.vocab)
    limit = args.max_model_len or min(ckpt.config.max_position_embeddings, 4096)
    engine = EngineConfig(
        max_num_seqs=args.max_num_seqs,
        max_model_len=limit,
        cache_memory_gib=args.cache_memory,
        enable_prefix_caching=not args.no_prefix_cache,
    )
    print(json.dumps(describe(ckpt, engine=engine), indent=2))
    return 0


def cmd_decode(args: argparse.Namespace) -> int:
    from blazr.tokenizer import TokenizerSource, load_tokenizer

    try:
        ids = [int(x) for x in args.ids.replace(" ", "").split(",") if x]
    except ValueError:
        raise BlazrError(f"--ids must be comma-separated integers, got {args.ids!r}") from None
    if args.vocab and not args.model:
        tok = load_tokenizer(TokenizerSource(vocab_name=args.vocab))
    else:
        from blazr.detect import inspect_checkpoint, resolve_model_path

        ckpt = inspect_checkpoint(resolve_model_path(args.model), vocab_name=args.vocab)
        tok = load_tokenizer(ckpt.tokenizer)
    bad = [i for i in ids if not 0 <= i < tok.vocab_size]
    if bad:
        raise BlazrError(f"token id {bad[0]} is out of range for {tok.name} (vocab size {tok.vocab_size})")
    print(tok.decode(ids, skip_special=not args.special))
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    llm = _llm(args)
    params = _params(args)
    history: list[dict] = []
    if args.system:
        history.append({"role": "system", "content": args.system})
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"blazr chat — {llm.name}. /reset clears the conversation, /exit quits.", file=sys.stderr)
    while True:
        if interactive:
            sys.stderr.write("> ")
            sys.stderr.flush()
        line = sys.stdin.readline()
        if not line:
            return 0
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return 0
        if text == "/reset":
            history = history[:1] if args.system else []
            continue
        history.append({"role": "user", "content": text})
        ids = llm.tokenizer.encode_chat(history)
        reply = []
        for out in llm.stream_ids(ids, params):
            if out.text:
                reply.append(out.text)
                sys.stdout.write(out.text)
                sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
        history.append({"role": "assistant", "content": "".join(reply)})


def cmd_serve(args: argparse.Namespace) -> int:
    from blazr.server.options import ServerConfig

    config = ServerConfig.from_args(args)
    if not config.ray:
        if (config.num_replicas, config.min_replicas, config.max_replicas) != (None, None, None):
            raise BlazrError("--num-replicas, --min-replicas and --max-replicas need --ray")
        from blazr.server.app import serve

        serve(args)
        return 0
    try:
        from blazr.server.ray_serve import serve_ray
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "ray":
            raise
        raise BlazrError("--ray needs Ray Serve: pip install 'blazr[ray]'") from None
    serve_ray(config)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from blazr.bench import run_bench

    return run_bench(args)


# -------------------------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blazr", description="Fast LLM inference for hybrid architectures")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("generate", help="complete a prompt (completion on stdout, stats on stderr)")
    _common(p)
    _sampling(p)
    p.add_argument("--prompt", "-p", help="prompt text (default: read stdin)")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("info", help="print the detected format, architecture and sizes as JSON")
    _common(p, weights=False)
    p.add_argument(
        "--max-model-len", type=int, default=None, help="context limit the cache budget is shown for"
    )
    p.add_argument("--max-num-seqs", type=int, default=16, help="sequences the cache budget is shown for")
    p.add_argument("--cache-memory", type=float, default=None, metavar="GIB", help="cache budget in GiB")
    _prefix_cache_flag(p)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("decode", help="decode token ids to text")
    _common(p, weights=False)
    p.add_argument("--ids", required=True, help='comma-separated ids, e.g. "1,2,3"')
    p.add_argument("--special", action="store_true", help="render special tokens")
    p.set_defaults(func=cmd_decode)

    p = sub.add_parser("chat", help="multi-turn chat in the terminal, with the model's chat template")
    _common(p)
    _sampling(p)
    p.add_argument("--system", help="system prompt")
    p.set_defaults(func=cmd_chat)

    from blazr.server.options import add_serve_arguments

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    _common(p)
    add_serve_arguments(p)
    p.set_defaults(func=cmd_serve)

    from blazr.bench import add_bench_arguments

    p = sub.add_parser("bench", help="benchmark a running server (like `vllm bench serve`)")
    add_bench_arguments(p)
    p.set_defaults(func=cmd_bench)
    from blazr.cli_models import add_model_commands

    add_model_commands(sub)  # pull | ls | rm: models by name
    return parser


def _tensor_parallel_rank(args: argparse.Namespace) -> int:
    """A rank > 0 of a torchrun launch: load the shard rank 0 names and mirror its steps until it stops."""
    from blazr.distributed.worker import run_worker

    run_worker(args.tensor_parallel_size)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = str(getattr(args, "log_level", "warning")).upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.WARNING), format="%(levelname)s %(name)s: %(message)s"
    )
    func: Callable[[argparse.Namespace], int] = args.func
    if getattr(args, "tensor_parallel_size", 1) > 1 and int(os.environ.get("RANK", "0")) > 0:
        func = _tensor_parallel_rank  # under torchrun: every rank runs this command; ranks > 0 serve rank 0
    try:
        return func(args)
    except BlazrError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
