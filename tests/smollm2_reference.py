"""SmolLM2 as transformers and gguf-py read it from the embedded GGUF — its tokenizer (the independent
reference of the tokenizer and chat-template tests, and the tokenizer the llama.cpp converter's checkpoints
carry: tests/llama_cpp_convert.py), made once per test process, and its float32 model (the reference of
test_smollm2 and test_llama_cpp), read from the GGUF once per test run.

`AutoTokenizer.from_pretrained(dir, gguf_file=…)` parses the 49152-token vocabulary field by field through
gguf-py: 8-10 s of CPU on the 2-core Zen 3 VM, and ~14 modules of the suite asked for it, each anew.
The files live in a directory of this process's own (outside the session's base temporary directory, which
tests/tmp_cleanup.py sweeps after each module), removed at exit; callers copy them, never change them.
`from_pretrained(dir, gguf_file=…)` of the model takes ~34 s the same way: the first process to ask saves
its config and state dict in the run's shared directory (`RUN_SHARED`, made by conftest.py's controller
before the workers start, removed when the run ends), and the others build it from those in ~3 s.
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from blazr.detect import default_model_path

VOCAB = 49152  # SmolLM2's tokenizer: ids a checkpoint carrying it must embed
RUN_SHARED = "BLAZR_TEST_RUN_SHARED"  # env: a directory every process of one test run shares


@functools.cache
def _home() -> Path:
    home = Path(tempfile.mkdtemp(prefix="blazr-smollm2-reference-"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    return home


@functools.cache
def hf_tokenizer_dir() -> Path:
    """transformers' tokenizer files for the embedded GGUF (tokenizer.json, tokenizer_config.json, chat
    template), saved from `AutoTokenizer.from_pretrained(dir, gguf_file=…)`. Read-only."""
    import transformers

    gguf = default_model_path()
    out = _home() / "hf"
    transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    return out


def gguf_tokenizer_metadata() -> dict[str, Any]:
    """The embedded GGUF's `tokenizer.*` fields as gguf-py's GGUFReader reads them, in JSON's types (a
    fresh copy each call)."""
    return json.loads(_gguf_tokenizer_json())


@functools.cache
def _gguf_tokenizer_json() -> str:
    import gguf

    reader = gguf.GGUFReader(default_model_path())
    return json.dumps({k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")})


@functools.cache
def hf_float_model() -> Any:
    """transformers' float32 SmolLM2 — its own reading and dequantization of the embedded GGUF, eval mode.
    Shared by the process's callers: never change it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    def from_gguf() -> Any:
        gguf = default_model_path()
        return AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)

    shared = os.environ.get(RUN_SHARED)
    if not shared:  # (outside a pytest run)
        return from_gguf().eval()
    out = Path(shared) / "smollm2-hf-float32"
    with open(Path(shared) / "smollm2-hf-float32.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process reads the GGUF; the others wait for its files
        if not (out / "config.json").exists():
            model = from_gguf()
            part = out.with_suffix(".part")  # (transformers will not save a model it read from a GGUF)
            part.mkdir(exist_ok=True)  # (a process that failed mid-write left one)
            torch.save(model.state_dict(), part / "weights.pt")
            model.config.to_json_file(part / "config.json")
            part.rename(out)  # whole or absent
            return model.eval()
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out), dtype=torch.float32)
    model.load_state_dict(torch.load(out / "weights.pt"))
    return model.eval()
