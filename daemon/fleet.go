package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/fleet"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/objstore"
	"github.com/torpor-dev/torpor/webhook"
)

// nodeNameRE is what a node name may be: it appears in URLs, logs and the
// store.
var nodeNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$`)

// validateFleet checks the fleet settings.
func (c Config) validateFleet() error {
	if c.NodeName != "" && !nodeNameRE.MatchString(c.NodeName) {
		return fmt.Errorf("node_name must be 1 to 63 lower-case letters, digits, '.' and '-', got %q", c.NodeName)
	}
	for _, a := range []struct{ key, v string }{{"node_address", c.NodeAddress}, {"node_proxy_address", c.NodeProxyAddress}} {
		if a.v == "" {
			continue
		}
		if host, port, err := net.SplitHostPort(a.v); err != nil || host == "" || port == "" {
			return fmt.Errorf("%s must be host:port, got %q", a.key, a.v)
		}
	}
	if _, err := c.nodeLabels(); err != nil {
		return err
	}
	if c.NodeDownSeconds < 2 || c.NodeDownSeconds > 3600 {
		return fmt.Errorf("node_down_seconds must be between 2 and 3600, got %d", c.NodeDownSeconds)
	}
	if c.UploadAfterSeconds < 0 {
		return fmt.Errorf("upload_after_seconds must not be negative, got %d", c.UploadAfterSeconds)
	}
	if c.ObjectStore != "" && !strings.HasPrefix(c.ObjectStore, "s3://") && !strings.HasPrefix(c.ObjectStore, "file:///") {
		return errors.New("object_store must be an s3://BUCKET[/PREFIX]?endpoint=URL or a file:///DIR URL")
	}
	return nil
}

// nodeLabels parses node_labels: KEY=VALUE pairs, by the rule of a
// create's node_labels.
func (c Config) nodeLabels() (map[string]string, error) {
	out := map[string]string{}
	for _, f := range c.NodeLabels.fields() {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("node_labels: %q is not KEY=VALUE", f)
		}
		out[k] = v
	}
	if err := torpor.ValidateNodeLabels("node_labels", out); err != nil {
		return nil, err
	}
	return out, nil
}

// nodeName is node_name, else the host's name made a valid node name.
func (c Config) nodeName() string {
	if c.NodeName != "" {
		return c.NodeName
	}
	h, _ := os.Hostname()
	h = strings.ToLower(h)
	h = regexp.MustCompile(`[^a-z0-9.-]+`).ReplaceAllString(h, "-")
	h = strings.Trim(h, ".-")
	if len(h) > 63 {
		h = strings.Trim(h[:63], ".-")
	}
	if h == "" {
		h = "node"
	}
	return h
}

// advertised is addr (a listen address) as other nodes would dial it, or
// "" when it is a wildcard they cannot.
func advertised(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || port == "0" {
		return ""
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return ""
	}
	return addr
}

// fleetSecret reads fleet_secret_file (nil when unset): a file only its
// owner may read.
func (c Config) fleetSecret() (fleet.Secret, error) {
	if c.FleetSecretFile == "" {
		return nil, nil
	}
	st, err := os.Stat(c.FleetSecretFile)
	if err != nil {
		return nil, fmt.Errorf("fleet_secret_file: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("fleet_secret_file %s may be read by others (mode %v); chmod 600 it", c.FleetSecretFile, st.Mode().Perm())
	}
	b, err := os.ReadFile(c.FleetSecretFile)
	if err != nil {
		return nil, fmt.Errorf("fleet_secret_file: %w", err)
	}
	s := fleet.Secret(strings.TrimSpace(string(b)))
	if len(s) < 32 {
		return nil, fmt.Errorf("fleet_secret_file %s holds %d bytes; the fleet secret must be at least 32 (e.g. openssl rand -hex 32)", c.FleetSecretFile, len(s))
	}
	return s, nil
}

// nodeNameFile keeps, in the data dir, the node name the daemon ran as, so
// that a host renamed later (or a container's changing host name) does
// not make a new node that leaves the old one's sandboxes behind.
const nodeNameFile = "node-name"

// stickyNodeName is node_name when set, else the name this data dir ran
// as before, else the host's name; it is kept in the data dir.
func stickyNodeName(cfg Config, log *slog.Logger) (string, error) {
	path := filepath.Join(cfg.DataDir, nodeNameFile)
	kept := ""
	if b, err := os.ReadFile(path); err == nil {
		kept = strings.TrimSpace(string(b))
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("node name: %w", err)
	}
	name := cfg.NodeName
	switch {
	case name == "" && kept != "" && nodeNameRE.MatchString(kept):
		return kept, nil
	case name == "":
		name = cfg.nodeName()
	case kept != "" && kept != name:
		log.Warn("node_name differs from the name this data dir ran as; the sandboxes of the old node stay with it", "node", name, "was", kept)
	}
	if err := os.WriteFile(path, []byte(name+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("node name: %w", err)
	}
	return name, nil
}

// nodeIDFile keeps, in the data dir, the id of the data dir's daemon as a
// node (torpor.Node.Instance): a daemon of another data dir under the
// same node name, such as a cloned host's, is then refused by the fleet
// instead of serving the node's sandboxes beside this one.
const nodeIDFile = "node-id"

// nodeInstance returns the node id of the data dir, made on first use
// (and again should the file be found empty).
func nodeInstance(dataDir string) (string, error) {
	path := filepath.Join(dataDir, nodeIDFile)
	b, err := os.ReadFile(path)
	if id := strings.TrimSpace(string(b)); err == nil && id != "" {
		return id, nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("node id: %w", err)
	}
	id := torpor.NewID("", 20)
	if err := os.WriteFile(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("node id: %w", err)
	}
	return id, nil
}

// openObjects opens object_store (nil when unset).
func openObjects(ctx context.Context, cfg Config) (torpor.ObjectStore, error) {
	if cfg.ObjectStore == "" {
		return nil, nil
	}
	o, err := objstore.Open(ctx, cfg.ObjectStore)
	if err != nil {
		return nil, fmt.Errorf("object_store: %w", err)
	}
	return o, nil
}

// openArchives returns where archived sandboxes' disks go
// (docs/archive.md): the fleet's object store when there is one, else a
// directory object store under the data dir.
func openArchives(ctx context.Context, cfg Config, objects torpor.ObjectStore) (torpor.ObjectStore, error) {
	if objects != nil {
		return objects, nil
	}
	dir := filepath.Join(cfg.DataDir, "archive")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("archive store: %w", err)
	}
	o, err := objstore.Open(ctx, (&url.URL{Scheme: "file", Path: dir}).String())
	if err != nil {
		return nil, fmt.Errorf("archive store: %w", err)
	}
	return o, nil
}

// newFleet makes this daemon a node: the engine's fleet settings and,
// with a fleet secret, the side that signs, checks and forwards requests
// between nodes (nil without one: requests for other nodes' sandboxes
// are refused).
func newFleet(cfg Config, name string, secret fleet.Secret, nodes torpor.NodeStore, objects torpor.ObjectStore,
	apiAddr, proxyAddr string, log *slog.Logger) (*fleet.Fleet, *lifecycle.FleetConfig, error) {
	labels, _ := cfg.nodeLabels() // checked by LoadConfig
	instance, err := nodeInstance(cfg.DataDir)
	if err != nil {
		return nil, nil, err
	}
	self := torpor.Node{Name: name, Instance: instance, Address: cfg.NodeAddress, ProxyAddress: cfg.NodeProxyAddress, Labels: labels}
	if self.Address == "" {
		self.Address = advertised(apiAddr)
	}
	if self.ProxyAddress == "" && proxyAddr != "" {
		self.ProxyAddress = advertised(proxyAddr)
	}
	fc := &lifecycle.FleetConfig{Nodes: nodes, Self: self, DownAfter: time.Duration(cfg.NodeDownSeconds) * time.Second,
		Objects: objects, UploadAfter: time.Duration(cfg.UploadAfterSeconds) * time.Second}
	if secret == nil {
		if cfg.Store != "" {
			log.Warn("no fleet_secret_file: this node cannot forward requests to other nodes of the fleet, nor take theirs (docs/fleet.md)")
		}
		return nil, fc, nil
	}
	fl, err := fleet.New(fleet.Config{Self: name, Secret: secret, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	fc.StartOn = func(ctx context.Context, n torpor.Node, tenant, id string) error {
		return startOn(ctx, fl, n, tenant, id)
	}
	return fl, fc, nil
}

// startOn asks node n, as this node acting for tenant, to start sandbox
// id.
func startOn(ctx context.Context, fl *fleet.Fleet, n torpor.Node, tenant, id string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+n.Address+"/v1/sandboxes/"+id+"/start", nil)
	if err != nil {
		return err
	}
	fl.Sign(req, fleet.Identity{Tenant: tenant, Tier: torpor.TierStandard})
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode >= 300 {
		return fmt.Errorf("node %s answered %s: %s", n.Name, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// lockWebhooks is the fleet-wide lock of webhook delivery.
const lockWebhooks = "torpor.webhooks"

// runWebhooks delivers webhooks while this node holds the fleet's
// webhook lock, and waits for it while another node does, until ctx ends.
func runWebhooks(ctx context.Context, nodes torpor.NodeStore, d *webhook.Dispatcher, log *slog.Logger) {
	for ctx.Err() == nil {
		ok, err := nodes.Exclusive(ctx, lockWebhooks, func(lctx context.Context) error {
			if err := d.Run(lctx); err != nil {
				return err
			}
			// Webhooks added or removed through other nodes show here
			// within a few seconds.
			t := time.NewTicker(5 * time.Second)
			defer t.Stop()
			for {
				select {
				case <-lctx.Done():
					d.Wait()
					return nil
				case <-t.C:
					if err := d.Refresh(lctx); err != nil && lctx.Err() == nil {
						log.Warn("webhooks: refreshing", "err", err)
					}
				}
			}
		})
		if err != nil && ctx.Err() == nil {
			log.Warn("webhooks: delivering", "err", err)
		}
		if !ok || err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
			}
		}
	}
}
