"""Fill a model's parameters from a checkpoint, one tensor at a time, each straight to its final dtype.

The model is built on the meta device (no memory, no random init). `WeightLoader.parameter` pulls one
parameter from the checkpoint through `names.unfuse` + the format's `NameMap`, shape-checked part by part
and converted to the compute dtype on the target device; `load_weights` assigns every parameter still on
meta (layers that loading/quantize.py already made from the file's bytes are no longer float parameters,
so they are never materialised as float). A part read as stored, with no transform and nothing to
combine, may be a view of the checkpoint's memory map (sources that offer `alias`): no copy at all.

Errors name the checkpoint tensor, the expected shape and the shape found; unexpected leftover tensors are
reported in one warning line.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn
from tqdm import tqdm

from blazr.config import ModelConfig
from blazr.errors import CheckpointError
from blazr.loading.names import NameMap, Part, Reshaping, unfuse

if TYPE_CHECKING:
    from blazr.loading.quant_cache import QuantCache

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


def set_parameter(model: nn.Module, name: str, value: torch.Tensor) -> None:
    """Replace parameter `name` (dotted) of `model` by `value`, frozen."""
    module_name, _, attr = name.rpartition(".")
    module = model.get_submodule(module_name) if module_name else model
    module._parameters[attr] = nn.Parameter(value, requires_grad=False)


class WeightLoader:
    """Reads parameters of `cfg`'s model from `source` in `dtype` on `device`, recording which checkpoint
    tensors were used; `progress` (a tqdm bar or None) advances by one per parameter made; `cache` (or
    None): where `--quantize` finds the weights an earlier load made (loading/quant_cache.py)."""

    def __init__(
        self,
        cfg: ModelConfig,
        source: TensorSource,
        names: NameMap,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        progress: tqdm | None = None,
        cache: QuantCache | None = None,
    ) -> None:
        self.cfg, self.source, self.names = cfg, source, names
        self.dtype, self.device = dtype, torch.device(device)
        self.progress, self.cache = progress, cache
        self.available = source.names
        self.used: set[str] = set()
        self._can_alias = "alias" in inspect.signature(source.load).parameters

    def parameter(self, pname: str, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> torch.Tensor:
        """Parameter `pname` [*shape] in `dtype` (default: the loader's): its checkpoint part(s) read,
        checked, transformed and combined. May be a read-only view of the file (see the module docstring)."""
        dtype = dtype or self.dtype
        whole = self.names.source(pname)
        if whole is not None and whole[0] in self.available:
            parts, combine = [Part(pname, shape)], None
        else:
            parts, combine = unfuse(self.cfg, pname, shape)
        alias = combine is None or len(parts) == 1
        tensors = [self._part(part, dtype, alias) for part in parts]
        value = tensors[0] if combine is None else combine(tensors)
        assert tuple(value.shape) == tuple(shape), (pname, value.shape, shape)
        return value.contiguous()

    def source_names(self, pname: str, shape: tuple[int, ...]) -> list[str]:
        """The checkpoint tensors parameter `pname` is made from (for bookkeeping: `used`, `release`)."""
        whole = self.names.source(pname)
        if whole is not None and whole[0] in self.available:
            return [whole[0]]
        parts, _ = unfuse(self.cfg, pname, shape)
        return [found[0] for p in parts if (found := self.names.source(p.name)) is not None]

    def stored_dtype(self, pname: str, shape: tuple[int, ...]) -> torch.dtype | None:
        """The one dtype parameter `pname`'s checkpoint tensors are stored in, when it is read as stored (no
        transform on any part) and the source says (safetensors do); else None."""
        dtype_of = getattr(self.source, "dtype", None)
        whole = self.names.source(pname)
        if whole is not None and whole[0] in self.available:
            found = [whole]
        else:
            found = [self.names.source(p.name) for p in unfuse(self.cfg, pname, shape)[0]]
        if dtype_of is None or any(
            f is None or f[1] is not None or f[0] not in self.available for f in found
        ):
            return None
        dtypes = {dtype_of(f[0]) for f in found}  # type: ignore[index]
        return dtypes.pop() if len(dtypes) == 1 else None

    def consume(self, pname: str, shape: tuple[int, ...], is_copied: bool) -> None:
        """Mark the checkpoint tensors of parameter `pname` used (made by another path than `parameter`, e.g.
        a quantized weight from the file's bytes); when their bytes were copied (repacked), drop their mapped
        pages (`release`, where the source has it): nothing keeps a view of them."""
        sources = self.source_names(pname, shape)
        self.used.update(sources)
        if is_copied and hasattr(self.source, "release"):
            for src in sources:
                self.source.release(src)

    def _part(self, part: Part, dtype: torch.dtype, alias: bool) -> torch.Tensor:
        found = self.names.source(part.name)
        if found is None:
            raise CheckpointError(f"no checkpoint name is known for parameter {part.name}")
        src, transform = found
        if src not in self.available:
            raise CheckpointError(
                f"missing tensor {src} (expected shape {list(part.shape)}) in {_where(self.source)}"
            )
        src_shape = tuple(self.source.shape(src))
        rows = getattr(transform, "source_rows", None)  # a RowOrder picking some of the stored rows
        stored = part.shape if rows is None else (rows, *part.shape[1:])
        if isinstance(transform, Reshaping):  # a transform to another shape (a transpose)
            stored = transform.source_shape(part.shape)
        is_unit_dims = (
            stored == part.shape and src_shape != part.shape and _squeezed(src_shape) == _squeezed(part.shape)
        )
        if is_unit_dims:  # the same values under other unit dims (Kimi-Linear's A_log [1, 1, H, 1] → [H])
            transform = _reshaper(part.shape, transform)
        elif src_shape != stored:
            want = list(stored)
            raise CheckpointError(
                f"tensor {src} in {self.source.file_of(src)}: expected shape {want}, found {list(src_shape)}"
            )
        self.used.add(src)
        if self._can_alias and self.device.type == "cpu":
            t = self.source.load(src, dtype, alias=alias and transform is None)  # type: ignore[call-arg]
        else:
            t = self.source.load(src)
        if transform is not None:
            t = transform(t)
        return t.to(device=self.device, dtype=dtype)

    def tick(self) -> None:
        if self.progress is not None:
            self.progress.update(1)

    def warn_unused(self) -> None:
        unused = sorted(
            n
            for n in self.available - self.used
            if not n.endswith(_IGNORED_SUFFIXES) and not n.startswith(self.names.ignored_prefixes)
        )
        if unused:
            more = f" (+{len(unused) - 5} more)" if len(unused) > 5 else ""
            log.warning(
                "ignored %d checkpoint tensors not used by the model: %s%s", len(unused), unused[:5], more
            )


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n for n in shape if n != 1)


def _reshaper(
    shape: tuple[int, ...], then: Callable[[torch.Tensor], torch.Tensor] | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A transform that views a stored tensor under `shape` (unit dims only differ), then applies `then`."""
    return lambda t: t.reshape(shape) if then is None else then(t.reshape(shape))


def load_weights(model: nn.Module, loader: WeightLoader) -> None:
    """Assign every parameter of `model` still on the meta device from the loader's checkpoint."""
    for pname, param in list(model.named_parameters(remove_duplicate=True)):
        if not param.is_meta:
            continue
        dtype = torch.float32 if getattr(param, "keep_float32", False) else None
        value = loader.parameter(pname, tuple(param.shape), dtype)
        set_parameter(model, pname, with_offset(param, value))
        loader.tick()


def with_offset(param: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """The value a parameter holds: the checkpoint's, plus the parameter's `weight_offset` where it declares
    one (a "(1 + w)" RMSNorm's stored w, model/norm.py), added in the loaded dtype."""
    offset = getattr(param, "weight_offset", 0.0)
    return value + offset if offset else value


def _where(source: TensorSource) -> str:
    files = getattr(source, "files", None)
    if files:
        return ", ".join(str(f) for f in files[:3]) + (" …" if len(files) > 3 else "")
    return str(getattr(source, "path", "checkpoint"))
