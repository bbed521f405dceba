"""Tiny random HF checkpoints built with transformers, saved with save_pretrained (the reference models of
the parity tests). Each builder returns the HF model (eval, float32) after saving it to `path`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

TINY: dict[str, Any] = dict(
    vocab_size=1024,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    initializer_range=0.1,  # logits with std ~1, so parity errors are measured on a real scale
)


# text-only architectures whose config class is not `{Arch}Config` (that one is the multimodal model's)
CONFIG_CLASSES = {
    "Qwen3_5ForCausalLM": "Qwen3_5TextConfig",
    "Qwen3_5MoeForCausalLM": "Qwen3_5MoeTextConfig",
    "Gemma3ForCausalLM": "Gemma3TextConfig",
    "Gemma4ForCausalLM": "Gemma4TextConfig",
}


def build(arch: str, path: Path, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    import transformers

    config_cls = getattr(transformers, CONFIG_CLASSES.get(arch, arch.replace("ForCausalLM", "Config")))
    model_cls = getattr(transformers, arch)
    config = config_cls(**{**TINY, **overrides})
    torch.manual_seed(seed)
    model = model_cls(config).float().eval()
    model.save_pretrained(path)
    return model


@torch.no_grad()
def hf_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """[L, V] float32 logits of one unpadded sequence."""
    x = torch.tensor([ids])
    return model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0].float()


@torch.no_grad()
def hf_greedy(model: torch.nn.Module, ids: list[int], n: int) -> list[int]:
    """n greedy tokens from HF generate with its cache (explicit mask; EOS disabled)."""
    x = torch.tensor([ids])
    out = model.generate(
        input_ids=x,
        attention_mask=torch.ones_like(x),
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(ids) :].tolist()
