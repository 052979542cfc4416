package e2b_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/runtime/fake"
)

// egressRuntime is the fake runtime with a sandbox network that records
// the egress rules it is told to enforce.
type egressRuntime struct {
	*fake.Runtime
	mu  sync.Mutex
	got []*torpor.NetworkRules
}

func (r *egressRuntime) SetEgress(_ context.Context, _ torpor.InstanceRef, rules *torpor.NetworkRules) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, rules)
	return nil
}

func (r *egressRuntime) Address(context.Context, torpor.InstanceRef) (netip.Addr, bool) {
	return netip.Addr{}, false
}

func (r *egressRuntime) Networked() bool { return true }

// TestNetworkRules: E2B's network.allowOut/denyOut at create become the
// sandbox's egress rules (shown in GET /sandboxes/{id}); PUT
// /sandboxes/{id}/network (the SDK's updateNetwork) replaces them and
// enforces them at once; what torpor does not serve is refused with a
// 400 naming the field.
func TestNetworkRules(t *testing.T) {
	var rt *egressRuntime
	f := newFixture(t, func(c *lifecycle.Config) {
		rt = &egressRuntime{Runtime: c.Runtimes[0].(*fake.Runtime)}
		c.Runtimes = []torpor.Runtime{rt}
	})
	r := f.do("POST", "/v2/sandboxes", f.acme, `{"templateID":"base","network":{"allowOut":["API.example.com","10.1.2.3/16"],"denyOut":["bad.example.com"],"allowPublicTraffic":true}}`)
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	var created struct {
		SandboxID string `json:"sandboxID"`
	}
	json.Unmarshal(r.body, &created)
	id := created.SandboxID
	sb, err := f.eng.Get(ctx, "acme", id)
	if err != nil {
		t.Fatal(err)
	}
	if sb.Network == nil || !slices.Equal(sb.Network.AllowOut, []string{"api.example.com", "10.1.0.0/16"}) || !slices.Equal(sb.Network.DenyOut, []string{"bad.example.com"}) {
		t.Fatalf("rules %+v", sb.Network)
	}
	info := f.do("GET", "/sandboxes/"+id, f.acme, "")
	var detail struct {
		Network *struct{ AllowOut, DenyOut []string } `json:"network"`
	}
	json.Unmarshal(info.body, &detail)
	if detail.Network == nil || len(detail.Network.AllowOut) != 2 || detail.Network.DenyOut[0] != "bad.example.com" {
		t.Fatalf("GET network: %s", info.body)
	}

	if r := f.do("PUT", "/sandboxes/"+id+"/network", f.acme, `{"allowOut":["*.example.org"]}`); r.status != http.StatusNoContent {
		t.Fatalf("update: %d %s", r.status, r.body)
	}
	rt.mu.Lock()
	last := rt.got[len(rt.got)-1]
	rt.mu.Unlock()
	if last == nil || !slices.Equal(last.AllowOut, []string{"*.example.org"}) || len(last.DenyOut) != 0 {
		t.Fatalf("enforced %+v", last)
	}
	if r := f.do("PUT", "/sandboxes/"+id+"/network", f.acme, `{}`); r.status != http.StatusNoContent {
		t.Fatalf("removing the rules: %d %s", r.status, r.body)
	}
	if sb, _ := f.eng.Get(ctx, "acme", id); sb.Network != nil {
		t.Fatalf("rules left after {}: %+v", sb.Network)
	}

	for _, c := range []struct {
		method, path, body, param string
	}{
		{"POST", "/v2/sandboxes", `{"templateID":"base","network":{"allowOut":["2001:db8::/32"]}}`, "network.allowOut"},
		{"POST", "/v2/sandboxes", `{"templateID":"base","network":{"denyOut":["a b"]}}`, "network.denyOut"},
		{"POST", "/v2/sandboxes", `{"templateID":"base","network":{"rules":{"x.com":[{}]}}}`, "network.rules"},
		{"POST", "/v2/sandboxes", `{"templateID":"base","network":{"egressProxy":{"address":"p:1080"}}}`, "network.egressProxy"},
		{"POST", "/v2/sandboxes", `{"templateID":"base","network":{"allowPublicTraffic":false}}`, "network.allowPublicTraffic"},
		{"POST", "/v2/sandboxes", `{"templateID":"base","network":{"allowOut":"10.0.0.1"}}`, "network"},
		{"PUT", "/sandboxes/" + id + "/network", `{"allowOut":["10.0.0.0/33"]}`, "network.allowOut"},
		{"PUT", "/sandboxes/" + id + "/network", `{"allow_internet_access":true}`, "allow_internet_access"},
		{"PUT", "/sandboxes/nosuch/network", `{"allowOut":["10.0.0.1"]}`, ""},
	} {
		r := f.do(c.method, c.path, f.acme, c.body)
		if c.param == "" {
			if r.status != http.StatusNotFound {
				t.Errorf("%s %s: %d %s, want 404", c.method, c.body, r.status, r.body)
			}
			continue
		}
		if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), c.param) {
			t.Errorf("%s %s: %d %s, want 400 naming %s", c.method, c.body, r.status, r.body, c.param)
		}
	}
	// Another tenant's sandbox is not found.
	if r := f.do("PUT", "/sandboxes/"+id+"/network", f.other, `{"allowOut":["10.0.0.1"]}`); r.status != http.StatusNotFound {
		t.Errorf("another tenant's update: %d %s", r.status, r.body)
	}
}
