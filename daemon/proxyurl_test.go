package daemon

import "testing"

// The dashboard's proxy links name the proxy's scheme, domain and port,
// the port left out when it is the scheme's default.
func TestProxyURL(t *testing.T) {
	for _, c := range []struct {
		domain, cert, addr, want string
	}{
		{"localhost", "", "127.0.0.1:7071", "http://{port}-{id}.localhost:7071/"},
		{"Sandbox.Example.com", "", "[::]:80", "http://{port}-{id}.sandbox.example.com/"},
		{"sandbox.example.com", "/etc/cert.pem", "0.0.0.0:443", "https://{port}-{id}.sandbox.example.com/"},
		{"sandbox.example.com", "/etc/cert.pem", "0.0.0.0:8443", "https://{port}-{id}.sandbox.example.com:8443/"},
		{"localhost", "", "", ""},
	} {
		if got := proxyURL(Config{ProxyDomain: c.domain, ProxyTLSCert: c.cert}, c.addr); got != c.want {
			t.Errorf("proxyURL(%q, cert %q, %q) = %q, want %q", c.domain, c.cert, c.addr, got, c.want)
		}
	}
}
