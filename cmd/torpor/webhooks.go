package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

func (c *cli) webhooksCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "webhooks", Short: "Send this tenant's events to HTTP endpoints, signed"}
	cmd.AddCommand(&cobra.Command{
		Use:   "add URL",
		Short: "Register an endpoint; prints its id and signing secret (shown once)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			w, err := cl.CreateWebhook(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if c.json {
				return c.printJSON(w)
			}
			fmt.Fprintf(c.stdout, "%s\nsecret: %s\n", w.ID, w.Secret)
			return nil
		},
	}, &cobra.Command{
		Use:   "ls",
		Short: "List endpoints and how far each has delivered",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			hooks, err := cl.Webhooks(cmd.Context())
			if err != nil {
				return err
			}
			if c.json {
				return c.printJSON(hooks)
			}
			tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tURL\tDELIVERED UP TO\tCREATED")
			for _, w := range hooks {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", w.ID, w.URL, w.Cursor, w.CreatedAt.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}, &cobra.Command{
		Use:   "rm ID",
		Short: "Remove an endpoint",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.client()
			if err != nil {
				return err
			}
			return cl.DeleteWebhook(cmd.Context(), args[0])
		},
	})
	return cmd
}
