"""Renames for HF Phi-3 / Phi-4 (`Phi3ForCausalLM`; GGUF phi3 after its HF renames): Llama's names, where
`self_attn.qkv_proj` and `mlp.gate_up_proj` are stored fused in blazr's own row order ([q; k; v] and
[gate; up]), so each is read whole under its mapped name and never split into parts."""

from __future__ import annotations

from blazr.loading.names.llama import llama_names

NAME_MAPS = {"Phi3ForCausalLM": lambda cfg: llama_names()}
