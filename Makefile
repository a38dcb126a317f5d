# ftune developer entry points. `make test` is the one command CI runs.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
SANITIZE ?= 1

.PHONY: all deps configure build test sanitize format format-check demo clean

all: build

deps:
	bash deploy/install-deps.sh

# Warnings are errors in the trees we build (a plain `cmake` configure leaves FT_WERROR off).
configure: deps
	cmake -S . -B $(BUILD) -G Ninja -DFT_WERROR=ON $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Installs missing dependencies, configures, builds and runs every test suite,
# then (unless SANITIZE=0) the sanitizer runs. The e2e_test and e2e_gang_test
# scenarios run once: under TSan when the sanitizer runs follow (the same
# assertions, with races checked), in the normal tree with SANITIZE=0.
NORMAL_EXCLUDE = $(if $(filter 0,$(SANITIZE)),,-E '^(e2e_test_shard|e2e_gang_test)')
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(NORMAL_EXCLUDE)
	if [ "$(SANITIZE)" != 0 ]; then $(MAKE) --no-print-directory sanitize; fi

# The test suite under ASan + UBSan, and the daemon, worker and e2e tests under
# TSan, each in a clang tree of its own under $(BUILD) (tests/sanitize/run.sh).
sanitize:
	bash tests/sanitize/run.sh asan $(BUILD)/asan
	bash tests/sanitize/run.sh tsan $(BUILD)/tsan

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
