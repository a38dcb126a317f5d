# ftune developer entry points. `make test` is the one command CI runs.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build test format format-check demo clean

all: build

deps:
	bash deploy/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Installs missing dependencies, configures, builds and runs every test suite.
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# Makes a tiny random Llama and fine-tunes a LoRA on toy data, on the CPU.
demo: build
	$(BUILD)/engine/ft-train make-model --preset tiny-llama --out runs/demo/model
	$(BUILD)/engine/ft-train run examples/tiny-lora/job.yaml
	@echo "demo: adapter in runs/demo/out/adapter, merged model in runs/demo/out/merged, metrics in runs/demo/out/metrics.jsonl"

format:
	find common kernels engine daemon worker cli proto bench tests -type f \
	  \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' -o -name '*.proto' \) 2>/dev/null \
	  | xargs -r clang-format -i --style=file

format-check:
	bash tests/format/check-format.sh

clean:
	rm -rf $(BUILD)
