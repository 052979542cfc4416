package main

import (
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
	"github.com/torpor-dev/torpor/client"
)

func (c *cli) webhooksCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "webhooks", Short: "Send this tenant's events to HTTP endpoints, signed"}
	cmd.AddCommand(&cobra.Command{
		Use:   "add URL",
		Short: "Register an endpoint; prints its id and signing secret (shown once)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				w, err := cl.CreateWebhook(cmd.Context(), args[0])
				return answer(c, w, err, func(w *wire.WebhookCreated) error {
					fmt.Fprintf(c.stdout, "%s\nsecret: %s\n", w.ID, w.Secret)
					return nil
				})
			})
		},
	}, &cobra.Command{
		Use:   "ls",
		Short: "List endpoints and how far each has delivered",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				hooks, err := cl.Webhooks(cmd.Context())
				return answer(c, hooks, err, c.printWebhooks)
			})
		},
	}, &cobra.Command{
		Use:   "rm ID",
		Short: "Remove an endpoint",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				return cl.DeleteWebhook(cmd.Context(), args[0])
			})
		},
	})
	return cmd
}

// printWebhooks lists endpoints, one a row, with how far each has
// delivered and how its deliveries are going (counted since the daemon
// started; BEHIND counts the events still to send).
func (c *cli) printWebhooks(hooks []torpor.Webhook) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tURL\tDELIVERED UP TO\tDELIVERED\tFAILURES\tLAST STATUS\tBEHIND\tCREATED")
	for _, w := range hooks {
		delivered, failures, last, behind := "-", "-", "-", "-"
		if d := w.Delivery; d != nil {
			delivered, failures, behind = strconv.FormatInt(d.Delivered, 10), strconv.Itoa(d.ConsecutiveFailures), strconv.FormatInt(d.Behind, 10)
			if d.Behind >= torpor.MaxWebhookBehind {
				behind += "+"
			}
			last = lastAttempt(d)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", w.ID, w.URL, w.Cursor, delivered, failures, last, behind, w.CreatedAt.Local().Format(time.DateTime))
	}
	return tw.Flush()
}

// lastAttempt is the LAST STATUS cell: the status code, or the error when
// no answer came, or "-" before the first attempt.
func lastAttempt(d *torpor.WebhookDelivery) string {
	switch {
	case d.LastAttemptAt == nil:
		return "-"
	case d.LastStatus != 0:
		return strconv.Itoa(d.LastStatus)
	default:
		return d.LastError
	}
}
