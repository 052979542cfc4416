// Package daemon assembles torpor's server: configuration, the store, the
// runtime, the built-in template, the admin key, the lifecycle engine and
// the HTTP API, and runs them until its context ends.
package daemon

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"

	"github.com/BurntSushi/toml"
	"github.com/spf13/pflag"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/ratelimit"
	e2btemplates "github.com/torpor-dev/torpor/e2b/templates"
	"github.com/torpor-dev/torpor/network"
	"github.com/torpor-dev/torpor/proxy"
)

// Config is every setting of `torpor serve`. Each has a default, a key in
// the TOML config file, a TORPOR_* environment variable and a flag; a flag
// beats the environment, which beats the file, which beats the default.
type Config struct {
	DataDir string `toml:"data_dir"`
	// Store is where the daemon keeps its state: empty for the SQLite
	// file in DataDir, or a PostgreSQL URL (docs/postgres.md).
	Store  string `toml:"store"`
	Listen string `toml:"listen"`
	// ProxyListen is the port proxy's address ("" turns it off);
	// ProxyDomain the domain of its host names.
	ProxyListen string `toml:"proxy_listen"`
	ProxyDomain string `toml:"proxy_domain"`
	// ProxyTCPPorts lists the sandbox ports the proxy forwards plain TCP
	// to (HTTP CONNECT), e.g. "5432,6379,8000-8099"; empty: none.
	ProxyTCPPorts string `toml:"proxy_tcp_ports"`
	// ProxyTLSCert and ProxyTLSKey, PEM files of a (wildcard) certificate
	// for *.ProxyDomain, make the proxy serve HTTPS (E2B's SDKs use https
	// in their E2B_DOMAIN form); empty: plain HTTP.
	ProxyTLSCert string `toml:"proxy_tls_cert"`
	ProxyTLSKey  string `toml:"proxy_tls_key"`
	// E2BTemplates maps the template names E2B programs ask for to torpor
	// templates (docs/e2b.md).
	E2BTemplates string `toml:"e2b_templates"`
	// NetworkBridge is the host bridge of the sandbox network ("" turns
	// it off: sandboxes get only a loopback); NetworkCIDR its IPv4 range.
	NetworkBridge string `toml:"network_bridge"`
	NetworkCIDR   string `toml:"network_cidr"`
	// NetworkDNS lists the nameservers of the sandboxes allowed the
	// internet; empty: the host's (network.ChooseDNS).
	NetworkDNS stringList `toml:"network_dns"`
	// NetworkDNSUpstream lists the resolvers ("host" or "host:port")
	// that torpor's resolver for sandboxes with host name egress rules
	// forwards to; empty: network_dns, else the host's nameservers
	// (docs/egress.md).
	NetworkDNSUpstream stringList `toml:"network_dns_upstream"`
	Runtime            string     `toml:"runtime"`
	RuncPath           string     `toml:"runc_path"`
	LogLevel           string     `toml:"log_level"`
	// Limits on each sandbox, and the defaults a request leaves out.
	DefaultVCPUs     float64 `toml:"default_vcpus"`
	DefaultMemoryMiB int64   `toml:"default_memory_mib"`
	DefaultPids      int64   `toml:"default_pids"`
	DefaultDiskMiB   int64   `toml:"default_disk_mib"`
	MaxVCPUs         float64 `toml:"max_vcpus"`
	MaxMemoryMiB     int64   `toml:"max_memory_mib"`
	MaxPids          int64   `toml:"max_pids"`
	MaxDiskMiB       int64   `toml:"max_disk_mib"`
	// Capacity of the node (0: from the machine) and the idle engine.
	CapacityVCPUs               float64 `toml:"capacity_vcpus"`
	CapacityMemoryMiB           int64   `toml:"capacity_memory_mib"`
	PausedResourceReleaseRatio  float64 `toml:"paused_resource_release_ratio"`
	MaxPausedSeconds            int64   `toml:"max_paused_seconds"`
	DefaultPauseAfterIdle       int64   `toml:"default_pause_after_idle_seconds"`
	DefaultHibernateAfterPaused int64   `toml:"default_hibernate_after_paused_seconds"`
	DefaultConnectionIdle       int64   `toml:"default_connection_idle_seconds"`
	// DefaultArchiveAfterHibernated is archive_after_hibernated_seconds of
	// a sandbox that sets none (docs/archive.md).
	DefaultArchiveAfterHibernated int64   `toml:"default_archive_after_hibernated_seconds"`
	CPUActivityThreshold          float64 `toml:"cpu_activity_threshold"`
	// MaxUploadMiB bounds one file or tar upload through the API (0: none).
	MaxUploadMiB int64 `toml:"max_upload_mib"`
	// The request rate of each tenant key on the native and E2B APIs
	// (docs/limits.md): sustained per second (0: no limit) and burst.
	RateLimitPerSecond float64 `toml:"rate_limit_per_second"`
	RateLimitBurst     int64   `toml:"rate_limit_burst"`
	// WebhookAllowCIDRs lists the ranges webhooks may reach although
	// they are the host's own networks (loopback, private, ...), which
	// are refused otherwise (docs/webhooks.md).
	WebhookAllowCIDRs stringList `toml:"webhook_allow_cidrs"`
	// The pricing table of the usage ledger (docs/billing.md) and how
	// often open intervals are settled into it.
	PricingCurrency         string  `toml:"pricing_currency"`
	PricingVCPUSecond       float64 `toml:"pricing_vcpu_second"`
	PricingMemoryGiBSecond  float64 `toml:"pricing_memory_gib_second"`
	PricingDiskGiBMonth     float64 `toml:"pricing_disk_gib_month"`
	PricingSnapshotGiBMonth float64 `toml:"pricing_snapshot_gib_month"`
	PricingArchiveGiBMonth  float64 `toml:"pricing_archive_gib_month"`
	SettleSeconds           int64   `toml:"settle_seconds"`
	// GPUSim runs GPU sandboxes on a simulated GPU host (docs/gpu.md),
	// with a hard cap when GPUSimHardCap.
	GPUSim        bool `toml:"gpu_sim"`
	GPUSimHardCap bool `toml:"gpu_sim_hard_cap"`
	// The microVM runtime (docs/vm.md): acceleration (auto, kvm, tcg, or
	// off to run no VMs), the guest agent and kernel, lazy memory.
	VMAccel      string `toml:"vm_accel"`
	VMAgent      string `toml:"vm_agent"`
	VMKernelDir  string `toml:"vm_kernel_dir"`
	VMLazyMemory bool   `toml:"vm_lazy_memory"`
	// UI serves the web dashboard at /ui/ on the API's address, with its
	// session routes and cookie authentication (docs/dashboard.md).
	UI bool `toml:"ui"`
	// WarmPools are the warm pools a start begins with (docs/pools.md), as
	// TEMPLATE=N or TEMPLATE=N:internet: a TOML array of them (or one
	// comma-separated string), TORPOR_WARM_POOLS (comma-separated), or
	// --warm-pool, once per template; each layer over the one before for
	// the templates it names. A pool set at run time (PUT
	// /v1/pools/{template}) is stored and wins over these.
	WarmPools stringList `toml:"warm_pools"`
	// The fleet (docs/fleet.md): this node's name (default: the host's
	// name), the addresses other nodes forward its sandboxes' requests
	// to (default: listen and proxy_listen, which must then not be a
	// wildcard), its labels (key=value, comma-separated or repeated
	// --node-label), the file holding the secret that authenticates
	// node-to-node requests, how long a node may miss heartbeats before
	// it is declared down, the object store that keeps hibernated disks
	// and how long a sandbox stays hibernated before its disk goes there.
	NodeName           string     `toml:"node_name"`
	NodeAddress        string     `toml:"node_address"`
	NodeProxyAddress   string     `toml:"node_proxy_address"`
	NodeLabels         stringList `toml:"node_labels"`
	FleetSecretFile    string     `toml:"fleet_secret_file"`
	NodeDownSeconds    int64      `toml:"node_down_seconds"`
	ObjectStore        string     `toml:"object_store"`
	UploadAfterSeconds int64      `toml:"upload_after_seconds"`
}

