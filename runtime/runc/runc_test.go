package runc

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/rootfs"
	"github.com/torpor-dev/torpor/runtime/runtimetest"
)

// needHost skips unless the host can run sandboxes: root, runc, static
// busybox, overlayfs and cgroups.
func needHost(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("needs runc (apt-get install runc)")
	}
	if _, err := os.Stat(rootfs.BusyboxPath); err != nil {
		t.Skip("needs busybox-static (apt-get install busybox-static)")
	}
	if err := checkOverlay(); err != nil {
		t.Skipf("needs overlayfs: %v", err)
	}
	if _, err := detectCgroups(); err != nil {
		t.Skipf("needs cgroups: %v", err)
	}
}

// testConfig returns a Config over a temporary directory with a cgroup
// parent of its own, so that parallel test processes do not collide, and
// removes what is left at the end.
func testConfig(t testing.TB) Config {
	t.Helper()
	cfg := Config{
		Dir:          filepath.Join(t.TempDir(), "state"),
		InitPath:     runtimetest.BuildInit(t),
		CgroupParent: torpor.NewID("torpor_test_", 8),
	}
	t.Cleanup(func() {
		r, err := New(cfg)
		if err != nil {
			return
		}
		ctx := context.Background()
		ids, _ := r.List(ctx)
		for _, id := range ids {
			if err := r.Destroy(ctx, torpor.InstanceRef{SandboxID: id}); err != nil {
				t.Errorf("cleanup: destroy %s: %v", id, err)
			}
		}
		if err := r.cg.remove(ctx, r.parent); err != nil {
			t.Errorf("cleanup: cgroup parent: %v", err)
		}
	})
	return cfg
}

func TestRuntime(t *testing.T) {
	needHost(t)
	base := filepath.Join(t.TempDir(), "templates", "base")
	if err := rootfs.BuildBase(context.Background(), base); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	runtimetest.Run(t, runtimetest.Harness{
		New: func(t *testing.T) torpor.Runtime {
			r, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			return r
		},
		Template:  torpor.Template{Name: "base", RootFS: base},
		Processes: true,
		// Another node's runtime: a directory and cgroup parent of its own.
		Elsewhere: func(t *testing.T) torpor.Runtime {
			r, err := New(testConfig(t))
			if err != nil {
				t.Fatal(err)
			}
			return r
		},
	})
}

// bootOne boots a sandbox on the base template and destroys it at the end.
func bootOne(t testing.TB, r *Runtime, base string, mod func(*torpor.BootSpec)) torpor.InstanceRef {
	t.Helper()
	spec := torpor.BootSpec{
		SandboxID: torpor.NewID("rc_", 10),
		Template:  torpor.Template{Name: "base", RootFS: base},
		Resources: torpor.Resources{VCPUs: 1, MemoryMiB: 128},
	}
	if mod != nil {
		mod(&spec)
	}
	ref := torpor.InstanceRef{SandboxID: spec.SandboxID}
	t.Cleanup(func() { _ = r.Destroy(context.Background(), ref) })
	h, err := r.Boot(context.Background(), spec)
	if err != nil {
		t.Fatalf("boot: %v", err)
	}
	ref.Handle = h
	return ref
}

