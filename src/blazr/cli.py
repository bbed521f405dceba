"""Command line: `blazr generate | serve | info | decode | chat | bench` — thin wrappers over the API.

Every command defaults to the embedded SmolLM2-135M-Instruct when `--model` is omitted. User errors
(bad paths, broken checkpoints, bad flags) print one line `error: …` to stderr and exit 1, never a traceback.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence

from blazr import progress
from blazr.errors import BlazrError


def _log_level(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-level",
        default=os.environ.get("BLAZR_LOG", "warning"),
        help="debug|info|warning|error (env BLAZR_LOG)",
    )


def _model_flags(p: argparse.ArgumentParser) -> None:
    """generate / chat: the flags of LoadConfig and EngineConfig (config_flags.py, one per field)."""
    from blazr import config_flags
    from blazr.engine_config import EngineConfig
    from blazr.load_config import LoadConfig

    _log_level(p)
    config_flags.add_flags(p, LoadConfig)
    config_flags.add_flags(p, EngineConfig)


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


def _llm(args: argparse.Namespace):
    """The model the command's flags name, with its sampling parameters. A flag's error comes before the
    load: a path that names nothing and an engine value out of range before torch's import too."""
    from blazr.model_ref import resolve_model_path

    resolve_model_path(args.model)
    from blazr import config_flags
    from blazr.engine_config import EngineConfig
    from blazr.load_config import LoadConfig

    load = config_flags.from_args(LoadConfig, args)
    engine = config_flags.from_args(EngineConfig, args)
    params = _params(args)
    from blazr.llm import LLM

    return LLM(load_config=load, engine_config=engine), params


# ------------------------------------------------------------------------------------------ commands


def cmd_generate(args: argparse.Namespace) -> int:
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    llm, params = _llm(args)
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
    from blazr.model_ref import resolve_model_path

    path = resolve_model_path(args.model)  # before torch's import: a path that names nothing fails at once
    from blazr import config_flags
    from blazr.config import EngineConfig
    from blazr.detect import inspect_checkpoint
    from blazr.info import describe

    ckpt = inspect_checkpoint(path, vocab_name=args.vocab)
    engine = config_flags.from_args(EngineConfig, args).resolved(ckpt.config.max_position_embeddings)
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
        from blazr.model_ref import resolve_model_path

        path = resolve_model_path(args.model)  # before torch's import, as `info`
        from blazr.detect import inspect_checkpoint

        ckpt = inspect_checkpoint(path, vocab_name=args.vocab)
        tok = load_tokenizer(ckpt.tokenizer)
    bad = [i for i in ids if not 0 <= i < tok.vocab_size]
    if bad:
        raise BlazrError(f"token id {bad[0]} is out of range for {tok.name} (vocab size {tok.vocab_size})")
    print(tok.decode(ids, skip_special=not args.special))
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    llm, params = _llm(args)
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

_CHECKPOINT = ("model", "vocab")  # info / decode: which checkpoint (LoadConfig fields)
# info: the EngineConfig fields its cache budget depends on
_CACHE_SHOWN = ("max_num_seqs", "max_model_len", "block_size", "cache_memory_gib", "enable_prefix_caching")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blazr", description="Fast LLM inference for hybrid architectures")
    sub = parser.add_subparsers(dest="command", required=True)

    from blazr import config_flags
    from blazr.engine_config import EngineConfig
    from blazr.load_config import LoadConfig

    p = sub.add_parser("generate", help="complete a prompt (completion on stdout, stats on stderr)")
    _model_flags(p)
    _sampling(p)
    p.add_argument("--prompt", "-p", help="prompt text (default: read stdin)")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("info", help="print the detected format, architecture and sizes as JSON")
    _log_level(p)
    config_flags.add_flags(p, LoadConfig, only=_CHECKPOINT)
    config_flags.add_flags(
        p, EngineConfig, only=_CACHE_SHOWN, title="the engine the cache budget is shown for"
    )
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("decode", help="decode token ids to text")
    _log_level(p)
    config_flags.add_flags(p, LoadConfig, only=_CHECKPOINT)
    p.add_argument("--ids", required=True, help='comma-separated ids, e.g. "1,2,3"')
    p.add_argument("--special", action="store_true", help="render special tokens")
    p.set_defaults(func=cmd_decode)

    p = sub.add_parser("chat", help="multi-turn chat in the terminal, with the model's chat template")
    _model_flags(p)
    _sampling(p)
    p.add_argument("--system", help="system prompt")
    p.set_defaults(func=cmd_chat)

    from blazr.server.options import add_serve_arguments

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
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

    run_worker(args.tensor_parallel_size, "cpu" if getattr(args, "cpu", False) else None)
    return 0


def _freeze_heap() -> None:
    """Move every object made so far — the imported modules: torch's above all — to the cyclic collector's
    permanent generation, as vLLM and SGLang do once started: full collections stop walking them, and the
    interpreter's exit stops collecting them (~0.7 s of CPU on a 2-core Zen 3, a fifth of `blazr info`).
    Only for the process's own command: the heap is then the command's, not a caller's."""
    gc.freeze()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = str(getattr(args, "log_level", None) or os.environ.get("BLAZR_LOG", "warning")).upper()
    words = sys.argv[1:] if argv is None else list(argv)
    explicit = "BLAZR_LOG" in os.environ or any(w.split("=")[0] == "--log-level" for w in words)
    progress.configure(level, explicit)  # bars on a terminal unless quiet was asked (blazr/progress.py)
    logging.basicConfig(
        level=getattr(logging, level, logging.WARNING), format="%(levelname)s %(name)s: %(message)s"
    )
    func: Callable[[argparse.Namespace], int] = args.func
    if argv is None:  # this process's own command line (the console script, `python -m blazr`)
        _freeze_heap()
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