// nodeLabelFlag is the repeatable flag of NodeLabels.
const nodeLabelFlag = "node-label"

// warmPoolFlag is the repeatable flag of WarmPools.
const warmPoolFlag = "warm-pool"

// addWarmPools appends TEMPLATE=N specs to c.WarmPools; a later one wins.
func (c *Config) addWarmPools(specs ...string) {
	for _, spec := range specs {
		if c.WarmPools != "" {
			c.WarmPools += ","
		}
		c.WarmPools += stringList(spec)
	}
}

// warmPools parses WarmPools: one config a template, the last spec of it.
func (c Config) warmPools() ([]torpor.PoolConfig, error) {
	var out []torpor.PoolConfig
	at := map[string]int{}
	for _, spec := range c.WarmPools.fields() {
		p, err := torpor.ParsePoolSpec(spec)
		if err != nil {
			return nil, fmt.Errorf("warm_pools (the file's warm_pools, TORPOR_WARM_POOLS or --warm-pool): %w", err)
		}
		if i, ok := at[p.Template]; ok {
			out[i] = p
			continue
		}
		at[p.Template] = len(out)
		out = append(out, p)
	}
	return out, nil
}

// setting describes one Config field for the file, env and flag layers.
type setting struct {
	key   string // TOML key and flag name (with '-' for '_')
	usage string
	ptr   any
}

