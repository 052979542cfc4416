#!/usr/bin/env bash
# Runs torpor's real-host GPU tests (gpu/nvidia, TORPOR_GPU_REAL=1) on a
# machine with an NVIDIA GPU, in well under 5 minutes: a CUDA process that
# allocates VRAM, the probe (NVML, nvidia-smi), spill and restore with
# cuda-checkpoint (times per GiB), a spill and resume through the lease
# manager, a freeze-only suspend, and the watchdog.
#
# It needs no network. What it needs on the GPU machine:
#   - the NVIDIA driver: libcuda.so.1 (the test's CUDA processes), and
#     libnvidia-ml.so.1 or nvidia-smi (the VRAM probe);
#   - python3 (standard library only: the CUDA processes use ctypes);
#   - cuda-checkpoint (https://github.com/NVIDIA/cuda-checkpoint, driver
#     550+) in PATH, /usr/local/cuda/bin or ./bin, for the spill tests;
#   - root (cuda-checkpoint and signals to the test's processes);
#   - either a Go toolchain, or a test binary built beforehand on another
#     machine with `scripts/gpu-check.sh --build` (bin/gpu-real.test, with
#     cgo for NVML, and bin/gpu-real-nocgo.test, nvidia-smi only, for a
#     machine whose C library is too old for the first).
# What is missing is reported and the tests that need it skip with a line
# starting MISSING:.
#
# Usage:
#   scripts/gpu-check.sh --build   build the test binaries into bin/ (here)
#   scripts/gpu-check.sh           run the tests (on the GPU machine)
# Environment: TORPOR_GPU_SPILL_GIB (default 1,4,16): the sizes to spill;
# OUT: a directory for gpu-check.log (default the repository root).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

build() {
  mkdir -p bin
  # go-nvml's cgo prologue warns about deprecated NVML calls it wraps.
  CGO_CFLAGS="${CGO_CFLAGS:-} -Wno-deprecated-declarations" \
    go test -tags nvml -c -o bin/gpu-real.test ./gpu/nvidia || return 1
  CGO_ENABLED=0 go test -c -o bin/gpu-real-nocgo.test ./gpu/nvidia || return 1
  echo "built bin/gpu-real.test and bin/gpu-real-nocgo.test"
}

if [[ ${1:-} == --build ]]; then
  build
  exit $?
fi

log=${OUT:-$ROOT}/gpu-check.log
: >"$log" 2>/dev/null || log=/tmp/gpu-check.log
say() { echo "$@" | tee -a "$log"; }

say "==> gpu-check on $(hostname) at $(date -u +%FT%TZ)"
missing=()
have() { command -v "$1" >/dev/null 2>&1; }
lib() { ldconfig -p 2>/dev/null | grep -q "$1" || ls /usr/lib/x86_64-linux-gnu/"$1"* /usr/lib64/"$1"* /usr/lib/"$1"* >/dev/null 2>&1; }

[[ $(id -u) -eq 0 ]] || missing+=("root (cuda-checkpoint and the freeze need it)")
if have nvidia-smi; then
  say "nvidia-smi: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -n 4 | tr '\n' ';')"
else
  missing+=("nvidia-smi (the probe's fallback)")
fi
lib libnvidia-ml.so.1 || missing+=("libnvidia-ml.so.1 (NVML; the probe falls back to nvidia-smi)")
lib libcuda.so.1 || missing+=("libcuda.so.1 (the CUDA driver: the tests' CUDA processes cannot run)")
have python3 || missing+=("python3 (the tests' CUDA processes)")
for d in /usr/local/cuda/bin "$ROOT/bin"; do
  [[ -x $d/cuda-checkpoint ]] && PATH=$PATH:$d
done
if have cuda-checkpoint; then
  say "cuda-checkpoint: $(command -v cuda-checkpoint)"
else
  missing+=("cuda-checkpoint (spill and restore tests skip)")
fi
for m in "${missing[@]}"; do say "MISSING: $m"; done

export TORPOR_GPU_REAL=1 TORPOR_GPU_SPILL_GIB=${TORPOR_GPU_SPILL_GIB:-1,4,16}
args=(-test.run 'Real' -test.v -test.count=1 -test.timeout 5m)
start=$(date +%s)
if have go; then
  say "==> go test ($(go version))"
  CGO_CFLAGS="${CGO_CFLAGS:-} -Wno-deprecated-declarations" \
    go test -tags nvml -count=1 -timeout 5m -v -run Real ./gpu/nvidia 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
else
  bin=""
  for b in bin/gpu-real.test bin/gpu-real-nocgo.test; do
    if [[ -x $b ]] && "./$b" -test.list '^$' >/dev/null 2>&1; then bin=$b; break; fi
  done
  if [[ -z $bin ]]; then
    say "MISSING: a Go toolchain or a runnable bin/gpu-real.test (build it with scripts/gpu-check.sh --build)"
    exit 2
  fi
  say "==> $bin"
  (cd gpu/nvidia && "$ROOT/$bin" "${args[@]}") 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
fi
say "==> took $(($(date +%s) - start)) s, exit $rc"
say "==> results"
grep -h '^RESULT\|MISSING' "$log" | sort -u | tee -a "$log.summary"
exit "$rc"
