// Package runc runs torpor sandboxes as OCI containers through the runc
// binary.
//
// Each sandbox gets a directory under Config.Dir/sandboxes/<id>/ holding
// its disk (an ext4 image of its disk_mib, see prepareDisk, which holds the
// overlayfs upper and work directories over the template's root
// filesystem, so sandboxes share the template's files), its OCI bundle and
// init's run directory. The container's pid 1 is the torpor binary in init
// mode (package initproc), bind-mounted read-only (with the host's ELF
// interpreter and C library when it is dynamically linked, see
// initBinary); it runs the setup commands and the entrypoint and reports
// through files in the run directory.
//
// Freeze and thaw write the cgroup freezer directly instead of running
// `runc pause`; runc reads the same files, so `runc state` agrees. Every
// method works from what is on disk and in /proc, so a new Runtime over the
// same Dir (after a daemon restart) handles the instances an earlier one
// booted.
package runc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/initproc"
	"github.com/torpor-dev/torpor/keyedmutex"
	"github.com/torpor-dev/torpor/network"
	"github.com/torpor-dev/torpor/runtime/instances"
)

// Kind is the runtime's name.
const Kind = "runc"

// Config configures a Runtime.
type Config struct {
	// Dir holds the runtime's state: runc's --root, the sandboxes' bundles
	// and disks. Required.
	Dir string
	// RuncPath is the runc binary; empty: "runc" from PATH.
	RuncPath string
	// InitPath is the torpor binary that runs as each sandbox's init:
	// statically linked (CGO_ENABLED=0), or dynamically linked against the
	// host's C library, which then is bind-mounted into each sandbox with
	// it. Required.
	InitPath string
	// CgroupParent is the cgroup under which every sandbox's cgroup is
	// made, in every hierarchy. List reports every cgroup under it (and
	// the engine destroys what it does not know), so two runtimes must
	// never share one. The default, "torpor/" plus a short hash of Dir, is
	// stable across restarts and unique per Dir.
	CgroupParent string
	// Logger receives the runtime's diagnostics; default slog.Default().
	Logger *slog.Logger
	// Network, when set, gives each sandbox an address on the host's
	// sandbox network (package network); without it a sandbox has only a
	// loopback, reached by entering its namespace.
	Network Network
	// ResolvConf, when set, is written to /etc/resolv.conf on the disk
	// of each sandbox allowed the internet, at every boot (with a
	// Network only); the file of any other sandbox stays as it is.
	ResolvConf string
	// NamesResolvConf, when set, is written to /etc/resolv.conf of each
	// sandbox with host name egress rules, at every boot and when a rule
	// change gives it names (it points at torpor's resolver).
	NamesResolvConf string
}

// Network is what the runtime needs of the host's sandbox network
// (*network.Network): a sandbox's namespace, made with eth0 on the bridge
// at boot, gone when it stops, and its address, kept until it is
// destroyed.
type Network interface {
	Attach(ctx context.Context, ep network.Endpoint) (netip.Addr, error)
	Detach(ctx context.Context, netns string) error
	Release(ctx context.Context, netns string) error
	Addr(netns string) (netip.Addr, bool)
	SetEgress(ctx context.Context, netns string, eg *network.Egress) error
}

