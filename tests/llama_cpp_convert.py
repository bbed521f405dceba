"""GGUF files made the way users get them: llama.cpp's own `convert_hf_to_gguf.py` (from the
llama-cpp-python sdist that `make test` unpacks into .venv/llama-cpp-sdist, or $LLAMA_CPP_SDIST) run on a
tiny transformers checkpoint, and llama.cpp's quantizer (`llama_model_quantize`) for the block types.

The converter needs a tokenizer it recognises: SmolLM2's, exported from the embedded GGUF (so checkpoints
that go through it have SmolLM2's 49152-token vocabulary) — or, for converters that take only a Llama-style
one (Jamba's), a small SentencePiece model trained here (`spm_tokenizer`); GLM's converter looks up GLM's
special tokens by name, added to SmolLM2's (`glm_tokenizer`)."""

from __future__ import annotations

import atexit
import io
import json
import os
import queue
import random
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from tests.smollm2_reference import VOCAB as VOCAB  # SmolLM2's: the converter's pre-tokenizer table knows it
from tests.smollm2_reference import hf_tokenizer_dir

SDIST_DIR = Path(__file__).resolve().parent.parent / ".venv" / "llama-cpp-sdist"


def converter() -> Path:
    """convert_hf_to_gguf.py of the llama-cpp-python sdist matching the installed llama_cpp."""
    root = Path(os.environ["LLAMA_CPP_SDIST"]) if "LLAMA_CPP_SDIST" in os.environ else None
    if root is None:
        found = sorted(SDIST_DIR.glob("llama_cpp_python-*/"))
        root = found[-1] if found else SDIST_DIR / "llama_cpp_python-<version>"
    script = root / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise FileNotFoundError(
            f"{script} not found: `make test` unpacks the llama-cpp-python sdist into {SDIST_DIR} "
            "(or point LLAMA_CPP_SDIST at an unpacked sdist)"
        )
    return script


def export_tokenizer(dst: Path) -> Path:
    """SmolLM2's tokenizer files (tokenizer.json, tokenizer_config.json, chat template) under `dst`: copies
    of the process's one export (tests/smollm2_reference.py)."""
    if not (dst / "tokenizer.json").is_file():
        shutil.copytree(hf_tokenizer_dir(), dst, dirs_exist_ok=True)
    return dst


GLM_SPECIAL = ("[gMASK]", "<|user|>", "<|observation|>")  # beside SmolLM2's <|endoftext|> (id 0)


def glm_tokenizer(dst: Path) -> Path:
    """SmolLM2's tokenizer with the special tokens llama.cpp's GLM converter (`_set_vocab_glm`) looks up —
    `[gMASK]` (its BOS), `<|user|>` (EOT), `<|observation|>` (EOM) — added after its 49152 (ids 49152…
    49154: a checkpoint's vocabulary must hold `VOCAB + len(GLM_SPECIAL)`); the pre-tokenizer, which the
    converter recognises by its output on a fixed text, is SmolLM2's."""
    import transformers

    if not (dst / "tokenizer.json").is_file():
        tok = transformers.AutoTokenizer.from_pretrained(export_tokenizer(dst))
        tok.add_special_tokens({"additional_special_tokens": list(GLM_SPECIAL)})
        tok.save_pretrained(dst)
    return dst


# architectures whose converter expects a multi-token-prediction head unless told there is none
NO_MTP = (
    "Qwen3NextForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
)


def convert(
    hf_dir: Path, tokenizer_dir: Path | None, out: Path, outtype: str = "f32", script: Path | None = None
) -> Path:
    """`hf_dir` (a saved transformers checkpoint; its tokenizer copied in from `tokenizer_dir` unless None)
    → a GGUF at `out`, by llama.cpp's converter (`script`, default `converter()`); `--no-mtp` for the
    Qwen3-Next / Qwen3.5 families, whose converter otherwise requires an MTP head."""
    for f in tokenizer_dir.iterdir() if tokenizer_dir is not None else ():
        shutil.copy(f, hf_dir / f.name)
    script = script or converter()
    args = [str(hf_dir), "--outtype", outtype, "--outfile", str(out)]
    archs = json.loads((hf_dir / "config.json").read_text()).get("architectures") or []
    if any(a in NO_MTP for a in archs):
        args.append("--no-mtp")
    rc, log = _run_converter(script, args)
    if rc != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py failed ({rc}):\n{log}")
    return out


