package daemon

import (
	"context"
	"log/slog"
	"path/filepath"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/network"
	"github.com/torpor-dev/torpor/runtime/vm"
)

// newVMRuntime returns the microVM runtime when this host can run it
// (QEMU, the guest kernel and the agent that scripts/install.sh sets up),
// or nil, saying why, when it cannot: containers work either way.
func newVMRuntime(ctx context.Context, cfg Config, n *network.Network, resolvConf string, log *slog.Logger) torpor.Runtime {
	if cfg.VMAccel == "off" {
		return nil
	}
	vc := vm.Config{
		Dir:        filepath.Join(cfg.DataDir, "vm"),
		AgentPath:  cfg.VMAgent,
		KernelDir:  cfg.VMKernelDir,
		Accel:      cfg.VMAccel,
		LazyMemory: cfg.VMLazyMemory,
		Logger:     log,
	}
	if n != nil { // a nil *network.Network is no Network
		vc.Network = n
		vc.ResolvConf = resolvConf
		vc.NamesResolvConf = n.ResolverConf()
	}
	rt, err := vm.New(ctx, vc)
	if err != nil {
		log.Warn("microVM runtime unavailable; sandboxes run as containers only", "err", err)
		return nil
	}
	i := rt.Info()
	log.Info("microVM runtime", "accel", i.Accel, "qemu", i.QEMUVersion, "kernel", i.Kernel, "memory", i.Memory)
	return rt
}
