package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
)

// BenchmarkE2B compares the official E2B SDK's hot paths with torpor's
// native API on the same daemon and sandbox, both from one node process
// (e2e/e2b/bench.mjs: an SDK sample, then a native one with node's fetch,
// in turn), in rounds (TORPOR_BENCH_ROUNDS, default 3) of b.N pairs, and
// reports the ratio of the medians (SDK / native; for files, native time /
// SDK time, i.e. the SDK's throughput as a fraction of the native API's):
//
//	go test -run '^$' -bench BenchmarkE2B -benchtime 20x ./e2e/
func BenchmarkE2B(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root (runc containers)")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		b.Skip("needs node")
	}
	if _, err := os.Stat(filepath.Join("e2b", "node_modules", "e2b")); err != nil {
		b.Skip("needs `npm ci` in e2e/e2b")
	}
	d := startDaemon(b, torporBin(b), b.TempDir())
	if out, errs, code := d.cli("template", "build", "--e2b", "e2b-base"); code != 0 {
		b.Fatalf("template build --e2b: %s%s", out, errs)
	}
	var env []string
	for _, m := range exportRe.FindAllStringSubmatch(d.stdout.String(), -1) {
		env = append(env, m[1]+"="+strings.ReplaceAll(m[2], "$(cat "+filepath.Join(d.dataDir, "admin.key")+")", d.key))
	}
	cl := d.client(b)
	sb, err := cl.Create(context.Background(), torpor.CreateRequest{Template: "e2b-base"})
	if err != nil {
		b.Fatal(err)
	}
	run := func(op string, n int) (sdk, native []float64) {
		cmd := exec.Command(node, "bench.mjs", op, fmt.Sprint(n), sb.ID)
		cmd.Dir, cmd.Env, cmd.Stderr = "e2b", append(os.Environ(), env...), os.Stderr
		out, err := cmd.Output()
		if err != nil {
			b.Fatalf("bench.mjs %s: %v", op, err)
		}
		var r struct{ SDK, Native []float64 }
		if err := json.Unmarshal(bytes.TrimSpace(out), &r); err != nil {
			b.Fatalf("bench.mjs %s: %v: %s", op, err, out)
		}
		return r.SDK, r.Native
	}
	rounds := 3
	if v := os.Getenv("TORPOR_BENCH_ROUNDS"); v != "" {
		fmt.Sscan(v, &rounds)
	}
	b.ResetTimer()
	for _, op := range []string{"run-true", "create-first", "write", "write-stream", "read", "pause-connect", "rest-pause-connect"} {
		var s, n []float64
		for range rounds {
			ps, pn := run(op, b.N)
			s, n = append(s, ps...), append(n, pn...)
		}
		ms, mn := median(s), median(n)
		b.ReportMetric(ms, op+"-sdk-p50-ms")
		b.ReportMetric(mn, op+"-native-p50-ms")
		if strings.HasPrefix(op, "write") || op == "read" {
			b.ReportMetric(mn/ms, op+"-sdk/native-throughput")
		} else {
			b.ReportMetric(ms/mn, op+"-sdk/native")
		}
	}
}

func median(s []float64) float64 {
	if len(s) == 0 {
		return 0
	}
	c := append([]float64(nil), s...)
	sort.Float64s(c)
	return c[len(c)/2]
}
