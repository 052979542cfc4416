package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// The baselines of BenchmarkCreate: `runc run -d` of the bundle torpor
// itself writes for a base sandbox (its config.json: torpor's init, its
// mounts, seccomp profile and limits; a fresh overlay over the same
// template), once with a loopback only and once with the network a
// torpor sandbox gets, made by ip and nft commands: a namespace, a veth
// pair whose host end is an isolated port of a bridge, an address and
// routes, and the port's element in an nftables set.

// benchBridge, benchPrefix and benchGroup are the baseline's own bridge,
// range and interface group, apart from any daemon's.
const (
	benchBridge = "torporbench0"
	benchPrefix = "10.254"
	benchGroup  = 4242
)

// runcBaseline runs the bundle of a torpor sandbox with runc alone.
type runcBaseline struct {
	b      *testing.B
	dir    string // bundles
	root   string // runc's state
	rootfs string // the template's root, the overlay's lower layer
	config map[string]any
	net    bool // the bridge and the nftables set are there
	n      int
}

// newRuncBaseline copies the config.json of a base sandbox of d and
// removes the sandbox.
func newRuncBaseline(b *testing.B, d *daemon) *runcBaseline {
	b.Helper()
	cl := d.client(b)
	ctx := context.Background()
	sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		b.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(d.dataDir, "runc", "sandboxes", sb.ID, "config.json"))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := cl.Delete(ctx, sb.ID); err != nil {
		b.Fatal(err)
	}
	rb := &runcBaseline{
		b:      b,
		dir:    b.TempDir(),
		root:   filepath.Join(b.TempDir(), "runc"),
		rootfs: filepath.Join(d.dataDir, "templates", "base", "rootfs"),
	}
	if err := json.Unmarshal(data, &rb.config); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(rb.cleanup)
	return rb
}

// withNetwork makes the baseline's bridge and its nftables set, once.
func (rb *runcBaseline) withNetwork() {
	if rb.net {
		return
	}
	rb.net = true
	script := fmt.Sprintf("link add %[1]s type bridge\naddr add %[2]s.0.1/16 dev %[1]s\nlink set %[1]s up\n", benchBridge, benchPrefix)
	rb.runIn(script, "ip", "-batch", "-")
	rb.runIn(fmt.Sprintf("table bridge %s { set ports { type ifname . ipv4_addr; }; }\n", benchBridge), "nft", "-f", "-")
}

// cleanup removes the bridge, the set and the cgroups runc made.
func (rb *runcBaseline) cleanup() {
	if rb.net {
		exec.Command("ip", "link", "del", benchBridge).Run()
		exec.Command("nft", "delete", "table", "bridge", benchBridge).Run()
	}
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/torporbench")
	for _, d := range append(dirs, "/sys/fs/cgroup/torporbench") {
		_ = syscall.Rmdir(d)
	}
}

