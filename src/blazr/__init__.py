"""blazr: a fast LLM inference server for hybrid architectures (Mamba2, MLA, MoE, GQA) on PyTorch."""

__version__ = "0.1.0"
