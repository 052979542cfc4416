package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/api/ratelimit"
	"github.com/torpor-dev/torpor/e2b"
	"github.com/torpor-dev/torpor/e2b/envd"
	"github.com/torpor-dev/torpor/e2b/interp"
	e2btemplates "github.com/torpor-dev/torpor/e2b/templates"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/metrics"
	"github.com/torpor-dev/torpor/network"
	"github.com/torpor-dev/torpor/proxy"
	"github.com/torpor-dev/torpor/rootfs"
	"github.com/torpor-dev/torpor/runtime/runc"
	"github.com/torpor-dev/torpor/template"
	"github.com/torpor-dev/torpor/ui"
	"github.com/torpor-dev/torpor/webhook"
)

// AdminKeyFile is the name, under the data dir, of the file holding the
// admin API key (mode 0600).
const AdminKeyFile = "admin.key"

// BaseTemplate is the built-in template every server has.
const BaseTemplate = "base"

// FailpointEnv names a transition point ("pausing.after-runtime", ...) at
// which the daemon kills itself with SIGKILL. Crash tests use it; it is not
// a setting for production.
const FailpointEnv = "TORPOR_TEST_FAILPOINT"

// Options are what Run needs besides the configuration.
type Options struct {
	// Stdout receives what is printed once (the new admin key).
	Stdout io.Writer
	// Logger logs; nil logs text to stderr at the configured level.
	Logger *slog.Logger
	// Getenv reads the environment (os.Getenv when nil).
	Getenv func(string) string
	// OnListen, when set, is called with the API's address once it listens.
	OnListen func(addr string)
}