// run starts one container and returns how long it took to run, from
// nothing to `runc run -d` returning, with the network when network.
func (rb *runcBaseline) run(network bool) time.Duration {
	b := rb.b
	rb.n++
	i := rb.n
	id := fmt.Sprintf("benchbase%d", i)
	bundle := filepath.Join(rb.dir, id)
	netns, link := "bench"+strconv.Itoa(i), "tvb"+strconv.Itoa(i)
	addr := fmt.Sprintf("%s.%d.%d", benchPrefix, 1+i/250, 2+i%250)

	start := time.Now()
	for _, d := range []string{"upper", "work", "rootfs", "run"} {
		if err := os.MkdirAll(filepath.Join(bundle, d), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	if err := syscall.Mount("overlay", bundle+"/rootfs", "overlay", syscall.MS_NODEV,
		"lowerdir="+rb.rootfs+",upperdir="+bundle+"/upper,workdir="+bundle+"/work"); err != nil {
		b.Fatal(err)
	}
	nsPath := ""
	if network {
		// As torpor's network does it: the namespace, the veth pair with
		// its host end an isolated port of the bridge, the address and
		// routes inside, and the port's element in the set.
		rb.runIn(fmt.Sprintf("netns add %[1]s\n"+
			"link add %[2]s mtu 1500 type veth peer name eth0 mtu 1500 netns %[1]s\n"+
			"link set %[2]s group %[3]d master %[4]s\n"+
			"link set dev %[2]s type bridge_slave isolated on\n"+
			"link set %[2]s up\n", netns, link, benchGroup, benchBridge), "ip", "-batch", "-")
		rb.runIn(fmt.Sprintf("link set lo up\naddr add %[1]s/32 dev eth0\nlink set eth0 up\n"+
			"route add %[2]s.0.1/32 dev eth0 scope link\nroute add default via %[2]s.0.1 dev eth0\n", addr, benchPrefix),
			"ip", "-n", netns, "-batch", "-")
		rb.runIn("", "nft", "add", "element", "bridge", benchBridge, "ports", "{ "+link+" . "+addr+" }")
		nsPath = "/run/netns/" + netns
	}
	rb.writeConfig(bundle, id, nsPath)
	// Output to /dev/null: the container would hold a pipe open.
	cmd := exec.Command("runc", "--root", rb.root, "--log", filepath.Join(bundle, "runc.log"),
		"run", "--detach", "--pid-file", filepath.Join(bundle, "init.pid"), "--bundle", bundle, id)
	if err := cmd.Run(); err != nil {
		log, _ := os.ReadFile(filepath.Join(bundle, "runc.log"))
		b.Fatalf("runc run: %v %s", err, log)
	}
	took := time.Since(start)

	exec.Command("runc", "--root", rb.root, "delete", "-f", id).Run()
	syscall.Unmount(bundle+"/rootfs", syscall.MNT_DETACH)
	if network {
		exec.Command("nft", "delete", "element", "bridge", benchBridge, "ports", "{ "+link+" . "+addr+" }").Run()
		exec.Command("ip", "link", "del", link).Run()
		exec.Command("ip", "netns", "del", netns).Run()
	}
	os.RemoveAll(bundle)
	return took
}

// writeConfig writes torpor's config for the bundle: its root, run
// directory, cgroup and network namespace (none: a new one, loopback
// only).
func (rb *runcBaseline) writeConfig(bundle, id, netns string) {
	spec := rb.config
	var mounts []any
	for _, m := range spec["mounts"].([]any) {
		mm := map[string]any{}
		for k, v := range m.(map[string]any) {
			mm[k] = v
		}
		if mm["destination"] == "/.torpor/run" {
			mm["source"] = filepath.Join(bundle, "run")
		}
		mounts = append(mounts, mm)
	}
	linux := map[string]any{}
	for k, v := range spec["linux"].(map[string]any) {
		linux[k] = v
	}
	linux["cgroupsPath"] = "/torporbench/" + id
	var nss []any
	for _, ns := range linux["namespaces"].([]any) {
		n := map[string]any{"type": ns.(map[string]any)["type"]}
		if n["type"] == "network" && netns != "" {
			n["path"] = netns
		}
		nss = append(nss, n)
	}
	linux["namespaces"] = nss
	out := map[string]any{}
	for k, v := range spec {
		out[k] = v
	}
	out["mounts"], out["linux"] = mounts, linux
	out["root"] = map[string]any{"path": filepath.Join(bundle, "rootfs"), "readonly": false}
	out["hostname"] = id
	data, err := json.Marshal(out)
	if err != nil {
		rb.b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o600); err != nil {
		rb.b.Fatal(err)
	}
}

// runIn runs a command with stdin, failing the benchmark if it fails.
func (rb *runcBaseline) runIn(stdin, name string, args ...string) {
	cmd := exec.Command(name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		rb.b.Fatalf("%s %s: %v %s", name, strings.Join(args, " "), err, out)
	}
}

// createSteps gathers the step timings that a daemon logs at debug level
// for the boots of the given sandboxes (see runtime/runc's bootSteps, the
// network's attach line and the engine's create line), by step name.
func createSteps(logs string, ids map[string]bool) map[string][]float64 {
	out := map[string][]float64{}
	add := func(name, v string) {
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			out[name] = append(out[name], f)
		}
	}
	for _, line := range strings.Split(logs, "\n") {
		kv := logFields(line)
		switch kv["msg"] {
		case "runc: boot steps":
			if !ids[kv["sandbox"]] {
				continue
			}
			add("runtime boot (all)", kv["ms"])
			for _, f := range strings.Fields(kv["steps"]) {
				if name, v, ok := strings.Cut(f, "="); ok {
					add("runtime: "+name, v)
				}
			}
		case "network: attach steps":
			if !ids[filepath.Base(filepath.Dir(kv["netns"]))] {
				continue
			}
			for _, k := range []string{"lease", "clean", "netns", "veth", "rules"} {
				add("network: "+k, kv[k+"_ms"])
			}
		case "lifecycle: create steps":
			if !ids[kv["sandbox"]] {
				continue
			}
			add("engine: store created", kv["store_ms"])
			add("engine: boot + store running", kv["boot_ms"])
		}
	}
	return out
}

var logFieldRE = regexp.MustCompile(`(\w+)=("(?:[^"\\]|\\.)*"|\S*)`)

// logFields splits a line of slog's text handler into its keys and values.
func logFields(line string) map[string]string {
	kv := map[string]string{}
	for _, m := range logFieldRE.FindAllStringSubmatch(line, -1) {
		v := m[2]
		if strings.HasPrefix(v, `"`) {
			if u, err := strconv.Unquote(v); err == nil {
				v = u
			}
		}
		kv[m[1]] = v
	}
	return kv
}

// printBreakdown prints the p50 and p99 of each step.
func printBreakdown(title string, steps map[string][]float64) {
	names := make([]string, 0, len(steps))
	for name := range steps {
		names = append(names, name)
	}
	sort.Strings(names)
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s (ms, p50 / p99 of %d boots):\n", title, len(steps["runtime boot (all)"]))
	for _, name := range names {
		v := append([]float64(nil), steps[name]...)
		sort.Float64s(v)
		fmt.Fprintf(&sb, "  %-32s %8.2f %8.2f\n", name, v[int(0.5*float64(len(v)-1))], v[int(0.99*float64(len(v)-1))])
	}
	// Printed, not logged: a benchmark's log is cut to a few lines.
	fmt.Print(sb.String())
}
