# Run `make help` for the targets. Variables: kernel, mode, dtype, pass, ARGS (extra Hydra overrides).
SHELL := /bin/bash
VENV ?= .venv
PY ?= $(VENV)/bin/python
# With PY pointing elsewhere (an existing env with torch), nothing is installed.
SETUP := $(if $(filter $(VENV)/bin/python,$(PY)),$(VENV)/.installed,)
PYTHON_VERSION ?= 3.12
PLATFORM ?= manylinux2014_x86_64
WHEELHOUSE ?= wheelhouse
# make wheelhouse PEERS=1: the peer libraries' wheels too (about 200 MB; docs/peers.md)
PEERS ?=
RESULTS ?= results/current/h100/study

# kernel=..., mode=..., dtype=..., pass=... become Hydra overrides when given.
OVERRIDES = $(if $(kernel),kernel=$(kernel)) $(if $(mode),mode=$(mode)) \
            $(if $(dtype),dtype=$(dtype)) $(if $(pass),pass=$(pass)) $(ARGS)

.DEFAULT_GOAL := help
.PHONY: help setup peers experiment sweep bench study promote fuzz resume model-shapes probe resources test test-slow test-all test-gpu sync figures report notebooks dashboard \
        wheelhouse install-offline lint clean

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

$(VENV)/.installed: requirements.txt requirements-cpu.txt
	python3 -m venv --system-site-packages $(VENV)
	@# If python3 is itself a venv holding torch (as on many GPU images), let .venv see its packages.
	python3 -c "import site; print('\n'.join(site.getsitepackages()))" \
	  > "$$($(VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/parent-env.pth"
	$(VENV)/bin/python -c "import torch, triton" 2>/dev/null || $(VENV)/bin/pip install -r requirements-cpu.txt
	$(VENV)/bin/pip install -r requirements.txt
	touch $@

setup: $(SETUP) ## Create .venv and install requirements (reuses an installed torch/triton)

# --no-deps: flag-gems pins numpy 1.26.4 and other old releases; the file lists every package the
# peers need beyond requirements.txt, so nothing already installed is touched (docs/peers.md).
peers: $(SETUP) ## Optional peer libraries for mode=flaggems|liger|quack (requirements-peers.txt)
	$(PY) -m pip install -q --no-deps -r requirements-peers.txt
	$(PY) -m experiments.peers

experiment: $(SETUP) ## One run: make experiment kernel=matmul mode=max-autotune [dtype=fp16] [ARGS="shapes=llm"]
	$(PY) -m experiments.run $(OVERRIDES)

sweep: $(SETUP) ## Hydra multirun over comma lists: make sweep kernel=matmul,softmax mode=eager,triton
	$(PY) -m experiments.run --multirun $(OVERRIDES)

bench: $(SETUP) ## An op's speed-target grids + ratio table (grids: experiments/registry.py): make bench kernel=<op> [ARGS="--grids 6,7"]
	$(PY) -m experiments.bench $(kernel) $(if $(BENCH_DIR),--dir $(BENCH_DIR)) $(ARGS)

study: $(SETUP) ## The whole grid, one job per GPU (docs/study.md): make study [STUDY=multirun/study/<time> to finish one] [ARGS="--dry-run" | ARGS=--smoke | ARGS="study.budget_s=540": one slice on one GPU]
	$(PY) -m experiments.study $(if $(STUDY),--dir $(STUDY)) $(ARGS)

promote: $(SETUP) ## Copy a finished run's records into results/current: make promote RUN=multirun/bench-softmax/<stamp> GPU=h100 NAME=softmax [ARGS=--force|--merge]
	@$(if $(and $(RUN),$(GPU),$(NAME)),,echo "error: make promote needs RUN=<multirun or bench dir> GPU=h100|h200 NAME=<folder>" >&2; exit 2)
	$(PY) -m analysis.promote $(RUN) $(GPU) $(NAME) $(ARGS)

