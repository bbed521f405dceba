"""`Checkpoint`: what detection knows about a checkpoint before any weight is read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from blazr.config import ModelConfig
from blazr.loading.gguf import GGUFFile
from blazr.tokenizer import TokenizerSource

Format = Literal["hf", "oxidizr", "gguf"]
Shapes = Mapping[str, tuple[int, ...]]


@dataclass(frozen=True)
class Checkpoint:
    """Everything known about a checkpoint before its weights are read."""

    path: Path
    format: Format
    weight_files: tuple[Path, ...]
    config: ModelConfig
    tokenizer: TokenizerSource
    weights_dtype: torch.dtype
    name: str  # a display name (served model id)
    # the GGUF file as opened (header parsed) by detection, so loading does not parse it a second time
    gguf: GGUFFile | None = field(default=None, compare=False, repr=False)
    name_prefix: str = ""  # put before the stored tensor names ("model." for a base-model save)
