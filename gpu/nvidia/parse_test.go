package nvidia

import (
	"errors"
	"testing"

	"github.com/torpor-dev/torpor/gpu"
)

func TestParseComputeApps(t *testing.T) {
	cases := []struct {
		name    string
		out     string
		want    map[int]int64
		wantErr bool
	}{
		{"empty", "", map[int]int64{}, false},
		{"two processes", "1234, 5678\n42, 100\n", map[int]int64{1234: 5678, 42: 100}, false},
		{"one process on two devices is summed", "7, 100\n7, 250\n", map[int]int64{7: 350}, false},
		{"blank lines and spaces", "\n  9 ,  12  \n\n", map[int]int64{9: 12}, false},
		{"old no-processes line", "No running processes found\n", map[int]int64{}, false},
		{"memory not available", "1234, [N/A]\n", nil, true},
		{"memory not supported", "1234, [Not Supported]\n", nil, true},
		{"pid not available", "[N/A], 100\n", nil, true},
		{"garbage", "hello\n", nil, true},
		{"negative", "5, -1\n", nil, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseComputeApps([]byte(c.out))
			if c.wantErr {
				if !errors.Is(err, gpu.ErrProbeUnavailable) {
					t.Fatalf("err = %v, want an unreadable probe", err)
				}
				return
			}
			if err != nil || len(got) != len(c.want) {
				t.Fatalf("= %v, %v; want %v", got, err, c.want)
			}
			for k, v := range c.want {
				if got[k] != v {
					t.Fatalf("= %v, want %v", got, c.want)
				}
			}
		})
	}
}

func TestParseGPUs(t *testing.T) {
	out := "0, GPU-1111, 1024, 143771\n1, GPU-2222, 0, 143771\n"
	devs, err := parseGPUs([]byte(out))
	if err != nil || len(devs) != 2 || devs[0].UUID != "GPU-1111" || devs[0].UsedMiB != 1024 || devs[1].TotalMiB != 143771 || devs[1].Index != 1 {
		t.Fatalf("= %+v, %v", devs, err)
	}
	for _, bad := range []string{"", "0, GPU-1, [N/A], 10\n", "0, GPU-1, 5\n"} {
		if _, err := parseGPUs([]byte(bad)); !errors.Is(err, gpu.ErrProbeUnavailable) {
			t.Fatalf("%q: err = %v", bad, err)
		}
	}
}

func TestParseStatus(t *testing.T) {
	st, err := parseStatus([]byte("Name:\tpython3\nUmask:\t0022\nState:\tT (stopped)\nTgid:\t100\nNgid:\t0\nPid:\t101\nPPid:\t1\n"))
	if err != nil || st.PID != 101 || st.Tgid != 100 || st.State != 'T' {
		t.Fatalf("= %+v, %v", st, err)
	}
	if _, err := parseStatus([]byte("Name:\tx\n")); err == nil {
		t.Fatal("parsed a status without Pid")
	}
}

func TestParseStatPgrp(t *testing.T) {
	// The command name may hold spaces and parentheses.
	g, err := parseStatPgrp([]byte("4242 (my (odd) cmd) S 1 4240 4240 0 -1 4194560 ..."))
	if err != nil || g != 4240 {
		t.Fatalf("= %d, %v", g, err)
	}
}

func TestParseProcCgroup(t *testing.T) {
	v1 := "12:pids:/torpor/a\n5:freezer:/torpor/a\n0::/user.slice\n"
	if p, ok := parseProcCgroup([]byte(v1), false); !ok || p != "/torpor/a" {
		t.Fatalf("v1 = %q %v", p, ok)
	}
	if p, ok := parseProcCgroup([]byte("0::/torpor/b\n"), true); !ok || p != "/torpor/b" {
		t.Fatalf("v2 = %q %v", p, ok)
	}
	if _, ok := parseProcCgroup([]byte("3:cpu:/x\n"), false); ok {
		t.Fatal("found a freezer that is not there")
	}
}

func TestParseCudaState(t *testing.T) {
	for out, want := range map[string]string{
		"running\n": cudaRunning, "checkpointed": cudaCheckpointed, "locked\n": cudaLocked, "failed": cudaFailed,
	} {
		if got, err := parseCudaState([]byte(out)); err != nil || got != want {
			t.Fatalf("%q = %q, %v", out, got, err)
		}
	}
	if _, err := parseCudaState([]byte("Error: could not open pid")); err == nil {
		t.Fatal("parsed an error as a state")
	}
}

func TestParseReserved(t *testing.T) {
	cases := []struct {
		in      string
		done    bool
		wantErr bool
		wantOOM bool
	}{
		{"", false, false, false},
		{"6 ok 100", false, false, false}, // an older answer
		{"7 ok 100", true, false, false},
		{"7 oom cuMemAlloc failed", true, true, true},
		{"7 error cuda not initialised", true, true, false},
	}
	for _, c := range cases {
		done, err := parseReserved([]byte(c.in), 7)
		if done != c.done || (err != nil) != c.wantErr || errors.Is(err, gpu.ErrOutOfMemory) != c.wantOOM {
			t.Fatalf("%q: done %v err %v", c.in, done, err)
		}
	}
}
