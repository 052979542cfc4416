package daemon

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/torpor-dev/torpor"
)

func TestConfigLayers(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "torpor.toml")
	if err := os.WriteFile(file, []byte("listen = \"127.0.0.1:1111\"\nlog_level = \"warn\"\nmax_vcpus = 8\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dnsFile := filepath.Join(dir, "dns.toml")
	dnsString := filepath.Join(dir, "dns-string.toml")
	uiOff := filepath.Join(dir, "ui-off.toml")
	pools := filepath.Join(dir, "pools.toml")
	for f, body := range map[string]string{dnsFile: "network_dns = [\"192.0.2.1\", \"192.0.2.2\"]\n", dnsString: "network_dns = \"192.0.2.3\"\n", uiOff: "ui = false\n",
		pools: "warm_pools = [\"base=4\", \"python=2:internet\"]\n"} {
		if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name  string
		env   map[string]string
		flags []string
		check func(c Config) bool
	}{
		{"defaults", nil, nil, func(c Config) bool {
			return c.Listen == DefaultListen && c.Runtime == "runc" && c.NetworkBridge == "torpor0" && c.NetworkCIDR == "10.213.0.0/16" && c.ProxyTCPPorts == ""
		}},
		{"network off, TCP ports on", map[string]string{"TORPOR_NETWORK_BRIDGE": ""}, []string{"--network-bridge", "", "--proxy-tcp-ports", "5432,8000-8099"},
			func(c Config) bool { return c.NetworkBridge == "" && c.ProxyTCPPorts == "5432,8000-8099" }},
		{"the data dir's file", map[string]string{"TORPOR_DATA_DIR": dir}, nil,
			func(c Config) bool { return c.Listen == "127.0.0.1:1111" && c.LogLevel == "warn" && c.MaxVCPUs == 8 }},
		{"env beats the file", map[string]string{"TORPOR_DATA_DIR": dir, "TORPOR_LISTEN": "127.0.0.1:2222"}, nil,
			func(c Config) bool { return c.Listen == "127.0.0.1:2222" && c.LogLevel == "warn" }},
		{"flag beats env", map[string]string{"TORPOR_DATA_DIR": dir, "TORPOR_LISTEN": "127.0.0.1:2222"}, []string{"--listen", "127.0.0.1:3333"},
			func(c Config) bool { return c.Listen == "127.0.0.1:3333" }},
		{"explicit config file", nil, []string{"--config", file, "--data-dir", "/tmp/x"},
			func(c Config) bool { return c.Listen == "127.0.0.1:1111" && c.DataDir == "/tmp/x" }},
		{"nameservers from the environment", map[string]string{"TORPOR_NETWORK_DNS": "1.1.1.1, 9.9.9.9"}, nil,
			func(c Config) bool { return nameservers(c) == "[1.1.1.1 9.9.9.9]" }},
		{"nameservers as a TOML array", nil, []string{"--config", dnsFile},
			func(c Config) bool { return nameservers(c) == "[192.0.2.1 192.0.2.2]" }},
		{"nameservers as a TOML string", nil, []string{"--config", dnsString},
			func(c Config) bool { return nameservers(c) == "[192.0.2.3]" }},
		{"no nameservers: the host's", nil, nil, func(c Config) bool { return nameservers(c) == "[]" }},
		{"rate limits by default", nil, nil, func(c Config) bool { return c.RateLimitPerSecond == 50 && c.RateLimitBurst == 200 }},
		{"rate limits from env and flags", map[string]string{"TORPOR_RATE_LIMIT_PER_SECOND": "2.5"}, []string{"--rate-limit-burst", "5"},
			func(c Config) bool { return c.RateLimitPerSecond == 2.5 && c.RateLimitBurst == 5 }},
		{"rate limits off", nil, []string{"--rate-limit-per-second", "0"}, func(c Config) bool { return c.RateLimitPerSecond == 0 }},
		{"no warm pools by default", nil, nil, func(c Config) bool { return len(c.WarmPools) == 0 }},
		{"no archive by default", nil, nil, func(c Config) bool {
			return c.DefaultArchiveAfterHibernated == 0 && !c.defaultPolicy().ArchiveAfterHibernatedSeconds.On() && c.pricing().ArchiveGiBMonth == 0.02
		}},
		{"archive default and price from env and flags", map[string]string{"TORPOR_DEFAULT_ARCHIVE_AFTER_HIBERNATED_SECONDS": "604800"}, []string{"--pricing-archive-gib-month", "0.01"},
			func(c Config) bool {
				return c.defaultPolicy().ArchiveAfterHibernatedSeconds == torpor.Seconds(604800) && c.pricing().ArchiveGiBMonth == 0.01
			}},
		{"warm pools from the file, env and repeated flags, each over the one before", map[string]string{"TORPOR_WARM_POOLS": "python=3, go=1:internet"},
			[]string{"--config", pools, "--warm-pool", "base=1", "--warm-pool", "rust=0"},
			func(c Config) bool {
				p, err := c.warmPools()
				return err == nil && fmt.Sprint(p) == "[{base 1 false} {python 3 false} {go 1 true} {rust 0 false}]"
			}},
		{"the dashboard on by default", nil, nil, func(c Config) bool { return c.UI }},
		{"--no-ui", nil, []string{"--no-ui"}, func(c Config) bool { return !c.UI }},
		{"--no-ui beats --ui", map[string]string{"TORPOR_UI": "true"}, []string{"--ui", "--no-ui"}, func(c Config) bool { return !c.UI }},
		{"--ui=false", nil, []string{"--ui=false"}, func(c Config) bool { return !c.UI }},
		{"ui = false in the file", nil, []string{"--config", uiOff}, func(c Config) bool { return !c.UI }},
		{"TORPOR_UI=false", map[string]string{"TORPOR_UI": "false"}, nil, func(c Config) bool { return !c.UI }},
		{"webhook ranges from the environment", map[string]string{"TORPOR_WEBHOOK_ALLOW_CIDRS": "10.1.2.3/16, fd00::/8"}, nil, func(c Config) bool {
			p, err := c.webhookAllow()
			return err == nil && fmt.Sprint(p) == "[10.1.0.0/16 fd00::/8]"
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
			AddFlags(fs)
			if err := fs.Parse(c.flags); err != nil {
				t.Fatal(err)
			}
			cfg, err := LoadConfig(fs, func(k string) string { return c.env[k] })
			if err != nil {
				t.Fatal(err)
			}
			if !c.check(cfg) {
				t.Fatalf("got %+v", cfg)
			}
		})
	}
}

func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(bad, []byte("lisen = \"x\"\n"), 0o600)
	badDNS := filepath.Join(dir, "bad-dns.toml")
	os.WriteFile(badDNS, []byte("network_dns = [1, 2]\n"), 0o600)
	badPool := filepath.Join(dir, "bad-pool.toml")
	os.WriteFile(badPool, []byte("warm_pools = [\"base=-1\"]\n"), 0o600)
	cases := []struct {
		name  string
		env   map[string]string
		flags []string
		want  string
	}{
		{"unknown key in the file", nil, []string{"--config", bad}, "unknown setting"},
		{"missing explicit file", nil, []string{"--config", filepath.Join(dir, "none.toml")}, "no such file"},
		{"bad number in env", map[string]string{"TORPOR_MAX_PIDS": "lots"}, nil, "TORPOR_MAX_PIDS"},
		{"relative data dir", nil, []string{"--data-dir", "rel"}, "absolute"},
		{"bad log level", nil, []string{"--log-level", "loud"}, "log_level"},
		{"default above max", nil, []string{"--default-vcpus", "9", "--max-vcpus", "8"}, "at most"},
		{"bad network range", map[string]string{"TORPOR_NETWORK_CIDR": "fd00::/64"}, nil, "network_cidr"},
		{"too small a network range", nil, []string{"--network-cidr", "10.9.9.0/30"}, "network_cidr"},
		{"bad TCP ports", nil, []string{"--proxy-tcp-ports", "22,80-70"}, "proxy_tcp_ports"},
		{"a TLS certificate without its key", nil, []string{"--proxy-tls-cert", "/etc/cert.pem"}, "proxy_tls_cert and proxy_tls_key go together"},
		{"bad E2B template aliases", map[string]string{"TORPOR_E2B_TEMPLATES": "base"}, nil, "e2b_templates"},
		{"nameserver not an address", nil, []string{"--network-dns", "1.1.1.1,dns.example"}, "network_dns: \"dns.example\" is not an IP address"},
		{"loopback nameserver", map[string]string{"TORPOR_NETWORK_DNS": "127.0.0.53"}, nil, "network_dns: 127.0.0.53 is a loopback address"},
		{"link-local nameserver", nil, []string{"--network-dns", "169.254.169.254"}, "network_dns: 169.254.169.254 is a link-local"},
		{"IPv6 nameserver", nil, []string{"--network-dns", "2606:4700:4700::1111"}, "network_dns: 2606:4700:4700::1111 is an IPv6 address"},
		{"too many nameservers", nil, []string{"--network-dns", "1.1.1.1,1.0.0.1,9.9.9.9,8.8.8.8"}, "network_dns lists 4 nameservers"},
		{"nameservers not strings", nil, []string{"--config", badDNS}, "network_dns"},
		{"negative rate limit", nil, []string{"--rate-limit-per-second", "-1"}, "rate_limit_per_second must be between 0"},
		{"no burst", map[string]string{"TORPOR_RATE_LIMIT_BURST": "0"}, nil, "rate_limit_burst must be between 1"},
		{"a warm pool without a size", nil, []string{"--warm-pool", "base"}, "--warm-pool"},
		{"negative archive default", nil, []string{"--default-archive-after-hibernated-seconds", "-1"}, "default_archive_after_hibernated_seconds must be between 0"},
		{"a warm pool too big", map[string]string{"TORPOR_WARM_POOLS": "base=65"}, nil, "TORPOR_WARM_POOLS"},
		{"a negative warm pool in the file", nil, []string{"--config", badPool}, "warm_pools"},
		{"webhook range not a CIDR", nil, []string{"--webhook-allow-cidrs", "127.0.0.1"}, "webhook_allow_cidrs: \"127.0.0.1\" is not a CIDR range"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
			AddFlags(fs)
			if err := fs.Parse(c.flags); err != nil {
				t.Fatal(err)
			}
			_, err := LoadConfig(fs, func(k string) string { return c.env[k] })
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error with %q", err, c.want)
			}
		})
	}
}

// nameservers is the parsed network_dns of c, as text.
func nameservers(c Config) string {
	a, err := c.nameservers()
	if err != nil {
		return err.Error()
	}
	return fmt.Sprint(a)
}