func (c *Config) settings() []setting {
	return []setting{
		{"data_dir", "directory for the database, templates, sandboxes and the admin key", &c.DataDir},
		{"store", "where state is kept: empty for DATA_DIR/torpor.db (SQLite), or a postgres://USER@HOST/DB URL (docs/postgres.md)", &c.Store},
		{"listen", "address of the HTTP API", &c.Listen},
		{"proxy_listen", "address of the port proxy, which routes <port>-<id>.<proxy_domain> to a sandbox (empty: off)", &c.ProxyListen},
		{"proxy_domain", "domain of the proxy's host names", &c.ProxyDomain},
		{"proxy_tcp_ports", "sandbox ports the proxy forwards plain TCP to through HTTP CONNECT, e.g. 5432,8000-8099 (empty: none)", &c.ProxyTCPPorts},
		{"proxy_tls_cert", "PEM certificate (e.g. a wildcard for *.proxy_domain) with which the proxy serves HTTPS instead of HTTP", &c.ProxyTLSCert},
		{"proxy_tls_key", "PEM private key of proxy_tls_cert", &c.ProxyTLSKey},
		{"e2b_templates", "torpor templates that E2B programs' template names stand for, as name=template pairs", &c.E2BTemplates},
		{"network_bridge", "host bridge of the sandbox network, made when missing (empty: sandboxes get only a loopback)", &c.NetworkBridge},
		{"network_cidr", "IPv4 range of sandbox addresses; the bridge gets the first one", &c.NetworkCIDR},
		{"network_dns", "nameservers (IPv4, comma-separated, at most 3) written to /etc/resolv.conf of sandboxes allowed the internet (empty: the host's)", (*string)(&c.NetworkDNS)},
		{"network_dns_upstream", "resolvers (host or host:port, comma-separated) that torpor's resolver for sandboxes with host name egress rules forwards to (empty: network_dns, else the host's)", (*string)(&c.NetworkDNSUpstream)},
		{"runtime", "default sandbox runtime", &c.Runtime},
		{"runc_path", "path of the runc binary (default: found in PATH)", &c.RuncPath},
		{"log_level", "debug, info, warn or error", &c.LogLevel},
		{"default_vcpus", "vCPUs of a sandbox that asks for none", &c.DefaultVCPUs},
		{"default_memory_mib", "memory of a sandbox that asks for none", &c.DefaultMemoryMiB},
		{"default_pids", "process limit of a sandbox that asks for none", &c.DefaultPids},
		{"default_disk_mib", "disk of a sandbox that asks for none", &c.DefaultDiskMiB},
		{"max_vcpus", "most vCPUs one sandbox may have", &c.MaxVCPUs},
		{"max_memory_mib", "most memory one sandbox may have", &c.MaxMemoryMiB},
		{"max_pids", "most processes one sandbox may have", &c.MaxPids},
		{"max_disk_mib", "most disk one sandbox may have", &c.MaxDiskMiB},
		{"capacity_vcpus", "vCPUs the node lends to running and paused sandboxes (0: 4 per core of the machine)", &c.CapacityVCPUs},
		{"capacity_memory_mib", "memory the node lends to running and paused sandboxes (0: the machine's memory)", &c.CapacityMemoryMiB},
		{"paused_resource_release_ratio", "fraction (0..1) of a paused sandbox's resources given back to the node", &c.PausedResourceReleaseRatio},
		{"max_paused_seconds", "hibernate a sandbox paused this long, on the platform's terms (0: never)", &c.MaxPausedSeconds},
		{"default_pause_after_idle_seconds", "pause_after_idle_seconds of a sandbox that sets no idle policy (0: off)", &c.DefaultPauseAfterIdle},
		{"default_hibernate_after_paused_seconds", "hibernate_after_paused_seconds of a sandbox that sets none (0: off)", &c.DefaultHibernateAfterPaused},
		{"default_connection_idle_seconds", "connection_idle_seconds of a sandbox that sets none (0: off)", &c.DefaultConnectionIdle},
		{"default_archive_after_hibernated_seconds", "archive_after_hibernated_seconds of a sandbox that sets none: archive a sandbox hibernated this long (0: off)", &c.DefaultArchiveAfterHibernated},
		{"cpu_activity_threshold", "count a sandbox using at least this many CPUs on average as active (e.g. 0.1; 0: off)", &c.CPUActivityThreshold},
		{"max_upload_mib", "largest file or tar archive one upload may send, in MiB (0: no limit)", &c.MaxUploadMiB},
		{"rate_limit_per_second", "requests a second each tenant key may send, sustained, to the native and E2B APIs; admin keys are exempt (0: no limit)", &c.RateLimitPerSecond},
		{"rate_limit_burst", "requests a tenant key that was quiet may send at once, above rate_limit_per_second", &c.RateLimitBurst},
		{"webhook_allow_cidrs", "address ranges (CIDR, comma-separated) webhooks may reach although loopback, private, link-local or otherwise the host's own (empty: none)", (*string)(&c.WebhookAllowCIDRs)},
		{"pricing_currency", "currency of the usage ledger's costs", &c.PricingCurrency},
		{"pricing_vcpu_second", "price of one vCPU for a second (charged while running)", &c.PricingVCPUSecond},
		{"pricing_memory_gib_second", "price of one GiB of memory for a second (running or frozen)", &c.PricingMemoryGiBSecond},
		{"pricing_disk_gib_month", "price of one GiB of disk for 30 days (in every state but terminated)", &c.PricingDiskGiBMonth},
		{"pricing_snapshot_gib_month", "price of one GiB of memory snapshot for 30 days (snapshot-paused)", &c.PricingSnapshotGiBMonth},
		{"pricing_archive_gib_month", "price of one GiB of archive (compressed) for 30 days (archived)", &c.PricingArchiveGiBMonth},
		{"settle_seconds", "how often open usage intervals are written to the ledger; must divide a day", &c.SettleSeconds},
		{"gpu_sim", "run GPU sandboxes (accel) on a simulated GPU host, for demos and tests", &c.GPUSim},
		{"gpu_sim_hard_cap", "the simulated GPU host enforces a per-lease VRAM cap", &c.GPUSimHardCap},
		{"vm_accel", "microVM acceleration: auto (KVM when it can boot the guest, else TCG), kvm, tcg, or off (no VMs)", &c.VMAccel},
		{"vm_agent", "the microVM guest agent (default: where scripts/install.sh puts it)", &c.VMAgent},
		{"vm_kernel_dir", "the microVM guest kernel directory (default: where scripts/install.sh puts it)", &c.VMKernelDir},
		{"vm_lazy_memory", "back VM memory with a file, so a snapshot pause writes only device state", &c.VMLazyMemory},
		{"ui", "serve the web dashboard at /ui/ on the API's address (--no-ui or ui = false: off)", &c.UI},
		{"node_name", "this node's name in a fleet (default: the host name; docs/fleet.md)", &c.NodeName},
		{"node_address", "host:port where other nodes reach this node's API (default: listen, when not a wildcard)", &c.NodeAddress},
		{"node_proxy_address", "host:port where other nodes reach this node's port proxy (default: proxy_listen, when not a wildcard)", &c.NodeProxyAddress},
		{"fleet_secret_file", "file holding the secret (at least 32 bytes) that authenticates node-to-node requests in a fleet", &c.FleetSecretFile},
		{"node_down_seconds", "declare a node down after this many seconds without a heartbeat", &c.NodeDownSeconds},
		{"object_store", "where hibernated disks are kept for any node to start them: s3://BUCKET[/PREFIX]?endpoint=URL or file:///DIR (empty: only on their node)", &c.ObjectStore},
		{"upload_after_seconds", "upload a hibernated sandbox's disk to the object store after it has been hibernated this long (0: at once)", &c.UploadAfterSeconds},
	}
}