// Run serves until ctx ends. Sandboxes keep running after it returns; the
// next Run adopts them. What the daemon made on the host and no sandbox
// uses any more goes when it returns (releaseHost).
func Run(ctx context.Context, cfg Config, opt Options) error {
	if opt.Stdout == nil {
		opt.Stdout = os.Stdout
	}
	if opt.Getenv == nil {
		opt.Getenv = os.Getenv
	}
	log := opt.Logger
	if log == nil {
		log = NewLogger(os.Stderr, cfg.LogLevel)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	nodeName, err := stickyNodeName(cfg, log)
	if err != nil {
		return err
	}
	st, storeAt, err := openStore(ctx, cfg, nodeName, log)
	if err != nil {
		return err
	}
	defer st.Close()
	objects, err := openObjects(ctx, cfg)
	if err != nil {
		return err
	}
	archives, err := openArchives(ctx, cfg, objects)
	if err != nil {
		return err
	}
	secret, err := cfg.fleetSecret()
	if err != nil {
		return err
	}

	sandboxNet, err := newNetwork(ctx, cfg, log)
	if err != nil {
		return err
	}
	resolvConf := sandboxResolvConf(cfg, sandboxNet, log)
	rt, err := newRuntime(ctx, cfg, sandboxNet, resolvConf, log)
	if err != nil {
		return err
	}
	if err := ensureBaseTemplate(ctx, st, cfg.DataDir); err != nil {
		return err
	}
	tmpls, err := template.New(ctx, template.Config{Store: st, Dir: cfg.DataDir, Logger: log})
	if err != nil {
		return err
	}
	if err := ensureAdminKey(ctx, st, cfg.DataDir, opt.Stdout); err != nil {
		return err
	}
	runtimes := []torpor.Runtime{rt}
	if vrt := newVMRuntime(ctx, cfg, sandboxNet, resolvConf, log); vrt != nil {
		runtimes = append(runtimes, vrt)
	}
	// Deferred before the engine's Close, so it runs after it: no boot is
	// under way when the host's leftovers go.
	defer releaseHost(runtimes, sandboxNet, log)
	gpuLeases, gpuAttach, err := newGPU(cfg, st, opt.Getenv, log)
	if err != nil {
		return err
	}
	// The engine reports to the metrics (its Observer), whose gauges then
	// read the engine.
	mets := metrics.New()
	warmPools, err := cfg.warmPools()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	// The proxy listens first: E2B's API names its address.
	var pln net.Listener
	var proxyAddr string
	if cfg.ProxyListen != "" {
		if pln, err = net.Listen("tcp", cfg.ProxyListen); err != nil {
			ln.Close()
			return fmt.Errorf("proxy listen: %w", err)
		}
		proxyAddr = pln.Addr().String()
	}
	fl, fleetCfg, err := newFleet(cfg, nodeName, secret, st, objects, ln.Addr().String(), proxyAddr, log)
	if err != nil {
		ln.Close()
		return err
	}
	eng, err := lifecycle.New(lifecycle.Config{
		Fleet:          fleetCfg,
		Observer:       mets,
		Store:          st,
		Runtimes:       runtimes,
		DefaultRuntime: cfg.Runtime,
		Logger:         log,
		Limits:         cfg.limits(),
		Capacity:       cfg.capacity(),
		MaxPaused:      time.Duration(cfg.MaxPausedSeconds) * time.Second,
		DefaultPolicy:  cfg.defaultPolicy(),
		CPUActivity:    cfg.CPUActivityThreshold,
		Pricing:        cfg.pricing(),
		SettleEvery:    time.Duration(cfg.SettleSeconds) * time.Second,
		GPU:            gpuLeases,
		GPUAttach:      gpuAttach,
		Failpoint:      failpoint(opt.Getenv(FailpointEnv), log),
		WarmPools:      warmPools,
		DataDiskFull:   func() bool { return diskFull(cfg.DataDir) },
		Archives:       archives,
	})
	if err != nil {
		return err
	}
	defer eng.Close()
	mets.AddSource(eng)

	// Webhooks never reach the host's own networks, unless allowed, nor
	// these listeners: hence made once they listen.
	self := []net.Addr{ln.Addr()}
	if pln != nil {
		self = append(self, pln.Addr())
	}
	allow, _ := cfg.webhookAllow() // checked by LoadConfig
	guard := webhook.NewGuard(webhook.GuardConfig{Allow: allow, Self: self})
	deliveries := webhook.New(webhook.Config{Store: st, Changed: eng.EventsChanged, Logger: log, Guard: guard})
	// One limiter for both APIs: a key's rate is one rate.
	limiter := ratelimit.New(ratelimit.Config{PerSecond: cfg.RateLimitPerSecond, Burst: int(cfg.RateLimitBurst)})
	apiCfg := api.Config{Engine: eng, Fleet: fl, Auth: st, Templates: st, TemplateManager: tmpls, Logger: log, MaxUploadBytes: cfg.MaxUploadMiB << 20, Webhooks: st,
		Metrics: mets.Handler(), Requests: mets, WebhookGuard: guard, RateLimit: limiter, WebhookDeliveries: deliveries,
		WebhooksChanged: func() {
			if err := deliveries.Refresh(ctx); err != nil {
				log.Error("refreshing webhooks", "err", err)
			}
		}}
	if cfg.UI {
		apiCfg.UI = ui.Handler()
		apiCfg.ProxyURL = proxyURL(cfg, proxyAddr)
	}
	srv := api.New(apiCfg)
	aliases, _ := e2btemplates.ParseAliases(cfg.E2BTemplates) // checked by LoadConfig
	// A create waits for a template being built up to just under the
	// SDKs' request timeout (60 s), then is told to retry.
	e2bTemplates := e2btemplates.New(e2btemplates.Config{Builder: tmpls, Store: st, Aliases: aliases, Logger: log, MaxWait: 50 * time.Second})
	volKey, err := volumeTokenKey(cfg.DataDir)
	if err != nil {
		return err
	}
	e2bAPI := e2b.New(e2b.Config{Engine: eng, Fleet: fl, Auth: st, TemplateStore: st, Logger: log, Templates: e2bTemplates, VolumeTokenKey: volKey,
		Domain: e2bDomain(cfg, proxyAddr), AllowInternetByDefault: sandboxNet != nil,
		DefaultResources: cfg.limits().Default, Ready: srv.Ready, RateLimit: limiter})
	hs := &http.Server{Handler: apiHandler(srv, e2bAPI), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	serveErr := make(chan error, 2)
	go func() { serveErr <- hs.Serve(ln) }()
	e2bServices := map[int]proxy.Service{
		envd.Port:   envd.New(envd.Config{Engine: eng, Logger: log, MaxUploadBytes: cfg.MaxUploadMiB << 20}),
		interp.Port: interp.New(interp.Config{Engine: eng, Logger: log}),
	}
	if pln != nil {
		if pln, err = proxyListener(cfg, pln); err != nil {
			_ = hs.Close()
			return err
		}
		tcpPorts, _ := proxy.ParsePorts(cfg.ProxyTCPPorts) // checked by LoadConfig
		prox := proxy.New(proxy.Config{Engine: eng, Fleet: fl, Domain: cfg.ProxyDomain, TCPPorts: tcpPorts, Logger: log, Observer: mets,
			Services: e2bServices})
		go func() { serveErr <- prox.Serve(pln) }()
		defer prox.Close()
		log.Info("proxy listening", "addr", proxyAddr, "domain", cfg.ProxyDomain, "tls", cfg.ProxyTLSCert != "")
	}
	log.Info("listening", "addr", ln.Addr().String(), "data_dir", cfg.DataDir, "store", storeAt, "runtime", rt.Kind())
	if cfg.UI {
		log.Info("dashboard", "url", "http://"+ln.Addr().String()+"/ui/")
	}
	printE2BEnv(opt.Stdout, cfg, ln.Addr().String(), proxyAddr)
	if opt.OnListen != nil {
		opt.OnListen(ln.Addr().String())
	}

	// Requests get 503 until every stored sandbox is reconciled.
	if err := eng.Recover(ctx); err != nil {
		_ = hs.Close()
		return err
	}
	// Webhooks are delivered by one node of a fleet at a time.
	webhooksDone := make(chan struct{})
	go func() {
		defer close(webhooksDone)
		runWebhooks(ctx, st, deliveries, log)
	}()
	defer func() { <-webhooksDone }()
	srv.SetReady()
	log.Info("ready")

	select {
	case <-ctx.Done():
	case err := <-serveErr:
		return err
	}
	log.Info("shutting down; sandboxes keep running")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return hs.Shutdown(sctx)
}

// newNetwork makes (or adopts) the host's sandbox network that both
// runtimes put their sandboxes on; nil when network_bridge is empty.
func newNetwork(ctx context.Context, cfg Config, log *slog.Logger) (*network.Network, error) {
	if cfg.NetworkBridge == "" {
		return nil, nil
	}
	prefix, err := cfg.networkPrefix()
	if err != nil {
		return nil, err
	}
	n, err := network.New(ctx, network.Config{Bridge: cfg.NetworkBridge, Prefix: prefix, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("%w (network_bridge = \"\" runs sandboxes with only a loopback)", err)
	}
	log.Info("sandbox network", "bridge", n.Bridge(), "range", n.Prefix().String(), "gateway", n.Gateway().String())
	ups, _ := cfg.dnsUpstreams() // checked by LoadConfig
	if len(ups) == 0 {
		servers, _ := cfg.nameservers()
		for _, a := range servers {
			ups = append(ups, netip.AddrPortFrom(a, network.DNSPort).String())
		}
	}
	if len(ups) == 0 {
		ups = network.HostUpstreams(network.HostResolvConfs...)
	}
	if err := n.StartResolver(ups); err != nil {
		// Sandboxes with host name rules then get no answers.
		log.Warn("no resolver for sandboxes with host name egress rules: their lookups will fail", "err", err)
	}
	return n, nil
}

// sandboxResolvConf returns the /etc/resolv.conf that sandboxes allowed
// the internet get at each boot: network_dns, else the host's
// nameservers that a sandbox can reach. It is "" (their own file stays)
// without a sandbox network, or when there are no such nameservers.
func sandboxResolvConf(cfg Config, n *network.Network, log *slog.Logger) string {
	if n == nil {
		return ""
	}
	servers, _ := cfg.nameservers() // checked by LoadConfig
	d := network.ChooseDNS(servers, network.HostResolvConfs...)
	if len(d.Nameservers) == 0 {
		log.Warn("no nameserver for sandboxes allowed the internet: the host's resolver files name none they can reach "+
			"(loopback, link-local and IPv6 addresses are skipped); set network_dns. Their /etc/resolv.conf stays as their template has it",
			"read", strings.Join(network.HostResolvConfs, ", "))
		return ""
	}
	from := d.Source
	if from == "" {
		from = "network_dns"
	}
	log.Info("sandbox DNS", "nameservers", fmt.Sprint(d.Nameservers), "from", from)
	return d.ResolvConf()
}

func newRuntime(ctx context.Context, cfg Config, n *network.Network, resolvConf string, log *slog.Logger) (torpor.Runtime, error) {
	if cfg.Runtime != "runc" {
		return nil, fmt.Errorf("runtime %q is not available (this build has: runc)", cfg.Runtime)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding the torpor binary for the sandbox init: %w", err)
	}
	rc := runc.Config{
		Dir:      filepath.Join(cfg.DataDir, "runc"),
		RuncPath: cfg.RuncPath,
		InitPath: self,
		Logger:   log,
	}
	if n != nil {
		rc.Network = n
		rc.ResolvConf = resolvConf
		rc.NamesResolvConf = n.ResolverConf()
	}
	return runc.New(rc)
}

func (c Config) limits() torpor.Limits {
	return torpor.Limits{
		Default: torpor.Resources{VCPUs: c.DefaultVCPUs, MemoryMiB: c.DefaultMemoryMiB, Pids: c.DefaultPids, DiskMiB: c.DefaultDiskMiB},
		Max:     torpor.Resources{VCPUs: c.MaxVCPUs, MemoryMiB: c.MaxMemoryMiB, Pids: c.MaxPids, DiskMiB: c.MaxDiskMiB},
	}
}

// vcpuOvercommit is how many sandbox vCPUs one core lends by default:
// sandboxes mostly wait, and frozen ones use none.
const vcpuOvercommit = 4

func (c Config) capacity() lifecycle.Capacity {
	cp := lifecycle.Capacity{VCPUs: c.CapacityVCPUs, MemoryMiB: c.CapacityMemoryMiB, PausedReleaseRatio: c.PausedResourceReleaseRatio}
	if cp.VCPUs == 0 {
		cp.VCPUs = float64(goruntime.NumCPU() * vcpuOvercommit)
	}
	if cp.MemoryMiB == 0 {
		cp.MemoryMiB = machineMemoryMiB()
	}
	return cp
}

// machineMemoryMiB reads MemTotal (0, unlimited, when it cannot).
func machineMemoryMiB() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb / 1024
		}
	}
	return 0
}

