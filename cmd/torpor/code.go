package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

func (c *cli) runCmd() *cobra.Command {
	var (
		lang    string
		code    string
		timeout float64
	)
	cmd := &cobra.Command{
		Use:   "run ID [--lang python|sh] [-c CODE]",
		Short: "Run code in a sandbox's persistent interpreter (state stays for the next run); code from -c or stdin",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("code") {
				data, err := io.ReadAll(io.LimitReader(c.stdin, torpor.MaxCodeSize+1))
				if err != nil {
					return err
				}
				code = string(data)
			}
			return c.withClient(func(cl *client.Client) error {
				res, err := cl.RunCode(cmd.Context(), args[0], client.CodeRequest{Language: lang, Code: code, TimeoutSeconds: timeout})
				if err := answer(c, res, err, c.printCodeResult); err != nil {
					return err
				}
				switch {
				case res.ExitCode != nil && *res.ExitCode != 0:
					return exitError{code: *res.ExitCode}
				case res.Error != nil || res.TimedOut:
					return exitError{code: 1}
				}
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&lang, "lang", torpor.LanguagePython, "language: python or sh")
	f.StringVarP(&code, "code", "c", "", "the code to run (default: read from stdin)")
	f.Float64Var(&timeout, "timeout", 0, "seconds before the interpreter is killed (0: none)")
	return cmd
}

// printCodeResult writes what a run printed to the matching streams, then
// its result, and its error as the interpreter tells it.
func (c *cli) printCodeResult(res *client.CodeResult) error {
	io.WriteString(c.stdout, res.Stdout)
	io.WriteString(c.stderr, res.Stderr)
	if res.Result != nil {
		fmt.Fprintln(c.stdout, *res.Result)
	}
	if res.Error != nil {
		if res.Error.Traceback != "" {
			io.WriteString(c.stderr, strings.TrimRight(res.Error.Traceback, "\n")+"\n")
		} else {
			fmt.Fprintf(c.stderr, "%s: %s\n", res.Error.Name, res.Error.Value)
		}
	}
	if res.Context == torpor.ContextNew {
		fmt.Fprintln(c.stderr, "torpor: (ran in a new interpreter)")
	}
	return nil
}
