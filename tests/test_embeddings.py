"""Embeddings (engine/pooling.py, `LLM.embed`): pooled final hidden states equal transformers' on the same
weights (cosine ≥ 0.9999, fp32) for every pooling a checkpoint can declare — a sentence-transformers
directory (last token, mean, CLS) and a GGUF's `pooling_type` — with the prompt prefilled in chunks; an
embedding request batched beside generation changes neither; a prefix-cache hit never changes a vector."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from blazr.engine.pooling import Pooling
from blazr.engine.sampling import SamplingParams
from blazr.llm import LLM
from tests.gguf_fixtures import write_tiny_llama_gguf
from tests.tiny import TINY, build

PROMPTS = [[(7 * i + 3) % 1000 + 1 for i in range(45)], [5, 17, 300, 42, 9, 88, 123]]
ST_MODES = {
    "last": "pooling_mode_lasttoken",
    "mean": "pooling_mode_mean_tokens",
    "cls": "pooling_mode_cls_token",
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-embed")
    return path, build("LlamaForCausalLM", path)


def sentence_transformers_dir(src: Path, dst: Path, kind: str) -> Path:
    """`src`'s checkpoint (linked) with a sentence-transformers pooling of `kind` and a Normalize module."""
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).symlink_to(f)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (dst / "modules.json").write_text(json.dumps(modules))
    (dst / "1_Pooling").mkdir()
    config = {"word_embedding_dimension": TINY["hidden_size"], **dict.fromkeys(ST_MODES.values(), False)}
    (dst / "1_Pooling" / "config.json").write_text(json.dumps({**config, ST_MODES[kind]: True}))
    (dst / "2_Normalize").mkdir()
    return dst


@torch.no_grad()
def reference(model: torch.nn.Module, ids: list[int], kind: str) -> torch.Tensor:
    """transformers' last_hidden_state (after the final norm), pooled and normalized."""
    hidden = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0].float()
    pooled = {"last": hidden[-1], "mean": hidden.mean(0), "cls": hidden[0]}[kind]
    return torch.nn.functional.normalize(pooled, dim=-1)


def check(vectors: list[list[float]], model: torch.nn.Module, kind: str) -> None:
    for v, ids in zip(vectors, PROMPTS, strict=True):
        got = torch.tensor(v)
        assert abs(float(got.norm()) - 1) < 1e-5
        cos = float(got @ reference(model, ids, kind))
        assert cos >= 0.9999, (kind, cos)


@pytest.mark.parametrize("kind", ["last", "mean", "cls"])
def test_a_declared_pooling_equals_transformers(tiny, tmp_path, kind):
    path, model = tiny
    llm = LLM(sentence_transformers_dir(path, tmp_path / kind, kind), cpu=True, max_num_batched_tokens=16)
    assert llm.pooling == Pooling(kind)
    check(llm.embed(PROMPTS), model, kind)  # the 45-token prompt prefilled in 3 chunks
    again = llm.embed(PROMPTS[0])  # its blocks are cached now: a hit (last) or none (mean, cls)
    assert torch.allclose(torch.tensor(again[0]), torch.tensor(llm.embed(PROMPTS)[0]), atol=1e-6)


def test_a_gguf_pooling_type_equals_transformers(tiny, tmp_path):
    _, model = tiny
    meta = {"llama.pooling_type": 3}  # LLAMA_POOLING_TYPE_LAST
    gguf = write_tiny_llama_gguf(tmp_path / "e.gguf", model.state_dict(), model.config, metadata=meta)
    llm = LLM(gguf, vocab="cl100k_base", cpu=True, quantize="none")
    assert llm.pooling == Pooling("last")
    check(llm.embed(PROMPTS), model, "last")


def test_an_embedding_beside_generation_changes_neither(tiny):
    path, _ = tiny
    llm = LLM(path, cpu=True, max_num_batched_tokens=32)
    assert llm.pooling == Pooling("mean")  # nothing declared: the mean
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    alone_vec = llm.embed(PROMPTS[0])[0]
    alone_gen = llm.generate([PROMPTS[1]], greedy)[0].outputs[0].token_ids
    engine = llm.engine
    engine.add_request("gen", PROMPTS[1], greedy)
    engine.add_request("emb", PROMPTS[0], SamplingParams(max_tokens=1, pooling=llm.pooling))
    tokens, vector, shared = [], None, False
    while engine.has_unfinished():
        running = {s.request_id for s in engine.scheduler.running}
        shared |= running == {"gen", "emb"}
        for out in engine.step():
            tokens += out.token_ids if out.request_id == "gen" else []
            vector = out.embedding if out.request_id == "emb" and out.finished else vector
    assert shared  # they ran in the same steps
    assert tokens == alone_gen
    assert vector is not None and torch.allclose(torch.tensor(vector), torch.tensor(alone_vec), atol=1e-5)


def test_a_qwen3_embedding_checkpoint_as_published(tmp_path):
    """Qwen3-Embedding as sentence-transformers writes it: the base model (`Qwen3Model`: `embed_tokens`,
    `layers.N.…`, no `model.` prefix, no head) with last-token pooling — read as its causal LM's names (not
    as an oxidizr checkpoint, whose names look the same), vectors equal transformers'."""
    model = build("Qwen3ForCausalLM", tmp_path / "full")
    model.model.save_pretrained(tmp_path / "base")
    config = json.loads((tmp_path / "base" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3Model"]
    st = sentence_transformers_dir(tmp_path / "base", tmp_path / "st", "last")
    llm = LLM(st, cpu=True, dtype="float32")
    assert llm.config.architecture == "Qwen3ForCausalLM" and llm.pooling == Pooling("last")
    check(llm.embed(PROMPTS), model, "last")
