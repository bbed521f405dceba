"""The command line, run as a user runs it (subprocesses): generate/info/decode output, and every broken
input answered with one `error: …` line and exit status 1 — never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from blazr import LLM, SamplingParams
from tests.tiny import build


def blazr(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "blazr", *args],
        capture_output=True,
        text=True,
        input=stdin,
        env=env,
        timeout=300,
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli-tiny")
    build("LlamaForCausalLM", path, vocab_size=100288)  # cl100k_base ids fit: text prompts work
    return path


def test_generate_prints_only_the_completion(tiny):
    r = blazr(
        "generate", "--model", str(tiny), "--prompt", "Hello there", "--max-tokens", "12",
        "--temperature", "0", "--ignore-eos", "--cpu",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    expected = LLM(tiny, cpu=True).generate(
        "Hello there", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    )
    assert r.stdout == expected[0].text + "\n"
    assert "12 generated" in r.stderr and "tok/s" in r.stderr


def test_generate_with_speculative_decoding(tiny):
    """--speculative ngram (a prompt that repeats, so n-grams match): the completion without it; a draft
    model drafts for itself; bad combinations of the flags are one-line errors."""
    prompt = "one two three four " * 6
    args = ["generate", "--model", str(tiny), "--prompt", prompt, "--max-tokens", "24", "--temperature", "0",
            "--ignore-eos", "--cpu"]  # fmt: skip
    plain = blazr(*args)
    assert plain.returncode == 0, plain.stderr
    for extra in (["--speculative", "ngram", "--num-speculative-tokens", "3"],
                  ["--speculative", "draft", "--draft-model", str(tiny)]):  # fmt: skip
        r = blazr(*args, *extra)
        assert r.returncode == 0, r.stderr
        assert r.stdout == plain.stdout
    _error(blazr(*args, "--draft-model", str(tiny)), r"--draft-model needs --speculative draft")
    _error(
        blazr(*args, "--speculative", "draft"), r"method 'draft' needs a draft model \(--draft-model PATH\)"
    )
    _error(
        blazr(*args, "--speculative", "ngram", "--num-speculative-tokens", "17"), r"num_speculative_tokens 17"
    )


def test_generate_reads_the_prompt_from_stdin(tiny):
    args = ["generate", "--model", str(tiny), "--max-tokens", "4", "--temperature", "0", "--ignore-eos"]
    assert blazr(*args, stdin="Hello there").stdout == blazr(*args, "--prompt", "Hello there").stdout


def test_kv_cache_dtype_flag(tiny):
    for kv in ("bfloat16", "float16"):
        r = blazr(
            "generate", "--model", str(tiny), "--prompt", "Hi", "--max-tokens", "3", "--temperature", "0",
            "--cpu", "--kv-cache-dtype", kv, "--log-level", "info",
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert f"kv cache {kv})" in r.stderr
    r = blazr("generate", "--model", str(tiny), "--prompt", "Hi", "--kv-cache-dtype", "fp8")
    assert r.returncode != 0 and "invalid choice: 'fp8'" in r.stderr and "Traceback" not in r.stderr


def test_info_reports_the_detected_model(tiny):
    r = blazr("info", "--model", str(tiny))
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["format"] == "hf"
    assert info["architecture"] == "LlamaForCausalLM"
    assert info["layer_kinds"] == ["attention+mlp", "attention+mlp"]
    expected = sum(t.numel() for t in load_file(tiny / "model.safetensors").values())
    assert info["tokenizer"]["source"] == "cl100k_base (from vocab_size 100288)"
    assert info["parameters"]["total"] == expected
    assert (
        info["cache"]["kv_bytes_per_token"] == 2 * 2 * 2 * 32 * 4
    )  # layers × (K,V) × kv heads × head_dim × fp32
    assert info["config"]["hidden_size"] == 128


def test_no_prefix_cache_flag(tiny):
    """`--no-prefix-cache` where an engine is built (generate, chat, serve) and on `info`; the load log and
    `info` say whether prefix caching is on."""
    from blazr.cli import build_parser
    from blazr.server.options import ServerConfig

    on = json.loads(blazr("info", "--model", str(tiny)).stdout)["cache"]
    off = json.loads(blazr("info", "--model", str(tiny), "--no-prefix-cache").stdout)["cache"]
    assert (on["prefix_caching"], off["prefix_caching"]) == (True, False)
    assert "token slots" in on["plan"] and "state snapshots" not in on["plan"]  # (no recurrent layers)
    args = ["--model", str(tiny), "--max-tokens", "2", "--temperature", "0", "--cpu", "--log-level", "info"]
    for flag, state in (([], "on"), (["--no-prefix-cache"], "off")):
        r = blazr("generate", *args, "--prompt", "Hi", *flag)
        assert r.returncode == 0, r.stderr
        assert f"prefix cache {state}" in r.stderr and "; cache: " in r.stderr
    r = blazr("chat", *args, "--no-prefix-cache", stdin="Hi\nHi again\n")
    assert r.returncode == 0 and "prefix cache off" in r.stderr, r.stderr
    assert ServerConfig.from_args(build_parser().parse_args(["serve"])).engine.enable_prefix_caching
    assert not ServerConfig.from_args(
        build_parser().parse_args(["serve", "--no-prefix-cache"])
    ).engine.enable_prefix_caching


def test_info_on_the_embedded_model():
    info = json.loads(blazr("info").stdout)
    assert (info["format"], info["num_layers"], info["config"]["vocab_size"]) == ("gguf", 30, 49152)


def test_decode_with_a_vocab_and_with_a_model(tiny):
    r = blazr("decode", "--vocab", "cl100k_base", "--ids", "9906, 1917")
    assert (r.returncode, r.stdout) == (0, "Hello world\n")
    r = blazr("decode", "--ids", "504,3575,282,4649,314,7042")  # the embedded model's vocabulary
    assert r.stdout == "The capital of France is Paris\n"


def test_the_command_freezes_its_own_heap_and_leaves_a_callers_alone():
    """`blazr …` as its process's command moves the objects made so far (torch's modules) to the collector's
    permanent generation — its exit then skips collecting them —, while `main([...])` called inside another
    program leaves that program's heap as it was."""
    code = (
        "import gc, sys\n"
        "from blazr.cli import main\n"
        "assert main(['decode', '--vocab', 'cl100k_base', '--ids', '9906']) == 0\n"
        "print('caller', gc.get_freeze_count())\n"
        "sys.argv = ['blazr', 'decode', '--vocab', 'cl100k_base', '--ids', '1917']\n"
        "assert main() == 0\n"
        "print('command', gc.get_freeze_count() > 10_000)\n"  # the modules imported (~35k objects)
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["Hello", "caller 0", " world", "command True"]


def test_commands_that_load_no_model_do_not_import_torch(tmp_path):
    """The parser (every command's flags, the tool and reasoning parsers' names among them) and `decode`
    import no torch: `blazr --help`, `decode` and `bench` start in well under a second, not after torch's
    ~3 s import. Nor do `generate`, `chat`, `info` and `decode` given a model path that names nothing, or
    `generate` and `chat` given engine flags that do not go together: the one-line error comes at once."""
    code = (
        "import sys\n"
        "from blazr.cli import build_parser, main\n"
        "build_parser()\n"
        "assert main(['decode', '--vocab', 'cl100k_base', '--ids', '9906']) == 0\n"
        "for cmd in (['generate', '--prompt', 'x'], ['chat'], ['info'], ['decode', '--ids', '1']):\n"
        "    assert main([*cmd, '--model', '/no/such/model']) == 1\n"
        "for cmd in (['generate', '--prompt', 'x'], ['chat']):\n"
        "    assert main([*cmd, '--model', sys.argv[1], '--speculative', 'draft']) == 1\n"
        "print('torch' in sys.modules)\n"
    )
    somewhere = str(tmp_path)  # a path that names something
    r = subprocess.run([sys.executable, "-c", code, somewhere], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["Hello", "False"]
    assert r.stderr.count("error: model path not found: /no/such/model") == 4, r.stderr
    assert r.stderr.count("'draft' needs a draft model (--draft-model PATH)") == 2, r.stderr


# ------------------------------------------------------------------------------------------- errors


def _error(r: subprocess.CompletedProcess[str], pattern: str) -> None:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, r.stderr
    import re

    assert re.search(pattern, lines[0]), lines[0]


def test_error_path_missing():
    _error(
        blazr("generate", "--model", "/no/such/model", "--prompt", "x"),
        r"model path not found: /no/such/model",
    )


def test_error_no_weights(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    _error(blazr("info", "--model", str(tmp_path)), r"no weights in .*found \['notes\.txt'\]")


def test_error_truncated_safetensors(tiny, tmp_path):
    data = (tiny / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    _error(blazr("info", "--model", str(tmp_path)), r"model\.safetensors: corrupt or truncated")


def test_error_corrupt_gguf(tmp_path):
    (tmp_path / "junk.gguf").write_bytes(os.urandom(4096))
    _error(blazr("info", "--model", str(tmp_path / "junk.gguf")), r"junk\.gguf")


def test_error_wrong_shape(tiny, tmp_path):
    tensors = load_file(tiny / "model.safetensors")
    tensors["model.layers.0.self_attn.o_proj.weight"] = torch.zeros(128, 64)
    save_file(tensors, tmp_path / "model.safetensors")
    shutil.copy(tiny / "config.json", tmp_path)
    r = blazr("generate", "--model", str(tmp_path), "--prompt", "x", "--max-tokens", "1")
    _error(r, r"o_proj\.weight .*expected shape \[128, 128\], found \[128, 64\]")


def test_error_missing_tensor(tiny, tmp_path):
    tensors = load_file(tiny / "model.safetensors")
    del tensors["model.norm.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    shutil.copy(tiny / "config.json", tmp_path)
    _error(
        blazr("generate", "--model", str(tmp_path), "--prompt", "x"), r"missing tensor model\.norm\.weight"
    )


def test_error_unsupported_architecture(tiny, tmp_path):
    shutil.copy(tiny / "model.safetensors", tmp_path)
    cfg = json.loads((tiny / "config.json").read_text()) | {"architectures": ["BertForMaskedLM"]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    _error(
        blazr("info", "--model", str(tmp_path)),
        r"unsupported architecture BertForMaskedLM; supported: .*Llama",
    )


def test_error_unknown_vocab():
    _error(blazr("decode", "--vocab", "klingon", "--ids", "1"), r"unknown vocab.*cl100k_base")


def test_error_bad_sampling_flag(tmp_path):
    """Before the model loads: the flag's error, not the checkpoint's (this one has no weights)."""
    (tmp_path / "notes.txt").write_text("x")
    _error(
        blazr("generate", "--model", str(tmp_path), "--prompt", "x", "--top-p", "1.5"),
        r"top_p must be in \(0, 1\]",
    )


# -------------------------------------------------------------------------------------------- bench


def test_bench_shared_prefix_cached_tokens_and_acceptance():
    """`blazr bench --shared-prefix-len N` against a stub server: every prompt (warm-up too) starts with the
    same N words, each level sends new prompts, and the server's `usage.prompt_tokens_details.cached_tokens`
    becomes the table's cached share; its speculative-decoding counters on /metrics (4 drafted, 3 accepted
    per request) the acceptance column. A server that reports neither gets neither column."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    prompts: list[str] = []
    report_cached = [True]
    spec = {"spec_decode_num_draft_tokens_total": 0, "spec_decode_num_accepted_tokens_total": 0}

    class Stub(BaseHTTPRequestHandler):
        def _send(self, body: bytes, kind: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/metrics":
                if not report_cached[0]:
                    self._send(b"blazr:num_requests_running 0\n", "text/plain")
                    return
                text = "".join(f"# TYPE blazr:{k} counter\nblazr:{k} {v}.0\n" for k, v in spec.items())
                self._send(text.encode(), "text/plain")
                return
            self._send(json.dumps({"data": [{"id": "stub"}]}).encode(), "application/json")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            prompts.append(body["prompt"])
            spec["spec_decode_num_draft_tokens_total"] += 4
            spec["spec_decode_num_accepted_tokens_total"] += 3
            usage = {"prompt_tokens": len(body["prompt"].split()), "completion_tokens": 2}
            if report_cached[0]:
                usage["prompt_tokens_details"] = {"cached_tokens": 8}
            events = [{"choices": [{"index": 0, "text": t}]} for t in (" a", " b")]
            events.append({"choices": [], "usage": usage})
            sse = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
            self._send(sse.encode(), "text/event-stream")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    common = ["bench", "--base-url", url, "--concurrency", "1,2", "--num-prompts", "3", "--input-len", "5"]
    try:
        r = blazr(*common, "--output-len", "2", "--shared-prefix-len", "8")
        assert r.returncode == 0, r.stderr
        assert len(prompts) == 1 + 2 * 3  # the warm-up, then 3 per level
        words = [p.split() for p in prompts]
        assert all(len(w) == 8 + 5 and w[:8] == words[0][:8] for w in words)
        assert len({" ".join(w[8:]) for w in words[1:]}) == 6  # new prompts at every level
        assert "after 8 shared words" in r.stderr
        table = [line for line in r.stdout.splitlines() if line.startswith("|")]
        assert table[0].endswith(" cached | accepted |")
        assert all(row.endswith(f" {100 * 8 / 13:.1f}% | 75.0% |") for row in table[2:]), table

        prompts.clear()
        report_cached[0] = False
        r = blazr(*common, "--output-len", "2")
        assert r.returncode == 0, r.stderr
        assert all(len(p.split()) == 5 for p in prompts)
        assert "cached" not in r.stdout and "accepted" not in r.stdout
    finally:
        server.shutdown()
    r = blazr(*common, "--shared-prefix-len", "-1")
    assert r.returncode == 2 and "error: --shared-prefix-len must be ≥ 0" in r.stderr
