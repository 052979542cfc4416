package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

// BenchmarkE2B compares the official E2B SDK's hot paths with torpor's
// native API on the same daemon and sandbox, interleaved in rounds
// (TORPOR_BENCH_ROUNDS, default 3) of b.N samples each, and reports the
// ratio of the medians (SDK / native; for files, native time / SDK time,
// i.e. the SDK's throughput as a fraction of the native API's):
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
	ctx := context.Background()
	sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "e2b-base"})
	if err != nil {
		b.Fatal(err)
	}
	sdk := func(op string, n int, id string) []float64 {
		cmd := exec.Command(node, "bench.mjs", op, fmt.Sprint(n), id)
		cmd.Dir, cmd.Env, cmd.Stderr = "e2b", append(os.Environ(), env...), os.Stderr
		out, err := cmd.Output()
		if err != nil {
			b.Fatalf("bench.mjs %s: %v", op, err)
		}
		var r map[string][]float64
		if err := json.Unmarshal(bytes.TrimSpace(out), &r); err != nil {
			b.Fatalf("bench.mjs %s: %v: %s", op, err, out)
		}
		return r[op]
	}
	timed := func(n int, fn func()) []float64 {
		var s []float64
		for range n {
			t0 := time.Now()
			fn()
			s = append(s, float64(time.Since(t0).Microseconds())/1000)
		}
		return s
	}
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	ten := bytes.Repeat([]byte{7}, 10<<20)
	native := map[string]func(n int) []float64{
		"run-true": func(n int) []float64 {
			return timed(n, func() { _, err := cl.Exec(ctx, sb.ID, client.ExecRequest{Cmd: []string{"true"}}); must(err) })
		},
		"create-first": func(n int) []float64 {
			var s []float64
			for range n {
				t0 := time.Now()
				c, err := cl.Create(ctx, torpor.CreateRequest{Template: "e2b-base"})
				must(err)
				_, err = cl.Exec(ctx, c.ID, client.ExecRequest{Cmd: []string{"true"}})
				must(err)
				s = append(s, float64(time.Since(t0).Microseconds())/1000)
				_, err = cl.Delete(ctx, c.ID)
				must(err)
			}
			return s
		},
		"write": func(n int) []float64 {
			return timed(n, func() {
				_, err := cl.WriteFile(ctx, sb.ID, "/home/user/ten.bin", bytes.NewReader(ten), nil)
				must(err)
			})
		},
		"read": func(n int) []float64 {
			return timed(n, func() {
				r, err := cl.ReadFile(ctx, sb.ID, "/home/user/ten.bin")
				must(err)
				_, err = io.Copy(io.Discard, r)
				must(err)
				r.Close()
			})
		},
		"pause-connect": func(n int) []float64 {
			return timed(n, func() {
				_, err := cl.Pause(ctx, sb.ID, "")
				must(err)
				_, err = cl.Connect(ctx, sb.ID)
				must(err)
			})
		},
	}
	rounds := 3
	if v := os.Getenv("TORPOR_BENCH_ROUNDS"); v != "" {
		fmt.Sscan(v, &rounds)
	}
	b.ResetTimer()
	for _, op := range []string{"run-true", "create-first", "write", "read", "pause-connect"} {
		var s, n []float64
		for range rounds {
			s = append(s, sdk(op, b.N, sb.ID)...)
			n = append(n, native[op](b.N)...)
		}
		ps, pn := median(s), median(n)
		b.ReportMetric(ps, op+"-sdk-p50-ms")
		b.ReportMetric(pn, op+"-native-p50-ms")
		if op == "write" || op == "read" {
			b.ReportMetric(pn/ps, op+"-sdk/native-throughput")
		} else {
			b.ReportMetric(ps/pn, op+"-sdk/native")
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
