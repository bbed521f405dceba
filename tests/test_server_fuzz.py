"""A bounded fuzz of the live server (tests/fuzz_requests.py): 400 malformed, adversarial and valid
requests, 8 at a time, against a tiny Llama — no 5xx, every error OpenAI JSON, every stream ended with
[DONE], /health 200 throughout, and afterwards nothing left running and the whole admission capacity free
(one call of max_num_seqs + max_waiting sequences is served). benchmarks/fuzz.py runs the same at any
size and reports the counts."""

from __future__ import annotations

import asyncio
import random

import pytest

from tests.fuzz_requests import generate, run
from tests.server_util import ServerProcess
from tests.tiny import build

VOCAB = 100288


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    build("LlamaForCausalLM", path, vocab_size=VOCAB)
    args = ["--model", str(path), "--served-model-name", "m", "--num-threads", "1", "--max-model-len", "128"]
    args += ["--max-num-seqs", "8", "--max-waiting", "32", "--max-request-bytes", "200000"]
    with ServerProcess(args) as s:
        yield s


def test_fuzz(server):
    gen = generate(random.Random(1234), "m", VOCAB)
    report = asyncio.run(run(server.url, [next(gen) for _ in range(400)], concurrency=8))
    assert report.num_requests == 400
    assert not report.failures, "\n".join(report.failures[:10])
    assert report.num_5xx == 0 and report.health_failures == 0, report.summary()
    assert report.statuses[200] > 100 and report.statuses[400] > 100, report.summary()  # both kinds tried
    m = server.wait_metric("blazr:num_requests_running", lambda v: v == 0)
    assert m["blazr:num_requests_waiting"] == 0 and m["blazr:kv_cache_usage_perc"] == 0
    # nothing leaked from the admission count: the whole capacity (8 running + 32 waiting) in one call
    full = server.client().completions.create(model="m", prompt=[[1, 2, 3]] * 5, n=8, max_tokens=2)
    assert len(full.choices) == 40 and all(c.finish_reason == "length" for c in full.choices)
