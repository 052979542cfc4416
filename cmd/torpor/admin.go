package main

import (
	"fmt"

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
under the data directory, the API on ` + daemon.DefaultListen + `, the runc runtime.
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
	tenants := &cobra.Command{Use: "tenants", Short: "Manage tenants (admin)"}
	tenants.AddCommand(&cobra.Command{
		Use:   "ls",
		Short: "List tenants",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				ts, err := cl.Tenants(cmd.Context())
				return answer(c, ts, err, func(ts []torpor.Tenant) error {
					for _, t := range ts {
						fmt.Fprintln(c.stdout, t.Name)
					}
					return nil
				})
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
	})
	return tenants
}
