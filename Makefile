# loom: the two commands a newcomer needs, plus the build.
#   make demo   set up what is missing, build, train the Fashion-MNIST example
#   make test   set up what is missing, build, run the whole test suite
#   make build  set up what is missing, build the tests and examples into build/
#   make bench-build  the benchmarks too (make bench runs two of them)
#   make kjv-data  the KJV token files (kjv_text + kjv.py) in data/kjv, for make gpt2 / make bert
#   make llama-sft-data  KJV instruction data with loss masks (kjv.py + prepare.py --sft) in data/kjv_sft
#   make llama-sft  LoRA fine-tuning of a Llama-architecture model on data/kjv_sft (examples/llama_sft)
#   make dpo-data   KJV preference pairs with completion masks (kjv.py + prepare.py --preference) in data/kjv_dpo
#   make dpo        DPO (or --task reward) of a Llama-architecture model on data/kjv_dpo (examples/llama_dpo)
#   make gpt2, make bert  train examples/gpt2, fine-tune examples/bert_classify on data/kjv (ARGS=...)
#   make fuzz   libFuzzer harnesses (tests/fuzz/) built with clang into build-fuzz/, each run FUZZ_SECONDS
#   make sanitize  the unit tests built with ASan+UBSan into build-sanitize/, then ctest -L unit
# Each step is skipped when already done (stamps in .deps/, CMake/Ninja/ccache for the build).

SHELL := /bin/bash
.DEFAULT_GOAL := help

ROOT := $(abspath .)
VENV := $(ROOT)/.venv
PY := $(VENV)/bin/python
BUILD := $(ROOT)/build
DEPS := $(ROOT)/.deps
JOBS ?= $(shell nproc)

APT_PACKAGES := build-essential cmake ninja-build ccache python3-venv zlib1g-dev \
                nlohmann-json3-dev doctest-dev libgloo-dev dataset-fashion-mnist bible-kjv-text clang-19 lld-19 \
                libpcre2-dev libutf8proc-dev

# loom's own build compiles with clang 19 (Debian's clang-19): the same code builds in about
# two thirds of GCC 12's time (docs/building.md). The consumer test builds with the system c++
# (GCC), so both compilers are covered. LOOM_CXX=c++ LOOM_CC=cc builds everything with GCC.
LOOM_CXX ?= clang++-19
LOOM_CC ?= clang-19

# ccache's other settings travel with the build (build/loom-ccache, cmake/loomBuildHelpers.cmake).
export CCACHE_MAXSIZE := 5G

.PHONY: help deps build bench-build demo test bench clean fuzz sanitize kjv-data llama-sft-data llama-sft dpo-data dpo gpt2 bert

help:
	@echo "make demo   - train the default example (Fashion-MNIST) after any missing set-up"
	@echo "make test   - run the whole test suite after any missing set-up"
	@echo "make build  - build the tests and examples into build/"
	@echo "make bench-build - build the benchmarks into build/benchmarks"
	@echo "make bench  - build the benchmarks, run the overhead and sharding ones"
	@echo "make kjv-data - tokenize the King James Bible into data/kjv (BPE token files, a few seconds)"
	@echo "make llama-sft-data - KJV instruction pairs as SFT token files with loss masks in data/kjv_sft (seconds)"
	@echo "make llama-sft - LoRA fine-tuning of a Llama-architecture model on data/kjv_sft (examples/llama_sft; ARGS=...)"
	@echo "make dpo-data - KJV preference pairs as token files with completion masks in data/kjv_dpo (seconds)"
	@echo "make dpo - DPO of a Llama-architecture model on data/kjv_dpo (examples/llama_dpo; ARGS='--task reward' for a reward model)"
	@echo "make gpt2   - train GPT-2 on data/kjv (examples/gpt2; ARGS=\"--flag value ...\")"
	@echo "make bert   - fine-tune BERT to classify KJV verses by book group (examples/bert_classify)"
	@echo "make fuzz   - build the libFuzzer harnesses (clang) and run each for FUZZ_SECONDS (default 60)"
	@echo "make sanitize - build the unit tests with ASan+UBSan into build-sanitize/ and run them"

