package network

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestChooseDNS(t *testing.T) {
	const (
		plain = "# from DHCP\nnameserver 10.0.0.2\nnameserver 192.0.2.53\nsearch corp.example example\noptions ndots:2\noptions timeout:1\n"
		// systemd-resolved's /etc/resolv.conf names its stub only.
		stub     = "nameserver 127.0.0.53\noptions edns0 trust-ad\nsearch stub.example\n"
		resolved = "nameserver 192.0.2.1\nnameserver 192.0.2.2\nsearch lan.example\n"
		mixed    = "nameserver 127.0.0.1\nnameserver ::1\nnameserver 2001:db8::53\nnameserver 169.254.169.254\nnameserver fe80::1%eth0\n" +
			"nameserver ::ffff:192.0.2.9\nnameserver not-an-address\n; nameserver 192.0.2.77\n#nameserver 192.0.2.78\nnameserver 192.0.2.10\n"
		four = "nameserver 192.0.2.1\nnameserver 192.0.2.2\nnameserver 192.0.2.3\nnameserver 192.0.2.4\n"
		// The last search or domain line wins.
		domain = "search a.example\ndomain b.example\nnameserver 192.0.2.5\n"
	)
	cases := []struct {
		name    string
		servers []string
		files   []string // contents; "" is a missing file
		want    string
	}{
		{"the host's file", nil, []string{plain, resolved},
			"# Written by torpor at boot, from the host's F0.\nnameserver 10.0.0.2\nnameserver 192.0.2.53\nsearch corp.example example\noptions ndots:2 timeout:1\n"},
		{"systemd-resolved's upstream servers behind its stub", nil, []string{stub, resolved},
			"# Written by torpor at boot, from the host's F1.\nnameserver 192.0.2.1\nnameserver 192.0.2.2\nsearch lan.example\n"},
		{"no /etc/resolv.conf", nil, []string{"", resolved},
			"# Written by torpor at boot, from the host's F1.\nnameserver 192.0.2.1\nnameserver 192.0.2.2\nsearch lan.example\n"},
		{"loopback, link-local, IPv6 and comments skipped", nil, []string{mixed},
			"# Written by torpor at boot, from the host's F0.\nnameserver 192.0.2.9\nnameserver 192.0.2.10\n"},
		{"at most three", nil, []string{four},
			"# Written by torpor at boot, from the host's F0.\nnameserver 192.0.2.1\nnameserver 192.0.2.2\nnameserver 192.0.2.3\n"},
		{"domain line", nil, []string{domain},
			"# Written by torpor at boot, from the host's F0.\nnameserver 192.0.2.5\nsearch b.example\n"},
		{"none usable", nil, []string{stub, ""}, ""},
		{"given servers win, without the host's search and options", []string{"198.51.100.1", "198.51.100.2"}, []string{plain},
			"# Written by torpor at boot, from the server's configuration.\nnameserver 198.51.100.1\nnameserver 198.51.100.2\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			var files []string
			for i, content := range c.files {
				f := filepath.Join(dir, fmt.Sprintf("resolv%d", i))
				if content != "" {
					if err := os.WriteFile(f, []byte(content), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				files = append(files, f)
			}
			var servers []netip.Addr
			for _, s := range c.servers {
				servers = append(servers, netip.MustParseAddr(s))
			}
			d := ChooseDNS(servers, files...)
			if c.want == "" {
				if len(d.Nameservers) != 0 {
					t.Fatalf("got nameservers %v, want none", d.Nameservers)
				}
				return
			}
			want := c.want
			for i, f := range files {
				want = strings.ReplaceAll(want, fmt.Sprintf("F%d", i), f)
			}
			if got := d.ResolvConf(); got != want {
				t.Fatalf("got\n%s\nwant\n%s", got, want)
			}
		})
	}
}

func TestCheckNameserver(t *testing.T) {
	for _, c := range []struct {
		addr string
		ok   bool
	}{
		{"1.1.1.1", true}, {"10.0.0.2", true}, {"::ffff:8.8.8.8", true},
		{"127.0.0.53", false}, {"::1", false}, {"169.254.169.253", false}, {"2001:4860:4860::8888", false},
		{"0.0.0.0", false}, {"224.0.0.251", false}, {"255.255.255.255", false},
	} {
		if err := CheckNameserver(netip.MustParseAddr(c.addr)); (err == nil) != c.ok {
			t.Errorf("%s: got %v, want ok=%v", c.addr, err, c.ok)
		}
	}
}
