package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

func (c *cli) createCmd() *cobra.Command {
	var (
		req              torpor.CreateRequest
		res              torpor.Resources
		env, md          []string
		nodeLabels       []string
		secrets          []string
		volumes          []string
		setup            []string
		runtimeKind      string
		cpus             float64
		mem, pids, disks int64
		pf               policyFlags
		hooksFile        string
		acc              torpor.AccelRequest
		gpuIdle          float64
		allowOut         []string
		denyOut          []string
	)
	cmd := &cobra.Command{
		Use:   "create [flags] [-- ENTRYPOINT ARGS...]",
		Short: "Create a sandbox and print its id",
		Example: `  torpor create --template base
  torpor create -m team=ml --setup 'mkdir -p /data' -- sh -c 'httpd -f -p 8080'
  torpor create --secret db-password=env:DB_PASSWORD --secret tls-key=path:/run/secrets/tls.key
  torpor create --volume data:/data --volume models:/models:ro`,
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if req.Env, err = kv("env", env); err != nil {
				return err
			}
			if req.Metadata, err = kv("metadata", md); err != nil {
				return err
			}
			if req.NodeLabels, err = kv("node-label", nodeLabels); err != nil {
				return err
			}
			if req.Secrets, err = parseSecretRefs(secrets); err != nil {
				return err
			}
			if req.VolumeMounts, err = parseVolumeMounts(volumes); err != nil {
				return err
			}
			if len(allowOut) > 0 || len(denyOut) > 0 {
				req.Network = &torpor.NetworkRules{AllowOut: allowOut, DenyOut: denyOut}
			}
			res = torpor.Resources{VCPUs: cpus, MemoryMiB: mem, Pids: pids, DiskMiB: disks}
			if res != (torpor.Resources{}) {
				req.Resources = &res
			}
			req.Runtime = torpor.RuntimeConfig{Kind: runtimeKind, Setup: setup, Entrypoint: args}
			req.PolicyRequest = pf.request(cmd)
			if f := cmd.Flags(); f.Changed("vram") || f.Changed("gpus") || f.Changed("suspend-mode") || f.Changed("gpu-idle-timeout") {
				if f.Changed("gpu-idle-timeout") {
					acc.IdleTimeoutS = &gpuIdle
				}
				req.Accel = &acc
			}
			if hooksFile != "" {
				if req.Hooks, err = readHooks(hooksFile); err != nil {
					return err
				}
			}
			return c.withClient(func(cl *client.Client) error {
				done := c.progress("Creating a sandbox from %s", req.Template)
				sb, err := cl.Create(cmd.Context(), req)
				if err != nil {
					return err
				}
				done()
				return show(c, sb, func(sb *torpor.Sandbox) error {
					fmt.Fprintln(c.stdout, sb.ID)
					if sb.State == torpor.StateFailed && sb.Failure != nil {
						return fmt.Errorf("sandbox %s failed to boot: %s (%s)", sb.ID, sb.Failure.Message, sb.Failure.Code)
					}
					return nil
				})
			})
		},
	}
	f := cmd.Flags()
	f.StringVarP(&req.Template, "template", "t", "base", "template to create from")
	f.Float64Var(&cpus, "cpus", 0, "vCPUs (default: the server's)")
	f.Int64Var(&mem, "memory", 0, "memory in MiB (default: the server's)")
	f.Int64Var(&pids, "pids", 0, "process limit (default: the server's)")
	f.Int64Var(&disks, "disk", 0, "disk in MiB (default: the server's)")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.StringArrayVarP(&md, "metadata", "m", nil, "metadata KEY=VALUE (repeatable)")
	f.StringArrayVar(&nodeLabels, "node-label", nil, "in a fleet, place the sandbox on a node with the label KEY=VALUE (repeatable; docs/fleet.md)")
	f.StringArrayVar(&secrets, "secret", nil, "give the sandbox the tenant's secret NAME as NAME=env:VARIABLE or NAME=path:/ABSOLUTE/PATH (repeatable; docs/secrets.md)")
	f.StringArrayVar(&volumes, "volume", nil, "mount the tenant's volume NAME as NAME:/PATH, or NAME:/PATH:ro read-only (repeatable; docs/volumes.md)")
	f.StringArrayVar(&setup, "setup", nil, "shell command run at each boot before the entrypoint (repeatable)")
	f.StringVar(&runtimeKind, "runtime", "", "runtime (default: the server's)")
	f.StringVar(&req.Isolation, "isolation", "", "container or vm (default: the server's; torpor runtimes lists them)")
	f.BoolVar(&req.AllowInternet, "allow-internet", false, "let the sandbox reach the internet")
	f.StringArrayVar(&allowOut, "allow-out", nil, "egress rule: let the sandbox reach an IPv4 address, CIDR block or host name, and nothing else not allowed (repeatable; docs/egress.md)")
	f.StringArrayVar(&denyOut, "deny-out", nil, "egress rule: refuse an IPv4 address, CIDR block or host name; deny wins over allow (repeatable; docs/egress.md)")
	f.StringVar(&hooksFile, "hooks-file", "", "JSON file with a list of lifecycle hooks (see docs/hooks.md)")
	f.BoolVar(&req.IgnoreImageHooks, "ignore-image-hooks", false, "skip the hooks the template ships")
	f.Int64Var(&acc.VRAMMiB, "vram", 0, "GPU lease: MiB of VRAM (the slice; docs/gpu.md)")
	f.IntVar(&acc.GPUs, "gpus", 0, "GPU lease: GPUs (default 1)")
	f.StringVar(&acc.SuspendMode, "suspend-mode", "", "GPU lease: what pause does, none or transparent (default)")
	f.Float64Var(&gpuIdle, "gpu-idle-timeout", 0, "GPU lease: idle seconds before auto-pause (0: off; default 600)")
	pf.add(cmd)
	return cmd
}