// Runtime is a torpor.Runtime that runs sandboxes in runc containers.
type Runtime struct {
	// ProcessClient gives the runtime its background processes
	// (torpor.ProcessRunner), through the sandbox's code server.
	initproc.ProcessClient

	// cloned holds the ids of sandboxes whose disk image a checkpoint's
	// copy just made (checkpoint.go): a new inode, bound to no loop
	// device, so that the next mount skips the search for one.
	cloned sync.Map

	dir      string
	runcRoot string
	runcPath string
	initPath string
	init     initBinary
	parent   string
	cg       *cgroups
	log      *slog.Logger
	net      Network
	// resolvConf is Config.ResolvConf.
	resolvConf      string
	namesResolvConf string
	locks           keyedmutex.Mutex
	live            liveSet
	// code is the host's side of the sandboxes' code servers.
	code instances.CodeServer
	// codeStarts serialises starting a sandbox's code server.
	codeStarts keyedmutex.Mutex
	// mkfs is mkfs.ext4, with which disks of a fixed size are made; ""
	// where the host cannot make them (see prepareDisk).
	mkfs string
	// blanks serialises making each blank disk image.
	blanks keyedmutex.Mutex
	// volumes serialises the changes to each volume (volumes.go), and
	// noDisks says why the host cannot make disks of a fixed size.
	volumes keyedmutex.Mutex
	// volumeHolder, when set (SetVolumeHolder), answers the VM sandbox
	// that holds a volume as its block device: such a volume is not
	// mounted on the host.
	volumeHolder atomic.Pointer[func(id string) (string, bool)]
	noDisks      string
	// spares are disks made ahead of the boots that take them (spare.go).
	spares spareSet
}

var _ torpor.Runtime = (*Runtime)(nil)

var cgroupParentRE = regexp.MustCompile(`^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$`)

// New checks the host (runc, the init binary, overlayfs, cgroups, and
// what disks of a fixed size need) and
// returns a Runtime over cfg.Dir.
func New(cfg Config) (*Runtime, error) {
	if cfg.Dir == "" {
		return nil, errors.New("runc: Config.Dir is required")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("runc: %w", err)
	}
	if cfg.InitPath == "" {
		return nil, errors.New("runc: Config.InitPath (the torpor binary) is required")
	}
	runcPath := cfg.RuncPath
	if runcPath == "" {
		runcPath = "runc"
	}
	if runcPath, err = exec.LookPath(runcPath); err != nil {
		return nil, fmt.Errorf("runc: no runc binary (%w): install Debian's runc package (apt-get install runc)", err)
	}
	initPath, err := filepath.Abs(cfg.InitPath)
	if err != nil {
		return nil, fmt.Errorf("runc: %w", err)
	}
	initBin, err := inspectInit(initPath)
	if err != nil {
		return nil, err
	}
	parent := cfg.CgroupParent
	if parent == "" {
		parent = defaultCgroupParent(dir)
	}
	if !cgroupParentRE.MatchString(parent) || strings.Contains("/"+parent+"/", "/../") || strings.Contains("/"+parent+"/", "/./") {
		return nil, fmt.Errorf("runc: bad CgroupParent %q", parent)
	}
	if err := checkOverlay(); err != nil {
		return nil, err
	}
	cg, err := detectCgroups()
	if err != nil {
		return nil, fmt.Errorf("runc: %w", err)
	}
	r := &Runtime{
		dir:      dir,
		runcRoot: filepath.Join(dir, "runc"),
		runcPath: runcPath,
		initPath: initPath,
		init:     initBin,
		parent:   parent,
		cg:       cg,
		log:      cfg.Logger,
		net:      cfg.Network,
	}
	if r.net != nil {
		r.resolvConf = cfg.ResolvConf
		r.namesResolvConf = cfg.NamesResolvConf
	}
	if r.log == nil {
		r.log = slog.Default()
	}
	mkfs, noDisks := diskSupport()
	if noDisks == "" {
		if err := probeDisks(context.Background(), filepath.Join(dir, "disks"), mkfs); err != nil {
			noDisks = err.Error()
		}
	}
	r.noDisks = noDisks
	if noDisks != "" {
		r.log.Warn("runc: sandboxes' disk_mib is not enforced: their disks are directories on the host's file system", "why", noDisks)
	} else {
		r.mkfs = mkfs
		removeStaleSpares(filepath.Join(dir, "disks"))
	}
	r.code = instances.CodeServer{Who: Kind, CheckRef: checkRef, Conn: r.codeConn, Runtime: r}
	r.ProcessClient = initproc.ProcessClient{Send: r.code.Send, Who: Kind}
	for _, d := range []string{r.runcRoot, filepath.Join(dir, "sandboxes")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("runc: %w", err)
		}
	}
	return r, nil
}

