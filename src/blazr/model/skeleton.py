"""A model's skeleton: `CausalLM` built on the meta device — every parameter's shape and dtype, no values —
for the loader to fill and for `blazr info` / model listings to count.

torch's modules initialise their parameters in `reset_parameters` (torch.nn.init's `normal_` / `uniform_`).
On meta those make no values, yet torch's meta `normal_` / `uniform_` are Python references behind a
dynamo-disable wrapper whose first call imports torch._dynamo (~3 s of CPU on a 2-core Zen 3, most of a
small model's load). `skeleton` skips them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode

from blazr.config import ModelConfig
from blazr.model.model import CausalLM

if TYPE_CHECKING:
    from blazr.distributed.group import TPGroup


class NoInit(TorchFunctionMode):
    """Skips `torch.nn.init` calls on meta tensors; real tensors are initialised as usual."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: object,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            tensor = args[0] if args else kwargs["tensor"]
            if tensor.device.type == "meta":
                return tensor
        return func(*args, **kwargs)


def skeleton(cfg: ModelConfig, max_len: int | None = None, tp: TPGroup | None = None) -> CausalLM:
    """`CausalLM(cfg, max_len, tp)` on the meta device, its init skipped."""
    with torch.device("meta"), NoInit():
        return CausalLM(cfg, max_len, tp)
