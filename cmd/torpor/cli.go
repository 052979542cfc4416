package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/daemon"
)

// cli holds what every command shares: the streams, the environment, and
// the flags that say how to reach the daemon.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string

	url, apiKey string
	json        bool
}

func newRoot(c *cli) *cobra.Command {
	root := &cobra.Command{
		Use:           "torpor",
		Short:         "Sandboxes that cost nothing while idle and wake on the next request",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&c.url, "url", "", "daemon URL (default: $TORPOR_URL, else http://"+daemon.DefaultListen+")")
	pf.StringVar(&c.apiKey, "api-key", "", "API key (default: $TORPOR_API_KEY, else the local admin key file when readable)")
	pf.BoolVar(&c.json, "json", false, "print JSON for scripts")
	root.AddCommand(
		c.serveCmd(),
		c.createCmd(), c.lsCmd(), c.getCmd(), c.updateCmd(), c.execCmd(), c.runCmd(),
		c.spawnCmd(), c.psCmd(), c.logsCmd(), c.sendCmd(), c.killCmd(),
		c.filesCmd(), c.cpCmd(),
		c.verbCmd("pause", nil, "Freeze a running sandbox: its processes stop, its memory stays"),
		c.verbCmd("start", []string{"resume", "connect"}, "Continue a paused sandbox, or boot a hibernated one"),
		c.verbCmd("hibernate", nil, "Stop a sandbox's processes and keep every file on its disk"),
		c.verbCmd("archive", nil, "Pack a hibernated sandbox's disk into a compressed archive and free it from the node (a start restores it)"),
		c.verbCmd("restart", nil, "Boot a running sandbox again on a fresh instance (disk kept)"),
		c.verbCmd("touch", nil, "Record activity on a sandbox"),
		c.verbCmd("rm", []string{"delete"}, "Terminate a sandbox and remove its disk"),
		c.checkpointCmd(), c.checkpointsCmd(), c.forkCmd(), c.restoreCmd(),
		c.scheduleCmd(), c.eventsCmd(), c.usageCmd(), c.runtimesCmd(), c.templateCmd(), c.poolsCmd(), c.nodesCmd(), c.keysCmd(), c.tenantsCmd(), c.webhooksCmd(),
		c.secretsCmd(), c.volumesCmd(), c.storeCmd(),
	)
	refuseUnknownSubcommands(root)
	return root
}

// refuseUnknownSubcommands makes every group of verbs below the root
// (files, keys, template...) refuse a verb it does not have, as the root
// does, instead of printing its help and exiting 0: cobra runs a group's
// help for any argument. Without arguments a group still prints its help.
func refuseUnknownSubcommands(root *cobra.Command) {
	for _, cmd := range root.Commands() {
		if cmd.HasSubCommands() && !cmd.Runnable() {
			cmd.Args = cobra.NoArgs
			cmd.RunE = func(cmd *cobra.Command, args []string) error { return cmd.Help() }
		}
		refuseUnknownSubcommands(cmd)
	}
}

// client builds the API client from flags, environment and local defaults.
func (c *cli) client() (*client.Client, error) {
	url := firstNonEmpty(c.url, c.getenv("TORPOR_URL"), "http://"+daemon.DefaultListen)
	key := firstNonEmpty(c.apiKey, c.getenv("TORPOR_API_KEY"))
	if key == "" {
		dir := firstNonEmpty(c.getenv(daemon.EnvName("data_dir")), daemon.DefaultDataDir())
		data, err := os.ReadFile(filepath.Join(dir, daemon.AdminKeyFile))
		if err != nil {
			return nil, fmt.Errorf("no API key: set TORPOR_API_KEY or --api-key (the local admin key %s is not readable: %v)",
				filepath.Join(dir, daemon.AdminKeyFile), errors.Unwrap(err))
		}
		key = strings.TrimSpace(string(data))
	}
	cl, err := client.New(url, key)
	if err != nil {
		return nil, err
	}
	p := client.DefaultRetry
	p.OnRetry = func(err error, attempt int, wait time.Duration) {
		fmt.Fprintf(c.stderr, "torpor: the node is full; retrying in %s (attempt %d of %d)\n", wait, attempt+1, p.Attempts)
	}
	return cl.WithRetry(p), nil
}

// withClient runs f with the API client, so that a verb holds only what it
// asks the daemon and what it prints.
func (c *cli) withClient(f func(cl *client.Client) error) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	return f(cl)
}

// show prints v: as JSON with --json, else in the human form human writes.
// A nil human prints nothing without --json: the verb's success is silent.
func show[T any](c *cli, v T, human func(T) error) error {
	switch {
	case c.json:
		return c.printJSON(v)
	case human == nil:
		return nil
	}
	return human(v)
}

// answer prints what a request answered: its error when it failed, else v
// as show prints it.
func answer[T any](c *cli, v T, err error, human func(T) error) error {
	if err != nil {
		return err
	}
	return show(c, v, human)
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// progress tells a person at a terminal what a long verb waits for.
func (c *cli) progress(format string, a ...any) func() {
	f, ok := c.stderr.(*os.File)
	if !ok || c.json {
		return func() {}
	}
	if st, err := f.Stat(); err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return func() {}
	}
	fmt.Fprintf(f, format+"…", a...)
	return func() { fmt.Fprintln(f, " done") }
}

func (c *cli) printJSON(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// describe turns an error into one line for a person.
func describe(err error) string {
	var te *torpor.Error
	if errors.As(err, &te) {
		msg := te.Message
		if te.Param != "" && !strings.Contains(msg, te.Param) {
			msg = te.Param + ": " + msg
		}
		return fmt.Sprintf("%s (%s)", msg, te.Code)
	}
	return err.Error()
}

// kv parses KEY=VALUE flags into a map.
func kv(flag string, pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--%s wants KEY=VALUE, got %q", flag, p)
		}
		m[k] = v
	}
	return m, nil
}