fuzz: $(SETUP) ## Fuzz every op's kernel API against float64 on a GPU (1000 cases, 8 processes): make fuzz [ARGS="--cases 2000"]
	$(PY) -m experiments.fuzz --cases 1000 --autotune-share 0.05 --workers 8 $(ARGS)

resume: $(SETUP) ## Finish an interrupted sweep: make resume SWEEP=multirun/<date>/<time> [ARGS=...]
	$(PY) -m experiments.resume $(SWEEP) $(ARGS)

# TRITON=3.6.0 compiles with that Triton release instead of the installed one (the GPU
# machines' version): it is pip-installed once, without dependencies, into .triton-<version>/.
TRITON ?=
TRITON_DIR = .triton-$(TRITON)

model-shapes: $(SETUP) ## Record every model's op calls into conf/kernel/recorded/ (shapes=resnet50, ...; CPU, seconds): make model-shapes [ARGS=--check]
	$(PY) -m experiments.model_shapes $(or $(ARGS),--write)

probe: $(SETUP) ## Each conv tuning config forced alone, on a GPU, against cuDNN: make probe design=implicit|gemm|depthwise [ARGS="--shapes resnet50 --splits 1,2"]
	$(PY) -m experiments.tile_probe $(design) $(ARGS)

resources: $(SETUP) ## Registers/spills/smem/PTX hash of each kernel a GPU would launch, compiled offline: make resources kernel=conv [dtype=fp16] [pass=fwd_bwd] [TRITON=3.6.0] [ARGS="--shapes resnet50 --arch 90 --sms 132"]
	$(if $(TRITON),test -d $(TRITON_DIR)/triton || $(PY) -m pip install -q --no-deps --target $(TRITON_DIR) triton==$(TRITON))
	TRITON_INTERPRET=0 $(if $(TRITON),PYTHONPATH=$(TRITON_DIR)) $(PY) -m experiments.resources $(if $(kernel),--kernel $(kernel)) $(if $(dtype),--dtype $(dtype)) $(if $(pass),--pass $(pass)) $(ARGS)

# The CPU suites run on TEST_WORKERS pytest-xdist workers (0: in this process). loadgroup keeps
# tests marked @pytest.mark.xdist_group(name) on one worker (ones that share a service).
TEST_WORKERS ?= 2
PYTEST_XDIST = -n $(TEST_WORKERS) $(if $(filter 0,$(TEST_WORKERS)),,--dist loadgroup)

# The CPU suite in two disjoint halves: `make test` (at most 2 minutes on 2 cores; it prints its
# wall time and its 10 slowest tests, so a test that grew shows) and `make test-slow`, the rest.
# `make test-all` (CI) runs the two in turn, so every CPU test runs once.
FAST_TESTS = not gpu and not slow and not integration
SLOW_TESTS = not gpu and (slow or integration)

test: $(SETUP) ## Fast CPU suite (<= 2 min, 2 cores): every op vs float64 in the interpreter, every config group, one make experiment, the analysis
	@TIMEFORMAT="make test: %0R s wall"; time $(PY) -m pytest $(PYTEST_XDIST) -m "$(FAST_TESTS)" --durations=10 $(ARGS)

test-slow: $(SETUP) ## The CPU tests make test leaves out: the slow and integration ones (slurm: start scripts/slurm/cluster.sh)
	@TIMEFORMAT="make test-slow: %0R s wall"; time $(PY) -m pytest $(PYTEST_XDIST) -m "$(SLOW_TESTS)" --durations=25 $(ARGS)

test-all: $(SETUP) ## Every CPU test (what CI runs): make test, then make test-slow (both run; fails if either does)
	@fast=0; $(MAKE) --no-print-directory test || fast=$$?; \
	$(MAKE) --no-print-directory test-slow && exit $$fast

test-gpu: $(SETUP) ## GPU-marked tests, on a CUDA machine
	$(PY) -m pytest -m gpu --durations=20 $(ARGS)

