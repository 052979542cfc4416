package template

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/torpor-dev/torpor"
)

func TestParseRef(t *testing.T) {
	for _, tc := range []struct {
		ref string
		ok  bool
	}{
		{"alpine", true},
		{"alpine:3.20", true},
		{"docker.io/library/alpine:3.20", true},
		{"registry.example:5000/team/app:1", true},
		{"localhost:5000/app", true},
		{"127.0.0.1:5000/app@sha256:" + strings.Repeat("a", 64), true},
		{"[::1]:5000/app", true},
		{"[::1]/app", true},
		{"file:///etc/shadow", false},
		{"file:/etc/shadow", false},
		{"https://registry.example/app", false},
		{"ftp://registry.example/app", false},
		{"registry.example:0/app", false},
		{"registry.example:99999/app", false},
		{"registry.example:05000/app", false},
		{"registry.example:http/app", false},
		{"[not-v6]:5000/app", false},
		{"[1.2.3.4]:5000/app", false},
		{"-bad.example/app", false},
		{"UPPER CASE!", false},
	} {
		_, err := parseRef(tc.ref, false)
		if tc.ok != (err == nil) {
			t.Errorf("parseRef(%q) = %v, want ok %v", tc.ref, err, tc.ok)
			continue
		}
		if err != nil {
			if e := torpor.AsError(err); e.Code != torpor.EInvalid || e.Param != "image" {
				t.Errorf("parseRef(%q) = %+v, want invalid naming image", tc.ref, e)
			}
		}
	}
}

// What the network says names the server's resolver and the addresses it
// dialed; the caller sees the registry as the reference names it, and
// what kind of failure it was.
func TestRegistryErrorHidesAddresses(t *testing.T) {
	dial := func(err error) error {
		return &url.Error{Op: "Get", URL: "https://reg.example/v2/", Err: &net.OpError{Op: "dial", Net: "tcp",
			Addr: &net.TCPAddr{IP: net.IPv4(10, 9, 8, 7), Port: 443}, Err: err}}
	}
	const ref = "reg.example/team/app:1"
	for _, tc := range []struct {
		name  string
		err   error
		code  torpor.ErrorCode
		words string
	}{
		{"no such host", dial(&net.DNSError{Err: "no such host", Name: "reg.example", Server: "10.255.255.53:53", IsNotFound: true}),
			torpor.EInvalid, "the registry host reg.example does not exist"},
		{"resolver down", dial(&net.DNSError{Err: "server misbehaving", Name: "reg.example", Server: "[fd00::53]:53", IsTemporary: true}),
			torpor.EUnavailable, "cannot look up the registry host reg.example"},
		{"refused", dial(errors.New("connect: connection refused")), torpor.EUnavailable, "cannot reach the registry reg.example"},
		{"timeout", dial(&net.DNSError{Err: "i/o timeout", Name: "reg.example", Server: "10.255.255.53:53", IsTimeout: true}),
			torpor.EUnavailable, "did not answer in time"},
		{"untrusted certificate", &url.Error{Op: "Get", URL: "https://reg.example/v2/", Err: &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}},
			torpor.EInvalid, "does not trust"},
		{"refused by the registry", &transport.Error{StatusCode: http.StatusBadRequest, Request: &http.Request{Method: "GET", URL: &url.URL{Scheme: "https", Host: "10.1.1.1:9000", Path: "/blobs/x"}}},
			torpor.EInvalid, "refused the request"},
		{"something else", errors.New("manifest from 192.168.7.7 is odd"), torpor.EInvalid, "(address)"},
	} {
		e := torpor.AsError(registryError(ref, tc.err))
		if e.Code != tc.code || !strings.Contains(e.Message, tc.words) || !strings.Contains(e.Message, ref) {
			t.Errorf("%s: %+v, want %s saying %q", tc.name, e, tc.code, tc.words)
		}
		for _, addr := range []string{"10.255.255.53", "fd00::53", "10.9.8.7", "10.1.1.1", "192.168.7.7"} {
			if strings.Contains(e.Message, addr) {
				t.Errorf("%s: %q shows the address %s", tc.name, e.Message, addr)
			}
		}
	}
}

func TestHideAddrs(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"lookup deb.example on 10.255.255.53:53: no such host", "lookup deb.example on (address): no such host"},
		{"Connecting to deb.example (deb.example)|151.101.2.132|:80... failed", "Connecting to deb.example (deb.example)|(address)|:80... failed"},
		{"dial tcp [2001:db8::1]:443: refused", "dial tcp (address): refused"},
		{"dial tcp 2001:db8::1 refused", "dial tcp (address) refused"},
		{"at 12:30:45, sha256:abc, version 1.2.3", "at 12:30:45, sha256:abc, version 1.2.3"},
		{"from the mirror http://10.0.0.5/debian", "from the mirror http://10.0.0.5/debian"},
	} {
		if got := hideAddrs(tc.in, "http://10.0.0.5/debian"); got != tc.want {
			t.Errorf("hideAddrs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