deps: $(DEPS)/apt.stamp $(DEPS)/venv.stamp

# $(call apt_install,packages): installs those of `packages` that dpkg does not list as installed.
define apt_install
	@missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q "ok installed" || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "== installing Debian packages: $$missing"; \
	  SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	else echo "== Debian packages present"; fi
endef

$(DEPS)/apt.stamp: Makefile
	@mkdir -p $(DEPS)
	$(call apt_install,$(APT_PACKAGES))
	@touch $@

# uv installs requirements.txt: the same wheels and sdist builds as pip, downloaded and unpacked
# in parallel (a fresh venv in 19 s here against pip's 108 s, docs/building.md). Where uv cannot
# be installed, pip does the work.
UV_VERSION := 0.13.9
$(DEPS)/venv.stamp: requirements.txt
	@mkdir -p $(DEPS)
	@echo "== setting up $(VENV) (torch wheel: several GB on first run)"
	@[ -x $(PY) ] || python3 -m venv $(VENV)
	@if $(PY) -m pip install -q --disable-pip-version-check uv==$(UV_VERSION); then \
	  DS_BUILD_OPS=0 UV_NO_CACHE=1 $(VENV)/bin/uv pip install -q --python $(PY) -r requirements.txt; \
	else \
	  echo "== uv unavailable; installing with pip"; \
	  $(PY) -m pip install -q --upgrade pip && DS_BUILD_OPS=0 $(PY) -m pip install -q --no-cache-dir -r requirements.txt; \
	fi
	@touch $@

# CMAKE_ARGS: more -D settings for the first configure (.ci/run sets LOOM_BENCHMARKS_CHECK_BUILD
# and LOOM_COMPILED_CHECK_BUILD; LOOM_EXAMPLES_OPTIMIZED=ON builds the examples at -O3).
CMAKE_ARGS ?=
$(BUILD)/build.ninja: $(DEPS)/apt.stamp $(DEPS)/venv.stamp CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_PYTHON=$(PY) \
	      -DCMAKE_CXX_COMPILER=$(LOOM_CXX) -DCMAKE_C_COMPILER=$(LOOM_CC) $(CMAKE_ARGS)

build: $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# The benchmarks are not part of `make build` (benchmarks/CMakeLists.txt); .ci/run builds them.
bench-build: $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS) --target benchmarks

# The demo and the model examples build only their own program and what it links.
demo: $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS) --target fashion_mnist
	$(BUILD)/examples/fashion_mnist $(ARGS)

# The tests' warm Python (tests/warm_python.py) is stopped after the run, passed or not.
# One test more than cores: the multi-process tests wait (rendezvous, barriers, a peer's
# start) for part of their time, and a third test fills it (docs/building.md). Each test's
# libtorch (and Python peer) runs one intra-op thread unless OMP_NUM_THREADS says otherwise:
# with tests side by side, a second OpenMP thread per process only spins against the others.
CTEST_JOBS ?= $(shell echo $$(( $(JOBS) + 1 )))
test: build
	cd $(BUILD) && { OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} ctest --output-on-failure -j $(CTEST_JOBS) $(CTEST_ARGS); rc=$$?; \
	  [ ! -x tests/warm_python ] || tests/warm_python --warm-python-stop; exit $$rc; }

bench: bench-build
	$(BUILD)/benchmarks/overhead $(ARGS)
	$(BUILD)/benchmarks/sharding --torchrun $(VENV)/bin/torchrun

# --- the Hugging Face model examples on the King James Bible ------------------------------
# data/kjv: Debian's bible-kjv-text decoded by kjv_text, tokenized by kjv.py through
# prepare.py (a BPE trained here, 8192 tokens); remade when either changes.
KJV_DATA := data/kjv
TEXT_TOOLS := examples/text_data/kjv.py examples/text_data/prepare.py

$(KJV_DATA)/meta.json: $(TEXT_TOOLS) $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS) --target kjv_text
	$(PY) examples/text_data/kjv.py --kjv_text $(BUILD)/examples/kjv_text --out $(KJV_DATA)

