"""Command line for models by name: `blazr pull org/name[:QUANT]`, `blazr ls`, `blazr rm` (blazr.hub).

`pull` lists the repository, downloads the chosen GGUF quant (default Q4_K_M) or a safetensors checkpoint's
weights, configs, tokenizer and template (resumably; a progress bar when stderr is a terminal, none under
`--log-level error`), and prints one line: the name, the size and the path every command can load
(`--model org/name:QUANT` resolves to the same file from the cache). `ls` prints the cached hub models and
the quantization-cache files as a table; `rm` removes a model, one quant of it, or quantization-cache files.
Errors are `BlazrError`s, printed as one line by cli.main.
"""

from __future__ import annotations

import argparse
import os
import sys

from blazr.errors import BlazrError


def add_model_commands(sub: argparse._SubParsersAction) -> None:
    """Add `pull`, `ls` and `rm` to the `blazr` parser's subcommands."""
    p = sub.add_parser("pull", help="download a model by name: org/name or org/name:QUANT (GGUF quant)")
    p.add_argument("name", help="org/name[:QUANT], e.g. bartowski/SmolLM2-135M-Instruct-GGUF:Q8_0")
    _log_level(p)
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser("ls", help="list cached hub models and quantization-cache files with their sizes")
    _log_level(p)
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("rm", help="remove cached models (org/name, or org/name:QUANT for one quant)")
    p.add_argument("names", nargs="*", metavar="NAME", help="org/name[:QUANT], or files with --quantized")
    p.add_argument(
        "--quantized",
        action="store_true",
        help="remove quantization-cache files instead: the NAMEs `blazr ls` shows, or all of them",
    )
    _log_level(p)
    p.set_defaults(func=cmd_rm)


def _log_level(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-level", default=os.environ.get("BLAZR_LOG", "warning"), help="debug|info|warning|error"
    )


def human_size(num_bytes: int) -> str:
    """Bytes as B / KiB / MiB / GiB / TiB with one decimal."""
    size = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def cmd_pull(args: argparse.Namespace) -> int:
    from blazr.hub.pull import pull

    pulled = pull(args.name)  # a progress bar under blazr/progress.py's policy
    sel = pulled.selection
    what = f"{len(sel.files)} file{'s' * (len(sel.files) != 1)}"
    label = f"{pulled.name.repo_id}:{sel.quant}" if sel.kind == "gguf" and sel.quant else pulled.name.repo_id
    print(f"{label}\t{sel.kind}\t{what}, {human_size(pulled.size)}\t{pulled.path}")
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    from blazr.hub.cache import hub_entries, quantized_entries

    rows = [(e.name, e.kind, human_size(e.size), str(e.path)) for e in hub_entries()]
    rows += [(e.name, e.kind, human_size(e.size), str(e.path)) for e in quantized_entries()]
    if not rows:
        print("no cached models", file=sys.stderr)
        return 0
    header = ("NAME", "KIND", "SIZE", "PATH")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    for r in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)) + "  " + r[3])
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    from blazr.hub.cache import remove_model, remove_quantized
    from blazr.hub.names import parse_name

    if args.quantized:
        freed = remove_quantized(list(args.names))
        print(f"removed {'all quantization-cache files' if not args.names else ', '.join(args.names)}: "
              f"{human_size(freed)} freed")  # fmt: skip
        return 0
    if not args.names:
        raise BlazrError("rm: name a model (org/name or org/name:QUANT), or pass --quantized")
    for text in args.names:
        name = parse_name(text)
        freed = remove_model(name)
        print(f"removed {name}: {human_size(freed)} freed")
    return 0