// DefaultDataDir is /var/lib/torpor for root, else under the user's data
// directory.
func DefaultDataDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/torpor"
	}
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "torpor")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "share", "torpor")
	}
	return filepath.Join(os.TempDir(), "torpor")
}

// DefaultListen is the API's default address.
const DefaultListen = "127.0.0.1:7070"

// DefaultConfig returns the embedded defaults.
func DefaultConfig() Config {
	return Config{
		DataDir:          DefaultDataDir(),
		Listen:           DefaultListen,
		ProxyListen:      "127.0.0.1:7071",
		ProxyDomain:      "localhost",
		NetworkBridge:    network.DefaultBridge,
		NetworkCIDR:      network.DefaultPrefix.String(),
		Runtime:          "runc",
		LogLevel:         "info",
		DefaultVCPUs:     1,
		DefaultMemoryMiB: 512,
		DefaultPids:      1024,
		DefaultDiskMiB:   2048,
		MaxVCPUs:         64,
		MaxMemoryMiB:     256 * 1024,
		MaxPids:          1 << 20,
		MaxDiskMiB:       4 << 20,
		MaxPausedSeconds: 8 * 3600,
		// connection_idle_seconds as in spec 003's example.
		DefaultConnectionIdle: 300,
		RateLimitPerSecond:    ratelimit.DefaultPerSecond,
		RateLimitBurst:        ratelimit.DefaultBurst,

		PricingCurrency:         torpor.DefaultPricing.Currency,
		PricingVCPUSecond:       torpor.DefaultPricing.VCPUSecond,
		PricingMemoryGiBSecond:  torpor.DefaultPricing.MemoryGiBSecond,
		PricingDiskGiBMonth:     torpor.DefaultPricing.DiskGiBMonth,
		PricingSnapshotGiBMonth: torpor.DefaultPricing.SnapshotGiBMonth,
		PricingArchiveGiBMonth:  torpor.DefaultPricing.ArchiveGiBMonth,
		SettleSeconds:           3600,
		VMAccel:                 "auto",
		E2BTemplates:            e2btemplates.DefaultAliases,
		UI:                      true,
		NodeDownSeconds:         10,
	}
}