kjv-data: $(KJV_DATA)/meta.json

# data/kjv_sft: instruction data from the KJV ("Genesis 1:1" -> the verse, and some verse ->
# next verse pairs) written by kjv.py as instructions.jsonl, then tokenized by prepare.py --sft
# into token files with loss masks (a BPE of 8192 tokens trained on the pairs).
KJV_SFT := data/kjv_sft

$(KJV_SFT)/meta.json: $(TEXT_TOOLS) $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS) --target kjv_text
	$(PY) examples/text_data/kjv.py --kjv_text $(BUILD)/examples/kjv_text --instructions $(KJV_SFT)/instructions.jsonl
	$(PY) examples/text_data/prepare.py --sft $(KJV_SFT)/instructions.jsonl --out $(KJV_SFT)

llama-sft-data: $(KJV_SFT)/meta.json

# data/kjv_dpo: KJV preference pairs ("Genesis 1:1" -> that verse, chosen, or one half the text
# away, rejected) written by kjv.py as preferences.jsonl from 4000 verses, then tokenized by
# prepare.py --preference with their completion masks (a BPE of 8192 tokens).
KJV_DPO := data/kjv_dpo

$(KJV_DPO)/meta.json: $(TEXT_TOOLS) $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS) --target kjv_text
	$(PY) examples/text_data/kjv.py --kjv_text $(BUILD)/examples/kjv_text --preferences $(KJV_DPO)/preferences.jsonl --limit 4000
	$(PY) examples/text_data/prepare.py --preference $(KJV_DPO)/preferences.jsonl --out $(KJV_DPO)

dpo-data: $(KJV_DPO)/meta.json

gpt2: kjv-data
	cmake --build $(BUILD) -j $(JOBS) --target gpt2
	$(BUILD)/examples/gpt2 --data_dir $(KJV_DATA) $(ARGS)

bert: kjv-data
	cmake --build $(BUILD) -j $(JOBS) --target bert_classify
	$(BUILD)/examples/bert_classify --data_dir $(KJV_DATA) $(ARGS)

llama-sft: llama-sft-data
	cmake --build $(BUILD) -j $(JOBS) --target llama_sft
	$(BUILD)/examples/llama_sft --data_dir $(KJV_SFT) $(ARGS)

dpo: dpo-data
	cmake --build $(BUILD) -j $(JOBS) --target llama_dpo
	$(BUILD)/examples/llama_dpo --data_dir $(KJV_DPO) $(ARGS)

# --- fuzzing (tests/fuzz/README.md) ------------------------------------------------------
# One clang binary with four libFuzzer harnesses, picked by LOOM_FUZZ_TARGET. Each target
# runs FUZZ_SECONDS on a working corpus in build-fuzz/corpus/<target> seeded from
# tests/fuzz/corpus/<target>; a crash, sanitizer report or non-loom exception fails the run
# and leaves the input in build-fuzz/artifacts/<target>/.
FUZZ_BUILD := $(ROOT)/build-fuzz
FUZZ_BIN := $(FUZZ_BUILD)/loom_fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= safetensors state_json parse_args scheduler_kwargs hf_config token_meta token_files
FUZZ_ARGS ?= -timeout=30
FUZZ_APT_PACKAGES := clang libclang-rt-dev
FUZZ_CXX ?= clang++
# Evaluated when the recipe runs, after the venv exists.
FUZZ_SITE = $(firstword $(wildcard $(VENV)/lib/python3*/site-packages))
FUZZ_TORCH_LIB = $(FUZZ_SITE)/torch/lib
FUZZ_INCLUDES = -I$(ROOT)/include -isystem $(FUZZ_SITE)/torch/include \
  -isystem $(FUZZ_SITE)/torch/include/torch/csrc/api/include -isystem $(FUZZ_SITE)/boost_headers/include \
  $(addprefix -isystem ,$(wildcard /usr/local/cuda/include $(FUZZ_SITE)/nvidia/nccl/include))
