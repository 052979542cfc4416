package proxy_test

import (
	"io"
	"net/http"
	"testing"

	"github.com/torpor-dev/torpor"
)

// BenchmarkProxyHotPath: small GETs through the proxy to a local server,
// in parallel, over kept-alive connections: the proxy's own cost per
// request (with the engine and its store, over the fake runtime). The
// end-to-end comparison with a direct connection and nginx is e2e's
// BenchmarkProxy.
func BenchmarkProxyHotPath(b *testing.B) {
	f := newFixture(b)
	sb := f.create(b, torpor.CreateRequest{Ports: []torpor.PortSpec{{Port: 8080, Public: true}}})
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	url, host := f.proxy.URL+"/", "8080-"+sb.ID+".sb.test"
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequest("GET", url, nil)
			req.Host = host
			resp, err := c.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
}
