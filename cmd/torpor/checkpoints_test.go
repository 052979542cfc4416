package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestCheckpointFlags: the checkpoint, fork and restore verbs refuse
// what they lack before asking the daemon.
func TestCheckpointFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		err  string
	}{
		{[]string{"checkpoint", "sb1"}, "--name"},
		{[]string{"checkpoint"}, "accepts 1 arg"},
		{[]string{"checkpoint", "rm", "sb1"}, "accepts 2 arg"},
		{[]string{"checkpoints"}, "accepts 1 arg"},
		{[]string{"restore", "sb1"}, "--checkpoint"},
		{[]string{"fork"}, "accepts 1 arg"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			env := func(k string) string {
				switch k {
				case "TORPOR_API_KEY":
					return "tpk_test"
				case "TORPOR_URL":
					return "http://127.0.0.1:1"
				}
				return ""
			}
			code := Run(context.Background(), c.args, strings.NewReader(""), &stdout, &stderr, env)
			if code == 0 || !strings.Contains(stderr.String(), c.err) {
				t.Fatalf("exit %d, stderr %q; want %q", code, stderr.String(), c.err)
			}
		})
	}
}
