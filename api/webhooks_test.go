package api_test

import (
	"context"
	"net"
	"net/netip"
	"testing"

	"github.com/torpor-dev/torpor/webhook"
)

// hostsFile resolves the test's host names without a DNS server.
type hostsFile map[string]string

func (h hostsFile) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	ip, ok := h[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return []netip.Addr{netip.MustParseAddr(ip)}, nil
}

// webhookGuard is the fixture's: the default rule, with names that
// resolve to a public address and to the host's own.
var webhookGuard = webhook.NewGuard(webhook.GuardConfig{Resolver: hostsFile{
	"localhost":            "127.0.0.1",
	"hooks.example.com":    "93.184.215.14",
	"loopback.example.com": "127.0.0.1",
	"metadata.example.com": "169.254.169.254",
	"intranet.example.com": "10.20.30.40",
}})

// TestWebhookRegistrationRefusesTheHostsOwnNetworks: an endpoint on the
// loopback, a private, link-local, shared, multicast or unspecified
// address, given as such or behind a name, is refused with a 400 on url
// and registers nothing.
func TestWebhookRegistrationRefusesTheHostsOwnNetworks(t *testing.T) {
	f := newFixture(t)
	for _, url := range []string{
		"http://127.0.0.1:7070/v1/sandboxes", "http://localhost:22/", "http://[::1]/", "http://127.1.2.3/",
		"http://10.0.0.1/", "http://172.16.5.4/", "http://192.168.1.1/", "http://[fd00::1]/", "http://[fc00::1]/",
		"http://169.254.169.254/latest/meta-data/", "http://[fe80::1%25eth0]/", "http://100.64.0.1/",
		"http://0.0.0.0/", "http://[::]/", "http://224.0.0.1/", "http://[ff02::1]/", "http://[::ffff:127.0.0.1]/",
		"http://loopback.example.com/", "https://metadata.example.com/", "https://intranet.example.com:8443/",
		"https://nosuch.example.com/",
	} {
		status, eb := f.raw(t, "POST", "/v1/webhooks", f.acmeKey, "application/json", `{"url":"`+url+`"}`)
		if status != 400 || eb.Error.Param != "url" {
			t.Errorf("%s: %d %+v, want 400 on url", url, status, eb.Error)
		}
	}
	if list, err := f.tenantCl.Webhooks(ctx); err != nil || len(list) != 0 {
		t.Fatalf("refused endpoints were registered: %+v %v", list, err)
	}
}
