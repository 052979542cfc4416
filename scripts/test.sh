#!/usr/bin/env bash
# Sets up and runs every test of torpor on Debian 12 as root: installs what
# the tests need (runc, busybox-static, debootstrap, QEMU and a guest kernel,
# a Go toolchain when missing), then
# runs go vet and the whole suite, so that nothing skips.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/scripts/lib.sh"
cd "$ROOT"

if [[ $(id -u) -ne 0 ]]; then
  echo "warning: not root: the runc and end-to-end tests will skip" >&2
fi
apt_install runc busybox-static ca-certificates debootstrap
ensure_vm_support
ensure_go
echo "==> $(go version)"

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
go test -count=1 -race "${race[@]}"
# Everything else, one package at a time (they start real sandboxes).
rest=$(go list ./... | grep -v -x -F "$(go list "${race[@]}")")
go test -count=1 -p 1 -timeout 20m $rest
echo "==> fuzzing the create body for 20s"
go test -run '^$' -fuzz FuzzCreateBody -fuzztime 20s ./api/
echo "==> fuzzing confined file paths for 20s"
go test -run '^$' -fuzz FuzzPaths -fuzztime 20s ./files/
echo "==> fuzzing the proxy's request heads against net/http for 20s"
go test -run '^$' -fuzz FuzzRequestHead -fuzztime 20s ./proxy/
