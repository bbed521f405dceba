"""Split GGUFs (llama.cpp's gguf-split layout: `-0000i-of-0000N.gguf` parts, `split.*` keys, each tensor in
one part) load as the one-file GGUF holding the same tensors: same tensors, same greedy tokens; a missing
or inconsistent part is a one-line error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from blazr import LLM, SamplingParams
from blazr.detect import find_weight_files, inspect_checkpoint
from blazr.errors import CheckpointError
from blazr.loading.gguf import GGUFFile
from blazr.loading.gguf_split import GGUFParts, open_gguf
from tests.gguf_fixtures import write_tiny_llama_gguf
from tests.test_gguf import TINY, tiny_state_dict

VOCAB = [f"t{i}" for i in range(TINY["vocab_size"])]


def write_split(directory: Path, qtype: str, num_tensors_first: int) -> tuple[Path, list[Path]]:
    """The same weights as one file and as two parts (metadata and vocabulary in the first, as gguf-split
    writes them); (single file, parts)."""
    directory.mkdir(parents=True, exist_ok=True)
    state = tiny_state_dict(seed=3)
    merges = {"tokenizer.ggml.merges": ["t 1"]}
    single = write_tiny_llama_gguf(directory / "single.gguf", state, TINY, qtype, VOCAB, merges)
    names = list(state)
    split = {"split.count": 2, "split.tensors.count": len(names)}
    parts = [directory / "m-Q8_0-00001-of-00002.gguf", directory / "m-Q8_0-00002-of-00002.gguf"]
    first = {n: state[n] for n in names[:num_tensors_first]}
    rest = {n: state[n] for n in names[num_tensors_first:]}
    write_tiny_llama_gguf(
        parts[0], first, TINY, qtype, vocab=VOCAB, metadata={**split, **merges, "split.no": 0}
    )
    write_tiny_llama_gguf(parts[1], rest, TINY, qtype, metadata={**split, "split.no": 1})
    return single, parts


@pytest.mark.parametrize("qtype", ["Q8_0", "F32"])
@pytest.mark.parametrize("num_first", [7, 8, 3], ids=["whole-layers", "gate|up-apart", "q|k|v-apart"])
def test_a_split_gguf_loads_as_the_single_file(tmp_path: Path, qtype: str, num_first: int):
    """Split between tensors, and between the parts of a fused weight (blazr fuses gate|up and q|k|v; a
    fused weight whose parts lie in two files' maps is gathered, not viewed)."""
    single, parts = write_split(tmp_path / qtype, qtype, num_tensors_first=num_first)
    whole = GGUFFile(single)
    both = open_gguf(parts[1])  # any part opens the set
    assert isinstance(both, GGUFParts) and both.paths == tuple(parts)
    assert sorted(both.tensor_names) == sorted(whole.tensor_names)
    for name in whole.tensor_names:
        assert both.tensor_type(name) == whole.tensor_type(name)
        assert torch.equal(both.raw(name), whole.raw(name))
    ckpt = inspect_checkpoint(parts[0], vocab_name=None)
    assert ckpt.weight_files == tuple(parts)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompt = [[1, 5, 9, 2, 7]]
    expected = LLM(single, cpu=True).generate(prompt, params)[0].outputs[0].token_ids
    assert LLM(parts[0], cpu=True).generate(prompt, params)[0].outputs[0].token_ids == expected


def test_a_directory_with_one_split_set_opens_its_first_part(tmp_path: Path):
    _, parts = write_split(tmp_path, "F32", num_tensors_first=5)
    (tmp_path / "single.gguf").unlink()
    assert find_weight_files(tmp_path) == ("gguf", [parts[0]])


def test_missing_or_inconsistent_parts_are_one_line_errors(tmp_path: Path):
    _, parts = write_split(tmp_path, "F32", num_tensors_first=5)
    moved = parts[1].rename(tmp_path / "elsewhere.gguf")
    with pytest.raises(
        CheckpointError, match=r"part of a 2-part split GGUF; missing m-Q8_0-00002-of-00002\.gguf"
    ):
        open_gguf(parts[0])
    write_tiny_llama_gguf(parts[1], {}, TINY, metadata={"split.count": 2, "split.no": 0})
    with pytest.raises(CheckpointError, match=r"expected split.no 1 of split.count 2, found 0 of 2"):
        open_gguf(parts[0])
    moved.replace(parts[1])
    three = tmp_path / "m-Q8_0-00001-of-00003.gguf"
    parts[0].rename(three)
    for i in (2, 3):
        write_tiny_llama_gguf(
            tmp_path / f"m-Q8_0-0000{i}-of-00003.gguf", {}, TINY, metadata={"split.count": 2}
        )
    with pytest.raises(CheckpointError, match=r"split.count is 2 but the file names say 3 parts"):
        open_gguf(three)
