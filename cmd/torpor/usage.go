package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
	"github.com/torpor-dev/torpor/client"
)

func (c *cli) usageCmd() *cobra.Command {
	var (
		q        client.UsageQuery
		from, to string
	)
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Show metered usage and its cost: seconds in each state, per sandbox or per day",
		Long: `Show metered usage from the usage ledger, with the intervals still open up to now.

  torpor usage                        this tenant's totals, grouped by sandbox
  torpor usage --by day --from 2026-11-01 --to 2026-12-01
  torpor usage --sandbox ID --by none   every ledger row of one sandbox`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if q.From, err = parseWhen("--from", from); err != nil {
				return err
			}
			if q.To, err = parseWhen("--to", to); err != nil {
				return err
			}
			if q.GroupBy == "none" {
				q.GroupBy = ""
			}
			return c.withClient(func(cl *client.Client) error {
				rep, err := cl.Usage(cmd.Context(), q)
				return answer(c, rep, err, func(rep *wire.UsageReport) error { return c.printUsage(q.GroupBy, rep) })
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&q.Tenant, "tenant", "", "tenant to report (admin keys; default: the key's tenant, every tenant for an admin key)")
	f.StringVar(&q.Sandbox, "sandbox", "", "only this sandbox")
	f.StringVar(&from, "from", "", "start of the window: a date (2026-11-30) or an RFC 3339 time")
	f.StringVar(&to, "to", "", "end of the window (exclusive)")
	f.StringVar(&q.GroupBy, "by", torpor.GroupBySandbox, "group by sandbox, day or tenant; none lists the rows")
	return cmd
}

// printUsage prints a usage report: its rows, or its groups when grouped
// by groupBy, then the total and the currency.
func (c *cli) printUsage(groupBy string, rep *wire.UsageReport) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	if groupBy == "" {
		fmt.Fprintln(tw, "SANDBOX\tKIND\tSTART\tEND\tSECONDS\tCOST\t")
		for _, r := range rep.Rows {
			end := r.End.Local().Format(time.DateTime)
			if r.Open {
				end += " (open)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.1f\t%.6f\t\n", r.SandboxID, r.Kind, r.Start.Local().Format(time.DateTime), end, r.Seconds, r.Cost)
		}
	} else {
		fmt.Fprintf(tw, "%s\tRUNNING\tFROZEN\tSNAPSHOT\tHIBERNATED\tBILLED\tCOST\t\n", map[string]string{
			torpor.GroupBySandbox: "SANDBOX", torpor.GroupByDay: "DAY", torpor.GroupByTenant: "TENANT"}[groupBy])
		for _, g := range rep.Groups {
			printTotals(tw, g.Key, g)
		}
	}
	printTotals(tw, "TOTAL", rep.Total)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "costs in %s; BILLED = seconds charged for CPU or memory\n", rep.Currency)
	return nil
}

func printTotals(tw *tabwriter.Writer, key string, t torpor.UsageTotals) {
	fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.6f\t\n", key, secs(t.RunningS), secs(t.FrozenS), secs(t.SnapshotPausedS),
		secs(t.HibernatedS), secs(t.BilledS), t.Cost)
}

// secs prints seconds as a duration rounded to the second.
func secs(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Second).String()
}

// parseWhen reads a date or an RFC 3339 time; empty is the zero time.
func parseWhen(flag, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, v); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("%s %q: use a date (2026-11-30) or an RFC 3339 time (2026-11-30T12:00:00Z)", flag, v)
}
