package vm

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// TestSnapshotTravels moves a snapshot-paused VM, per memory mode, to a
// runtime over another directory (another node) with ExportSnapshot and
// ImportSnapshot: after a Restore there its counting process runs on and
// the data it held only in guest memory (tmpfs) is the same. A stream
// from another host is refused before its data (FailureSnapshot), and a
// stream cut short or corrupted is refused; neither leaves anything of
// the sandbox on the importing runtime.
func TestSnapshotTravels(t *testing.T) {
	needHost(t)
	tmpl := baseTemplate(t)
	for _, lazy := range []bool{false, true} {
		name := "Eager"
		if lazy {
			name = "Lazy"
		}
		t.Run(name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.LazyMemory = lazy
			testSnapshotTravels(t, cfg, tmpl)
		})
	}
}

func testSnapshotTravels(t *testing.T, cfg Config, tmpl torpor.Template) {
	src := newRuntime(t, cfg)
	dst := newRuntime(t, testConfig(t)) // eager: the snapshot's own mode restores
	ctx := testCtx(t)
	if src.Host() == "" || src.Host() != dst.Host() {
		t.Fatalf("hosts %q and %q: two runtimes of one machine are one host", src.Host(), dst.Host())
	}
	spec := torpor.BootSpec{SandboxID: torpor.NewID("rt_", 12), Template: tmpl,
		Resources: torpor.Resources{VCPUs: 1, MemoryMiB: 256}, Hostname: "travel"}
	h, err := src.Boot(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	ref := torpor.InstanceRef{SandboxID: spec.SandboxID, Handle: h}
	pid := strings.TrimSpace(sh(t, src, ref, `
		dd if=/dev/urandom of=/dev/shm/blob bs=1M count=16 2>/dev/null
		i=0
		while :; do i=$((i+1)); echo $i > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.02; done </dev/null >/dev/null 2>&1 &
		echo $!`))
	sum := sh(t, src, ref, "md5sum /dev/shm/blob")
	waitFor(t, "the counter to start", func() bool {
		return sh(t, src, ref, "test -s /tmp/counter && echo y || echo n") == "y\n"
	})
	if _, err := src.ExportSnapshot(ctx, ref, &bytes.Buffer{}); !torpor.IsCode(err, torpor.EConflict) {
		t.Fatalf("export of a running VM: %v; want conflict", err)
	}
	c1 := counter(t, src, ref)
	if _, err := src.Snapshot(ctx, ref); err != nil {
		t.Fatal(err)
	}
	var stream bytes.Buffer
	n, err := src.ExportSnapshot(ctx, ref, &stream)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(stream.Len()) {
		t.Errorf("export says %d bytes and wrote %d", n, stream.Len())
	}
	if _, ok := src.snapshotInfo(ref.SandboxID); !ok {
		t.Error("the exporting sandbox lost its snapshot")
	}

	// Refused streams leave nothing on the importing runtime.
	foreign := bytes.Replace(stream.Bytes(), []byte(`"host":"qemu`), []byte(`"host":"QEMU`), 1)
	_, err = dst.ImportSnapshot(ctx, ref.SandboxID, bytes.NewReader(foreign))
	var te *torpor.Error
	if !errors.As(err, &te) || te.Reason != torpor.FailureSnapshot {
		t.Errorf("import of another host's snapshot: %v; want %s", err, torpor.FailureSnapshot)
	}
	cut := stream.Bytes()[:stream.Len()/2]
	if _, err := dst.ImportSnapshot(ctx, ref.SandboxID, bytes.NewReader(cut)); !torpor.IsCode(err, torpor.EInvalid) {
		t.Errorf("import of a stream cut short: %v; want invalid_argument", err)
	}
	bad := bytes.Clone(stream.Bytes())
	bad[len(bad)-1] ^= 1
	if _, err := dst.ImportSnapshot(ctx, ref.SandboxID, bytes.NewReader(bad)); !torpor.IsCode(err, torpor.EInvalid) {
		t.Errorf("import of a stream with a wrong digest: %v; want invalid_argument", err)
	}
	if _, err := os.Stat(dst.sandboxDir(ref.SandboxID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused imports left the sandbox's directory: %v", err)
	}

	info, err := dst.ImportSnapshot(ctx, ref.SandboxID, bytes.NewReader(stream.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if info.Path == "" || info.SizeBytes <= 0 {
		t.Errorf("imported snapshot info %+v", info)
	}
	// The source goes, as a node that hands a sandbox on does.
	if err := src.Destroy(ctx, ref); err != nil {
		t.Fatal(err)
	}
	ref2 := torpor.InstanceRef{SandboxID: ref.SandboxID}
	h2, err := dst.Restore(ctx, ref2)
	if err != nil {
		t.Fatalf("restore of the imported snapshot: %v", err)
	}
	ref2.Handle = h2
	if got := sh(t, dst, ref2, "md5sum /dev/shm/blob"); got != sum {
		t.Errorf("tmpfs data after the move: %q, want %q", got, sum)
	}
	if got := strings.TrimSpace(sh(t, dst, ref2, "kill -0 "+pid+" && echo alive")); got != "alive" {
		t.Errorf("the counting process %s after the move: %q", pid, got)
	}
	c2 := counter(t, dst, ref2)
	if c2 < c1 {
		t.Errorf("counter went back from %d to %d", c1, c2)
	}
	waitFor(t, "the counter to go on", func() bool { return counter(t, dst, ref2) > c2 })
	if err := dst.Destroy(context.Background(), ref2); err != nil {
		t.Fatal(err)
	}
}

// TestSnapshotTravelsOnTheNetwork: a snapshot of a VM on the sandbox
// network, imported by a runtime over another directory on a network of
// the same range (another node set up alike), resumes with its address:
// the host reaches its server there, and its tap and card are the
// importing runtime's own.
func TestSnapshotTravelsOnTheNetwork(t *testing.T) {
	needHost(t)
	ncfg := testNetwork(t)
	tmpl := baseTemplate(t)
	src := newNetRuntime(t, testConfig(t), ncfg)
	ctx := testCtx(t)
	spec := webSpec(tmpl, false)
	h, err := src.Boot(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	ref := torpor.InstanceRef{SandboxID: spec.SandboxID, Handle: h}
	addr, ok := src.Address(ctx, ref)
	if !ok {
		t.Fatal("no address")
	}
	hc := &http.Client{Timeout: 20 * time.Second}
	serving(t, hc, addr, spec.SandboxID)
	if _, err := src.Snapshot(ctx, ref); err != nil {
		t.Fatal(err)
	}
	var stream bytes.Buffer
	if _, err := src.ExportSnapshot(ctx, ref, &stream); err != nil {
		t.Fatal(err)
	}
	// The source node lets go of it (and of its address) first.
	if err := src.Destroy(ctx, ref); err != nil {
		t.Fatal(err)
	}
	dst := newNetRuntime(t, testConfig(t), ncfg)
	if dst.Host() != src.Host() || !strings.Contains(dst.Host(), "net "+gatewayOf(ncfg)) {
		t.Fatalf("hosts %q and %q: want one, naming the network", src.Host(), dst.Host())
	}
	if _, err := dst.ImportSnapshot(ctx, ref.SandboxID, bytes.NewReader(stream.Bytes())); err != nil {
		t.Fatal(err)
	}
	var m machine
	if ok, err := dst.loadJSON(ref.SandboxID, "machine.json", &m); err != nil || !ok || m.Net == nil ||
		m.Net.NetNS != dst.netnsPath(ref.SandboxID) || m.Net.Tap != tapName || m.Disk != dst.diskPath(ref.SandboxID) {
		t.Fatalf("the imported machine: %+v (%v): want this runtime's paths", m, err)
	}
	ref2 := torpor.InstanceRef{SandboxID: ref.SandboxID}
	if ref2.Handle, err = dst.Restore(ctx, ref2); err != nil {
		t.Fatalf("restore on the other runtime: %v", err)
	}
	if got, ok := dst.Address(ctx, ref2); !ok || got != addr {
		t.Fatalf("the moved VM's address is %s (%v), want %s", got, ok, addr)
	}
	serving(t, hc, addr, spec.SandboxID)
}
