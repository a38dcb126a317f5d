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

# The end-to-end demo: ftd + two workers, a job, a worker killed mid-run, the job resuming elsewhere.
demo: build
	bash examples/demo.sh $(BUILD)

format:
	find common kernels engine daemon worker cli proto bench tests -type f \
	  \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' -o -name '*.proto' \) 2>/dev/null \
	  | xargs -r clang-format -i --style=file

format-check:
	bash tests/format/check-format.sh

clean:
	rm -rf $(BUILD)
