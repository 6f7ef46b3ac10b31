#!/usr/bin/env bash
# On the GPU machine, in the repository root, after tools/gpu/bundle.sh packed .gpu/bundle.tar.gz
# here: unpack it, put luajit and our libraries on the paths, and run the stages named:
#   info      nvidia-smi, nvcc, the OS, what pn.cuda sees
#   specs     every CUDA spec on the GPU (the interpreter-only ones skip)
#   bench     experiments/perf/attention_gpu.lua $BENCH_ARGS (e.g. "scores=dot n=4096 d=64,128")
#   probe     tools/gpu/probe.lua: one dense call's time, bf16 / f32 / CPU agreement
#   plain     tools/gpu/sanitize.lua without the sanitizer (tells its failures from the script's)
#   sanitize  compute-sanitizer memcheck and racecheck on tools/gpu/sanitize.lua
#   ncu       Nsight Compute sections of the first kernel matching $NCU_KERNEL (default mfwd, the mma.sync forward;
#             wfwd for the wmma one with PENUMBRA_CUDA_MMA=0) during probe.lua
#   power     probe.lua mode=power (the benchmark's chunked power attention call, timed; $POWER_ARGS,
#             e.g. "N=16384") with 16-wide tiles forced and with the default choice, then each of
#             its kernels' duration under ncu (SpeedOfLight only, the first $NCU_COUNT launches,
#             default 40: one forward and one forward+backward)
# Each stage has its own timeout (T_<STAGE>, seconds) and writes its log under $OUT, so one that
# hangs leaves the others' results. The peer (PyTorch) runs the machine's python3 without our
# libraries on its path.
#
# Durations seen on an H100 (2026-11-27): the machine's start ~30 s; setup 1 s; specs 40 s;
# probe 5 s; bench with BENCH_ARGS="scores=dot,laplacian,umbral,penumbral,hyperbolic n=4096
# d=64,128 compiled=0 power=0 rounds=2 reps=3 warmup=2" 77 s (with compiled=umbral, n=4096:
# 88 s); "scores=dot,cosine causal=1 n=1024,4096,16384 d=64 compiled=0 power=1" 40 s; ncu 30–50 s
# a kernel. A 15-minute lease fits, in one call: info specs probe bench ncu sanitize (power: ~2 min, a guess).
# Second lease (2026-11-27, three calls): start 30–60 s; specs 40–58 s; bench with six scores at
# n=4096 d=64,128 rounds=2 reps=3 65 s (with compiled=umbral: 130 s); ncu 17–26 s a kernel;
# memcheck 3–5 s and racecheck 60 s before sanitize.lua ended in its cosine part (README).
# Third lease (2026-11-30, an H200, one call of 177 s): info specs bench power ncu plain sanitize with
# the bench arguments above, T_SPECS=150 T_BENCH=200 T_PROBE=100 T_NCU=80 T_SANITIZE=70; info,
# specs, bench and power took 109 s together, ncu 8 s, plain 1 s, memcheck 3 s, racecheck 55 s.
# Logs: run with OUT pointing elsewhere and tar that folder into the real $OUT (only 8 files come
# back). The sanitizer still ends the process inside sanitize.lua's cosine part (README).
# Next lease: `specs`, then `bench` with d=128 (the key pass at width 128 on mma.sync, untimed)
# and compiled=umbral,penumbral (the compiled peers were last timed on the H100).
set -u
OUT=${OUT:-/tmp/pn-out}; mkdir -p "$OUT"
R=$PWD B=${PN_PREFIX:-/opt/pn}
t0=$(date +%s)
say() { echo "[$(($(date +%s) - t0))s] $*"; }
if [ ! -x "$B/bin/luajit" ]; then
  mkdir -p "$B" && tar -C "$B" -xzf .gpu/bundle.tar.gz || { echo "run.sh: cannot unpack .gpu/bundle.tar.gz"; exit 1; }
fi
# luajit's default module paths include /usr/local/{share,lib}/lua/5.1
mkdir -p /usr/local/share/lua /usr/local/lib/lua
cp -a "$B/lua/share/5.1" /usr/local/share/lua/ && cp -a "$B/lua/lib/5.1" /usr/local/lib/lua/
mkdir -p build && cp -a "$B/build/." build/ && touch build/libpenumbra.so build/penumbra_ffi.h # not stale
CL=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [ -e "$d/libcublas.so.13" ] && CL="$CL:$d"; done
if [ -z "$CL" ]; then
  for n in libcublas.so.13 libcudart.so.13; do
    f=$(find /usr /opt -name "$n" 2>/dev/null | head -n 1); [ -n "$f" ] && CL="$CL:$(dirname "$f")"
  done
