"""Embeddings: a prompt's final hidden states (after the last norm, as HF's `last_hidden_state`) pooled
into one vector, normalized to unit length.

In:  `Pooling` on `SamplingParams.pooling` (the request is then prefill-only: nothing is sampled, it
     finishes with its prompt), and the hidden rows of each prefill chunk (engine/runner.py).
Out: per chunk a partial (`Pooling.partial`), summed over chunks by the engine (`Pooling.combine`) and
     finished into the vector (`Pooling.finish`).

Kinds: `last` (the prompt's last token: decoder embedding models such as Qwen3-Embedding, E5-Mistral),
`mean` (the average over the prompt's tokens), `cls` (the first token). What a checkpoint declares wins:
a sentence-transformers configuration (`modules.json` with a Pooling module: its `1_Pooling/config.json`
`pooling_mode_lasttoken`, `pooling_mode_mean_tokens` or `pooling_mode_cls_token`), or a GGUF's
`<arch>.pooling_type` (1 mean, 2 cls, 3 last); a checkpoint that declares none gets `mean`.

Mean and CLS pooling need every prompt position computed, so such requests take no prefix-cache hit
(engine/cache_manager.py); last-token pooling does (the prompt's last token is always computed).

Reading these keys here, not in detect/, is a stopgap: detect/ belongs to another room of the project; the
reading moves there (a `pooling` field of the detected checkpoint) when it can.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

from blazr.errors import BlazrError

if TYPE_CHECKING:
    from blazr.detect import Checkpoint

PoolingKind = Literal["last", "mean", "cls"]
GGUF_POOLING: dict[int, PoolingKind] = {1: "mean", 2: "cls", 3: "last"}
ST_MODES: dict[str, PoolingKind] = {
    "pooling_mode_lasttoken": "last",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
}


@dataclass(frozen=True)
class Pooling:
    """How a prompt's hidden states become one vector (see the module docstring)."""

    kind: PoolingKind = "mean"
    normalize: bool = True

    @property
    def needs_every_position(self) -> bool:
        """Every prompt position must be computed (no prefix-cache hit)."""
        return self.kind != "last"

    def partial(self, hidden: torch.Tensor, start: int, is_last_chunk: bool) -> torch.Tensor | None:
        """What one chunk contributes: hidden [n, D] are positions start … start + n - 1."""
        if self.kind == "mean":
            return hidden.float().sum(0)
        if self.kind == "cls":
            return hidden[0].float() if start == 0 else None
        return hidden[-1].float() if is_last_chunk else None

    def combine(self, so_far: torch.Tensor | None, part: torch.Tensor | None) -> torch.Tensor | None:
        if part is None:
            return so_far
        if so_far is None or self.kind != "mean":
            return part.clone()
        return so_far + part

    def finish(self, pooled: torch.Tensor, num_tokens: int) -> list[float]:
        vector = pooled / num_tokens if self.kind == "mean" else pooled
        if self.normalize:
            vector = torch.nn.functional.normalize(vector, dim=-1)
        return vector.cpu().tolist()


def declared_pooling(ckpt: Checkpoint) -> Pooling | None:
    """The pooling a checkpoint declares (sentence-transformers files or GGUF metadata), or None."""
    if ckpt.gguf is not None:
        arch = ckpt.gguf.metadata.get("general.architecture")
        value = ckpt.gguf.metadata.get(f"{arch}.pooling_type")
        return Pooling(GGUF_POOLING[int(value)]) if value is not None and int(value) in GGUF_POOLING else None
    root = ckpt.path if ckpt.path.is_dir() else ckpt.path.parent
    return sentence_transformers_pooling(root)


def sentence_transformers_pooling(root: Path) -> Pooling | None:
    """The Pooling module of a sentence-transformers directory (`modules.json`), or None."""
    try:
        modules = json.loads((root / "modules.json").read_text())
    except (OSError, ValueError):
        return None
    for module in modules if isinstance(modules, list) else ():
        if not isinstance(module, dict) or not str(module.get("type", "")).endswith("models.Pooling"):
            continue
        try:
            config = json.loads((root / str(module.get("path", "")) / "config.json").read_text())
        except (OSError, ValueError) as e:
            raise BlazrError(f"{root}: the Pooling module's config.json cannot be read ({e})") from None
        for key, kind in ST_MODES.items():
            if config.get(key):
                return Pooling(kind)
        used = sorted(k for k, v in config.items() if k.startswith("pooling_mode") and v)
        raise BlazrError(
            f"{root}: pooling {', '.join(used) or 'none'} is not supported (last, mean, cls are)"
        )
    return None
