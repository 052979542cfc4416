package e2e

import (
	"io"
	"net"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor/network/networktest"
)

// TestEgressRulesVM: a VM sandbox's egress rules, enforced by the same
// kernel sets as a container's (its tap's namespace is on the sandbox
// network): an allowed block is reached, a PATCH that denies the address
// closes it, and one that allows it again opens it (docs/egress.md). One
// boot: under TCG a VM boot is slow.
func TestEgressRulesVM(t *testing.T) {
	env := needsVM(t)
	d := startDaemon(t, torporBin(t), t.TempDir(), env...)
	out := networktest.NewOutside(t)
	ln := out.Listen(t)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.WriteString(c, "HTTP/1.0 200 OK\r\n\r\nhello\n")
			}()
		}
	}()
	far := out.Addr.String()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	block := far + "/24"
	reaches := func(id string) bool {
		got, code := fetchFrom(d, id, far, port)
		return code == 0 && strings.Contains(got, "200 OK")
	}

	id := strings.TrimSpace(d.ok("create", "--isolation", "vm", "--memory", "256", "--allow-out", block))
	if sb := d.get(id); sb.Runtime.Kind != "vm" || sb.Network == nil || len(sb.Network.AllowOut) != 1 {
		t.Fatalf("a VM sandbox with rules: runtime %s, network %+v", sb.Runtime.Kind, sb.Network)
	}
	if !reaches(id) {
		t.Fatal("a VM allowed the block (without allow_internet) did not reach it")
	}
	d.ok("update", id, "--allow-out", block, "--deny-out", far)
	if reaches(id) {
		t.Fatal("the VM reached a denied address after the PATCH")
	}
	d.ok("update", id, "--allow-out", block)
	if !reaches(id) {
		t.Fatal("allowed again: the VM did not reach the block")
	}
	d.ok("update", id, "--no-egress-rules")
	if reaches(id) {
		t.Fatal("without rules or allow_internet, the VM reached the outside")
	}
}
