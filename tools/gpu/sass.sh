#!/usr/bin/env bash
# tools/gpu/sass.sh [kernel] [arch] [score] — the tensor-core attention kernels as the GPU would run
# them, read without one: compiles core/cuda/attention/dense.cu for sm_90 (or arch) with one score's
# kernels alone (default dot; any name of scores.cuh's GRAPH_SCORES list, e.g. umbral, halfspace;
# -DPN_CU_ONLY_SCORE, ~1–2 min instead of ~10), then prints
#   - registers and spills of the bf16 mma.sync kernels (ptxas --resource-usage),
#   - the SASS instruction mix of one kernel's main loop (default mfwd_kernel, width 64; also
#     mbwq_kernel, mbwk_kernel, or any regular expression on the mangled name): static counts,
#     every path of the loop included, and the loop's HMMA instructions in order with their
#     accumulator registers, which shows whether independent products sit side by side.
# cuobjdump comes with the CUDA toolkit; where the toolkit lacks it (Debian's nvcc-only
# installs), PyPI's nvidia-cuda-cuobjdump wheel holds it: this script unpacks that into
# build/cudatools on first use. Output under build/sass/.
set -eu
cd "$(dirname "$0")/../.."
K=${1:-mfwd_kernel}
ARCH=${2:-sm_90}
SCORE=${3:-dot}
KNOWN=$(sed -n '/^#define GRAPH_SCORES(X)/,/^[^ ]*$/s/^ *X(\([a-z]*\),.*/\1/p' core/cuda/attention/scores.cuh | tr '\n' ' ')
case " $KNOWN" in
*" $SCORE "*) ;;
*) echo "sass.sh: unknown score '$SCORE' (scores.cuh's GRAPH_SCORES: $KNOWN)" >&2; exit 2 ;;
esac
OUT=build/sass
mkdir -p "$OUT"
CUOBJDUMP=$(command -v cuobjdump || true)
if [ -z "$CUOBJDUMP" ]; then
    CUOBJDUMP=$(ls build/cudatools/nvidia/*/bin/cuobjdump 2>/dev/null | head -1 || true)
fi
if [ -z "$CUOBJDUMP" ]; then
    # cuobjdump -sass runs nvdisasm, which the toolkit may lack too: both wheels
    echo "sass.sh: no cuobjdump; fetching PyPI's nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm into build/cudatools"
    python3 -m pip download --no-deps -q -d build/cudatools/whl nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
    (cd build/cudatools && for w in whl/nvidia_cuda_cuobjdump-*.whl whl/nvidia_cuda_nvdisasm-*.whl; do
        python3 -m zipfile -e "$w" .; done)
    CUOBJDUMP=$(ls build/cudatools/nvidia/*/bin/cuobjdump | head -1)
    chmod +x "$CUOBJDUMP" "$(dirname "$CUOBJDUMP")"/nvdisasm
fi
command -v nvdisasm >/dev/null || export PATH="$(dirname "$CUOBJDUMP"):$PATH" # cuobjdump looks for it on PATH
echo "sass.sh: nvcc $(nvcc --version | grep -o 'release [0-9.]*'), $ARCH, $SCORE only"
nvcc -std=c++17 -O3 -Icore -I/usr/include/hdf5/serial -DPN_HAVE_CUDA=1 -DPN_CU_ONLY_SCORE="S_$SCORE" -arch="$ARCH" \
    -cubin --resource-usage core/cuda/attention/dense.cu -o "$OUT/dense_$SCORE.cubin" > "$OUT/ptxas.log" 2>&1 ||
    { echo "sass.sh: nvcc failed; the end of $OUT/ptxas.log:" >&2; tail -n 20 "$OUT/ptxas.log" >&2; exit 1; }
"$CUOBJDUMP" -sass "$OUT/dense_$SCORE.cubin" > "$OUT/dense_$SCORE.sass"
python3 tools/gpu/sass_mix.py "$OUT/ptxas.log" "$OUT/dense_$SCORE.sass" "$K" "$SCORE"
