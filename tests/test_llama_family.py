"""Llama-family parity with transformers (Llama incl. llama3 rope scaling and tied embeddings, Qwen2 with
q/k/v bias, Mistral with a sliding window) and the cache invariants on the same tiny checkpoints."""

from __future__ import annotations

import json
import random

import pytest

from blazr import LLM, SamplingParams
from blazr.config import AttentionConfig
from tests.drive import assert_logits_close, chunked, full_logits, stepwise_logits
from tests.tiny import build, hf_greedy, hf_logits

VARIANTS = {
    "llama": ("LlamaForCausalLM", {}),
    "llama3-tied": (
        "LlamaForCausalLM",
        dict(
            tie_word_embeddings=True,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
        ),
    ),
    "qwen2": ("Qwen2ForCausalLM", {}),
    "llama-gelu-erf": ("LlamaForCausalLM", dict(hidden_act="gelu")),  # transformers' "gelu" is the exact one
    "mistral-window": ("MistralForCausalLM", dict(sliding_window=24)),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    arch, overrides = VARIANTS[request.param]
    path = tmp_path_factory.mktemp(request.param)
    hf = build(arch, path, **overrides)
    llm = LLM(path, cpu=True, dtype="float32", max_num_seqs=8)
    return hf, llm


def _prompts(lengths: list[int], seed: int = 1, vocab: int = 1024) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


def test_logits_match_transformers(pair):
    hf, llm = pair
    prompts = _prompts([5, 17, 40, 9])
    ours = full_logits(llm.runner, prompts)
    for p, o in zip(prompts, ours, strict=True):
        assert_logits_close(o, hf_logits(hf, p))


def test_greedy_tokens_match_transformers_with_cache(pair):
    hf, llm = pair
    prompt = _prompts([11], seed=2)[0]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    ours = llm.generate([prompt], params)[0].outputs[0].token_ids
    assert ours == hf_greedy(hf, prompt, 32)


def test_batched_generation_equals_each_alone(pair):
    _, llm = pair
    prompts = _prompts([3, 21, 8, 30], seed=3)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    together = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
    alone = [llm.generate([p], params)[0].outputs[0].token_ids for p in prompts]
    assert together == alone


@pytest.mark.parametrize("plan", ["prefill+steps", "chunk7", "chunk64", "mixed-batch"])
def test_cache_invariants(pair, plan):
    _, llm = pair
    prompts = _prompts([70, 33, 12], seed=4)
    ref = full_logits(llm.runner, prompts)
    if plan == "prefill+steps":
        chunks = [[len(p) - 10] + [1] * 10 for p in prompts]
    elif plan == "chunk7":
        chunks = [chunked(len(p), 7) for p in prompts]
    elif plan == "chunk64":
        chunks = [chunked(len(p), 64) for p in prompts]
    else:  # different schedules per sequence in the same steps
        chunks = [[40, 5, 1, 1, 23], [1] * 33, [12]]
    for got, want in zip(stepwise_logits(llm, prompts, chunks), ref, strict=True):
        assert_logits_close(got, want)


def test_v4_and_v5_config_styles_agree(tmp_path):
    """transformers v5 writes rope_parameters; v4 checkpoints carry rope_theta + rope_scaling."""
    overrides = VARIANTS["llama3-tied"][1]
    hf = build("LlamaForCausalLM", tmp_path, **overrides)
    cfg = json.loads((tmp_path / "config.json").read_text())
    params = cfg.pop("rope_parameters")
    cfg["rope_theta"] = params.pop("rope_theta")
    cfg["rope_scaling"] = params
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    llm = LLM(tmp_path, cpu=True)
    rope = llm.config.layers[0].mixer(AttentionConfig).rope
    assert (rope.scaling, rope.theta, rope.factor) == ("llama3", 500000.0, 8.0)
    prompt = _prompts([20], seed=5)[0]
    assert_logits_close(full_logits(llm.runner, [prompt])[0], hf_logits(hf, prompt))


def test_missing_config_json_is_inferred(tmp_path):
    """Sizes come from tensor shapes; hyper-parameters no shape carries (rope theta, norm eps) take the
    common defaults, which this checkpoint uses."""
    hf = build(
        "Qwen2ForCausalLM",
        tmp_path,
        num_attention_heads=2,  # head_dim 64: the assumption used when no config gives the head count
        num_key_value_heads=1,
        rms_norm_eps=1e-5,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0),
    )
    with_cfg = LLM(tmp_path, cpu=True).config
    (tmp_path / "config.json").unlink()
    inferred = LLM(tmp_path, cpu=True)
    assert inferred.config.architecture == "Qwen2ForCausalLM"
    a, b = inferred.config.layers[0].mixer(AttentionConfig), with_cfg.layers[0].mixer(AttentionConfig)
    assert (a.num_heads, a.num_kv_heads, a.head_dim, a.has_qkv_bias) == (
        b.num_heads,
        b.num_kv_heads,
        b.head_dim,
        True,
    )
    prompt = _prompts([15], seed=6)[0]
    assert_logits_close(full_logits(inferred.runner, [prompt])[0], hf_logits(hf, prompt))
