package main

import (
	"fmt"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

// poolsCmd lists the node's warm pools (docs/pools.md) and, with set,
// changes one's size.
func (c *cli) poolsCmd() *cobra.Command {
	list := func(cmd *cobra.Command, args []string) error {
		return c.withClient(func(cl *client.Client) error {
			pools, err := cl.Pools(cmd.Context())
			return answer(c, pools, err, c.printPools)
		})
	}
	cmd := &cobra.Command{
		Use:   "pools",
		Short: "List the warm pools: sandboxes of a template kept booted and frozen for fast creates",
		Args:  cobra.NoArgs,
		RunE:  list,
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "ls",
		Short: "List the warm pools (as torpor pools)",
		Args:  cobra.NoArgs,
		RunE:  list,
	})
	var internet bool
	set := &cobra.Command{
		Use:   "set TEMPLATE SIZE",
		Short: "Keep SIZE sandboxes of TEMPLATE ready (admin; 0 turns the pool off); kept over a restart",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			size, err := strconv.Atoi(args[1])
			if err != nil {
				return torpor.Invalid("size", "%q is not a number", args[1])
			}
			if err := torpor.ValidatePoolSize("size", size); err != nil {
				return err
			}
			return c.withClient(func(cl *client.Client) error {
				var st *torpor.PoolStatus
				var err error
				if cmd.Flags().Changed("internet") {
					st, err = cl.SetPoolInternet(cmd.Context(), args[0], size, internet)
				} else {
					st, err = cl.SetPool(cmd.Context(), args[0], size)
				}
				return answer(c, st, err, func(st *torpor.PoolStatus) error {
					return c.printPools([]torpor.PoolStatus{*st})
				})
			})
		},
	}
	set.Flags().BoolVar(&internet, "internet", false, "boot the members with the internet, for creates that ask for it (E2B's do by default); without the flag the pool keeps its setting")
	cmd.AddCommand(set)
	return cmd
}

// printPools lists pools, one a row.
func (c *cli) printPools(pools []torpor.PoolStatus) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TEMPLATE\tSIZE\tREADY\tINTERNET\tHITS\tMISSES\tLAST ERROR")
	for _, p := range pools {
		net := "no"
		if p.AllowInternet {
			net = "yes"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\t%d\t%s\n", p.Template, p.Size, p.Ready, net, p.Hits, p.Misses, p.LastError)
	}
	return tw.Flush()
}