// AddFlags registers a flag per setting, plus --config.
func AddFlags(fs *pflag.FlagSet) {
	def := DefaultConfig()
	fs.String("config", "", "TOML config file (default: $TORPOR_CONFIG, else DATA_DIR/torpor.toml when it exists)")
	fs.Bool(noUIFlag, false, "turn the web dashboard off (the same as --ui=false)")
	fs.StringArray(nodeLabelFlag, nil, "a label of this node, as KEY=VALUE, that creates may ask for with node_labels; repeat for more (docs/fleet.md)")
	fs.StringArray(warmPoolFlag, nil, "keep N sandboxes of TEMPLATE booted and frozen for fast creates, as TEMPLATE=N (TEMPLATE=N:internet: with the internet); repeat for more templates (docs/pools.md)")
	for _, s := range def.settings() {
		name := strings.ReplaceAll(s.key, "_", "-")
		switch p := s.ptr.(type) {
		case *string:
			fs.String(name, *p, s.usage)
		case *int64:
			fs.Int64(name, *p, s.usage)
		case *float64:
			fs.Float64(name, *p, s.usage)
		case *bool:
			fs.Bool(name, *p, s.usage)
		}
	}
}

// EnvName is the environment variable of a setting.
func EnvName(key string) string { return "TORPOR_" + strings.ToUpper(key) }