// readHooks reads a JSON list of hooks.
func readHooks(path string) ([]torpor.Hook, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var hooks []torpor.Hook
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&hooks); err != nil {
		return nil, fmt.Errorf("%s: a JSON list of hooks is expected: %w", path, err)
	}
	return hooks, nil
}

// policyFlags are the idle-policy flags of create and update. A value of 0
// turns a rule off (null in the API).
type policyFlags struct {
	timeout, pauseAfter, hibernateAfter, connIdle, archiveAfter int64
	onTimeout, pauseMode                                        string
	autoResume                                                  bool
}

func (p *policyFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.Int64Var(&p.timeout, "timeout", 0, "idle seconds before --on-timeout acts (0: off)")
	f.StringVar(&p.onTimeout, "on-timeout", "", "kill, pause or hibernate when --timeout passes (default kill)")
	f.StringVar(&p.pauseMode, "pause-mode", "", "how the idle engine pauses: freeze or snapshot (default: the runtime's)")
	f.BoolVar(&p.autoResume, "auto-resume", true, "wake the sandbox on the next operation when it is paused or hibernated")
	f.Int64Var(&p.pauseAfter, "pause-after", 0, "pause after this many idle seconds (0: off)")
	f.Int64Var(&p.hibernateAfter, "hibernate-after", 0, "hibernate after this many seconds paused, or idle when pausing is off (0: off)")
	f.Int64Var(&p.connIdle, "connection-idle", 0, "seconds a silent connection still counts as activity (0: off)")
	f.Int64Var(&p.archiveAfter, "archive-after", 0, "archive after this many seconds hibernated: the disk is packed into a compressed archive and freed from the node (0: off)")
}

