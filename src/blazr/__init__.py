"""blazr: a fast LLM inference server for hybrid architectures (Mamba2, MLA, MoE, GQA) on PyTorch.

Public API: `LLM` (load a checkpoint, generate, chat), `SamplingParams` and `StructuredOutput` (what an
output must match: JSON schema, regex, choice, grammar). Imported lazily, so the CLI's
light commands (`--help`, `decode`) start without loading torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["LLM", "CompletionOutput", "RequestOutput", "SamplingParams", "StructuredOutput"]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from blazr.engine.grammar import StructuredOutput
    from blazr.engine.sampling import SamplingParams
    from blazr.llm import LLM, CompletionOutput, RequestOutput


def __getattr__(name: str) -> Any:
    if name == "SamplingParams":
        from blazr.engine.sampling import SamplingParams

        return SamplingParams
    if name == "StructuredOutput":
        from blazr.engine.grammar import StructuredOutput

        return StructuredOutput
    if name in ("LLM", "CompletionOutput", "RequestOutput"):
        from blazr import llm

        return getattr(llm, name)
    raise AttributeError(f"module 'blazr' has no attribute {name!r}")
