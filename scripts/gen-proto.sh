#!/usr/bin/env bash
# Regenerates the Go code of the envd protocol (e2b/envd/proto) from its
# .proto files with pinned generators. The generated files are committed:
# building torpor needs neither protoc nor the plugins.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/scripts/lib.sh"
cd "$ROOT"
apt_install protobuf-compiler
BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
GOBIN=$BIN go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
GOBIN=$BIN go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.19.1
cd e2b/envd/proto
PATH=$BIN:$PATH protoc -I . \
  --go_out=. --go_opt=paths=source_relative \
  --connect-go_out=. --connect-go_opt=paths=source_relative \
  process/process.proto filesystem/filesystem.proto
echo "generated: $(find . -name '*.go' | sort | tr '\n' ' ')"
