# Shared steps of install.sh and test.sh: Debian packages and a Go toolchain.
# Sourced, not run.

# apt_install PKG...: installs the Debian packages that are missing.
apt_install() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  echo "==> installing Debian packages: ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    echo "error: run as root to install ${missing[*]} (or install them yourself)" >&2
    return 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# go_version_ok GO: the toolchain GO is at least the version go.mod asks for.
go_version_ok() {
  local have want
  have=$("$1" env GOVERSION 2>/dev/null | sed 's/^go//') || return 1
  want=$(awk '/^go /{print $2; exit}' "$ROOT/go.mod")
  [[ -n $have ]] || return 1
  [[ $(printf '%s\n%s\n' "$want" "$have" | sort -V | head -1) == "$want" ]]
}

# ensure_go: puts a Go toolchain new enough for go.mod first in PATH.
# Order: the go in PATH or /usr/local/go; else Debian's golang-go, which is
# too old to build torpor itself but can fetch the toolchain module that
# go.mod needs from the Go module proxy.
ensure_go() {
  local want go_bin dir
  want=$(awk '/^go /{print $2; exit}' "$ROOT/go.mod")
  for go_bin in "$(command -v go 2>/dev/null)" /usr/local/go/bin/go "/usr/local/lib/torpor-go$want/bin/go" /usr/lib/go/bin/go; do
    [[ -n $go_bin && -x $go_bin ]] || continue
    if go_version_ok "$go_bin"; then
      export PATH="$(dirname "$go_bin"):$PATH"
      return 0
    fi
    # Go 1.21 and later switch to the toolchain go.mod names by themselves.
    if "$go_bin" env GOTOOLCHAIN >/dev/null 2>&1 && [[ $("$go_bin" env GOTOOLCHAIN) != local ]]; then
      export PATH="$(dirname "$go_bin"):$PATH"
      return 0
    fi
  done
  apt_install golang-go ca-certificates git
  echo "==> fetching the Go $want toolchain module"
  dir=$(cd "$(mktemp -d)" && GOFLAGS= GO111MODULE=on GOPATH="${GOPATH:-$HOME/go}" \
    /usr/lib/go/bin/go mod download -json "golang.org/toolchain@v0.0.1-go${want}.linux-$(dpkg --print-architecture)" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  if [[ -z $dir || ! -f $dir/bin/go ]]; then
    echo "error: could not fetch Go $want; install Go $want or later and retry" >&2
    return 1
  fi
  # The module cache keeps files read-only and not executable: copy it out.
  local dest=/usr/local/lib/torpor-go$want
  rm -rf "$dest" && cp -r "$dir" "$dest"
  chmod -R u+w "$dest" && chmod +x "$dest"/bin/* "$dest"/pkg/tool/*/*
  export PATH="$dest/bin:$PATH"
  export GOTOOLCHAIN=local
}

# build_torpor OUT: a static torpor binary (it is also the sandbox init).
build_torpor() {
  echo "==> building $1"
  (cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -o "$1" ./cmd/torpor)
}

# VM_KERNEL_DIR is where ensure_vm_support keeps the microVM guest kernel:
# VM_KERNEL_DIR/<version>/{vmlinux,modules/,config} and a link "current"
# to the newest. runtime/vm reads it (vm.DefaultKernelDir).
VM_KERNEL_DIR=${TORPOR_VM_KERNEL_DIR:-/var/lib/torpor/vm-kernel}

# ensure_vm_support: what the microVM runtime (runtime/vm) needs: QEMU and
# qemu-img, mkfs.ext4, static busybox, and a guest kernel from Debian's
# linux-image-cloud-amd64 (fetched with apt-get download, unpacked into
# VM_KERNEL_DIR: the raw PVH-bootable kernel taken out of the LZ4 vmlinuz,
# and the virtio modules the guest loads from its initramfs).
ensure_vm_support() {
  apt_install qemu-system-x86 qemu-utils e2fsprogs busybox-static lz4
  local pkg ver dest tmp deb vmlinuz off
  pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -1 || true)
  if [[ -z $pkg ]]; then
    apt-get update -qq || true
    pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -1 || true)
  fi
  if [[ -z $pkg ]]; then
    if [[ -e $VM_KERNEL_DIR/current/vmlinux ]]; then
      echo "warning: cannot resolve linux-image-cloud-amd64; keeping $(readlink "$VM_KERNEL_DIR/current")" >&2
      return 0
    fi
    echo "error: apt knows no linux-image-cloud-amd64 package; the VM runtime needs its kernel" >&2
    return 1
  fi
  ver=${pkg#linux-image-}
  dest=$VM_KERNEL_DIR/$ver
  if [[ -s $dest/vmlinux && -d $dest/modules ]]; then
    ln -sfn "$ver" "$VM_KERNEL_DIR/current"
    return 0
  fi
  echo "==> fetching the microVM guest kernel ($pkg) from Debian"
  mkdir -p "$VM_KERNEL_DIR"
  tmp=$(mktemp -d "$VM_KERNEL_DIR/.fetch.XXXXXX")
  # apt's sandbox user must be able to write the download folder.
  chmod 0777 "$tmp"
  (cd "$tmp" && apt-get download "$pkg") || { rm -rf "$tmp"; return 1; }
  deb=$(ls "$tmp"/*.deb)
  echo "==> unpacking $(basename "$deb") ($(du -h "$deb" | cut -f1))"
  mkdir -p "$tmp/x" "$tmp/out/modules"
  dpkg-deb -x "$deb" "$tmp/x"
  vmlinuz=$(ls "$tmp"/x/boot/vmlinuz-*)
  # The bzImage holds the kernel ELF (with its PVH entry note) as an LZ4
  # legacy frame: find its magic and decompress from there (lz4 stops at
  # the frame's end and complains about what follows; the ELF is whole).
  off=$(grep -obUaP -m1 '\x02\x21\x4c\x18' "$vmlinuz" | head -1 | cut -d: -f1 || true)
  if [[ -z $off ]]; then
    echo "error: $vmlinuz holds no LZ4 frame" >&2
    rm -rf "$tmp"
    return 1
  fi
  tail -c +$((off + 1)) "$vmlinuz" | lz4 -dc >"$tmp/out/vmlinux" 2>/dev/null || true
  if [[ $(head -c 4 "$tmp/out/vmlinux" | od -An -c | tr -d ' ') != '177ELF' ]]; then
    echo "error: could not extract the kernel ELF from $vmlinuz" >&2
    rm -rf "$tmp"
    return 1
  fi
  cp "$tmp"/x/boot/config-* "$tmp/out/config"
  # The virtio drivers the guest needs (and what they depend on); the
  # runtime reads each module's dependencies from the module itself.
  local mods="$tmp"/x/lib/modules/$ver/kernel m
  for m in drivers/virtio drivers/block/virtio_blk.ko drivers/char/virtio_console.ko \
    drivers/net/virtio_net.ko drivers/net/net_failover.ko net/core/failover.ko; do
    [[ -e $mods/$m ]] || continue
    mkdir -p "$tmp/out/modules/$(dirname "$m")"
    cp -r "$mods/$m" "$tmp/out/modules/$(dirname "$m")/"
  done
  echo "$ver" >"$tmp/out/version"
  rm -rf "$dest"
  mv "$tmp/out" "$dest"
  rm -rf "$tmp"
  ln -sfn "$ver" "$VM_KERNEL_DIR/current"
  echo "==> guest kernel $ver in $dest ($(du -sh "$dest" | cut -f1))"
}

# build_vm_agent OUT: the static guest agent of the microVM runtime.
build_vm_agent() {
  echo "==> building $1"
  (cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$1" ./cmd/torpor-agent)
}

# node_ok: the node in PATH is at least 20.18.1, what the E2B SDKs need.
node_ok() {
  local v
  v=$(node --version 2>/dev/null | sed 's/^v//') || return 1
  [[ -n $v && $(printf '%s\n%s\n' 20.18.1 "$v" | sort -V | head -1) == 20.18.1 ]]
}

# NODE_PKG_VERSION is the Node.js that ensure_e2b_sdk takes from the npm
# registry where Debian's is too old (Debian 12 ships 18).
NODE_PKG_VERSION=22.23.5

# ensure_e2b_sdk: Node.js and npm (Debian's packages where missing), a
# Node.js new enough for the official E2B SDKs (from the npm registry's
# node-linux-<arch> package, into /usr/local/lib/torpor-node, when the one
# installed is older than 20.18.1), and the SDKs at the versions
# e2e/e2b/package-lock.json pins (npm ci), for the E2B compatibility suite
# (e2e/e2b_test.go). Puts that node first in PATH.
ensure_e2b_sdk() {
  command -v node >/dev/null 2>&1 || apt_install nodejs
  command -v npm >/dev/null 2>&1 || apt_install npm
  if ! node_ok; then
    local arch dest
    case $(dpkg --print-architecture) in
      amd64) arch=x64 ;;
      arm64) arch=arm64 ;;
      *) echo "error: no Node.js package for $(dpkg --print-architecture) in the npm registry" >&2; return 1 ;;
    esac
    dest=/usr/local/lib/torpor-node
    if [[ ! -x $dest/node_modules/node-linux-$arch/bin/node ]] || ! "$dest/node_modules/node-linux-$arch/bin/node" --version | grep -qx "v$NODE_PKG_VERSION"; then
      echo "==> Node.js $(node --version 2>/dev/null) is older than the E2B SDKs need (20.18.1): installing Node.js $NODE_PKG_VERSION from the npm registry"
      npm install --no-audit --no-fund --loglevel=error --prefix "$dest" "node-linux-$arch@$NODE_PKG_VERSION"
    fi
    export PATH="$dest/node_modules/node-linux-$arch/bin:$PATH"
  fi
  echo "==> Node.js $(node --version); installing the E2B SDKs for the compatibility suite (npm ci)"
  (cd "$ROOT/e2e/e2b" && npm ci --no-audit --no-fund --loglevel=error)
}
