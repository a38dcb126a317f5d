#!/usr/bin/env bash
# Packs the Debian libraries the engine needs beyond what a GPU machine has
# (PCRE2 and ICU for the tokenizers, CLI11 for ft-train, Gloo with its
# runtime libraries for the multi-rank tests, and cuDNN 9's headers for the
# cuDNN attention route, whose pip wheel on the GPU machine may ship its
# libraries without them: cudnn*.h of the toolkit here, under cudnn/include) into
# .carry/ftdeps.tar.xz, for bench/gpu/run.sh to unpack under /tmp/ftdeps and
# build ft-train and the engine tests against. The GPU machine has no network
# and none of our Debian packages; it does have nvcc, CMake, yaml-cpp,
# nlohmann-json and OpenSSL.
# Usage (on the development machine, Debian 12): bench/gpu/carry-deps.sh
# then run the device command with carry [".carry/googletest", ".carry/ftdeps.tar.xz"].
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=/tmp/ftdeps  # where run.sh unpacks it; the .pc files name it
(cd "$work" && apt-get download libpcre2-dev libpcre2-8-0 libicu-dev libicu72 libcli11-dev \
  libgloo-dev libgloo0 libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200 > /dev/null 2>&1)
mkdir -p "$work/x"
for f in "$work"/*.deb; do dpkg -x "$f" "$work/x"; done
lib=usr/lib/x86_64-linux-gnu
keep="$work/keep$prefix"
mkdir -p "$keep/$lib/pkgconfig" "$keep/usr/share"
cp -a "$work/x/usr/include" "$keep/usr/"
cp -a "$work/x/usr/share/cmake" "$work/x/usr/share/pkgconfig" "$keep/usr/share/"
for l in libpcre2-8 libicuuc libicudata; do cp -a "$work/x/$lib/$l".so* "$keep/$lib/"; done
for l in libhiredis libibverbs libnl-route-3; do cp -a "$work/x/$lib/$l".so* "$keep/$lib/"; done
cp -a "$work/x/lib/x86_64-linux-gnu/libnl-3".so* "$keep/$lib/"
# Gloo installs into /usr/lib and names that path in its CMake package: point it at the carried copy.
mkdir -p "$keep/usr/lib"
cp -a "$work/x/usr/lib/libgloo.so"* "$keep/usr/lib/"
sed -i "s|\"/usr/lib/libgloo|\"$prefix/usr/lib/libgloo|" "$keep/usr/share/cmake/Gloo/GlooTargets-"*.cmake
for pc in libpcre2-8 icu-uc; do
  sed "s|^prefix=.*|prefix=$prefix/usr|; s|^prefix = .*|prefix = $prefix/usr|" "$work/x/$lib/pkgconfig/$pc.pc" \
    > "$keep/$lib/pkgconfig/$pc.pc"
done
# cuDNN's headers (the API is stable across 9.x; the library itself is the GPU machine's wheel, dlopen'ed).
cudnn_headers=$(ls /usr/local/cuda-13.0/include/cudnn*.h /usr/local/cuda/include/cudnn*.h 2> /dev/null | head -1 || true)
if [ -n "$cudnn_headers" ]; then
  mkdir -p "$keep/cudnn/include"
  cp -a "$(dirname "$cudnn_headers")"/cudnn*.h "$keep/cudnn/include/"
else
  echo "no cudnn*.h under /usr/local/cuda*/include: the archive has no cuDNN headers" >&2
fi
mkdir -p "$root/.carry"
tar -C "$work/keep" -cJf "$root/.carry/ftdeps.tar.xz" "${prefix#/}"
ls -la "$root/.carry/ftdeps.tar.xz"
