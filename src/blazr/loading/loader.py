"""Build a model from a detected checkpoint: construct on the meta device, pull weights tensor by tensor
(safetensors via mmap, GGUF dequantized per tensor), move to the target device."""

from __future__ import annotations

import torch

from blazr.detect import Checkpoint
from blazr.loading.gguf import GGUFFile, gguf_to_hf_name, unpermute_qk
from blazr.loading.names import name_map_for
from blazr.loading.safetensors import SafetensorsCheckpoint
from blazr.loading.weights import TensorSource, load_weights
from blazr.model.model import CausalLM


class GGUFSource:
    """A GGUF file seen through HF tensor names, q/k rows un-permuted back to the HF layout."""

    def __init__(self, gguf: GGUFFile, num_heads: int, num_kv_heads: int) -> None:
        self.gguf = gguf
        self.path = gguf.path
        self._by_hf = {hf: name for name in gguf.tensor_names if (hf := gguf_to_hf_name(name)) is not None}
        self._heads = {"q_proj": num_heads, "k_proj": num_kv_heads}

    @property
    def names(self) -> set[str]:
        return set(self._by_hf)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.gguf.tensor_shape(self._by_hf[name])

    def load(self, name: str) -> torch.Tensor:
        t = self.gguf.load(self._by_hf[name], torch.float32)
        proj = name.rsplit(".", 2)[-2]
        if proj in self._heads:
            t = unpermute_qk(t, self._heads[proj])
        return t

    def file_of(self, name: str) -> object:
        return self.gguf.path


def open_source(ckpt: Checkpoint) -> TensorSource:
    if ckpt.format == "gguf":
        attn = next((layer.attention for layer in ckpt.config.layers if layer.attention), None)
        heads = (attn.num_heads, attn.num_kv_heads) if attn else (1, 1)
        return GGUFSource(GGUFFile(ckpt.weight_files[0]), *heads)
    return SafetensorsCheckpoint(list(ckpt.weight_files))


def load_model(
    ckpt: Checkpoint,
    device: torch.device,
    dtype: torch.dtype,
    max_len: int | None = None,
    show_progress: bool = False,
) -> CausalLM:
    with torch.device("meta"):
        model = CausalLM(ckpt.config, max_len)
    source = open_source(ckpt)
    names = name_map_for(ckpt.format, ckpt.config)
    load_weights(model, ckpt.config, source, names, dtype, device, show_progress)
    return model.to(device).eval()
