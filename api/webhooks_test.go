package api_test

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api"
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

// fakeDeliveries answers each webhook's state from its id.
type fakeDeliveries map[string]torpor.WebhookDelivery

func (f fakeDeliveries) WebhookDelivery(_ context.Context, w torpor.Webhook) torpor.WebhookDelivery {
	return f[w.ID]
}

// TestWebhookListShowsDeliveryState: GET /v1/webhooks carries each of the
// tenant's webhooks' delivery state from the dispatcher, and another
// tenant's list shows none of them.
func TestWebhookListShowsDeliveryState(t *testing.T) {
	states := fakeDeliveries{}
	f := newFixture(t, func(c *api.Config) { c.WebhookDeliveries = states })
	created, err := f.tenantCl.CreateWebhook(ctx, "https://hooks.example.com/a")
	if err != nil {
		t.Fatal(err)
	}
	if created.Delivery != nil {
		t.Fatalf("a new webhook's answer carries a delivery: %+v", created.Delivery)
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	states[created.ID] = torpor.WebhookDelivery{Delivered: 3, LastAttemptAt: &at, LastStatus: 500, LastError: "the endpoint answered 500 Internal Server Error", ConsecutiveFailures: 2, NextRetryAt: &at, Behind: 4}
	list, err := f.tenantCl.Webhooks(ctx)
	if err != nil || len(list) != 1 || list[0].Delivery == nil {
		t.Fatalf("list: %+v %v", list, err)
	}
	if got, want := *list[0].Delivery, states[created.ID]; got.Delivered != want.Delivered || got.ConsecutiveFailures != 2 || got.LastStatus != 500 || got.Behind != 4 || !got.LastAttemptAt.Equal(at) || !got.NextRetryAt.Equal(at) || got.LastError != want.LastError {
		t.Fatalf("delivery %+v, want %+v", got, want)
	}
	if others, err := f.adminCl.Webhooks(ctx); err != nil || slices.ContainsFunc(others, func(w torpor.Webhook) bool { return w.ID == created.ID }) {
		t.Fatalf("another tenant's list: %+v %v", others, err)
	}
}