// LoadConfig layers defaults, the config file, the environment and the
// flags that were set.
func LoadConfig(fs *pflag.FlagSet, getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	// The data dir decides where the default config file is, so settle it
	// from env and flags first.
	if v := getenv(EnvName("data_dir")); v != "" {
		c.DataDir = v
	}
	if f := fs.Lookup("data-dir"); f != nil && f.Changed {
		c.DataDir = f.Value.String()
	}
	path := getenv("TORPOR_CONFIG")
	if f := fs.Lookup("config"); f != nil && f.Changed {
		path = f.Value.String()
	}
	explicit := path != ""
	if !explicit {
		path = filepath.Join(c.DataDir, "torpor.toml")
	}
	md, err := toml.DecodeFile(path, &c)
	switch {
	case err == nil:
		if und := md.Undecoded(); len(und) > 0 {
			return Config{}, fmt.Errorf("config %s: unknown setting %q", path, und[0].String())
		}
	case errors.Is(err, os.ErrNotExist) && !explicit:
	default:
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	for _, s := range c.settings() {
		if v := getenv(EnvName(s.key)); v != "" {
			if err := set(s.ptr, v); err != nil {
				return Config{}, fmt.Errorf("%s: %w", EnvName(s.key), err)
			}
		}
		if f := fs.Lookup(strings.ReplaceAll(s.key, "_", "-")); f != nil && f.Changed {
			if err := set(s.ptr, f.Value.String()); err != nil {
				return Config{}, fmt.Errorf("--%s: %w", f.Name, err)
			}
		}
	}
	if f := fs.Lookup(noUIFlag); f != nil && f.Changed && f.Value.String() == "true" {
		c.UI = false
	}
	if v := getenv(EnvName("warm_pools")); v != "" {
		c.addWarmPools(v)
	}
	if specs, err := fs.GetStringArray(warmPoolFlag); err == nil {
		c.addWarmPools(specs...)
	}
	if labels, err := fs.GetStringArray(nodeLabelFlag); err == nil && len(labels) > 0 {
		c.NodeLabels = stringList(strings.Join(append(c.NodeLabels.fields(), labels...), ","))
	}
	return c, c.validate()
}

// noUIFlag turns the dashboard off, as --ui=false does, in the words a
// reader looks for.
const noUIFlag = "no-ui"

func set(ptr any, v string) error {
	switch p := ptr.(type) {
	case *string:
		*p = v
	case *int64:
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("%q is not an integer", v)
		}
		*p = n
	case *float64:
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return fmt.Errorf("%q is not a number", v)
		}
		*p = n
	case *bool:
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("%q is not true or false", v)
		}
		*p = b
	}
	return nil
}