// request turns the flags that were given into a policy request.
func (p *policyFlags) request(cmd *cobra.Command) torpor.PolicyRequest {
	f := cmd.Flags()
	secs := func(name string, v int64) torpor.OptSeconds {
		switch {
		case !f.Changed(name):
			return torpor.OptSeconds{}
		case v == 0:
			return torpor.Off()
		}
		return torpor.Seconds(v)
	}
	var r torpor.PolicyRequest
	r.Timeout = secs("timeout", p.timeout)
	if f.Changed("on-timeout") || f.Changed("auto-resume") || f.Changed("pause-mode") {
		r.Lifecycle = &torpor.Lifecycle{OnTimeout: p.onTimeout, PauseMode: torpor.PauseMode(p.pauseMode)}
		if f.Changed("auto-resume") {
			v := p.autoResume
			r.Lifecycle.AutoResume = &v
		}
	}
	lp := torpor.LifecyclePolicy{
		PauseAfterIdleSeconds:         secs("pause-after", p.pauseAfter),
		HibernateAfterPausedSeconds:   secs("hibernate-after", p.hibernateAfter),
		ConnectionIdleSeconds:         secs("connection-idle", p.connIdle),
		ArchiveAfterHibernatedSeconds: secs("archive-after", p.archiveAfter),
	}
	if lp != (torpor.LifecyclePolicy{}) {
		r.LifecyclePolicy = &lp
	}
	return r
}

func (c *cli) updateCmd() *cobra.Command {
	var (
		md        []string
		pf        policyFlags
		hooksFile string
		allowOut  []string
		denyOut   []string
		noRules   bool
	)
	cmd := &cobra.Command{
		Use:   "update ID",
		Short: "Change a sandbox's metadata (KEY= removes a key) or idle policy",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			meta, err := kv("metadata", md)
			if err != nil {
				return err
			}
			req := torpor.UpdateRequest{PolicyRequest: pf.request(cmd)}
			if f := cmd.Flags(); f.Changed("allow-out") || f.Changed("deny-out") || noRules {
				// The rules given replace all of the sandbox's.
				req.Network = &torpor.NetworkRules{AllowOut: allowOut, DenyOut: denyOut}
			}
			if hooksFile != "" {
				hooks, err := readHooks(hooksFile)
				if err != nil {
					return err
				}
				if hooks == nil {
					hooks = []torpor.Hook{}
				}
				req.Hooks = &hooks
			}
			for k, v := range meta {
				if req.Metadata == nil {
					req.Metadata = map[string]*string{}
				}
				v := v
				req.Metadata[k] = &v
			}
			return c.withClient(func(cl *client.Client) error {
				sb, err := cl.Update(cmd.Context(), args[0], req)
				return answer(c, sb, err, c.printSandbox)
			})
		},
	}
	cmd.Flags().StringArrayVarP(&md, "metadata", "m", nil, "metadata KEY=VALUE (repeatable; KEY= removes)")
	cmd.Flags().StringVar(&hooksFile, "hooks-file", "", "JSON file with the list of hooks that replaces the sandbox's ([] removes them)")
	cmd.Flags().StringArrayVar(&allowOut, "allow-out", nil, "egress rule (repeatable): together with --deny-out, replaces all of the sandbox's rules (docs/egress.md)")
	cmd.Flags().StringArrayVar(&denyOut, "deny-out", nil, "egress rule to refuse (repeatable): together with --allow-out, replaces all of the sandbox's rules")
	cmd.Flags().BoolVar(&noRules, "no-egress-rules", false, "remove every egress rule of the sandbox")
	pf.add(cmd)
	return cmd
}

