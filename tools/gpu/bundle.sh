#!/usr/bin/env bash
# Pack penumbra for a GPU machine that has the NVIDIA driver, CUDA 13's runtime and cuBLAS but none
# of our Debian packages and no network (the lent H100/H200 machines: Ubuntu, PyTorch, nvcc,
# compute-sanitizer, ncu). Into .gpu/bundle.tar.gz (.gitignore keeps it out of git; the device tool
# carries it when asked: carry [".gpu"]):
#   build/   the ordinary build's libpenumbra.so (nvcc, sm_80 + sm_90), penumbra_ffi.h, .deps-ok
#   bin/     luajit                lua/     the Lua modules (busted and its friends, cjson, lfs)
#   lib/     every shared library those load, except glibc's, the C++ runtime's and CUDA's
#            (and NCCL's), which the machine has in newer versions
# Then on the machine: tools/gpu/run.sh (see there). Only x86-64; about 38 MB.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD BUILD=${PENUMBRA_BUILD:-$PWD/build}
./bench --help >/dev/null # builds when stale
grep -q PN_CUDA_EMU:BOOL=ON "$BUILD/CMakeCache.txt" 2>/dev/null && {
  echo "bundle.sh: $BUILD is an interpreter build; pack the ordinary (nvcc) build" >&2; exit 1; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
mkdir -p "$T/lib" "$T/bin" "$T/lua/share" "$T/lua/lib" "$T/build"
cp -L "$(command -v luajit)" "$T/bin/luajit"
cp -a /usr/share/lua/5.1 "$T/lua/share/"
cp -aL /usr/lib/x86_64-linux-gnu/lua/5.1 "$T/lua/lib/"
cp "$BUILD/libpenumbra.so" "$BUILD/penumbra_ffi.h" "$BUILD/.deps-ok" "$T/build/"
{ ldd "$T/bin/luajit" "$T/build/libpenumbra.so"; find "$T/lua/lib" -name '*.so' -exec ldd {} \; ; } |
  awk '/=>/ { print $3 }' | sort -u |
  grep -v -E '/(libc|libm|libdl|libpthread|librt|libresolv|libstdc\+\+|libgcc_s|libcudart|libcublas|libcublasLt|libnccl|ld-linux-x86-64)\.so' |
  while read -r l; do cp -L "$l" "$T/lib/"; done
mkdir -p "$ROOT/.gpu"
tar -C "$T" -cf - . | gzip -6 > "$ROOT/.gpu/bundle.tar.gz"
ls -l "$ROOT/.gpu/bundle.tar.gz"
echo "bundle.sh: run on the machine with carry ['.gpu'], e.g.: bash tools/gpu/run.sh info specs"
