package initproc

import (
	"sort"
	"strings"
)

// DefaultPath is the PATH of a sandbox whose environment sets none.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// baseEnv is what a sandbox's environment holds unless it sets otherwise.
var baseEnv = []string{"HOME=/root", "PATH=" + DefaultPath, "TERM=xterm"}

// SandboxEnv returns the environment a sandbox's init starts with, and
// with it every process in the sandbox: PATH, HOME and TERM unless env
// sets them, then env, sorted. A container gets it from its OCI config
// (runtime/runc); in a VM the guest agent, which stands in for init, sets
// it itself, so both kinds of sandbox start alike.
func SandboxEnv(env map[string]string) []string {
	return MergeEnv(append([]string(nil), baseEnv...), env)
}

// MergeEnv returns base (KEY=VALUE entries) with over's variables set
// (over wins), sorted; base itself when over sets nothing.
func MergeEnv(base []string, over map[string]string) []string {
	if len(over) == 0 {
		return base
	}
	m := map[string]string{}
	for _, kv := range base {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	for k, v := range over {
		m[k] = v
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