func (c Config) validate() error {
	if c.DataDir == "" || !filepath.IsAbs(c.DataDir) {
		return fmt.Errorf("data_dir must be an absolute path, got %q", c.DataDir)
	}
	if err := checkStore(c.Store); err != nil {
		return err
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("log_level must be debug, info, warn or error, got %q", c.LogLevel)
	}
	if c.PausedResourceReleaseRatio < 0 || c.PausedResourceReleaseRatio > 1 {
		return fmt.Errorf("paused_resource_release_ratio must be between 0 and 1, got %v", c.PausedResourceReleaseRatio)
	}
	for _, v := range []struct {
		name string
		n    int64
	}{{"max_paused_seconds", c.MaxPausedSeconds}, {"default_pause_after_idle_seconds", c.DefaultPauseAfterIdle},
		{"default_hibernate_after_paused_seconds", c.DefaultHibernateAfterPaused}, {"default_connection_idle_seconds", c.DefaultConnectionIdle},
		{"default_archive_after_hibernated_seconds", c.DefaultArchiveAfterHibernated}} {
		if v.n < 0 || v.n > torpor.MaxPolicySeconds {
			return fmt.Errorf("%s must be between 0 (off) and %d, got %d", v.name, torpor.MaxPolicySeconds, v.n)
		}
	}
	if c.NetworkBridge != "" {
		if _, err := c.networkPrefix(); err != nil {
			return err
		}
	}
	if _, err := c.nameservers(); err != nil {
		return err
	}
	if _, err := c.dnsUpstreams(); err != nil {
		return err
	}
	if _, err := c.webhookAllow(); err != nil {
		return err
	}
	if _, err := proxy.ParsePorts(c.ProxyTCPPorts); err != nil {
		return fmt.Errorf("proxy_tcp_ports: %w", err)
	}
	if _, err := e2btemplates.ParseAliases(c.E2BTemplates); err != nil {
		return fmt.Errorf("e2b_templates: %w", err)
	}
	if (c.ProxyTLSCert == "") != (c.ProxyTLSKey == "") {
		return errors.New("proxy_tls_cert and proxy_tls_key go together")
	}
	if c.MaxUploadMiB < 0 || c.MaxUploadMiB > 1<<30 {
		return fmt.Errorf("max_upload_mib must be between 0 (no limit) and %d, got %d", 1<<30, c.MaxUploadMiB)
	}
	if math.IsNaN(c.RateLimitPerSecond) || c.RateLimitPerSecond < 0 || c.RateLimitPerSecond > 1e6 {
		return fmt.Errorf("rate_limit_per_second must be between 0 (no limit) and 1000000, got %v", c.RateLimitPerSecond)
	}
	if c.RateLimitBurst < 1 || c.RateLimitBurst > 1e6 {
		return fmt.Errorf("rate_limit_burst must be between 1 and 1000000, got %d", c.RateLimitBurst)
	}
	if c.CPUActivityThreshold < 0 || c.CPUActivityThreshold > 1024 {
		return fmt.Errorf("cpu_activity_threshold must be between 0 (off) and 1024 CPUs, got %v", c.CPUActivityThreshold)
	}
	if err := c.pricing().Validate(); err != nil {
		return err
	}
	switch c.VMAccel {
	case "auto", "kvm", "tcg", "off":
	default:
		return fmt.Errorf("vm_accel must be auto, kvm, tcg or off, got %q", c.VMAccel)
	}
	if _, err := c.warmPools(); err != nil {
		return err
	}
	if err := c.validateFleet(); err != nil {
		return err
	}
	if c.SettleSeconds < 1 || 86400%c.SettleSeconds != 0 {
		return fmt.Errorf("settle_seconds must divide a day (86400), e.g. 60, 900 or 3600; got %d", c.SettleSeconds)
	}
	if c.CapacityVCPUs < 0 || c.CapacityMemoryMiB < 0 {
		return errors.New("capacity_vcpus and capacity_memory_mib must not be negative")
	}
	if c.DefaultVCPUs <= 0 || c.DefaultVCPUs > c.MaxVCPUs || c.DefaultMemoryMiB <= 0 || c.DefaultMemoryMiB > c.MaxMemoryMiB ||
		c.DefaultPids <= 0 || c.DefaultPids > c.MaxPids || c.DefaultDiskMiB <= 0 || c.DefaultDiskMiB > c.MaxDiskMiB {
		return errors.New("each default_* resource must be positive and at most its max_*")
	}
	return nil
}