func (c Config) defaultPolicy() torpor.LifecyclePolicy {
	secs := func(n int64) torpor.OptSeconds {
		if n == 0 {
			return torpor.Off()
		}
		return torpor.Seconds(n)
	}
	return torpor.LifecyclePolicy{
		PauseAfterIdleSeconds:         secs(c.DefaultPauseAfterIdle),
		HibernateAfterPausedSeconds:   secs(c.DefaultHibernateAfterPaused),
		ConnectionIdleSeconds:         secs(c.DefaultConnectionIdle),
		ArchiveAfterHibernatedSeconds: secs(c.DefaultArchiveAfterHibernated),
	}
}

// ensureBaseTemplate builds the busybox rootfs of the base template once.
func ensureBaseTemplate(ctx context.Context, st torpor.TemplateStore, dataDir string) error {
	dir := filepath.Join(dataDir, "templates", BaseTemplate, "rootfs")
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		if err := rootfs.BuildBase(ctx, dir); err != nil {
			return fmt.Errorf("building the base template: %w", err)
		}
	} else if err != nil {
		return err
	}
	if t, err := st.GetTemplate(ctx, BaseTemplate); err == nil && t.RootFS == dir && t.Source.Kind == torpor.SourceBuiltin {
		return nil
	}
	return st.PutTemplate(ctx, torpor.Template{Name: BaseTemplate, RootFS: dir, Source: torpor.TemplateSource{Kind: torpor.SourceBuiltin}, CreatedAt: time.Now().UTC()})
}

