"""Detection: the only reader of raw checkpoint metadata — config.json, generation_config.json, GGUF
metadata keys and tensor-name patterns — turned into a typed `Checkpoint` (format, weight files, frozen
`ModelConfig`, tokenizer source).

Flow: `resolve_model_path(str)` (blazr/model_ref.py: local path or hub name) → `inspect_checkpoint(path)`:
find weight files → open headers (names + shapes) → format from tensor names → architecture → that
architecture's builder reads config.json where present and infers every missing size from tensor shapes.

Modules: paths (where the weights are), raw (typed config access, RoPE rules), one module per family.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from blazr.config import ModelConfig
from blazr.detect.checkpoint import Checkpoint, Format, Shapes
from blazr.detect.gguf import inspect_gguf
from blazr.detect.paths import find_weight_files, read_json
from blazr.detect.raw import Raw, eos_ids, int_or_none
from blazr.errors import CheckpointError, UnsupportedError
from blazr.loading.gguf_split import open_gguf
from blazr.loading.safetensors import SafetensorsCheckpoint
from blazr.model_ref import default_model_path, resolve_model_path
from blazr.tokenizer import TokenizerSource

__all__ = [
    "Checkpoint",
    "default_model_path",
    "find_weight_files",
    "inspect_checkpoint",
    "resolve_model_path",
    "supported_architectures",
]

Builder = Callable[[Raw, Shapes], ModelConfig]


def _collect_families() -> tuple[
    dict[str, Builder], dict[str, str], list[tuple[Callable[[Shapes], bool], str]]
]:
    """Every family module of this package contributes `BUILDERS` (architecture → builder) and may add
    `MODEL_TYPES` (config.json model_type → architecture) and `NAME_RULES` ([(predicate on tensor shapes,
    architecture)], tried in order when config.json names no architecture)."""
    builders: dict[str, Builder] = {}
    model_types: dict[str, str] = {}
    name_rules: list[tuple[Callable[[Shapes], bool], str]] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        builders.update(getattr(module, "BUILDERS", {}))
        model_types.update(getattr(module, "MODEL_TYPES", {}))
        name_rules.extend(getattr(module, "NAME_RULES", []))
    return builders, model_types, name_rules


BUILDERS, MODEL_TYPES, NAME_RULES = _collect_families()


def inspect_checkpoint(path: Path, vocab_name: str | None = None) -> Checkpoint:
    """Read headers and metadata of the checkpoint at `path` (no weights are loaded)."""
    kind, files = find_weight_files(path)
    root = path if path.is_dir() else path.parent
    if kind == "gguf":
        gguf = open_gguf(files[0])
        return inspect_gguf(path, gguf, vocab_name)
    source = SafetensorsCheckpoint(files)
    shapes = {n: source.shape(n) for n in source.names}
    if not shapes:
        raise CheckpointError(f"{files[0]}: the safetensors file holds no tensors")
    raw = read_json(root / "config.json")
    if prefix := base_model_prefix(raw, shapes):  # the names loading reads (SafetensorsCheckpoint's prefix)
        shapes = {prefix + n: shape for n, shape in shapes.items()}
    fmt = detect_format(shapes, files[0])
    arch = detect_architecture(raw, shapes, fmt)
    builder = BUILDERS.get(arch)
    if builder is None:
        raise UnsupportedError(
            f"unsupported architecture {arch}; supported: {', '.join(supported_architectures())}"
        )
    cfg = builder(Raw(raw, root / "config.json"), shapes)
    if prefix and "lm_head.weight" not in shapes and not cfg.tie_word_embeddings:
        cfg = replace(cfg, tie_word_embeddings=True)  # no head saved: logits on the token table
    dtypes = {source.dtype(n) for n in list(source.names)[:64]}
    weights_dtype = torch.float32 if torch.float32 in dtypes else next(iter(dtypes))
    gen = read_json(root / "generation_config.json")
    tok = TokenizerSource(
        vocab_name=vocab_name,
        tokenizer_dir=root if (root / "tokenizer.json").is_file() else None,
        vocab_size=cfg.vocab_size,
        eos_token_ids=eos_ids(gen) or eos_ids(raw),
        bos_token_id=int_or_none(gen.get("bos_token_id", raw.get("bos_token_id"))),
        is_oxidizr=fmt == "oxidizr",
    )
    name = root.name if path.is_dir() else path.stem
    return Checkpoint(path, fmt, tuple(files), cfg, tok, weights_dtype, name, name_prefix=prefix)


def base_model_prefix(raw: Mapping[str, Any], shapes: Shapes) -> str:
    """`model.` for a transformers base-model save — `XModel` without its head: `embed_tokens.weight`,
    `layers.N.…`, as sentence-transformers writes Qwen3-Embedding — whose config.json names a family blazr
    builds (its `XForCausalLM`, or its model_type); empty otherwise (an oxidizr checkpoint's names are the
    same but its config.json names no transformers family)."""
    if "embed_tokens.weight" not in shapes or not any(n.startswith("layers.") for n in shapes):
        return ""
    return "model." if _transformers_architecture(raw) is not None else ""


def _transformers_architecture(raw: Mapping[str, Any]) -> str | None:
    """The transformers family config.json names that blazr builds: `architectures[0]`, else its
    model_type's; None when it names none."""
    archs = raw.get("architectures")
    if isinstance(archs, list) and archs and _causal_lm(str(archs[0])) in BUILDERS:
        return _causal_lm(str(archs[0]))
    model_type = raw.get("model_type")
    return MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None


def _causal_lm(arch: str) -> str:
    """A base model's class (`Qwen3Model`) as its causal LM's (`Qwen3ForCausalLM`) where blazr builds that."""
    causal = arch.removesuffix("Model") + "ForCausalLM"
    return causal if arch.endswith("Model") and causal in BUILDERS else arch


def detect_format(shapes: Shapes, where: Path) -> Format:
    names = list(shapes)
    if any(n.startswith(("model.", "backbone.", "language_model.model.")) for n in names):
        return "hf"
    if any(n.startswith("layers.") for n in names) and "embed_tokens.weight" in shapes:
        return "oxidizr"
    sample = ", ".join(sorted(names)[:4])
    raise CheckpointError(
        f"{where}: unrecognised tensor names (expected HF 'model.layers.N.…' or oxidizr 'layers.N.…'); "
        f"found {sample}"
    )


def detect_architecture(raw: Mapping[str, Any], shapes: Shapes, fmt: Format) -> str:
    if fmt == "oxidizr":
        return "oxidizr"
    archs = raw.get("architectures")
    if isinstance(archs, list) and archs:
        return _causal_lm(str(archs[0]))  # one blazr does not build is refused by the caller, naming it
    if found := _transformers_architecture(raw):  # by model_type
        return found
    for matches, arch in NAME_RULES:
        if matches(shapes):
            return arch
    return "LlamaForCausalLM"


def supported_architectures() -> list[str]:
    return sorted(a for a in BUILDERS if a != "oxidizr")
