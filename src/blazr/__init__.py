"""blazr: a fast LLM inference server for hybrid architectures (Mamba2, MLA, MoE, GQA) on PyTorch.

Public API: `LLM` (load a checkpoint, generate, chat) and `SamplingParams`.
"""

from blazr.engine.sampling import SamplingParams
from blazr.llm import LLM, CompletionOutput, RequestOutput

__all__ = ["LLM", "CompletionOutput", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"