// pricing is the ledger's pricing table.
func (c Config) pricing() torpor.Pricing {
	return torpor.Pricing{Currency: c.PricingCurrency, VCPUSecond: c.PricingVCPUSecond, MemoryGiBSecond: c.PricingMemoryGiBSecond,
		DiskGiBMonth: c.PricingDiskGiBMonth, SnapshotGiBMonth: c.PricingSnapshotGiBMonth,
		ArchiveGiBMonth: c.PricingArchiveGiBMonth}
}

// networkPrefix parses network_cidr: an IPv4 range from /8 to /29.
func (c Config) networkPrefix() (netip.Prefix, error) {
	p, err := netip.ParsePrefix(c.NetworkCIDR)
	if err != nil || !p.Addr().Is4() || p.Bits() < 8 || p.Bits() > 29 {
		return netip.Prefix{}, fmt.Errorf("network_cidr must be an IPv4 range from /8 to /29 such as %s, got %q", network.DefaultPrefix, c.NetworkCIDR)
	}
	return p.Masked(), nil
}

// nameservers parses network_dns: at most network.MaxNameservers
// addresses a sandbox can reach, separated by commas or spaces.
func (c Config) nameservers() ([]netip.Addr, error) {
	fields := c.NetworkDNS.fields()
	if len(fields) > network.MaxNameservers {
		return nil, fmt.Errorf("network_dns lists %d nameservers; a resolver uses at most %d", len(fields), network.MaxNameservers)
	}
	var out []netip.Addr
	for _, f := range fields {
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("network_dns: %q is not an IP address", f)
		}
		if err := network.CheckNameserver(a); err != nil {
			return nil, fmt.Errorf("network_dns: %w", err)
		}
		out = append(out, a.Unmap())
	}
	return out, nil
}

// dnsUpstreams parses network_dns_upstream: host or host:port entries
// (port 53 by default), separated by commas or spaces.
func (c Config) dnsUpstreams() ([]string, error) {
	var out []string
	for _, f := range c.NetworkDNSUpstream.fields() {
		if a, err := netip.ParseAddr(f); err == nil {
			out = append(out, netip.AddrPortFrom(a.Unmap(), network.DNSPort).String())
			continue
		}
		ap, err := netip.ParseAddrPort(f)
		if err != nil || ap.Port() == 0 {
			return nil, fmt.Errorf("network_dns_upstream: %q is not an IP address or address:port", f)
		}
		out = append(out, ap.String())
	}
	return out, nil
}

// webhookAllow parses webhook_allow_cidrs: CIDR ranges separated by
// commas or spaces.
func (c Config) webhookAllow() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range c.WebhookAllowCIDRs.fields() {
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("webhook_allow_cidrs: %q is not a CIDR range such as 10.1.0.0/16 or fd00:1::/64", f)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// stringList is a setting that lists values: a TOML array of strings, or
// one string of values separated by commas (as in the environment and
// flags).
type stringList string

// fields returns the values, separated by commas or spaces.
func (l stringList) fields() []string {
	return strings.FieldsFunc(string(l), func(r rune) bool { return r == ',' || unicode.IsSpace(r) })
}

// UnmarshalTOML takes a string or an array of strings.
func (l *stringList) UnmarshalTOML(v any) error {
	switch v := v.(type) {
	case string:
		*l = stringList(v)
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			s, ok := e.(string)
			if !ok {
				return fmt.Errorf("want a list of strings, got %T in it", e)
			}
			parts[i] = s
		}
		*l = stringList(strings.Join(parts, ","))
	default:
		return fmt.Errorf("want a list of strings, got %T", v)
	}
	return nil
}
