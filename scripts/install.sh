#!/usr/bin/env bash
# Sets up torpor on Debian 12: installs what it needs (runc, busybox-static,
# debootstrap for `torpor template build`, QEMU and a guest kernel for the
# microVM runtime, a Go toolchain when missing),
# builds the binary and installs it as /usr/local/bin/torpor. Then run
# `torpor serve`.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/scripts/lib.sh"

apt_install runc busybox-static ca-certificates debootstrap
ensure_vm_support
ensure_go
build_torpor "$ROOT/bin/torpor"
build_vm_agent "$ROOT/bin/torpor-agent"
install -m 0755 "$ROOT/bin/torpor" /usr/local/bin/torpor
install -D -m 0755 "$ROOT/bin/torpor-agent" /usr/local/lib/torpor/torpor-agent
echo "==> installed /usr/local/bin/torpor ($(/usr/local/bin/torpor --help >/dev/null && echo ok))"