# With KEEP_WORKERS (the test session sets it: tests/conftest.py) the converter runs in worker processes that
# import it once (torch, transformers, gguf-py and its model classes: ~2.2 s of a tiny checkpoint's ~3 s
# conversion) and then convert one request after another, each its `main()` under its own argv — the same
# bytes as `python convert_hf_to_gguf.py ARGS`, without the start-up. A worker per concurrent caller (the
# fixtures convert two at a time); they end with the process (their stdin closes). Otherwise (benchmarks:
# checkpoints of gigabytes, whose freed memory a long-lived worker would keep) one process per conversion.
KEEP_WORKERS = False
_WORKER = r"""
import contextlib, importlib.util, io, json, logging, sys, traceback
script = sys.argv[1]
sys.path.insert(0, str(__import__("pathlib").Path(script).parent))
spec = importlib.util.spec_from_file_location("convert_hf_to_gguf", script)
mod = importlib.util.module_from_spec(spec)
sys.modules["convert_hf_to_gguf"] = mod
spec.loader.exec_module(mod)
out = sys.stdout
for line in sys.stdin:
    sys.argv = [script, *json.loads(line)]
    log = io.StringIO()
    root = logging.getLogger()
    for handler in root.handlers[:]:  # main()'s basicConfig then logs to this run's log, not the first's
        root.removeHandler(handler)
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            mod.main()
        rc = 0
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc(file=log)
        rc = 1
    out.write(json.dumps({"rc": rc, "log": log.getvalue()[-3000:]}) + "\n")
    out.flush()
"""
_idle: dict[Path, queue.SimpleQueue] = {}
_workers: list[subprocess.Popen] = []
_lock = threading.Lock()


def _run_alone(script: Path, args: list[str], env: dict[str, str]) -> tuple[int, str]:
    done = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True)
    return done.returncode, done.stderr[-3000:]


def _run_converter(script: Path, args: list[str]) -> tuple[int, str]:
    """`convert_hf_to_gguf.py ARGS`: its exit status and the end of its log — with KEEP_WORKERS in an idle
    worker of `script` (a new one when none is idle), else in a process of its own."""
    env = dict(os.environ, PYTHONPATH=str(script.parent / "gguf-py"))
    if not KEEP_WORKERS:
        return _run_alone(script, args, env)
    with _lock:
        idle = _idle.setdefault(script, queue.SimpleQueue())
    try:
        worker = idle.get_nowait()
    except queue.Empty:
        worker = subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(script)], env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        with _lock:
            _workers.append(worker)
    assert worker.stdin is not None and worker.stdout is not None
    try:
        worker.stdin.write(json.dumps(args) + "\n")
        worker.stdin.flush()
        reply = worker.stdout.readline()
    except BrokenPipeError:
        reply = ""
    if not reply:  # the worker died (its import failed, or it crashed): not put back; the script run alone
        worker.kill()  # says why
        rc, log = _run_alone(script, args, env)
        return rc or 1, log
    idle.put(worker)
    done = json.loads(reply)
    return done["rc"], done["log"]


@atexit.register
def _stop_workers() -> None:
    for worker in _workers:
        if worker.stdin is not None:
            worker.stdin.close()
    for worker in _workers:
        try:
            worker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            worker.kill()


