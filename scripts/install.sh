#!/usr/bin/env bash
# Sets up torpor on Debian 12: installs what it needs (runc, busybox-static,
# debootstrap for `torpor template build`, a Go toolchain when missing),
# builds the binary and installs it as /usr/local/bin/torpor. Then run
# `torpor serve`.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/scripts/lib.sh"

apt_install runc busybox-static ca-certificates debootstrap
ensure_go
build_torpor "$ROOT/bin/torpor"
install -m 0755 "$ROOT/bin/torpor" /usr/local/bin/torpor
echo "==> installed /usr/local/bin/torpor ($(/usr/local/bin/torpor --help >/dev/null && echo ok))"
