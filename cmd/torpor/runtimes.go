package main

import (
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

func (c *cli) runtimesCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "runtimes",
		Short: "List the runtimes this node can run (container, vm) and how each pauses",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				rts, err := cl.Runtimes(cmd.Context())
				return answer(c, rts, err, c.printRuntimes)
			})
		},
	}
}

// printRuntimes lists runtimes, one a row, with how each pauses.
func (c *cli) printRuntimes(rts []torpor.RuntimeInfo) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tISOLATION\tPAUSE MODES\tDEFAULT\tDETAILS")
	for _, r := range rts {
		modes := make([]string, len(r.PauseModes))
		for i, m := range r.PauseModes {
			modes[i] = string(m)
		}
		var details []string
		for k, v := range r.Details {
			details = append(details, k+"="+v)
		}
		sort.Strings(details)
		def := ""
		if r.Default {
			def = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Kind, r.Isolation, strings.Join(modes, ","), def, strings.Join(details, " "))
	}
	return tw.Flush()
}
