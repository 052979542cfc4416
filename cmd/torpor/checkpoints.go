package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

// Checkpoints, fork and restore (docs/fork.md).

func (c *cli) checkpointCmd() *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "checkpoint ID --name NAME",
		Short: "Save a named checkpoint of a sandbox's disk without ending it (rm: remove one)",
		Example: `  torpor checkpoint ID --name before-upgrade
  torpor checkpoint rm ID before-upgrade`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if name == "" {
				return fmt.Errorf("give the checkpoint a --name")
			}
			return c.withClient(func(cl *client.Client) error {
				cp, err := cl.CreateCheckpoint(cmd.Context(), args[0], name)
				return answer(c, cp, err, func(cp *torpor.CheckpointInfo) error {
					fmt.Fprintf(c.stdout, "%s\t%s\t%d bytes (%s)\n", cp.Name, cp.CreatedAt.Format("2006-01-02T15:04:05Z"), cp.SizeBytes, cp.Method)
					return nil
				})
			})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "the checkpoint's name (letters, digits, '.', '_', '-')")
	cmd.AddCommand(&cobra.Command{
		Use:     "rm ID NAME",
		Aliases: []string{"delete"},
		Short:   "Remove a sandbox's checkpoint",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				return cl.DeleteCheckpoint(cmd.Context(), args[0], args[1])
			})
		},
	})
	return cmd
}

func (c *cli) checkpointsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "checkpoints ID",
		Short: "List a sandbox's checkpoints",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				cps, err := cl.Checkpoints(cmd.Context(), args[0])
				return answer(c, cps, err, func(cps []torpor.CheckpointInfo) error {
					tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "NAME\tCREATED\tSIZE\tKIND\tMETHOD")
					for _, cp := range cps {
						fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", cp.Name, cp.CreatedAt.Format("2006-01-02T15:04:05Z"), cp.SizeBytes, cp.Kind, cp.Method)
					}
					return tw.Flush()
				})
			})
		},
	}
}

func (c *cli) forkCmd() *cobra.Command {
	var (
		count      int
		checkpoint string
	)
	cmd := &cobra.Command{
		Use:   "fork ID [--count N] [--checkpoint NAME]",
		Short: "Make N new sandboxes from a sandbox's checkpoint, or its disk as it is (all or none; processes are not carried)",
		Example: `  torpor fork ID --count 3 --checkpoint before-upgrade
  torpor fork ID              # one fork of the disk as it is; a sleeping parent is not woken`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				res, err := cl.Fork(cmd.Context(), args[0], torpor.ForkRequest{Count: count, Checkpoint: checkpoint})
				return answer(c, res, err, func(res *torpor.ForkResult) error {
					for _, sb := range res.Sandboxes {
						fmt.Fprintln(c.stdout, sb.ID)
					}
					if res.Note != "" {
						fmt.Fprintln(c.stderr, "torpor: "+res.Note)
					}
					return nil
				})
			})
		},
	}
	cmd.Flags().IntVar(&count, "count", 1, fmt.Sprintf("how many sandboxes to make (1..%d)", torpor.MaxForkCount))
	cmd.Flags().StringVar(&checkpoint, "checkpoint", "", "the checkpoint to fork from (default: the disk as it is now)")
	return cmd
}

func (c *cli) restoreCmd() *cobra.Command {
	var checkpoint string
	cmd := &cobra.Command{
		Use:   "restore ID --checkpoint NAME",
		Short: "Bring a sandbox back to one of its checkpoints (a running one boots again on it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if checkpoint == "" {
				return fmt.Errorf("give the --checkpoint to restore")
			}
			return c.withClient(func(cl *client.Client) error {
				sb, err := cl.Restore(cmd.Context(), args[0], checkpoint)
				return answer(c, sb, err, c.printSandbox)
			})
		},
	}
	cmd.Flags().StringVar(&checkpoint, "checkpoint", "", "the checkpoint's name")
	return cmd
}