// ensureAdminKey makes the default tenant and an admin key on first start,
// writes the key to DATA_DIR/admin.key (0600) and prints it once.
func ensureAdminKey(ctx context.Context, st torpor.AuthStore, dataDir string, out io.Writer) error {
	path := filepath.Join(dataDir, AdminKeyFile)
	if data, err := os.ReadFile(path); err == nil {
		if _, err := st.APIKeyByHash(ctx, torpor.HashKey(string(data))); err == nil {
			return nil
		}
	}
	const tenant = "default"
	now := time.Now().UTC()
	if err := st.CreateTenant(ctx, torpor.Tenant{Name: tenant, CreatedAt: now}); err != nil && !torpor.IsCode(err, torpor.EConflict) {
		return err
	}
	secret, k := torpor.NewAPIKey(tenant, true, now)
	if err := st.CreateAPIKey(ctx, k); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(secret+"\n"), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	fmt.Fprintf(out, "Created the admin API key (shown once; also in %s, readable by root only):\n%s\n", path, secret)
	return nil
}

// failpoint returns the crash-test hook for the point named in spec.
func failpoint(spec string, log *slog.Logger) func(string) {
	if spec == "" {
		return nil
	}
	log.Warn("test failpoint armed: the daemon will kill itself", "at", spec)
	return func(name string) {
		if name == spec {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
}

// NewLogger returns a text logger at a level name.
func NewLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(strings.ToUpper(level)))
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

// diskFull reports whether the file system of dir has no block left that
// the daemon may use: what a store write or a sandbox's sparse disk image
// growing there would need. An error (dir unreadable) is not "full": the
// writes themselves will say what is wrong.
func diskFull(dir string) bool {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return false
	}
	return st.Bavail == 0
}