def quantize(src: Path, out: Path, ftype: str) -> Path:
    """llama.cpp's quantizer: `src` (F32/F16 GGUF) → `out` with LLAMA_FTYPE_MOSTLY_{ftype} (Q8_0, Q4_0…)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src.name} → {ftype}) failed ({rc})")
    return out


# config.json edits that make a transformers-v5 save look like the published files llama.cpp's converter reads
NEMOTRON_MOE_KEYS = (  # NemotronHConfig's MoE fields, absent from the dense models' published config.json
    "n_routed_experts", "n_shared_experts", "moe_intermediate_size", "moe_shared_expert_intermediate_size",
    "moe_latent_size", "moe_shared_expert_overlap", "num_experts_per_tok", "routed_scaling_factor",
    "n_group", "topk_group", "norm_topk_prob", "mtp_layers_block_type", "num_nextn_predict_layers",
)  # fmt: skip


def granite_as_published(raw: dict) -> None:
    """Hybrid Granite layer types as the published files name them (`attention` / `mamba`; transformers v5
    writes `full_attention` / `linear_attention`)."""
    legacy = {"full_attention": "attention", "linear_attention": "mamba"}
    raw["layer_types"] = [legacy.get(t, t) for t in raw["layer_types"]]


def nemotron_as_published(raw: dict, pattern: str) -> None:
    """A dense Nemotron-H config.json as published: `hybrid_override_pattern`, no MoE fields, and no
    model_type (with one, the converter lets transformers' AutoConfig rewrite the config)."""
    for key in (*NEMOTRON_MOE_KEYS, "model_type", "layers_block_type"):
        raw.pop(key, None)
    raw["hybrid_override_pattern"] = pattern
    raw["num_hidden_layers"] = len(pattern)


def kimi_as_published(raw: dict) -> None:
    """A Kimi-Linear config.json as moonshotai publishes it: the KDA sizes and the 1-based layer lists under
    `linear_attn_config`, `first_k_dense_replace`, `moe_router_activation_func`, and no model_type (with
    one, the converter lets transformers' AutoConfig rewrite the config, which drops `linear_attn_config`)."""
    types = raw.pop("layer_types")
    raw["linear_attn_config"] = {
        "head_dim": raw.pop("linear_head_dim"),
        "num_heads": raw.pop("linear_num_heads"),
        "short_conv_kernel_size": raw.pop("linear_conv_kernel_dim"),
        "kda_layers": [i + 1 for i, t in enumerate(types) if t == "linear_attention"],
        "full_attn_layers": [i + 1 for i, t in enumerate(types) if t == "full_attention"],
    }
    raw["first_k_dense_replace"] = raw.pop("mlp_layer_types").count("dense")
    raw["max_position_embeddings"] = raw["model_max_length"]
    raw["moe_router_activation_func"] = "sigmoid"
    raw["n_group"] = raw["num_expert_group"]  # the key the converter's generic MoE metadata reads
    raw.pop("model_type")


def kimi_weights_as_published(hf_dir: Path) -> None:
    """The dense layers' MLP under `mlp.` as moonshotai's files hold it (transformers saves every layer's
    feed-forward under `block_sparse_moe.`, which llama.cpp's converter cannot map for a dense one)."""
    from safetensors.torch import load_file, save_file

    path = hf_dir / "model.safetensors"
    dense = re.compile(r"(model\.layers\.\d+\.)block_sparse_moe\.((?:gate|up|down)_proj\.weight)")
    tensors = {dense.sub(r"\1mlp.\2", n): t for n, t in load_file(path).items()}
    save_file(tensors, path, metadata={"format": "pt"})


def spm_tokenizer(dst: Path, vocab: int = 600) -> Path:
    """A SentencePiece BPE model (byte fallback; <unk> 0, <s> 1, </s> 2) trained on random words: the
    Llama-style tokenizer.model llama.cpp's Jamba converter requires."""
    import sentencepiece

    dst.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    words = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 7)))
        for _ in range(400)
    ]
    lines = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(2000)]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
    )  # fmt: skip
    (dst / "tokenizer.model").write_bytes(model.getvalue())
    return dst
