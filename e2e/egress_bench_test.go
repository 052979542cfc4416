package e2e

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/network"
)

// BenchmarkEgressUpdate: a rule change on a running runc sandbox, from
// the PATCH to its answer (the kernel has the rules before the PATCH
// answers: docs/egress.md), against its baseline, the same change to the
// sandbox's deny set by a raw `nft add/delete element` command. The two
// take turns, iteration by iteration; each reports p50 and p99
// (BENCHMARKS.md).
func BenchmarkEgressUpdate(b *testing.B) {
	needsB(b)
	if _, err := exec.LookPath("nft"); err != nil {
		b.Skip("needs nft for the baseline (apt-get install nftables)")
	}
	d := startDaemon(b, torporBin(b), b.TempDir())
	cl := d.client(b)
	ctx := context.Background()
	block, far := "198.18.0.0/15", "198.18.7.7"
	sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", Network: &torpor.NetworkRules{AllowOut: []string{block}}})
	if err != nil || sb.State != torpor.StateRunning {
		b.Fatalf("create: %+v %v", sb, err)
	}
	addr := netip.MustParseAddr(sb.Address)
	a4 := addr.As4()
	set := fmt.Sprintf("eg-%08x-d", binary.BigEndian.Uint32(a4[:]))
	nft := func(verb string) {
		out, err := exec.Command("nft", verb, "element", "inet", network.DefaultBridge, set, "{ "+far+" }").CombinedOutput()
		if err != nil {
			b.Fatalf("nft %s: %v: %s", verb, err, strings.TrimSpace(string(out)))
		}
	}
	var patch, raw latencies
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rules := &torpor.NetworkRules{AllowOut: []string{block}}
		if i%2 == 0 {
			rules.DenyOut = []string{far}
		}
		t0 := time.Now()
		if _, err := cl.Update(ctx, sb.ID, torpor.UpdateRequest{Network: rules}); err != nil {
			b.Fatal(err)
		}
		patch = append(patch, time.Since(t0))

		// The baseline on the same set: the PATCH left far in it on even
		// iterations; the raw command takes it out and puts it back.
		verb := [2]string{"delete", "add"}
		t0 = time.Now()
		nft(verb[i%2])
		raw = append(raw, time.Since(t0))
		nft(verb[(i+1)%2])
	}
	b.StopTimer()
	patch.report(b, "patch-")
	raw.report(b, "nft-")
	if len(raw) > 0 {
		b.ReportMetric(patch.pct(0.5)/raw.pct(0.5), "patch/nft-p50")
	}
}
