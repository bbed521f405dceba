"""Fill a model's parameters from a checkpoint, one tensor at a time.

The model is built on the meta device (no memory, no random init); each parameter is then pulled from the
checkpoint through `names.unfuse` + the format's `NameMap`, shape-checked part by part, converted to the
compute dtype and placed on the target device. Errors name the checkpoint tensor, the expected shape and the
shape found; unexpected leftover tensors are reported in one warning line.
"""

from __future__ import annotations

import logging
from typing import Protocol

import torch
from torch import nn
from tqdm import tqdm

from blazr.config import ModelConfig
from blazr.errors import CheckpointError
from blazr.loading.names import NameMap, Part, unfuse

log = logging.getLogger("blazr.loading")

# Checkpoint tensors that carry no weights (rotary caches, HF bookkeeping) and are skipped silently.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq", "attn.bias", "attn.masked_bias")


class TensorSource(Protocol):
    """What the loader needs of a checkpoint (safetensors or GGUF)."""

    @property
    def names(self) -> set[str]: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def load(self, name: str) -> torch.Tensor: ...

    def file_of(self, name: str) -> object: ...


def _set_parameter(model: nn.Module, name: str, value: torch.Tensor) -> None:
    module_name, _, attr = name.rpartition(".")
    module = model.get_submodule(module_name) if module_name else model
    module._parameters[attr] = nn.Parameter(value, requires_grad=False)


def load_weights(
    model: nn.Module,
    cfg: ModelConfig,
    source: TensorSource,
    names: NameMap,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    show_progress: bool = False,
) -> None:
    """Assign every parameter of `model` (built on meta) from `source`."""
    available = source.names
    used: set[str] = set()
    params = list(model.named_parameters(remove_duplicate=True))
    for pname, param in tqdm(params, desc="loading", unit="tensor", disable=not show_progress, leave=False):
        whole = names.source(pname)
        if whole is not None and whole[0] in available:
            parts, combine = [Part(pname, tuple(param.shape))], None
        else:
            parts, combine = unfuse(cfg, pname, tuple(param.shape))
        target = torch.float32 if getattr(param, "keep_float32", False) else dtype
        tensors = [_load_part(source, names, part, available, target, device, used) for part in parts]
        value = tensors[0] if combine is None else combine(tensors)
        assert tuple(value.shape) == tuple(param.shape), (pname, value.shape, param.shape)
        _set_parameter(model, pname, value.contiguous())
    unused = sorted(n for n in available - used if not n.endswith(_IGNORED_SUFFIXES))
    if unused:
        more = f" (+{len(unused) - 5} more)" if len(unused) > 5 else ""
        log.warning(
            "ignored %d checkpoint tensors not used by the model: %s%s", len(unused), unused[:5], more
        )


def _load_part(
    source: TensorSource,
    names: NameMap,
    part: Part,
    available: set[str],
    dtype: torch.dtype,
    device: torch.device | str,
    used: set[str],
) -> torch.Tensor:
    found = names.source(part.name)
    if found is None:
        raise CheckpointError(f"no checkpoint name is known for parameter {part.name}")
    src, transform = found
    if src not in available:
        raise CheckpointError(f"missing tensor {src} (expected shape {list(part.shape)}) in {_where(source)}")
    src_shape = tuple(source.shape(src))
    if src_shape != part.shape:
        raise CheckpointError(
            f"tensor {src} in {source.file_of(src)}: "
            f"expected shape {list(part.shape)}, found {list(src_shape)}"
        )
    t = source.load(src)
    if transform is not None:
        t = transform(t)
    used.add(src)
    return t.to(device=device, dtype=dtype)


def _where(source: TensorSource) -> str:
    files = getattr(source, "files", None)
    if files:
        return ", ".join(str(f) for f in files[:3]) + (" …" if len(files) > 3 else "")
    return str(getattr(source, "path", "checkpoint"))