sync: $(SETUP) ## Upload offline W&B runs under outputs/ and multirun/ (needs WANDB_API_KEY)
	@runs=$$(find outputs multirun -type d -name 'offline-run-*' 2>/dev/null); \
	if [ -z "$$runs" ]; then echo "no offline W&B runs found"; else $(VENV)/bin/wandb sync $$runs; fi

figures: $(SETUP) ## PNG+SVG figures from the records: make figures RESULTS=multirun/... [FIGURES=dir]
	$(PY) -m analysis.figures $(RESULTS) $(or $(FIGURES),$(RESULTS)/figures)

report: $(SETUP) ## Static HTML report of RESULTS (figures + tables) into outputs/report/
	$(PY) -m analysis.report $(RESULTS) $(or $(OUT),outputs/report)

notebooks: $(SETUP) ## Execute analysis/notebooks/*.py against RESULTS into outputs/notebooks/
	$(PY) -m analysis.run_notebooks $(RESULTS) $(or $(OUT),outputs/notebooks)

dashboard: $(SETUP) ## Build the W&B workspace: make dashboard ENTITY=me [PROJECT=...] [ARGS=--dry-run]
	$(PY) -m analysis.dashboard $(if $(ENTITY),--entity $(ENTITY)) $(if $(PROJECT),--project $(PROJECT)) $(ARGS)

wheelhouse: ## Wheels of every dependency but torch/torchvision/triton for PYTHON_VERSION/PLATFORM (offline clusters)
	rm -rf $(WHEELHOUSE) && mkdir -p $(WHEELHOUSE)
	grep -vE '^(torch|torchvision|triton)\b' requirements.txt > $(WHEELHOUSE)/requirements.txt
	@# antlr4-python3-runtime (needed by omegaconf) ships no wheel: build one here first.
	python3 -m pip wheel --no-deps -w $(WHEELHOUSE) antlr4-python3-runtime==4.9.3
	@# timm requires torch and torchvision, which the wheelhouse leaves out: its wheel alone
	grep -vE '^timm\b' $(WHEELHOUSE)/requirements.txt > $(WHEELHOUSE)/download.txt
	python3 -m pip download --only-binary=:all: --python-version $(PYTHON_VERSION) \
	  --implementation cp --platform $(PLATFORM) --platform manylinux_2_28_x86_64 \
	  --platform manylinux_2_17_x86_64 -d $(WHEELHOUSE) -r $(WHEELHOUSE)/download.txt \
	  --find-links $(WHEELHOUSE)
	python3 -m pip download --no-deps --only-binary=:all: --python-version $(PYTHON_VERSION) \
	  --implementation cp --platform $(PLATFORM) -d $(WHEELHOUSE) \
	  "$$(grep -oE '^timm[^ #]*' requirements.txt)"
	rm $(WHEELHOUSE)/download.txt
	$(if $(PEERS),cp requirements-peers.txt $(WHEELHOUSE)/ && python3 -m pip download --no-deps \
	  --only-binary=:all: --python-version $(PYTHON_VERSION) --implementation cp \
	  --platform $(PLATFORM) --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux_2_24_x86_64 -d $(WHEELHOUSE) -r requirements-peers.txt)
	@ls $(WHEELHOUSE)/*.whl | wc -l | xargs echo "wheels in $(WHEELHOUSE):"

install-offline: ## Install the wheelhouse into the current python, with no index
	$(PY) -m pip install --no-index --find-links $(WHEELHOUSE) -r $(WHEELHOUSE)/requirements.txt
	@# a wheelhouse made with PEERS=1 holds the peer libraries, installed as `make peers` does
	if [ -f $(WHEELHOUSE)/requirements-peers.txt ]; then $(PY) -m pip install --no-index --no-deps \
	  --find-links $(WHEELHOUSE) -r $(WHEELHOUSE)/requirements-peers.txt; fi

lint: $(SETUP) ## ruff over the repo
	$(PY) -m ruff --version >/dev/null 2>&1 || $(PY) -m pip install -q ruff
	$(PY) -m ruff check .

clean: ## Remove outputs/ and multirun/ (keeps .venv)
	rm -rf outputs multirun .pytest_cache
