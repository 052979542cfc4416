package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

func (c *cli) secretsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secrets",
		Short: "Keep this tenant's secrets, which sandboxes get as variables or files (values never shown)",
		Long: `Keep this tenant's secrets: named values, encrypted at rest, that a
sandbox created with --secret gets as an environment variable or a file at
each boot and in each exec. No command, answer or log ever shows a value.
See docs/secrets.md.`,
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "set NAME",
		Short: "Create or rotate a secret, its value read from stdin",
		Long: `Create or rotate the secret NAME, its value read from standard input (up
to 64 KiB of text; one trailing newline is dropped, so that
"echo value | torpor secrets set NAME" stores "value"). Sandboxes that use
it get the new value at their next boot and in their next exec.`,
		Example: `  printf '%s' "$DB_PASSWORD" | torpor secrets set db-password
  torpor secrets set tls-key < server.key`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			value, err := readSecretValue(c.stdin)
			if err != nil {
				return err
			}
			return c.withClient(func(cl *client.Client) error {
				sec, err := cl.SetSecret(cmd.Context(), args[0], value)
				return answer(c, sec, err, func(s *torpor.Secret) error {
					fmt.Fprintf(c.stdout, "%s version %d\n", s.Name, s.Version)
					return nil
				})
			})
		},
	}, &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List secrets (names and versions, never values)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				secs, err := cl.ListSecrets(cmd.Context())
				if secs == nil {
					secs = []torpor.Secret{}
				}
				return answer(c, secs, err, c.printSecrets)
			})
		},
	}, &cobra.Command{
		Use:   "get NAME",
		Short: "Show a secret's metadata (never its value)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				sec, err := cl.GetSecret(cmd.Context(), args[0])
				return answer(c, sec, err, func(s *torpor.Secret) error {
					return c.printSecrets([]torpor.Secret{*s})
				})
			})
		},
	}, &cobra.Command{
		Use:     "delete NAME",
		Aliases: []string{"rm"},
		Short:   "Remove a secret (the sandboxes that use it fail their next boot)",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				return cl.DeleteSecret(cmd.Context(), args[0])
			})
		},
	})
	return cmd
}

// readSecretValue reads a value from r: text, at most
// torpor.MaxSecretValueLen bytes once one trailing newline is dropped.
// No error holds any of it.
func readSecretValue(r io.Reader) (string, error) {
	if r == nil {
		return "", fmt.Errorf("give the value on standard input")
	}
	b, err := io.ReadAll(io.LimitReader(r, torpor.MaxSecretValueLen+3))
	if err != nil {
		return "", fmt.Errorf("read the value from standard input: %w", err)
	}
	v := string(b)
	if t, ok := strings.CutSuffix(v, "\r\n"); ok {
		v = t
	} else {
		v = strings.TrimSuffix(v, "\n")
	}
	switch {
	case v == "":
		return "", fmt.Errorf("the value is empty: give it on standard input")
	case len(v) > torpor.MaxSecretValueLen:
		return "", fmt.Errorf("the value is longer than %d bytes", torpor.MaxSecretValueLen)
	case !utf8.ValidString(v):
		return "", fmt.Errorf("the value is not UTF-8 text (encode a binary value, e.g. with base64)")
	}
	return v, nil
}

func (c *cli) printSecrets(secs []torpor.Secret) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tVERSION\tUPDATED\tCREATED")
	for _, s := range secs {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", s.Name, s.Version, s.UpdatedAt.Local().Format(time.DateTime), s.CreatedAt.Local().Format(time.DateTime))
	}
	return tw.Flush()
}

// parseSecretRefs reads create's --secret flags: NAME=env:VAR gives the
// secret NAME as the variable VAR, NAME=path:/ABS/PATH as a file.
func parseSecretRefs(flags []string) ([]torpor.SecretRef, error) {
	var refs []torpor.SecretRef
	for _, f := range flags {
		name, where, ok := strings.Cut(f, "=")
		kind, target, ok2 := strings.Cut(where, ":")
		if !ok || !ok2 || name == "" || target == "" {
			return nil, fmt.Errorf("--secret %q: want NAME=env:VARIABLE or NAME=path:/ABSOLUTE/PATH", f)
		}
		switch kind {
		case "env":
			refs = append(refs, torpor.SecretRef{Name: name, Env: target})
		case "path":
			refs = append(refs, torpor.SecretRef{Name: name, Path: target})
		default:
			return nil, fmt.Errorf("--secret %q: %q is neither env nor path", f, kind)
		}
	}
	return refs, nil
}