# Header-only mode (no LOOM_SEPARATE_COMPILATION): loom's .ipp code is compiled here,
# instrumented. The c10d definitions match the project's (cmake/loomDependencies.cmake).
FUZZ_FLAGS := -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -DFMT_HEADER_ONLY=1 -DUSE_C10D_GLOO -DUSE_DISTRIBUTED
FUZZ_NCCL = $(if $(wildcard $(FUZZ_SITE)/nvidia/nccl/include/nccl.h),-DUSE_C10D_NCCL -DLOOM_HAVE_NCCL)
FUZZ_LIBS = -L$(FUZZ_TORCH_LIB) -Wl,-rpath,$(FUZZ_TORCH_LIB) -Wl,--push-state,--no-as-needed,-lstdc++,--pop-state \
  -Wl,--no-as-needed -ltorch -ltorch_cpu -lc10 -Wl,--as-needed -lz

$(DEPS)/apt-fuzz.stamp: Makefile
	@mkdir -p $(DEPS)
	$(call apt_install,$(FUZZ_APT_PACKAGES))
	@touch $@

$(FUZZ_BIN): tests/fuzz/fuzz.cpp $(shell find include/loom -type f) $(DEPS)/apt.stamp $(DEPS)/apt-fuzz.stamp $(DEPS)/venv.stamp
	@mkdir -p $(FUZZ_BUILD)
	@echo "== building $@ (clang, ASan+UBSan+libFuzzer; a few minutes)"
	$(FUZZ_CXX) $(FUZZ_FLAGS) $(FUZZ_NCCL) $(FUZZ_INCLUDES) tests/fuzz/fuzz.cpp -o $@ $(FUZZ_LIBS)

fuzz: $(FUZZ_BIN)
	@failed=; for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_BUILD)/corpus/$$t $(FUZZ_BUILD)/artifacts/$$t; \
	  cp -n tests/fuzz/corpus/$$t/* $(FUZZ_BUILD)/corpus/$$t/; \
	  echo "== fuzzing $$t for $(FUZZ_SECONDS) s (log: $(FUZZ_BUILD)/$$t.log)"; \
	  LOOM_FUZZ_TARGET=$$t $(FUZZ_BIN) -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	    -artifact_prefix=$(FUZZ_BUILD)/artifacts/$$t/ $(FUZZ_ARGS) $(FUZZ_BUILD)/corpus/$$t > $(FUZZ_BUILD)/$$t.log 2>&1; \
	  rc=$$?; grep -E "^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::(number_of_executed_units|average_exec_per_sec|new_units_added)" $(FUZZ_BUILD)/$$t.log; \
	  if [ $$rc -ne 0 ]; then echo "== $$t FAILED (exit $$rc); see $(FUZZ_BUILD)/$$t.log"; tail -n 40 $(FUZZ_BUILD)/$$t.log; failed="$$failed $$t"; fi; \
	done; \
	if [ -n "$$failed" ]; then echo "== fuzzing found crashes in:$$failed"; exit 1; fi; echo "== fuzzing: no crash"

# --- sanitizers ---------------------------------------------------------------------------
# The unit tests with ASan+UBSan (-DLOOM_SANITIZE=ON, cmake/loomBuildHelpers.cmake) in their
# own build folder; examples and benchmarks are left out.
SANITIZE_BUILD := $(ROOT)/build-sanitize
SANITIZE_ENV := ASAN_OPTIONS=abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

$(SANITIZE_BUILD)/build.ninja: $(DEPS)/apt.stamp $(DEPS)/venv.stamp CMakeLists.txt
	cmake -S . -B $(SANITIZE_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_PYTHON=$(PY) \
	  -DLOOM_SANITIZE=ON -DLOOM_BUILD_EXAMPLES=OFF -DLOOM_BUILD_BENCHMARKS=OFF -DLOOM_INSTALL=OFF

sanitize: $(SANITIZE_BUILD)/build.ninja
	cmake --build $(SANITIZE_BUILD) -j $(JOBS) --target loom_tests
	cd $(SANITIZE_BUILD) && $(SANITIZE_ENV) ctest --output-on-failure -j $(JOBS) -L unit $(CTEST_ARGS)

clean:
	rm -rf $(BUILD)
