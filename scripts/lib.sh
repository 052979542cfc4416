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
