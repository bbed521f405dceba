"""SmolLM2's tokenizer as transformers and gguf-py read it from the embedded GGUF — the independent reference
of the tokenizer and chat-template tests, and the tokenizer the llama.cpp converter's checkpoints carry
(tests/llama_cpp_convert.py) — made once per test process.

`AutoTokenizer.from_pretrained(dir, gguf_file=…)` parses the 49152-token vocabulary field by field through
gguf-py: 8-10 s of CPU on the 2-core Zen 3 VM, and ~14 modules of the suite asked for it, each anew.
The files live in a directory of this process's own (outside the session's base temporary directory, which
tests/tmp_cleanup.py sweeps after each module), removed at exit; callers copy them, never change them.
"""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from blazr.detect import default_model_path

VOCAB = 49152  # SmolLM2's tokenizer: ids a checkpoint carrying it must embed


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