func (c *cli) lsCmd() *cobra.Command {
	var (
		all        bool
		states     []string
		md         []string
		tenant     string
		allTenants bool
	)
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List sandboxes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			meta, err := kv("metadata", md)
			if err != nil {
				return err
			}
			o := client.ListOptions{All: all, Metadata: meta, Tenant: tenant}
			if allTenants {
				o.Tenant = client.AllTenants
			}
			for _, s := range states {
				o.States = append(o.States, torpor.State(s))
			}
			// The tenant column is shown when the rows may be of
			// several tenants, or of another than the key's.
			printRows := c.printTable
			if o.Tenant != "" {
				printRows = c.printTenantTable
			}
			return c.withClient(func(cl *client.Client) error {
				sbs, err := cl.List(cmd.Context(), o)
				return answer(c, sbs, err, printRows)
			})
		},
	}
	cmd.Flags().BoolVarP(&all, "all", "a", false, "include terminated sandboxes")
	cmd.Flags().StringVar(&tenant, "tenant", "", "list this tenant's sandboxes (admin key)")
	cmd.Flags().BoolVar(&allTenants, "all-tenants", false, "list every tenant's sandboxes, with a TENANT column (admin key)")
	cmd.MarkFlagsMutuallyExclusive("tenant", "all-tenants")
	cmd.Flags().StringSliceVar(&states, "state", nil, "only these states (repeatable or comma-separated)")
	cmd.Flags().StringArrayVarP(&md, "metadata", "m", nil, "only sandboxes with metadata KEY=VALUE (repeatable)")
	return cmd
}

// printTable lists sandboxes, one a row.
func (c *cli) printTable(sbs []*torpor.Sandbox) error { return c.writeTable(sbs, false) }

// printTenantTable lists sandboxes with their tenants.
func (c *cli) printTenantTable(sbs []*torpor.Sandbox) error { return c.writeTable(sbs, true) }

func (c *cli) writeTable(sbs []*torpor.Sandbox, tenants bool) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	head := "ID\tTEMPLATE\tSTATE\tSINCE\tCREATED\tMETADATA"
	if tenants {
		head = "ID\tTENANT\tTEMPLATE\tSTATE\tSINCE\tCREATED\tMETADATA"
	}
	fmt.Fprintln(tw, head)
	for _, sb := range sbs {
		id := sb.ID
		if tenants {
			id += "\t" + sb.Tenant
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", id, sb.Template, sb.State,
			ago(sb.StateSince), sb.CreatedAt.Local().Format(time.DateTime), metadataString(sb.Metadata))
	}
	tw.Flush()
	return nil
}

func ago(t time.Time) string {
	d := time.Since(t).Round(time.Second)
	if d < 0 {
		d = 0
	}
	return d.String() + " ago"
}

func metadataString(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ",")
}

func (c *cli) getCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "get ID",
		Short: "Show a sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				sb, err := cl.Get(cmd.Context(), args[0])
				return answer(c, sb, err, c.printSandbox)
			})
		},
	}
}