fi
export LD_LIBRARY_PATH="$B/lib$CL${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PATH="$B/bin:$PATH"
printf '#!/bin/sh\nunset LD_LIBRARY_PATH\nexec %s "$@"\n' "$(command -v python3 || echo /nonexistent)" > "$B/peer-python"
chmod +x "$B/peer-python"
# what ./bench sets, so luajit can run directly (compute-sanitizer and ncu want the real binary)
export PENUMBRA_PEER_PYTHON="$B/peer-python" OMP_WAIT_POLICY=passive PENUMBRA_HOME="$R" PENUMBRA_BUILD="$R/build" \
  LUA_PATH="$R/lua/?.lua;$R/lua/?/init.lua;$R/bindings/?.lua;$R/?.lua;;"
PN="luajit $R/lua/penumbra/cli.lua"
say "setup done"
for stage in "$@"; do
  case $stage in
  info)
    { nvidia-smi; nvcc --version | tail -n 1; head -n 1 /etc/os-release
      $PN "$R/tools/gpu/probe.lua" mode=info; } 2>&1 | tee "$OUT/info.log" ;;
  specs)
    say specs; timeout "${T_SPECS:-240}" $PN test spec/cuda_spec.lua $(ls spec/cuda_*_spec.lua) > "$OUT/specs.log" 2>&1
    say "specs rc=$?"; tail -n 16 "$OUT/specs.log" ;;
  bench)
    say "bench ${BENCH_ARGS:-}"; timeout "${T_BENCH:-300}" $PN experiments/perf/attention_gpu.lua ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
    say "bench rc=$?"; grep -E '^\| |^targets|^causal|^peer' "$OUT/bench.log" | head -n 80 ;;
  probe)
    say probe; timeout "${T_PROBE:-120}" $PN "$R/tools/gpu/probe.lua" 2>&1 | tee "$OUT/probe.log" ;;
  plain)
    say plain; OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 timeout "${T_SANITIZE:-150}" \
      luajit "$R/lua/penumbra/cli.lua" "$R/tools/gpu/sanitize.lua" > "$OUT/plain.log" 2>&1
    say "plain rc=$?"; tail -n 3 "$OUT/plain.log" ;;
  sanitize)
    # application-only: the sanitizer follows no child process; stdout line-buffered in the script.
    # One CPU thread: on 2026-11-27 the probe (little CPU work) ran clean under memcheck while the
    # scripts with threaded CPU references ended at once with no message — threads are the first suspect.
    for tool in memcheck racecheck; do
      say "$tool"; OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 timeout "${T_SANITIZE:-150}" \
        compute-sanitizer --tool "$tool" --target-processes application-only \
        --print-limit 20 luajit "$R/lua/penumbra/cli.lua" "$R/tools/gpu/sanitize.lua" > "$OUT/$tool.log" 2>&1
      say "$tool rc=$?"; grep -E 'SUMMARY|sanitize.lua|rror|hazard' "$OUT/$tool.log" | head -n 12
    done ;;
  ncu)
    k=${NCU_KERNEL:-mfwd}; say "ncu $k"
    timeout "${T_NCU:-120}" ncu -k "regex:$k" --launch-count 1 --section SpeedOfLight --section Occupancy \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats \
      --section SourceCounters luajit "$R/lua/penumbra/cli.lua" "$R/tools/gpu/probe.lua" > "$OUT/ncu_$k.log" 2>&1
    say "ncu rc=$?"; grep -v '^==PROF==' "$OUT/ncu_$k.log" | grep -E '^  [a-z_ ]*void|  [A-Z][A-Za-z /.()-]+  +[%a-zA-Z/]* +[0-9]' | head -n 50 ;;
  power)
    for tile in 16 auto; do # auto: 32-wide tiles where two blocks fit an SM (power.cu, pwc_lay_pick)
      say "power tile=$tile ${POWER_ARGS:-}"
      PENUMBRA_CUDA_POWER_TILE=${tile#auto} timeout "${T_PROBE:-120}" $PN "$R/tools/gpu/probe.lua" mode=power \
        ${POWER_ARGS:-} 2>&1 | tee -a "$OUT/power.log"
    done
    say "power: ncu"
    timeout "${T_NCU:-240}" ncu -k "regex:pw|sympow" --launch-count "${NCU_COUNT:-40}" --section SpeedOfLight \
      luajit "$R/lua/penumbra/cli.lua" "$R/tools/gpu/probe.lua" mode=power reps=1 ${POWER_ARGS:-} > "$OUT/ncu_power.log" 2>&1
    say "power ncu rc=$?"
    grep -v '^==PROF==' "$OUT/ncu_power.log" | grep -E '^  [a-z_ ]*void|^  [A-Za-z_].*\(|Duration|Compute \(SM\) Throughput|Memory Throughput' |
      head -n 160 ;;
  *) echo "run.sh: unknown stage '$stage' (info, specs, bench, probe, power, plain, sanitize, ncu)" ;;
  esac
done
say end
