#!/usr/bin/env bash
# Packs the control plane and the engine, as built on the development machine
# (Debian 12), for a GPU machine that has none of our Debian libraries:
# ftd, ft-worker, ftctl and ft-train (debug info stripped) plus every shared
# library `ldd` says they load, except glibc's own (libc, libm, libdl,
# libpthread, librt, libresolv, ld-linux) and CUDA's (libcudart, libcublasLt,
# libcublas: the GPU machine has them), into .carry/cluster.tar.xz, for
# bench/gpu/cluster_sigterm.sh to unpack under /tmp/ftcluster. The archive
# holds:
#   bin/       the four binaries
#   lib/       the libraries (put first on LD_LIBRARY_PATH)
#   compat/    libstdc++ and libgcc_s: used only where the machine's own are
#              older than the binaries need (a newer system libstdc++ is kept,
#              since the machine's CUDA libraries may need it)
#   glibc.txt  the newest GLIBC_ / GLIBCXX_ / CXXABI_ symbol versions the
#              binaries, the carried libraries and compat/ need (objdump -T)
#   MANIFEST   where each file came from, and the binaries' build ids
# Usage (on the development machine, from anywhere):
#   bench/gpu/cluster-carry.sh [BIN_DIR]     (BIN_DIR default: build-dev,
#   relative to the repository root unless absolute; a build tree with daemon/ftd, worker/ft-worker, cli/ftctl, engine/ft-train,
#   or a flat directory holding the four binaries)
# then run the device command with carry [".carry/cluster.tar.xz"] and command
# "bench/gpu/cluster_sigterm.sh".
# Exit status: 0 when the archive was written (and is under 60 MiB); 1 otherwise.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin_dir=${1:-build-dev}
case "$bin_dir" in /*) ;; *) bin_dir=$root/$bin_dir ;; esac
out=$root/.carry/cluster.tar.xz
limit=$((60 * 1024 * 1024))

bins=()
for rel in daemon/ftd worker/ft-worker cli/ftctl engine/ft-train; do
  name=${rel#*/}
  if [ -x "$bin_dir/$rel" ]; then
    bins+=("$bin_dir/$rel")
  elif [ -x "$bin_dir/$name" ]; then
    bins+=("$bin_dir/$name")
  else
    echo "cluster-carry: no $rel (or $name) under $bin_dir" >&2
    exit 1
  fi
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stage=$work/ftcluster
mkdir -p "$stage/bin" "$stage/lib" "$stage/compat"
# Copy first: the build tree may be rebuilt while we pack.
for b in "${bins[@]}"; do cp -p "$b" "$stage/bin/"; done

# glibc's parts and CUDA's stay with the machine.
skip='^(linux-vdso|libc|libm|libdl|libpthread|librt|libresolv|libutil|ld-linux-x86-64|libcudart|libcublasLt|libcublas)\.so'
{
  echo "# ftune cluster carry, $(date -u +%FT%TZ) on $(hostname) ($(sed -n 's/^PRETTY_NAME=//p' /etc/os-release | tr -d '"'), $(ldd --version | head -1))"
  echo "# source: $bin_dir"
  for b in "$stage"/bin/*; do
    echo "bin/$(basename "$b") $(file -b "$b" | grep -oE 'BuildID\[[a-z0-9]+\]=[0-9a-f]+' || true)"
  done
} > "$stage/MANIFEST"
missing=0
ldd "$stage"/bin/* | awk '/=>/ {print $1, $3}' | sort -u > "$work/deps.txt"
while read -r soname path; do
  if [[ "$soname" =~ $skip ]]; then continue; fi
  if [ "$path" = "not" ] || [ ! -e "$path" ]; then
    echo "cluster-carry: $soname not found by ldd" >&2
    missing=1
    continue
  fi
  dest=lib
  case "$soname" in libstdc++.so.* | libgcc_s.so.*) dest=compat ;; esac
  [ -e "$stage/$dest/$soname" ] && continue
  # The real file under the soname the binaries ask for (no symlink chains).
  cp -L "$path" "$stage/$dest/$soname"
  echo "$dest/$soname <- $(readlink -f "$path")" >> "$stage/MANIFEST"
done < "$work/deps.txt"
[ $missing = 0 ] || exit 1

# Debug info is most of the binaries' size; symbols stay for backtraces.
strip --strip-debug "$stage"/bin/* "$stage"/lib/*.so* "$stage"/compat/*.so*

# The newest symbol versions needed, from the binaries and the carried libraries.
maxof() {
  local prefix=$1
  shift
  objdump -T "$@" 2> /dev/null | grep -oE "\b${prefix}_[0-9][0-9.]*" | sort -uV | tail -1
}
# binaries: the four; libs: the four and lib/ (always loaded); compat: the
# carried libstdc++ and libgcc_s (loaded only where the machine's are too old).
{
  for v in GLIBC GLIBCXX CXXABI; do echo "binaries $v $(maxof $v "$stage"/bin/*)"; done
  for v in GLIBC GLIBCXX CXXABI; do echo "libs $v $(maxof $v "$stage"/bin/* "$stage"/lib/*.so*)"; done
  echo "compat GLIBC $(maxof GLIBC "$stage"/compat/*.so*)"
  echo "built-on $(ldd --version | head -1)"
} > "$stage/glibc.txt"

mkdir -p "$root/.carry"
tar -C "$work" -cf - ftcluster | xz -9 -T0 > "$out.tmp"
mv "$out.tmp" "$out"
size=$(stat -c %s "$out")
echo "cluster-carry: $out: $size bytes ($(awk "BEGIN{printf \"%.1f\", $size / 1048576}") MiB), $(find "$stage/lib" "$stage/compat" -name '*.so*' | wc -l) libraries"
cat "$stage/glibc.txt"
if [ "$size" -ge $limit ]; then
  echo "cluster-carry: over 60 MiB" >&2
  exit 1
fi
