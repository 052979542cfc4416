package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

func parsePID(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q is not a process id (a positive integer; see torpor ps)", s)
	}
	return n, nil
}

func (c *cli) spawnCmd() *cobra.Command {
	var (
		env []string
		cwd string
	)
	cmd := &cobra.Command{
		Use:   "spawn ID [--env K=V] [--cwd DIR] -- COMMAND [ARGS...]",
		Short: "Start a background process in a sandbox; prints its process id",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			envMap, err := kv("env", env)
			if err != nil {
				return err
			}
			return c.withClient(func(cl *client.Client) error {
				p, err := cl.StartProcess(cmd.Context(), args[0], client.ProcessRequest{Cmd: args[1:], Env: envMap, Cwd: cwd})
				return answer(c, p, err, func(p *client.Process) error {
					fmt.Fprintln(c.stdout, p.ID)
					return nil
				})
			})
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable K=V (repeatable)")
	f.StringVar(&cwd, "cwd", "", "working directory (absolute)")
	return cmd
}

func (c *cli) psCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "ps ID",
		Short: "List a sandbox's background processes (those ended by a hibernate or restart show as gone)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				list, err := cl.ListProcesses(cmd.Context(), args[0])
				return answer(c, list, err, c.printProcesses)
			})
		},
	}
}

// printProcesses lists background processes, one a row.
func (c *cli) printProcesses(list []client.Process) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPID\tSTATE\tSTARTED\tCOMMAND")
	for _, p := range list {
		state := p.State
		if p.ExitCode != nil {
			state += fmt.Sprintf(" (%d)", *p.ExitCode)
		}
		pid := "-"
		if p.Pid > 0 {
			pid = strconv.Itoa(p.Pid)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", p.ID, pid, state, p.StartedAt.Local().Format(time.DateTime), strings.Join(p.Cmd, " "))
	}
	return tw.Flush()
}

func (c *cli) logsCmd() *cobra.Command {
	var (
		follow bool
		offset int64
	)
	cmd := &cobra.Command{
		Use:   "logs ID PID [-f] [--offset N]",
		Short: "Print a background process's output (stdout and stderr together); -f follows it until the process ends",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := parsePID(args[1])
			if err != nil {
				return err
			}
			return c.withClient(func(cl *client.Client) error {
				if follow {
					end, err := cl.FollowProcessOutput(cmd.Context(), args[0], pid, offset, c.stdout)
					if err != nil {
						return err
					}
					if end.ExitCode != nil && *end.ExitCode != 0 {
						return exitError{code: *end.ExitCode}
					}
					return nil
				}
				out, err := cl.ProcessOutput(cmd.Context(), args[0], pid, offset)
				return answer(c, out, err, func(out *client.ProcessOutput) error {
					_, err := io.WriteString(c.stdout, out.Data)
					return err
				})
			})
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "stream new output until the process ends")
	cmd.Flags().Int64Var(&offset, "offset", 0, "byte offset to start from")
	return cmd
}

func (c *cli) sendCmd() *cobra.Command {
	var closeIt bool
	cmd := &cobra.Command{
		Use:   "send ID PID DATA|- [--close]",
		Short: "Write DATA (or stdin, with -) to a background process's stdin; --close closes it after",
		Args:  cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := parsePID(args[1])
			if err != nil {
				return err
			}
			var data string
			switch {
			case len(args) == 2 && !closeIt:
				return fmt.Errorf("give DATA, - for stdin, or --close")
			case len(args) == 3 && args[2] == "-":
				b, err := io.ReadAll(io.LimitReader(c.stdin, torpor.MaxProcessStdin+1))
				if err != nil {
					return err
				}
				data = string(b)
			case len(args) == 3:
				data = args[2]
			}
			return c.withClient(func(cl *client.Client) error {
				return cl.WriteProcessStdin(cmd.Context(), args[0], pid, data, closeIt)
			})
		},
	}
	cmd.Flags().BoolVar(&closeIt, "close", false, "close the process's stdin after writing")
	return cmd
}

func (c *cli) killCmd() *cobra.Command {
	var sig string
	cmd := &cobra.Command{
		Use:   "kill ID PID [-s SIGNAL]",
		Short: "Send a signal (TERM, KILL, INT or HUP) to a background process and what it started",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := parsePID(args[1])
			if err != nil {
				return err
			}
			return c.withClient(func(cl *client.Client) error {
				return cl.SignalProcess(cmd.Context(), args[0], pid, sig)
			})
		},
	}
	cmd.Flags().StringVarP(&sig, "signal", "s", "TERM", "TERM, KILL, INT or HUP")
	return cmd
}
