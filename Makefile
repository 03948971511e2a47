# nanoserve: every entry point. `make help` lists them.
SHELL := /bin/bash
PY    := .venv/bin/python
VENV_STAMP := .venv/.setup-stamp
export PYTHONHASHSEED := 0

.DEFAULT_GOAL := help
.PHONY: help setup test lint pytest chapters diagrams notebooks demo train-tiny bench stress clean

help: ## list every target
	@grep -hE '^[a-zA-Z0-9_%-]+:.*## ' $(MAKEFILE_LIST) | \
	  awk 'BEGIN{FS=":.*## "} {printf "  make %-14s %s\n", $$1, $$2}'

setup: $(VENV_STAMP) ## create .venv from nothing: torch==2.13.0 (CPU) first, then the rest

$(VENV_STAMP): pyproject.toml
	test -x .venv/bin/python || python3 -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q torch==2.13.0
	.venv/bin/pip install -q -e '.[serve,test,notebooks,docs]'
	$(PY) -c "import torch; assert torch.version.cuda is None, 'a CUDA torch was installed'; print('torch', torch.__version__)"
	touch $@

lint: setup ## ruff over the whole tree
	.venv/bin/ruff check .

pytest: setup ## pytest without the slow tests (GPU tests skip without CUDA)
	$(PY) -m pytest -q -m "not slow"

test: lint pytest ## what CI runs: ruff, then pytest (which also checks every chapter's claims)

chapter-%: setup ## recompute Day N's claims, e.g. make chapter-7
	$(PY) -m chapters.runner $*

chapters: setup ## recompute every chapter's claims
	$(PY) -m chapters.runner all

diagrams: setup ## render every chapter's figures into build/figures/
	@set -e; for d in chapters/day*/diagram.py; do echo "  $$d"; $(PY) $$d; done

notebooks: setup ## run every chapter notebook as a plain script
	@set -e; for n in chapters/day*/notebook.py; do echo "  $$n"; MPLBACKEND=Agg $(PY) $$n > /dev/null; done

demo: setup ## generate text with the shipped model
	$(PY) -m nanoserve.cli generate "The while statement" --max-tokens 60 --temperature 0

train-tiny: setup ## retrain the shipped model (seeded; about 25 minutes on 2 cores)
	$(PY) tools/train_tiny.py --out nanoserve/checkpoints/nanoserve-tiny

bench: setup ## benchmarks (pytest-benchmark); GPU tables where CUDA is present
	$(PY) -m pytest -q -m bench --benchmark-only --benchmark-columns=min,median,max

stress: setup ## the long stress test: 200 requests through a cramped pool, with aborts
	$(PY) -m nanoserve.cli bench stress --requests 200 --num-kv-blocks 20 --abort-rate 0.05 --seed 7

clean: ## remove build output
	rm -rf build .pytest_cache .benchmarks

-include site/site.mk