// printSandbox describes a sandbox, one field a line.
func (c *cli) printSandbox(sb *torpor.Sandbox) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("ID", sb.ID)
	row("Template", sb.Template)
	row("State", fmt.Sprintf("%s (since %s)", sb.State, sb.StateSince.Local().Format(time.DateTime)))
	if sb.Failure != nil {
		row("Failure", fmt.Sprintf("%s: %s", sb.Failure.Code, sb.Failure.Message))
	}
	row("Created", sb.CreatedAt.Local().Format(time.DateTime))
	row("Last activity", sb.LastActivityAt.Local().Format(time.DateTime))
	row("Resources", fmt.Sprintf("%g vCPU, %d MiB memory, %d pids, %d MiB disk", sb.Resources.VCPUs, sb.Resources.MemoryMiB, sb.Resources.Pids, sb.Resources.DiskMiB))
	row("Runtime", sb.Runtime.Kind)
	row("Node", nodeString(sb))
	row("Durability", firstNonEmpty(string(sb.Durability), "-"))
	row("Pause modes", fmt.Sprint(sb.PauseModes))
	row("Boots", fmt.Sprint(sb.Boots))
	if a := sb.Archive; a != nil && sb.State == torpor.StateArchived {
		row("Archive", fmt.Sprintf("%d bytes, archived %s; a start restores it", a.Bytes, a.ArchivedAt.Local().Format(time.DateTime)))
	}
	if t := sb.RestoredFromArchiveAt; t != nil {
		row("Restored from archive", t.Local().Format(time.DateTime))
	}
	row("Meters", sb.Meters.String())
	if sb.Accel != nil {
		row("GPU lease", fmt.Sprintf("%d GPU, %d MiB, suspend_mode %s, idle timeout %ds", sb.Accel.GPUs, sb.Accel.VRAMMiB, sb.Accel.SuspendMode, sb.Accel.IdleTimeoutS))
	}
	if st, ok := sb.GPU.(map[string]any); ok {
		row("GPU", fmt.Sprintf("phase %v, frozen %v, spilled %v, holds seat %v, meters %v", st["phase"], st["frozen"], st["spilled"] == true, st["holds_seat"], st["meters"]))
	}
	for _, h := range sb.Hooks {
		target := h.Path
		if h.Type == torpor.HookHTTP {
			target = fmt.Sprintf("port %d %s", h.Port, h.Path)
		}
		row("Hook", fmt.Sprintf("on %s: %s %s (wait %v, timeout %s)", h.On, h.Type, target, h.Wait, h.Timeout()))
	}
	for _, r := range sb.Secrets {
		if r.Env != "" {
			row("Secret", fmt.Sprintf("%s as $%s", r.Name, r.Env))
		} else {
			row("Secret", fmt.Sprintf("%s at %s", r.Name, r.Path))
		}
	}
	if hf := sb.HookFailure; hf != nil {
		row("Hook failure", fmt.Sprintf("%s hook %d at %s: %s", hf.On, hf.Index, hf.At.Local().Format(time.DateTime), hf.Message))
	}
	p := sb.Policy()
	pol := "none"
	if p.IdleAction != "" {
		pol = fmt.Sprintf("%s after %s idle", p.IdleAction, p.IdleAfter)
	}
	if p.HibernateAfterPaused > 0 {
		pol += fmt.Sprintf("; hibernate after %s paused", p.HibernateAfterPaused)
	}
	if p.ArchiveAfterHibernated > 0 {
		pol += fmt.Sprintf("; archive after %s hibernated", p.ArchiveAfterHibernated)
	}
	row("Idle policy", fmt.Sprintf("%s; auto-resume %v", pol, p.AutoResume))
	wakeupRows(row, sb.Wakeups)
	for _, ev := range sb.UpcomingEvents {
		row("Upcoming", fmt.Sprintf("%s at %s (%s)", ev.Action, ev.At.Local().Format(time.DateTime), ev.Cause))
	}
	if len(sb.Metadata) > 0 {
		row("Metadata", metadataString(sb.Metadata))
	}
	tw.Flush()
	return nil
}

