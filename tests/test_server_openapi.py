"""/openapi.json is truthful: schemathesis generates requests from it — valid and invalid, for every
operation — against a live `blazr serve` (tiny Llama, API key on); every response must be no 5xx and carry a
status, content type, headers and body the document declares. Bounded: 25 examples an operation and a
fixed seed: ~6900 generated cases (the schemathesis CLI: its pytest plugin does not run on this pytest)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server_util import ServerProcess
from tests.smollm2_reference import VOCAB, hf_tokenizer_dir
from tests.tiny import build

KEY = "sk-schema"
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,"
CHECKS += "response_schema_conformance"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    # SmolLM2's tokenizer (tokenizer.json, chat template) in the checkpoint: random text prompts tokenize in
    # range, and its 49152 ids make each generated token's head half cl100k's 100288 (the server's CPU here
    # was the tiny model's decode, its head most of it)
    build("LlamaForCausalLM", path, vocab_size=VOCAB)
    shutil.copytree(hf_tokenizer_dir(), path, dirs_exist_ok=True)
    args = ["--model", str(path), "--served-model-name", "m", "--num-threads", "1", "--max-model-len", "64"]
    with ServerProcess(args, api_key=KEY) as s:
        yield s


def test_every_response_matches_the_document(server, tmp_path):
    cli = Path(sys.executable).parent / "schemathesis"
    cmd = [str(cli), "run", f"{server.url}/openapi.json", "--checks", CHECKS, "--max-examples", "25"]
    cmd += ["--seed", "1", "--phases", "examples,coverage,fuzzing", "--no-color"]
    cmd += ["-H", f"Authorization: Bearer {KEY}", "--request-timeout", "120", "--workers", "1"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    report = run.stdout[-6000:] + run.stderr[-2000:]
    assert run.returncode == 0, report
    assert "passed" in run.stdout.lower(), report
    assert server.proc is not None and server.proc.poll() is None  # still serving
