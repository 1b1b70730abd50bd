# loom: the two commands a newcomer needs, plus the build.
#   make demo   set up what is missing, build, train the Fashion-MNIST example
#   make test   set up what is missing, build, run the whole test suite
#   make build  set up what is missing, build tests, examples and benchmarks into build/
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
                nlohmann-json3-dev doctest-dev libgloo-dev dataset-fashion-mnist bible-kjv-text

# ccache's other settings travel with the build (build/loom-ccache, cmake/loomBuildHelpers.cmake).
export CCACHE_MAXSIZE := 5G

.PHONY: help deps build demo test bench clean

help:
	@echo "make demo   - train the default example (Fashion-MNIST) after any missing set-up"
	@echo "make test   - run the whole test suite after any missing set-up"
	@echo "make build  - build tests, examples and benchmarks into build/"
	@echo "make bench  - run the overhead and sharding benchmarks"

deps: $(DEPS)/apt.stamp $(DEPS)/venv.stamp

$(DEPS)/apt.stamp: Makefile
	@mkdir -p $(DEPS)
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q "ok installed" || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "== installing Debian packages: $$missing"; \
	  SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	else echo "== Debian packages present"; fi
	@touch $@

$(DEPS)/venv.stamp: requirements.txt
	@mkdir -p $(DEPS)
	@echo "== setting up $(VENV) (torch wheel: several GB on first run)"
	@[ -x $(PY) ] || python3 -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -m pip install -q -r requirements.txt
	@touch $@

$(BUILD)/build.ninja: $(DEPS)/apt.stamp $(DEPS)/venv.stamp CMakeLists.txt
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_PYTHON=$(PY)

build: $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/examples/fashion_mnist $(ARGS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

bench: build
	$(BUILD)/benchmarks/overhead $(ARGS)
	$(BUILD)/benchmarks/sharding

clean:
	rm -rf $(BUILD)
