package main

import (
	"fmt"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

// scheduleCmd sets, lists and removes a sandbox's scheduled wake-ups
// (docs/schedule.md).
func (c *cli) scheduleCmd() *cobra.Command {
	var (
		cronExpr, tz, at, remove string
		timeout                  time.Duration
		list, clear              bool
	)
	cmd := &cobra.Command{
		Use:   "schedule ID [--cron EXPR [--tz ZONE] | --at TIME] [--timeout 60s] [-- COMMAND [ARGS...]]",
		Short: "Wake a sandbox on a schedule and run a command in it (list, --clear or --remove its wake-ups)",
		Long: `schedule adds a wake-up to a sandbox: at the time (--at) or at each time of a
cron schedule (--cron, in --tz, UTC by default) a paused or hibernated sandbox
is woken, the command runs in it, its exit code and the tail of its output are
kept as the wake-up's last result, and the sandbox sleeps again by its idle
policy. Without --cron or --at it lists the sandbox's wake-ups.`,
		Example: `  torpor schedule ID --cron '0 3 * * *' --tz Europe/Paris --timeout 10m -- ./nightly.sh
  torpor schedule ID --at 2026-12-24T18:00:00Z -- sh -c 'echo ho ho ho'
  torpor schedule ID --at +30s
  torpor schedule ID              # list
  torpor schedule ID --remove wk_...
  torpor schedule ID --clear`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, command := args[0], args[1:]
			if dash := cmd.ArgsLenAtDash(); dash >= 0 && dash != 1 {
				return fmt.Errorf("give one sandbox id, then -- and the command")
			}
			adding := cronExpr != "" || at != ""
			switch {
			case cronExpr != "" && at != "":
				return fmt.Errorf("give --cron or --at, not both")
			case !adding && (tz != "" || timeout != 0 || len(command) > 0):
				return fmt.Errorf("--tz, --timeout and a command go with --cron or --at")
			case (adding || list) && (clear || remove != ""), clear && remove != "":
				return fmt.Errorf("add, list, --clear and --remove are separate requests")
			}
			return c.withClient(func(cl *client.Client) error {
				ctx := cmd.Context()
				switch {
				case clear:
					return cl.ClearWakeups(ctx, id)
				case remove != "":
					return cl.RemoveWakeup(ctx, id, remove)
				case !adding:
					ws, err := cl.Wakeups(ctx, id)
					return answer(c, ws, err, c.printWakeups)
				}
				spec := torpor.WakeupSpec{WakeSchedule: cronExpr, TimeZone: tz, Cmd: command}
				if timeout > 0 {
					spec.TimeoutSeconds = int64(math.Ceil(timeout.Seconds()))
				}
				if at != "" {
					t, err := parseAt(at, time.Now())
					if err != nil {
						return err
					}
					spec.WakeAt = &t
				}
				w, err := cl.AddWakeup(ctx, id, spec)
				return answer(c, w, err, func(w *torpor.Wakeup) error {
					fmt.Fprintf(c.stdout, "%s next at %s\n", w.ID, nextString(*w))
					return nil
				})
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&cronExpr, "cron", "", "cron schedule: minute hour day-of-month month day-of-week, or @daily, @hourly, ...")
	f.StringVar(&tz, "tz", "", "time zone of --cron, an IANA name such as Europe/Paris (default UTC)")
	f.StringVar(&at, "at", "", "one-off time: RFC 3339 (2026-12-24T18:00:00Z), or +DURATION from now (+30s)")
	f.DurationVar(&timeout, "timeout", 0, "how long the command may run before it is killed (default: up to a day)")
	f.BoolVar(&list, "list", false, "list the sandbox's wake-ups (the default without --cron or --at)")
	f.BoolVar(&clear, "clear", false, "remove every wake-up of the sandbox")
	f.StringVar(&remove, "remove", "", "remove the wake-up with this id")
	return cmd
}

// parseAt reads --at: an RFC 3339 time, or +DURATION after now.
func parseAt(s string, now time.Time) (time.Time, error) {
	if d, ok := strings.CutPrefix(s, "+"); ok {
		v, err := time.ParseDuration(d)
		if err != nil || v <= 0 {
			return time.Time{}, fmt.Errorf("--at %s: give a positive duration after +, such as +30s or +2h", s)
		}
		return now.Add(v).UTC(), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("--at %s: give an RFC 3339 time such as 2026-12-24T18:00:00Z, or +30s", s)
	}
	return t, nil
}

// printWakeups lists wake-ups, one a row.
func (c *cli) printWakeups(ws []torpor.Wakeup) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tWHEN\tNEXT\tRUNS\tLAST RESULT\tCOMMAND")
	for _, w := range ws {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", w.ID, whenString(w), nextString(w), w.Runs, resultString(w.LastResult), strings.Join(w.Cmd, " "))
	}
	return tw.Flush()
}

// wakeupRows adds a sandbox's wake-ups to torpor get's rows.
func wakeupRows(row func(k, v string), ws []torpor.Wakeup) {
	for _, w := range ws {
		v := fmt.Sprintf("%s %s, next %s", w.ID, whenString(w), nextString(w))
		if len(w.Cmd) > 0 {
			v += ": " + strings.Join(w.Cmd, " ")
		}
		if w.LastResult != nil {
			v += "; last " + resultString(w.LastResult)
		}
		row("Wake-up", v)
	}
}

func whenString(w torpor.Wakeup) string {
	if w.WakeAt != nil {
		return "at " + w.WakeAt.Local().Format(time.DateTime)
	}
	return fmt.Sprintf("cron %q %s", w.WakeSchedule, firstNonEmpty(w.TimeZone, "UTC"))
}

func nextString(w torpor.Wakeup) string {
	switch {
	case w.RetryAt != nil:
		return fmt.Sprintf("%s (waiting: %s)", w.RetryAt.Local().Format(time.DateTime), w.Waiting)
	case w.NextAt != nil:
		return w.NextAt.Local().Format(time.DateTime)
	}
	return "-"
}

// resultString says in a few words how a run went.
func resultString(r *torpor.WakeupResult) string {
	if r == nil {
		return "-"
	}
	s := r.Status
	if r.ExitCode != nil {
		s += fmt.Sprintf(" exit %d", *r.ExitCode)
	}
	if r.TimedOut {
		s += " timed out"
	}
	if r.Late {
		s += fmt.Sprintf(" late (due %s", r.DueAt.Local().Format(time.DateTime))
		if r.Missed > 0 {
			s += fmt.Sprintf(", %d more missed", r.Missed)
		}
		s += ")"
	}
	s += " at " + r.StartedAt.Local().Format(time.DateTime)
	if r.Error != "" {
		s += ": " + r.Error
	}
	return s
}
