#!/usr/bin/env bash
# The port proxy's benchmark (BENCHMARKS.md): installs wrk and nginx when
# missing, then drives small GETs at a server inside a real sandbox directly
# (its address on the sandbox network), through torpor's proxy, and through
# nginx as a reverse proxy, in one run; and measures waking a paused
# sandbox. Needs root (runc). Extra arguments go to `go test`, e.g. -count 2.
# The three take turns for TORPOR_BENCH_ROUNDS rounds (default 5) of
# TORPOR_BENCH_SECONDS each (default 4) with TORPOR_BENCH_CONNS connections
# (default 32).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/scripts/lib.sh"
cd "$ROOT"

apt_install runc busybox-static wrk nginx
ensure_go
go test -run '^$' -bench BenchmarkProxy -benchtime 1x "$@" ./e2e/
