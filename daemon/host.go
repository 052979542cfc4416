package daemon

import (
	"context"
	"log/slog"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/network"
)

// hostCleaner is a runtime that can remove what it made on the host and
// no sandbox uses any more (runc: its empty cgroup parent).
type hostCleaner interface {
	Cleanup(ctx context.Context) error
}

// releaseHost removes, as the daemon stops, what it made on the host that
// no sandbox uses any more: the runtimes' empty cgroup parents, and the
// sandbox network's bridge and nftables tables when no sandbox is plugged
// into the bridge and no other daemon holds it (network.Network.Close).
// A sandbox still running or paused keeps all of them; hibernated ones
// need none (their disks and address leases stay). docs/lifecycle.md
// lists what stays on the host.
func releaseHost(runtimes []torpor.Runtime, n *network.Network, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, rt := range runtimes {
		if c, ok := rt.(hostCleaner); ok {
			if err := c.Cleanup(ctx); err != nil {
				log.Warn("removing the runtime's leftovers on the host", "runtime", rt.Kind(), "err", err)
			}
		}
	}
	if n != nil {
		if err := n.Close(ctx); err != nil {
			log.Warn("removing the sandbox network", "bridge", n.Bridge(), "err", err)
		}
	}
}
