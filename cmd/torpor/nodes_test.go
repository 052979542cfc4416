package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

// The nodes table shows each node's state, address, CPU and memory as
// used/capacity, its running/paused/hibernated counts, its last
// heartbeat's age, its GPUs (count, model, VRAM held/all) and its host
// (what a VM snapshot needs to resume there); the node that answered is
// marked.
func TestPrintNodes(t *testing.T) {
	var out bytes.Buffer
	c := &cli{stdout: &out}
	now := time.Now()
	err := c.printNodes([]wire.Node{
		wire.NewNode(torpor.Node{Name: "a", Address: "10.0.0.1:7070", State: torpor.NodeUp, HeartbeatAt: now.Add(-2 * time.Second),
			Capacity: torpor.Resources{VCPUs: 8, MemoryMiB: 16384}, Used: torpor.Resources{VCPUs: 0.1 + 0.2, MemoryMiB: 1024},
			Sandboxes: map[torpor.State]int{torpor.StateRunning: 3, torpor.StatePaused: 1, torpor.StateHibernated: 2},
			GPUs:      torpor.NodeGPUs{Count: 2, Model: "H100", VRAMMiB: 163840, UsedVRAMMiB: 4096}, Host: "vm: qemu 9.0"}, true),
		wire.NewNode(torpor.Node{Name: "b", State: torpor.NodeDraining}, false),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `NAME  STATE     ADDRESS        CPU    MEM MiB     SANDBOXES R/P/H  HEARTBEAT  GPUS (VRAM MiB)       HOST
a *   up        10.0.0.1:7070  0.3/8  1024/16384  3/1/2            2s ago     2 H100 (4096/163840)  vm: qemu 9.0
b     draining  -              0/-    0/-         0/0/0            -          -                     -
`
	if out.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", out.String(), want)
	}
}

// Off a terminal, the drain's progress is a new line each time it
// changes; with --json, nothing.
func TestStatusLineOffATerminal(t *testing.T) {
	var errb bytes.Buffer
	c := &cli{stderr: &errb}
	s := c.statusLine()
	for _, l := range []string{"2 left", "2 left", "1 left", "none left"} {
		s.set(l)
	}
	s.end()
	if errb.String() != "2 left\n1 left\nnone left\n" {
		t.Fatalf("stderr %q", errb.String())
	}
	errb.Reset()
	c.json = true
	s = c.statusLine()
	s.set("2 left")
	s.end()
	if errb.Len() != 0 {
		t.Fatalf("with --json, stderr %q", errb.String())
	}
}

// heldString lists the states a drain moves, in lifecycle order.
func TestHeldString(t *testing.T) {
	got := heldString(map[torpor.State]int{torpor.StateHibernated: 1, torpor.StateRunning: 2, torpor.StateFailed: 4, torpor.StatePausing: 1})
	if got != "2 running, 1 pausing, 1 hibernated" {
		t.Fatalf("got %q", got)
	}
	if got := heldString(map[torpor.State]int{torpor.StateFailed: 1}); got != "no sandboxes" {
		t.Fatalf("got %q", got)
	}
}

// A released sandbox says where it may start: a disk on any node with
// room (and its labels and GPUs), a VM snapshot only on its host.
func TestNodeStringOfReleased(t *testing.T) {
	disk := &torpor.Sandbox{Durability: torpor.DurabilityRemote, Remote: &torpor.RemoteState{}}
	if got := nodeString(disk); got != "none: its disk is in the object store; the next request starts it on a node with room" {
		t.Errorf("a released disk: %q", got)
	}
	disk.Accel = &torpor.Accel{GPUs: 1, VRAMMiB: 4096}
	if got := nodeString(disk); !strings.HasSuffix(got, "with room and 1 GPU(s) with 4096 MiB of VRAM free") {
		t.Errorf("a released GPU sandbox: %q", got)
	}
	snap := &torpor.Sandbox{State: torpor.StatePaused, Durability: torpor.DurabilityRemote, Remote: &torpor.RemoteState{Host: "vm: qemu 9.0"}}
	if got := nodeString(snap); !strings.Contains(got, "a node of the same host (vm: qemu 9.0)") || strings.Contains(got, "any node") {
		t.Errorf("a released VM snapshot: %q", got)
	}
	if got := nodeString(&torpor.Sandbox{Node: "n1", NodeEpoch: 3}); got != "n1 (epoch 3)" {
		t.Errorf("an owned sandbox: %q", got)
	}
}

// nodes refuses a verb it does not have, and its verbs want a name.
func TestNodesArguments(t *testing.T) {
	getenv := func(string) string { return "" }
	for _, c := range []struct {
		args []string
		err  string
	}{
		{[]string{"nodes", "frob"}, `unknown command "frob" for "torpor nodes"`},
		{[]string{"nodes", "drain"}, "accepts 1 arg(s), received 0"},
		{[]string{"nodes", "undrain", "a", "b"}, "accepts 1 arg(s), received 2"},
	} {
		var stdout, stderr bytes.Buffer
		code := Run(context.Background(), c.args, strings.NewReader(""), &stdout, &stderr, getenv)
		if code == 0 || !strings.Contains(stderr.String(), c.err) {
			t.Errorf("torpor %s: exit %d, stderr %q; want non-zero and %q", strings.Join(c.args, " "), code, stderr.String(), c.err)
		}
	}
}
