package main

import (
	"fmt"
	"math"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/daemon"
)

func (c *cli) serveCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the torpor daemon",
		Long: `Run the torpor daemon with its embedded defaults: state in a SQLite file
under the data directory (or in PostgreSQL with --store postgres://...,
docs/postgres.md), the API on ` + daemon.DefaultListen + `, the runc runtime.
Every setting can come from a flag, a TORPOR_* environment variable
(e.g. TORPOR_LISTEN) or a TOML config file (--config, $TORPOR_CONFIG, or
DATA_DIR/torpor.toml), in that order of precedence.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := daemon.LoadConfig(cmd.Flags(), c.getenv)
			if err != nil {
				return err
			}
			return daemon.Run(cmd.Context(), cfg, daemon.Options{Stdout: c.stdout, Getenv: c.getenv})
		},
	}
	daemon.AddFlags(cmd.Flags())
	return cmd
}

func (c *cli) keysCmd() *cobra.Command {
	keys := &cobra.Command{Use: "keys", Short: "Manage API keys (admin)"}
	var (
		tenant string
		admin  bool
		tier   string
	)
	create := &cobra.Command{
		Use:   "create --tenant NAME",
		Short: "Create an API key for a tenant (and the tenant if new); prints the key once",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				k, err := cl.CreateKey(cmd.Context(), wire.KeyRequest{Tenant: tenant, Admin: admin, Tier: tier})
				return answer(c, k, err, func(k *wire.KeyCreated) error {
					fmt.Fprintln(c.stdout, k.Key)
					return nil
				})
			})
		},
	}
	create.Flags().StringVar(&tenant, "tenant", "", "tenant the key belongs to")
	create.Flags().BoolVar(&admin, "admin", false, "the key can manage tenants and keys")
	create.Flags().StringVar(&tier, "tier", torpor.TierStandard, "the key's tier: standard or free (GPU rules read it)")
	_ = create.MarkFlagRequired("tenant")
	keys.AddCommand(create)
	return keys
}

func (c *cli) tenantsCmd() *cobra.Command {
	tenants := &cobra.Command{Use: "tenants", Short: "Manage tenants and their quotas (admin)"}
	tenants.AddCommand(&cobra.Command{
		Use:   "ls",
		Short: "List tenants, with their quotas and what their sandboxes hold",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				ts, err := cl.Tenants(cmd.Context())
				return answer(c, ts, err, c.printTenants)
			})
		},
	}, &cobra.Command{
		Use:   "create NAME",
		Short: "Create a tenant",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				t, err := cl.CreateTenant(cmd.Context(), args[0])
				return answer(c, t, err, func(t *torpor.Tenant) error {
					fmt.Fprintln(c.stdout, t.Name)
					return nil
				})
			})
		},
	}, c.tenantsSetCmd())
	return tenants
}

// tenantsSetCmd changes the quotas its flags name; the others stay.
func (c *cli) tenantsSetCmd() *cobra.Command {
	var (
		q                    wire.QuotaUpdate
		sandboxes, mem, disk int64
		vcpus                float64
	)
	cmd := &cobra.Command{
		Use:   "set NAME [--max-sandboxes N] [--max-vcpus N] [--max-memory-mib N] [--max-disk-mib N]",
		Short: "Set a tenant's quotas (0 removes one); the quotas not named stay as they are",
		Long: `Set a tenant's quotas: what its sandboxes may hold together. Every sandbox
that is not terminated counts against --max-sandboxes and holds its disk;
running ones (and paused ones, less paused_resource_release_ratio) hold
their vCPUs and memory. A create, start or resume past a quota is refused
(403, reason quota); what already runs is left alone.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f := cmd.Flags()
			if f.Changed("max-sandboxes") {
				q.MaxSandboxes = &sandboxes
			}
			if f.Changed("max-vcpus") {
				q.MaxVCPUs = &vcpus
			}
			if f.Changed("max-memory-mib") {
				q.MaxMemoryMiB = &mem
			}
			if f.Changed("max-disk-mib") {
				q.MaxDiskMiB = &disk
			}
			if q == (wire.QuotaUpdate{}) {
				return fmt.Errorf("nothing to set: give --max-sandboxes, --max-vcpus, --max-memory-mib or --max-disk-mib")
			}
			return c.withClient(func(cl *client.Client) error {
				t, err := cl.SetTenantQuota(cmd.Context(), args[0], q)
				return answer(c, t, err, func(t *torpor.Tenant) error { return c.printTenants([]torpor.Tenant{*t}) })
			})
		},
	}
	cmd.Flags().Int64Var(&sandboxes, "max-sandboxes", 0, "most sandboxes that are not terminated (0: no limit)")
	cmd.Flags().Float64Var(&vcpus, "max-vcpus", 0, "most vCPUs its sandboxes hold together (0: no limit)")
	cmd.Flags().Int64Var(&mem, "max-memory-mib", 0, "most memory its sandboxes hold together, in MiB (0: no limit)")
	cmd.Flags().Int64Var(&disk, "max-disk-mib", 0, "most disk its sandboxes hold together, in MiB (0: no limit)")
	return cmd
}

// printTenants shows each tenant's use against its quotas: "1/2" is one
// held of two allowed, "1/-" one held without a limit.
func (c *cli) printTenants(ts []torpor.Tenant) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSANDBOXES\tVCPUS\tMEMORY MIB\tDISK MIB")
	for _, t := range ts {
		var u torpor.QuotaUsage
		if t.Usage != nil {
			u = *t.Usage
		}
		q := t.Quota
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.Name,
			usedOf(float64(u.Sandboxes), float64(q.MaxSandboxes)), usedOf(u.VCPUs, q.MaxVCPUs),
			usedOf(u.MemoryMiB, float64(q.MaxMemoryMiB)), usedOf(float64(u.DiskMiB), float64(q.MaxDiskMiB)))
	}
	return tw.Flush()
}

// usedOf formats use against a limit (0: none), to a hundredth: sums of
// fractional vCPUs are not exact.
func usedOf(used, limit float64) string {
	f := func(v float64) string { return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64) }
	if limit == 0 {
		return f(used) + "/-"
	}
	return f(used) + "/" + f(limit)
}