// verbCmd is a lifecycle verb on one or more sandboxes.
func (c *cli) verbCmd(name string, aliases []string, short string) *cobra.Command {
	var mode string
	cmd := &cobra.Command{
		Use:     name + " ID...",
		Aliases: aliases,
		Short:   short,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				for _, id := range args {
					done := c.progress("%s %s", waiting[name], id)
					var (
						sb  *torpor.Sandbox
						err error
					)
					ctx := cmd.Context()
					switch name {
					case "pause":
						sb, err = cl.Pause(ctx, id, torpor.PauseMode(mode))
					case "start":
						sb, err = cl.Start(ctx, id)
					case "hibernate":
						sb, err = cl.Hibernate(ctx, id)
					case "archive":
						sb, err = cl.Archive(ctx, id)
					case "restart":
						sb, err = cl.Restart(ctx, id)
					case "touch":
						sb, err = cl.Touch(ctx, id)
					case "rm":
						sb, err = cl.Delete(ctx, id)
					}
					if err != nil {
						return fmt.Errorf("%s %s: %w", name, id, err)
					}
					done()
					if err := show(c, sb, c.printState); err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
	if name == "pause" {
		cmd.Flags().StringVar(&mode, "mode", "", "freeze or snapshot (default: the runtime's)")
	}
	return cmd
}

// printState says where a sandbox is now: its id and state.
func (c *cli) printState(sb *torpor.Sandbox) error {
	fmt.Fprintf(c.stdout, "%s %s\n", sb.ID, sb.State)
	return nil
}

var waiting = map[string]string{
	"pause": "Pausing", "start": "Starting", "hibernate": "Hibernating",
	"restart": "Restarting", "touch": "Touching", "rm": "Deleting",
}

func (c *cli) execCmd() *cobra.Command {
	var (
		env     []string
		cwd     string
		user    string
		timeout float64
		stdin   bool
	)
	cmd := &cobra.Command{
		Use:   "exec ID -- COMMAND [ARGS...]",
		Short: "Run a command in a sandbox; exits with its exit code",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			envMap, err := kv("env", env)
			if err != nil {
				return err
			}
			req := client.ExecRequest{Cmd: args[1:], Env: envMap, Cwd: cwd, User: user, TimeoutSeconds: timeout}
			if stdin {
				data, err := io.ReadAll(io.LimitReader(c.stdin, 512<<10))
				if err != nil {
					return err
				}
				req.Stdin = string(data)
			}
			return c.withClient(func(cl *client.Client) error {
				// --json waits for the whole answer; a person sees the
				// output as it comes.
				if c.json {
					res, err := cl.Exec(cmd.Context(), args[0], req)
					if err != nil {
						return err
					}
					if err := c.printJSON(res); err != nil {
						return err
					}
					return exitCode(res)
				}
				res, err := cl.ExecStream(cmd.Context(), args[0], req, c.stdout, c.stderr)
				if err != nil {
					return err
				}
				if res.TimedOut {
					fmt.Fprintf(c.stderr, "torpor: the command timed out after %gs and was killed\n", timeout)
				}
				return exitCode(res)
			})
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.StringVarP(&cwd, "cwd", "w", "", "working directory inside the sandbox")
	f.StringVarP(&user, "user", "u", "", "run as this user of the sandbox (name or uid[:gid]; default root)")
	f.Float64Var(&timeout, "timeout", 0, "seconds before the command is killed (0: none)")
	f.BoolVarP(&stdin, "stdin", "i", false, "send this command's standard input (up to 512 KiB)")
	return cmd
}

func exitCode(res *client.ExecResult) error {
	if res.ExitCode != 0 {
		return exitError{code: res.ExitCode}
	}
	return nil
}

func (c *cli) eventsCmd() *cobra.Command {
	var (
		since  int64
		follow bool
	)
	cmd := &cobra.Command{
		Use:   "events [ID]",
		Short: "Print lifecycle events (of one sandbox when ID is given)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				id := ""
				if len(args) == 1 {
					id = args[0]
				}
				print := func(ev torpor.Event) error { return show(c, ev, c.printEvent) }
				if !follow {
					evs, _, err := cl.Events(cmd.Context(), id, since)
					if err != nil {
						return err
					}
					for _, ev := range evs {
						if err := print(ev); err != nil {
							return err
						}
					}
					return nil
				}
				// Follow the stream; reconnect from the last cursor if it drops.
				for {
					var err error
					since, err = cl.FollowEvents(cmd.Context(), id, since, print)
					if cmd.Context().Err() != nil {
						return nil
					}
					if client.IsNotFound(err) || client.IsUnauthenticated(err) || client.IsInvalid(err) {
						return err
					}
					select {
					case <-cmd.Context().Done():
						return nil
					case <-time.After(time.Second):
					}
				}
			})
		},
	}
	cmd.Flags().Int64Var(&since, "since", 0, "print events after this cursor")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new events")
	return cmd
}

// printEvent prints an event on one line: cursor, time, sandbox, type and
// attributes.
func (c *cli) printEvent(ev torpor.Event) error {
	_, err := fmt.Fprintf(c.stdout, "%d\t%s\t%s\t%s\t%s\n", ev.Seq, ev.Time.Local().Format(time.DateTime), ev.SandboxID, ev.Type, metadataString(ev.Attrs))
	return err
}
