"""Renames for HF Granite 3: the dense model in Llama's names; GraniteMoe / GraniteMoeShared in hybrid
Granite's (`block_sparse_moe.input_linear` / `output_linear` / `router.layer`, `shared_mlp.*`: see
names/granite.py)."""

from __future__ import annotations

from blazr.loading.names.granite import granite_names
from blazr.loading.names.llama import llama_names

NAME_MAPS = {
    "GraniteForCausalLM": lambda cfg: llama_names(),
    "GraniteMoeForCausalLM": granite_names,
    "GraniteMoeSharedForCausalLM": granite_names,
}
