package e2e

import (
	"bufio"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/network/networktest"
)

// TestEgressRules: a sandbox's allow and deny rules, enforced on a real
// server outside the host; a PATCH stops an open connection; the rules
// stay across pause, hibernate and their starts (docs/egress.md).
func TestEgressRules(t *testing.T) {
	needs(t)
	d := startDaemon(t, torporBin(t), t.TempDir())
	out := networktest.NewOutside(t)
	ln := out.Listen(t)
	var lines atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				first, _ := br.ReadString('\n')
				if strings.HasPrefix(first, "GET ") {
					io.WriteString(c, "HTTP/1.0 200 OK\r\n\r\nhello\n")
					return
				}
				for {
					if _, err := br.ReadString('\n'); err != nil {
						return
					}
					lines.Add(1)
				}
			}()
		}
	}()
	far := out.Addr.String()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	block := out.Addr.String() + "/24"
	reaches := func(id string) bool {
		got, code := fetchFrom(d, id, far, port)
		return code == 0 && strings.Contains(got, "200 OK")
	}

	// Bad rules: 400 naming the field.
	if _, errs, code := d.cli("create", "--allow-out", "10.0.0.0/33"); code == 0 || !strings.Contains(errs, "network.allow_out") {
		t.Fatalf("a bad CIDR: exit %d, %q", code, errs)
	}
	allowed := strings.TrimSpace(d.ok("create", "--allow-out", block))
	if !reaches(allowed) {
		t.Fatal("a sandbox allowed the block (without allow_internet) did not reach it")
	}
	if sb := d.get(allowed); sb.Network == nil || len(sb.Network.AllowOut) != 1 || sb.Network.AllowOut[0] != netipMasked(block) {
		t.Fatalf("the sandbox object's network: %+v", sb.Network)
	}
	denied := strings.TrimSpace(d.ok("create", "--allow-internet", "--allow-out", "0.0.0.0/0", "--deny-out", far))
	if reaches(denied) {
		t.Fatal("a denied address was reached")
	}

	// An open connection stops passing once a PATCH denies its address.
	d.ok("exec", allowed, "--", "sh", "-c", `(while :; do echo ping; sleep 0.05; done | nc "$0" "$1" >/dev/null 2>&1 &)`, far, port)
	deadline := time.Now().Add(10 * time.Second)
	for lines.Load() < 5 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if lines.Load() < 5 {
		t.Fatal("the open connection carried nothing")
	}
	t0 := time.Now()
	d.ok("update", allowed, "--allow-out", block, "--deny-out", far)
	took := time.Since(t0)
	time.Sleep(300 * time.Millisecond) // lines in flight
	before := lines.Load()
	time.Sleep(time.Second)
	if after := lines.Load(); after != before {
		t.Fatalf("the open connection still passes after the PATCH (%d more lines)", after-before)
	}
	t.Logf("PATCH to enforcement: the update command took %v", took)
	if reaches(allowed) {
		t.Fatal("a new connection to a now-denied address passed")
	}

	// Kept across pause and hibernate.
	d.ok("update", allowed, "--allow-out", block)
	if !reaches(allowed) {
		t.Fatal("allowed again: not reached")
	}
	for _, verb := range []string{"pause", "hibernate"} {
		d.ok(verb, allowed)
		d.ok(verb, denied)
		d.ok("start", allowed)
		d.ok("start", denied)
		if !reaches(allowed) {
			t.Fatalf("after %s and start, the allowed block is not reached", verb)
		}
		if reaches(denied) {
			t.Fatalf("after %s and start, the denied address is reached", verb)
		}
	}
	// Removing the rules gives back allow_internet's behaviour.
	d.ok("update", allowed, "--no-egress-rules")
	if reaches(allowed) {
		t.Fatal("without rules or allow_internet, the outside was reached")
	}
	if sb := d.get(allowed); sb.Network != nil {
		t.Fatalf("rules removed, the object still has %+v", sb.Network)
	}
}

func netipMasked(cidr string) string {
	_, n, _ := net.ParseCIDR(cidr)
	return n.String()
}
