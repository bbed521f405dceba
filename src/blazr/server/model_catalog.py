"""Which models a `blazr serve` serves and what each is called: `catalog(config)` → `{name: spec}` in order.

The models: `--model` (each time given, then `--models`), then every checkpoint in `--models-dir` — each
`*.gguf` file and each subdirectory that holds a checkpoint (a `config.json`, `*.safetensors` or `*.gguf`),
hidden entries skipped, in name order. A spec is what `--model` takes: a path or a Hugging Face repo id.

Names (what a request's `model` field says): a file's name without its weight suffix (`1b-q4_k_m.gguf` →
`1b-q4_k_m`), a directory's name, a repo id as written (`org/model`). `--served-model-name` names the model
when only one is given. Two models with one name are refused, in one line naming both.
"""

from __future__ import annotations

import re
from pathlib import Path

from blazr.errors import BlazrError
from blazr.server.options import ServerConfig

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # as detect/paths.py reads one
WEIGHT_SUFFIXES = (".gguf", ".safetensors", ".oxidizr")
EMBEDDED_NAME = "SmolLM2-135M-Instruct"  # the embedded model (no --model), as a one-model server names it
CHECKPOINT_FILES = ("config.json", "*.safetensors", "*.gguf")


def model_name(spec: str) -> str:
    """The name a request uses for `spec` (see the module docstring)."""
    path = Path(spec).expanduser()
    if not path.exists() and _REPO_ID.match(spec):  # a repo id, as written
        return spec
    if path.name in ("", ".."):  # ".", "..": the directory's own name (a link keeps its own, unresolved)
        path = path.resolve()
    if path.is_dir():
        return path.name
    for suffix in WEIGHT_SUFFIXES:  # a file (or a missing one: loading it will say so)
        if path.name.endswith(suffix):
            return path.name[: -len(suffix)]
    return path.stem


def scan_dir(directory: str) -> list[str]:
    """The checkpoints in `directory` (see the module docstring), as paths."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise BlazrError(f"--models-dir {directory}: no such directory")
    found = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        is_gguf = entry.is_file() and entry.suffix == ".gguf"
        if is_gguf or (entry.is_dir() and any(next(entry.glob(p), None) for p in CHECKPOINT_FILES)):
            found.append(str(entry))
    return found


def catalog(config: ServerConfig) -> dict[str, str]:
    """{name: spec} of every model this server serves, in order (the first is the default for a request
    that names none)."""
    specs = [s for s in (config.load.model, *config.models) if s]
    if config.models_dir:
        in_dir = scan_dir(config.models_dir)
        if not in_dir and not specs:
            what = "no checkpoint in it (*.gguf, or a directory)"
            raise BlazrError(f"--models-dir {config.models_dir}: {what}")
        specs += in_dir
    if not specs:  # --sleep-idle-seconds alone: the embedded model
        return {config.served_model_names[0] if config.served_model_names else EMBEDDED_NAME: ""}
    if config.served_model_names and len(specs) > 1:
        raise BlazrError("--served-model-name names one model; with several, each is named by its file")
    names: dict[str, str] = {}
    for spec in specs:
        name = config.served_model_names[0] if config.served_model_names else model_name(spec)
        if name in names:
            raise BlazrError(f"two models are named {name!r}: {names[name]} and {spec}; rename one")
        names[name] = spec
    return names