// newTestRuntime returns a runtime and a base template for runc-specific
// tests.
func newTestRuntime(t testing.TB) (*Runtime, string) {
	t.Helper()
	base := filepath.Join(t.TempDir(), "base")
	if err := rootfs.BuildBase(context.Background(), base); err != nil {
		t.Fatal(err)
	}
	r, err := New(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	return r, base
}

func TestRuncStateAgreesWithFreezer(t *testing.T) {
	needHost(t)
	ctx := context.Background()
	r, base := newTestRuntime(t)
	ref := bootOne(t, r, base, nil)
	status := func() string {
		out, err := r.runc(ctx, "state", ref.SandboxID)
		if err != nil {
			t.Fatal(err)
		}
		var s struct{ Status string }
		if err := json.Unmarshal(out, &s); err != nil {
			t.Fatal(err)
		}
		return s.Status
	}
	if got := status(); got != "running" {
		t.Fatalf("runc state = %s after boot", got)
	}
	if err := r.Freeze(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if got := status(); got != "paused" {
		t.Errorf("runc state = %s after Freeze, want paused", got)
	}
	if err := r.Thaw(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if got := status(); got != "running" {
		t.Errorf("runc state = %s after Thaw, want running", got)
	}
}

func TestSandboxIsConfined(t *testing.T) {
	needHost(t)
	ctx := context.Background()
	r, base := newTestRuntime(t)
	ref := bootOne(t, r, base, nil)
	for _, c := range []struct{ what, script string }{
		{"mount", "mount -t tmpfs none /mnt"},
		{"unshare a user namespace", "unshare -U true"},
		{"write the init binary", "echo x > /.torpor/torpor"},
		{"remove the init binary", "rm -f /.torpor/torpor"},
		{"load a kernel module", "insmod /nonexistent.ko"},
	} {
		res, err := r.Exec(ctx, ref, torpor.ExecRequest{Cmd: []string{"/bin/sh", "-c", c.script}})
		if err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		if res.ExitCode == 0 {
			t.Errorf("the sandbox could %s", c.what)
		}
	}
	var out bytes.Buffer
	if _, err := r.Exec(ctx, ref, torpor.ExecRequest{Cmd: []string{"grep", "-E", "^(NoNewPrivs|Seccomp):", "/proc/self/status"}, Stdout: &out}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(out.String()); len(got) != 4 || got[1] != "1" || got[3] != "2" {
		t.Errorf("status: %q, want NoNewPrivs 1 and Seccomp 2 (filter)", out.String())
	}
}

func TestLimitsReachTheCgroup(t *testing.T) {
	needHost(t)
	r, base := newTestRuntime(t)
	ref := bootOne(t, r, base, func(s *torpor.BootSpec) {
		s.Resources = torpor.Resources{VCPUs: 0.5, MemoryMiB: 64, Pids: 100}
	})
	rel := r.cgroupRel(ref.SandboxID)
	read := func(controller, file string) string {
		dir := filepath.Join(r.cg.controllers[controller], rel)
		if r.cg.v2 {
			dir = filepath.Join(r.cg.root, rel)
		}
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if r.cg.v2 {
		if got := read("", "memory.max"); got != "67108864" {
			t.Errorf("memory.max = %s", got)
		}
		if got := read("", "cpu.max"); got != "50000 100000" {
			t.Errorf("cpu.max = %s", got)
		}
		if got := read("", "pids.max"); got != "100" {
			t.Errorf("pids.max = %s", got)
		}
		return
	}
	if got := read("memory", "memory.limit_in_bytes"); got != "67108864" {
		t.Errorf("memory.limit_in_bytes = %s", got)
	}
	if got := read("cpu", "cpu.cfs_quota_us"); got != "50000" {
		t.Errorf("cpu.cfs_quota_us = %s", got)
	}
	if got := read("pids", "pids.max"); got != "100" {
		t.Errorf("pids.max = %s", got)
	}
}

// TestIdleInitStoppedFromInside: SIGKILL to pid 1 from inside its pid
// namespace is ignored by the kernel, but SIGTERM stops an idle sandbox's
// init, and the instance then reads as an exited entrypoint.
func TestIdleInitStoppedFromInside(t *testing.T) {
	needHost(t)
	ctx := context.Background()
	r, base := newTestRuntime(t)
	ref := bootOne(t, r, base, nil)
	if _, err := r.Exec(ctx, ref, torpor.ExecRequest{Cmd: []string{"kill", "-KILL", "1"}}); err != nil {
		t.Fatal(err)
	}
	if st, err := r.Inspect(ctx, ref); err != nil || st.State != torpor.InstanceRunning {
		t.Fatalf("after kill -KILL 1: %+v, %v; want running", st, err)
	}
	// The exec may end with its sandbox, so its result does not matter.
	_, _ = r.Exec(ctx, ref, torpor.ExecRequest{Cmd: []string{"kill", "-TERM", "1"}})
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	st, err := r.Wait(wctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if f := st.Failure; st.State != torpor.InstanceStopped || f == nil || f.Code != torpor.FailureEntrypoint || f.ExitCode == nil || *f.ExitCode != 143 {
		t.Errorf("after kill -TERM 1: %+v (failure %+v), want entrypoint_exited with 143", st, f)
	}
}

func TestNoLeftoversAfterDestroy(t *testing.T) {
	needHost(t)
	ctx := context.Background()
	r, base := newTestRuntime(t)
	ref := bootOne(t, r, base, nil)
	if err := r.Freeze(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if err := r.Destroy(ctx, ref); err != nil {
		t.Fatal(err)
	}
	id := ref.SandboxID
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), id) {
		t.Errorf("a mount of %s is left", id)
	}
	for _, h := range r.cg.hierarchies {
		if _, err := os.Stat(filepath.Join(h, r.cgroupRel(id))); err == nil {
			t.Errorf("cgroup %s is left in %s", r.cgroupRel(id), h)
		}
	}
	for _, p := range []string{r.sandboxDir(id), r.runcState(id)} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s is left", p)
		}
	}
}

func TestBootRemovesLeftoverAfterCrash(t *testing.T) {
	needHost(t)
	ctx := context.Background()
	r, base := newTestRuntime(t)
	var spec torpor.BootSpec
	ref := bootOne(t, r, base, func(s *torpor.BootSpec) {
		s.Setup = []string{"echo boot >> /root/boots"}
		spec = *s
	})
	// A daemon that crashed mid-way lost the instance record, and froze
	// the sandbox before it did.
	if err := r.Freeze(ctx, ref); err != nil {
		t.Fatal(err)
	}
	old, err := r.loadInstance(ref.SandboxID)
	if err != nil || old == nil {
		t.Fatalf("instance record: %v, %v", old, err)
	}
	if err := os.Remove(r.instanceFile(ref.SandboxID)); err != nil {
		t.Fatal(err)
	}
	fresh, err := New(testConfigOf(r))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := fresh.Inspect(ctx, ref); err != nil || st.State != torpor.InstanceFrozen {
		t.Errorf("without its record: %+v, %v; want frozen (found through runc state)", st, err)
	}
	if _, err := fresh.Boot(ctx, spec); err != nil {
		t.Fatalf("boot over the leftover: %v", err)
	}
	if old.Alive() {
		t.Errorf("the leftover instance's init (pid %d) still runs", old.PID)
	}
	var out bytes.Buffer
	if _, err := fresh.Exec(ctx, ref, torpor.ExecRequest{Cmd: []string{"cat", "/root/boots"}, Stdout: &out}); err != nil {
		t.Fatal(err)
	}
	if out.String() != "boot\nboot\n" {
		t.Errorf("boots = %q", out.String())
	}
}

// testConfigOf returns the Config r was made from.
func testConfigOf(r *Runtime) Config {
	return Config{Dir: r.dir, RuncPath: r.runcPath, InitPath: r.initPath, CgroupParent: r.parent}
}

func TestNewChecksItsInputs(t *testing.T) {
	dir := t.TempDir()
	if _, err := New(Config{}); err == nil {
		t.Error("New without Dir succeeded")
	}
	if _, err := New(Config{Dir: dir}); err == nil || !strings.Contains(err.Error(), "InitPath") {
		t.Errorf("New without InitPath: %v", err)
	}
	if _, err := exec.LookPath("runc"); err == nil {
		if _, err := New(Config{Dir: dir, RuncPath: "/no/such/runc", InitPath: "/bin/true"}); err == nil || !strings.Contains(err.Error(), "apt-get install runc") {
			t.Errorf("New with a missing runc: %v", err)
		}
		if _, err := New(Config{Dir: dir, InitPath: filepath.Join(dir, "missing")}); err == nil || !strings.Contains(err.Error(), "init binary") {
			t.Errorf("New with a missing init binary: %v", err)
		}
	}
}

func TestDefaultCgroupParentIsPerDir(t *testing.T) {
	a, b := defaultCgroupParent("/var/lib/torpor/runc"), defaultCgroupParent("/tmp/other/runc")
	if a == b || !strings.HasPrefix(a, "torpor/") || !cgroupParentRE.MatchString(a) {
		t.Errorf("default parents %q and %q", a, b)
	}
	if a != defaultCgroupParent("/var/lib/torpor/runc") {
		t.Error("the default parent is not stable")
	}
}

func TestHandleIsChecked(t *testing.T) {
	for _, c := range []struct {
		id, handle string
		ok         bool
	}{
		{"sb_1", "", true},
		{"sb_1", "runc:sb_1:42:1234", true},
		{"sb_1", "runc:sb_2:42:1234", false},
		{"sb_1", "runc:sb_1:x:1234", false},
		{"sb_1", "vm:sb_1:42:1234", false},
		{"sb_1", "runc:sb_1:42", false},
	} {
		err := parseHandle(c.id, c.handle)
		if (err == nil) != c.ok {
			t.Errorf("parseHandle(%q, %q) = %v", c.id, c.handle, err)
		}
		if err != nil && !torpor.IsCode(err, torpor.EInvalid) {
			t.Errorf("parseHandle error is %v, want invalid_argument", err)
		}
	}
}

// TestFailureReadsReportsDefensively feeds the runtime's report reader what
// a hostile sandbox could leave in its run directory.
func TestFailureReadsReportsDefensively(t *testing.T) {
	cg, err := detectCgroups()
	if err != nil {
		t.Skipf("needs cgroups: %v", err)
	}
	r := &Runtime{dir: t.TempDir(), parent: torpor.NewID("torpor_test_", 8), cg: cg}
	id := "sb_1"
	run := r.runDir(id)
	if err := os.MkdirAll(run, 0o755); err != nil {
		t.Fatal(err)
	}
	result := filepath.Join(run, "result")
	put := func(content string) {
		os.Remove(result)
		if err := os.WriteFile(result, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	check := func(what, wantCode string) *torpor.Failure {
		t.Helper()
		done := make(chan *torpor.Failure, 1)
		go func() { done <- r.failure(id) }()
		select {
		case f := <-done:
			if f == nil || f.Code != wantCode {
				t.Errorf("%s: failure %+v, want %s", what, f, wantCode)
			}
			return f
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: reading the report hangs", what)
		}
		return nil
	}
	check("no report", torpor.FailureRuntime)
	put(`{"kind":"setup_failed","step":1,"exit_code":4,"output":"oops` + "\xff" + `","message":"setup command 2 failed"}`)
	if f := check("setup report", torpor.FailureSetup); f != nil && (f.ExitCode == nil || *f.ExitCode != 4 || !utf8.ValidString(f.Message)) {
		t.Errorf("setup failure %+v", f)
	}
	put(`{"kind":"entrypoint_exited","exit_code":3}`)
	check("entrypoint report", torpor.FailureEntrypoint)
	put("{junk")
	check("junk", torpor.FailureRuntime)
	put(`{"kind":"entrypoint_exited","exit_code":3,"output":"` + strings.Repeat("x", 1<<20) + `"}`)
	check("huge report", torpor.FailureRuntime)
	os.Remove(result)
	if err := os.Symlink("/etc/passwd", result); err != nil {
		t.Fatal(err)
	}
	check("symlink", torpor.FailureRuntime)
	os.Remove(result)
	if err := syscall.Mkfifo(result, 0o644); err != nil {
		t.Fatal(err)
	}
	check("fifo", torpor.FailureRuntime)
}

func TestSpec(t *testing.T) {
	spec := buildSpec(specInput{
		Boot: torpor.BootSpec{
			SandboxID:  "sb_1",
			Env:        map[string]string{"PATH": "/custom", "A": "1"},
			Setup:      []string{"echo one", "echo two"},
			Entrypoint: []string{"/bin/server", "-v"},
			Resources:  torpor.Resources{VCPUs: 1.5, MemoryMiB: 100},
		},
		RootFS: "/r", Init: initBinary{argv: staticInitArgv}, RunDir: "/run", Cgroup: "/torpor/sb_1", SwapLimit: true,
	})
	wantArgs := []string{initMount, "init", "-run", runMount, "-setup", "echo one", "-setup", "echo two", "--", "/bin/server", "-v"}
	if strings.Join(spec.Process.Args, "|") != strings.Join(wantArgs, "|") {
		t.Errorf("args = %q", spec.Process.Args)
	}
	if got := strings.Join(spec.Process.Env, " "); got != "A=1 HOME=/root PATH=/custom TERM=xterm" {
		t.Errorf("env = %s", got)
	}
	if spec.Hostname != "sb_1" || spec.Linux.CgroupsPath != "/torpor/sb_1" || !spec.Process.NoNewPrivileges {
		t.Errorf("hostname %q, cgroups path %q, no new privileges %v", spec.Hostname, spec.Linux.CgroupsPath, spec.Process.NoNewPrivileges)
	}
	res := spec.Linux.Resources
	if res.Memory == nil || res.Memory.Limit != 100<<20 || res.Memory.Swap != 100<<20 {
		t.Errorf("memory = %+v", res.Memory)
	}
	if res.CPU == nil || res.CPU.Quota != 150000 || res.CPU.Period != 100000 {
		t.Errorf("cpu = %+v", res.CPU)
	}
	if res.Pids == nil || res.Pids.Limit != defaultPids {
		t.Errorf("pids = %+v", res.Pids)
	}
	denied := strings.Join(spec.Linux.Seccomp.Syscalls[0].Names, " ")
	for _, name := range []string{"mount", "umount2", "pivot_root", "kexec_load", "init_module", "bpf", "setns", "unshare", "keyctl", "userfaultfd"} {
		if !strings.Contains(" "+denied+" ", " "+name+" ") {
			t.Errorf("seccomp allows %s", name)
		}
	}
	var ns []string
	for _, n := range spec.Linux.Namespaces {
		ns = append(ns, n.Type)
	}
	if got := strings.Join(ns, " "); got != "pid network ipc uts mount" {
		t.Errorf("namespaces = %s", got)
	}
}

// BenchmarkFreezeThaw measures a Freeze plus a Thaw of an idle sandbox.
// Compare with BenchmarkRawFreezer, the same two writes to the freezer done
// by hand.
func BenchmarkFreezeThaw(b *testing.B) {
	needHost(b)
	ctx := context.Background()
	r, base := newTestRuntime(b)
	ref := bootOne(b, r, base, nil)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := r.Freeze(ctx, ref); err != nil {
			b.Fatal(err)
		}
		if err := r.Thaw(ctx, ref); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRawFreezer is the baseline: write FROZEN, then THAWED, to the
// sandbox's freezer.state (cgroup.freeze on v2), with no checks at all.
func BenchmarkRawFreezer(b *testing.B) {
	needHost(b)
	ctx := context.Background()
	r, base := newTestRuntime(b)
	ref := bootOne(b, r, base, nil)
	dir := r.cg.freezerDir(r.cgroupRel(ref.SandboxID))
	file, frozen, thawed := filepath.Join(dir, "freezer.state"), []byte("FROZEN"), []byte("THAWED")
	if r.cg.v2 {
		file, frozen, thawed = filepath.Join(dir, "cgroup.freeze"), []byte("1"), []byte("0")
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := os.WriteFile(file, frozen, 0); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(file, thawed, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	_ = r.Thaw(ctx, ref)
}