// defaultCgroupParent names the cgroup parent of the runtime over dir:
// under "torpor", one per state directory.
func defaultCgroupParent(dir string) string {
	sum := sha256.Sum256([]byte(dir))
	return "torpor/" + hex.EncodeToString(sum[:4])
}

func checkOverlay() error {
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return fmt.Errorf("runc: %w", err)
	}
	if !bytes.Contains(b, []byte("\toverlay\n")) {
		return errors.New("runc: the kernel has no overlay file system (modprobe overlay)")
	}
	return nil
}

// Kind returns "runc".
func (r *Runtime) Kind() string { return Kind }

// PauseModes returns [freeze]: the cgroup freezer keeps memory resident.
func (r *Runtime) PauseModes() []torpor.PauseMode { return []torpor.PauseMode{torpor.PauseFreeze} }

// sandboxDir is the directory of everything the runtime keeps for a
// sandbox: its OCI bundle (config.json), disk (disk.img mounted at disk/,
// which holds upper/ and work/; or upper/ and work/ themselves, see
// prepareDisk), root mount (rootfs), init's run directory (run) and
// instance record.
func (r *Runtime) sandboxDir(id string) string { return filepath.Join(r.dir, "sandboxes", id) }

func (r *Runtime) sandboxPath(id, name string) string { return filepath.Join(r.sandboxDir(id), name) }

func (r *Runtime) rootfsDir(id string) string    { return r.sandboxPath(id, "rootfs") }
func (r *Runtime) runDir(id string) string       { return r.sandboxPath(id, "run") }
func (r *Runtime) instanceFile(id string) string { return r.sandboxPath(id, "instance.json") }
func (r *Runtime) pidFile(id string) string      { return r.sandboxPath(id, "init.pid") }
func (r *Runtime) runcLog(id string) string      { return r.sandboxPath(id, "runc.log") }

// netnsPath is where the sandbox's network namespace is bind-mounted
// while it runs (with a Network only).
func (r *Runtime) netnsPath(id string) string { return r.sandboxPath(id, "netns") }

// runcState is runc's state directory of the sandbox's container.
func (r *Runtime) runcState(id string) string { return filepath.Join(r.runcRoot, id) }

// cgroupRel is the sandbox's cgroup, relative to each hierarchy's root.
func (r *Runtime) cgroupRel(id string) string { return r.parent + "/" + id }

// checkRef validates the sandbox id (before it reaches any path) and the
// handle.
func checkRef(ref torpor.InstanceRef) (string, error) { return instances.CheckRef(ref, parseHandle) }

// List returns the ids of the sandboxes that have a directory, a runc
// container or a cgroup under the parent.
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	for _, d := range []string{filepath.Join(r.dir, "sandboxes"), r.runcRoot} {
		entries, err := os.ReadDir(d)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("runc: list: %w", err)
		}
		for _, e := range entries {
			if e.IsDir() {
				seen[e.Name()] = true
			}
		}
	}
	for _, name := range r.cg.children(r.parent) {
		seen[name] = true
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		if torpor.ValidID(id) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// runc runs a runc command under the runtime's root and returns its
// output; runc's message is in the error when it fails.
func (r *Runtime) runc(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, r.runcPath, append([]string{"--root", r.runcRoot}, args...)...)
	var out bytes.Buffer
	cmd.Stdout = &limitedBuffer{buf: &out, max: 1 << 20}
	var stderr bytes.Buffer
	cmd.Stderr = &limitedBuffer{buf: &stderr, max: 64 << 10}
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("runc %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return out.Bytes(), nil
}

// limitedBuffer keeps the first max bytes written to it and drops the rest.
type limitedBuffer struct {
	buf *bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.buf.Len(); room > 0 {
		if len(p) > room {
			b.buf.Write(p[:room])
		} else {
			b.buf.Write(p)
		}
	}
	return len(p), nil
}
