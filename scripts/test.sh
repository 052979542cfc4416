#!/usr/bin/env bash
# Sets up and runs every test of torpor on Debian 12 as root: installs what
# the tests need (runc, busybox-static, debootstrap, QEMU and a guest kernel,
# PostgreSQL 15, Chromium for the dashboard's browser tests, Node.js with
# the official E2B SDKs, a Go toolchain when missing), then runs go vet and
# the whole suite, so that nothing skips.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/scripts/lib.sh"
cd "$ROOT"

if [[ $(id -u) -ne 0 ]]; then
  echo "warning: not root: the runc and end-to-end tests will skip" >&2
fi
apt_install runc busybox-static ca-certificates debootstrap chromium postgresql nftables iproute2
ensure_vm_support
ensure_e2b_sdk
ensure_go
echo "==> $(go version)"

# The S3 server the object-store, lifecycle and fleet tests run against
# (tools/s3server: Versity's S3 gateway, a module of its own), built in the
# background while go vet and the first tests run, into the path where
# objstore/s3test looks for it (one per version of tools/s3server). The
# build holds the lock beside the binary, and s3test, told the path by
# TORPOR_S3SERVER, waits on that lock before its first server, so the
# packages that need it wait for it and no test skips for want of it.
s3_hash=$(export LC_ALL=C; for f in tools/s3server/*; do [[ -f $f ]] && cat "$f"; done | sha256sum | cut -c1-12)
export TORPOR_S3SERVER="${XDG_CACHE_HOME:-$HOME/.cache}/torpor-test/s3server-$s3_hash/s3server"
mkdir -p "$(dirname "$TORPOR_S3SERVER")"
s3_log=$(mktemp)
(
  exec 9>"$(dirname "$TORPOR_S3SERVER")/.lock"
  flock 9
  start=$SECONDS
  if [[ -x $TORPOR_S3SERVER ]]; then
    echo "==> S3 server: already built ($TORPOR_S3SERVER)"
    exit 0
  fi
  cd tools/s3server
  GOWORK=off GOFLAGS= CGO_ENABLED=0 go build -trimpath -o "$TORPOR_S3SERVER.$$" . &&
    mv "$TORPOR_S3SERVER.$$" "$TORPOR_S3SERVER" &&
    echo "==> S3 server: built in $((SECONDS - start)) s ($TORPOR_S3SERVER)"
) >"$s3_log" 2>&1 &
s3_build=$!
# wait_s3_server waits for the build, shows its output and fails the run
# if it failed.
wait_s3_server() {
  local rc=0
  wait "$s3_build" || rc=$?
  cat "$s3_log"
  rm -f "$s3_log"
  if [[ $rc -ne 0 ]]; then
    echo "building the S3 server (tools/s3server) failed" >&2
    exit 1
  fi
}

echo "==> gofmt and go vet"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [[ -n $unformatted ]]; then
  echo "gofmt would change: $unformatted" >&2
  exit 1
fi
go vet ./...

echo "==> go test"
# The lifecycle, store, API and GPU lease packages run with the race detector; the
# runtime and end-to-end packages drive real containers and run without it.
race=(./ ./lifecycle/... ./store/... ./api/... ./client/... ./gpu/... ./proxy/...)
# The lifecycle package's fleet tests need the S3 server: go test starts
# at once and they wait for its build (s3test waits on the build's lock).
race_rc=0
go test -count=1 -race "${race[@]}" || race_rc=$?
wait_s3_server
[[ $race_rc -eq 0 ]] || exit "$race_rc"
# Everything else, one package at a time (they start real sandboxes).
rest=$(go list ./... | grep -v -x -F "$(go list "${race[@]}")")
go test -count=1 -p 1 -timeout 20m $rest
# The daemon's lifecycle, idle, hooks, ledger, webhook and E2B tests once
# more, every daemon on the PostgreSQL store (docs/postgres.md).
TORPOR_E2E_POSTGRES=1 go test -count=1 -p 1 -timeout 20m ./e2e -run 'TestPostgresMode|TestTour|TestDaemonRestartAdoptsSandboxes|TestIdleCycle|TestAutoResumeOffAndPatch|TestHooksInARealSandbox|TestUsage|TestWebhooks|TestE2BSDK'
# Fuzzing budgets are counts of inputs, not durations: a -fuzztime
# duration races Go 1.26's fuzz coordinator at its deadline and can fail
# with "context deadline exceeded" and no crasher (golang/go#75804, fixed
# in Go 1.27). Each count is some 10-20 s of this 2-core machine. The
# targets that serve requests minimize a new input by count too: at the
# default (60 s of replays) one minimization stalled the run for a minute.
echo "==> fuzzing the create body (4,000 inputs)"
go test -run '^$' -fuzz FuzzCreateBody -fuzztime 4000x ./api/
echo "==> fuzzing the E2B create body (3,000 inputs)"
go test -run '^$' -fuzz FuzzE2BCreateBody -fuzztime 3000x -fuzzminimizetime 50x -parallel 1 ./e2b/
# FuzzAPIRequest's count includes its seed corpus (some 900 hostile
# requests over every route), replayed first.
echo "==> fuzzing every route of the API listener, native and E2B (3,000 inputs)"
go test -run '^$' -fuzz FuzzAPIRequest -fuzztime 3000x -fuzzminimizetime 50x -parallel 1 ./api/
echo "==> fuzzing envd's Connect envelopes (20,000 inputs)"
go test -run '^$' -fuzz FuzzConnectEnvelope -fuzztime 20000x -fuzzminimizetime 50x ./e2b/envd/
echo "==> fuzzing envd's multipart reader against mime/multipart (50,000 inputs)"
go test -run '^$' -fuzz FuzzFormReader -fuzztime 50000x ./e2b/envd/
echo "==> fuzzing confined file paths (3,000 inputs)"
go test -run '^$' -fuzz FuzzPaths -fuzztime 3000x ./files/
echo "==> fuzzing the proxy's request heads against net/http (50,000 inputs)"
go test -run '^$' -fuzz FuzzRequestHead -fuzztime 50000x ./proxy/
