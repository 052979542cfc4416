package daemon

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"

	"github.com/torpor-dev/torpor/e2b"
)

// apiHandler serves the native API and, beside it on the same listener,
// E2B's control plane on E2B's own paths (docs/e2b.md).
func apiHandler(native http.Handler, e2bAPI *e2b.API) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", native)
	for _, rt := range e2b.Routes() {
		mux.Handle(rt, e2bAPI)
	}
	return mux
}

// e2bDomain is the domain the E2B API gives each sandbox, from which the
// SDKs make envd's address https://<port>-<id>.<domain>: the proxy's
// domain and port when it serves TLS, else none (the SDKs then use
// E2B_SANDBOX_URL).
func e2bDomain(cfg Config, proxyAddr string) string {
	if cfg.ProxyTLSCert == "" || proxyAddr == "" {
		return ""
	}
	d := strings.ToLower(cfg.ProxyDomain)
	if _, port, err := net.SplitHostPort(proxyAddr); err == nil && port != "443" {
		d += ":" + port
	}
	return d
}

// proxyURL is the address of a sandbox's port through the proxy, with
// {port} and {id} to fill in, for the dashboard's links: the proxy's
// scheme, domain and port (left out when it is the scheme's default);
// empty without a proxy.
func proxyURL(cfg Config, proxyAddr string) string {
	if proxyAddr == "" {
		return ""
	}
	scheme, std := "http", "80"
	if cfg.ProxyTLSCert != "" {
		scheme, std = "https", "443"
	}
	host := "{port}-{id}." + strings.ToLower(cfg.ProxyDomain)
	if _, port, err := net.SplitHostPort(proxyAddr); err == nil && port != std {
		host += ":" + port
	}
	return scheme + "://" + host + "/"
}

// proxyListener wraps the proxy's listener in TLS when the config names a
// certificate (proxy_tls_cert, proxy_tls_key). HTTP/1.1 only: E2B's SDKs
// speak it, and the proxy's loop reads it.
func proxyListener(cfg Config, ln net.Listener) (net.Listener, error) {
	if cfg.ProxyTLSCert == "" {
		return ln, nil
	}
	cert, err := tls.LoadX509KeyPair(cfg.ProxyTLSCert, cfg.ProxyTLSKey)
	if err != nil {
		return nil, fmt.Errorf("proxy_tls_cert: %w", err)
	}
	return tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12}), nil
}

// printE2BEnv prints the environment that points E2B's SDKs at this
// daemon (docs/e2b.md): the API's address, the proxy's (or, with TLS, the
// domain form), and the API key, read from the admin key file so that the
// secret itself is not printed again.
func printE2BEnv(out io.Writer, cfg Config, apiAddr, proxyAddr string) {
	fmt.Fprintln(out, "E2B SDKs reach this daemon with:")
	fmt.Fprintf(out, "  export E2B_API_URL=http://%s\n", apiAddr)
	// The SDK's Volume class does not derive its API from E2B_API_URL.
	fmt.Fprintf(out, "  export E2B_VOLUME_API_URL=http://%s\n", apiAddr)
	switch {
	case proxyAddr == "":
		fmt.Fprintln(out, "  (no proxy: set proxy_listen for commands and files)")
	case cfg.ProxyTLSCert != "":
		fmt.Fprintf(out, "  export E2B_DOMAIN=%s\n", e2bDomain(cfg, proxyAddr))
	default:
		fmt.Fprintf(out, "  export E2B_SANDBOX_URL=http://%s\n", proxyAddr)
	}
	fmt.Fprintf(out, "  export E2B_API_KEY=$(cat %s)\n", filepath.Join(cfg.DataDir, AdminKeyFile))
}
