package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/e2b/templates"
)

// templateCmd is `torpor template`: list, show, import, build and remove
// templates. Alone (or as `torpor templates`) it lists them.
func (c *cli) templateCmd() *cobra.Command {
	ls := c.templateLsCmd()
	cmd := &cobra.Command{
		Use:     "template",
		Aliases: []string{"templates"},
		Short:   "List, import, build and remove templates",
		Args:    cobra.NoArgs,
		RunE:    ls.RunE,
	}
	cmd.AddCommand(ls, c.templateGetCmd(), c.templateRmCmd(), c.templateImportCmd(), c.templateBuildCmd())
	return cmd
}

func (c *cli) templateLsCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List templates",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				ts, err := cl.Templates(cmd.Context())
				return answer(c, ts, err, c.printTemplates)
			})
		},
	}
}

// printTemplates lists templates, one a row.
func (c *cli) printTemplates(ts []torpor.Template) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSOURCE\tSIZE\tIN USE\tCREATED")
	for _, t := range ts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", t.Name, sourceText(t.Source), sizeText(t.SizeBytes), t.InUse, t.CreatedAt.Local().Format("2006-01-02 15:04"))
	}
	return tw.Flush()
}

func sourceText(s torpor.TemplateSource) string {
	if s.Ref == "" {
		return s.Kind
	}
	return s.Kind + " " + s.Ref
}

func sizeText(n int64) string {
	if n == 0 {
		return "-"
	}
	const mib = 1 << 20
	if n < mib {
		return fmt.Sprintf("%.1f KiB", float64(n)/1024)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/mib)
}

func (c *cli) templateGetCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "get NAME",
		Short: "Show a template",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				t, err := cl.Template(cmd.Context(), args[0])
				return answer(c, t, err, c.describeTemplate)
			})
		},
	}
}

// describeTemplate shows a template, one field a line; empty fields are
// left out.
func (c *cli) describeTemplate(t *torpor.Template) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(tw, "%s\t%s\n", k, v)
		}
	}
	d := t.Defaults
	row("Name", t.Name)
	row("Source", sourceText(t.Source))
	row("Digest", t.Digest)
	row("Size", sizeText(t.SizeBytes))
	row("In use", fmt.Sprint(t.InUse))
	row("Created", t.CreatedAt.Local().Format("2006-01-02 15:04:05"))
	row("Entrypoint", strings.Join(d.Entrypoint, " "))
	row("Image command", strings.Join(d.ImageCmd, " "))
	row("Working dir", d.WorkingDir)
	row("Setup", strings.Join(d.Setup, "; "))
	for k, v := range d.Env {
		row("Env", k+"="+v)
	}
	return tw.Flush()
}

func (c *cli) templateRmCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"delete"},
		Short:   "Remove templates that no sandbox uses",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				for _, name := range args {
					if err := cl.DeleteTemplate(cmd.Context(), name); err != nil {
						return err
					}
					fmt.Fprintln(c.stdout, name)
				}
				return nil
			})
		},
	}
}

// templateFlags are the defaults flags of import and build.
type templateFlags struct {
	env, setup       []string
	cpus             float64
	mem, pids, disks int64
	isolation        string
}

func (f *templateFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringArrayVarP(&f.env, "env", "e", nil, "default environment variable KEY=VALUE (repeatable)")
	fl.StringArrayVar(&f.setup, "setup", nil, "default setup command run at each boot (repeatable)")
	fl.Float64Var(&f.cpus, "cpus", 0, "default vCPUs")
	fl.Int64Var(&f.mem, "memory", 0, "default memory in MiB")
	fl.Int64Var(&f.pids, "pids", 0, "default process limit")
	fl.Int64Var(&f.disks, "disk", 0, "default disk in MiB")
	fl.StringVar(&f.isolation, "isolation", "", "default isolation of its sandboxes: container or vm")
}

func (f *templateFlags) options(entrypoint []string) (torpor.TemplateOptions, error) {
	env, err := kv("env", f.env)
	if err != nil {
		return torpor.TemplateOptions{}, err
	}
	o := torpor.TemplateOptions{Env: env, Setup: f.setup, Entrypoint: entrypoint, Isolation: f.isolation}
	if r := (torpor.Resources{VCPUs: f.cpus, MemoryMiB: f.mem, Pids: f.pids, DiskMiB: f.disks}); r != (torpor.Resources{}) {
		o.Resources = &r
	}
	return o, nil
}

// progressLine prints a line of an import's or build's progress.
func (c *cli) progressLine(line string) { fmt.Fprintln(c.stderr, line) }

func (c *cli) templateImportCmd() *cobra.Command {
	var (
		req   torpor.TemplateImportRequest
		flags templateFlags
	)
	cmd := &cobra.Command{
		Use:   "import NAME (--image REF | --oci-layout DIR | --docker-archive FILE | --rootfs DIR|TAR) [flags] [-- ENTRYPOINT...]",
		Short: "Make a template from an OCI image or a root filesystem",
		Long: `Make a template from an image in a registry, or from an OCI image layout,
a docker save tarball or a root filesystem (directory or tarball) on the
server's machine. Layers are unpacked once and shared by every template and
sandbox that uses them. Needs an admin key.`,
		Example: `  torpor template import alpine --image docker.io/library/alpine:3.20
  torpor template import app --oci-layout ./layout --tag v1 --use-image-cmd
  torpor template import app --docker-archive app.tar
  torpor template import mine --rootfs /srv/rootfs -e LANG=C.UTF-8`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Name = args[0]
			var err error
			if req.TemplateOptions, err = flags.options(args[1:]); err != nil {
				return err
			}
			for _, p := range []*string{&req.OCILayout, &req.DockerArchive, &req.RootFS} {
				if *p != "" {
					if *p, err = filepath.Abs(*p); err != nil {
						return err
					}
				}
			}
			return c.withClient(func(cl *client.Client) error {
				t, err := cl.ImportTemplate(cmd.Context(), req, c.progressLine)
				return answer(c, t, err, c.printTemplateName)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Image, "image", "", "image reference in a registry")
	f.BoolVar(&req.Insecure, "insecure", false, "allow a plain-HTTP or self-signed registry")
	f.StringVar(&req.OCILayout, "oci-layout", "", "OCI image layout directory (a path on the server)")
	f.StringVar(&req.DockerArchive, "docker-archive", "", "docker save tarball (a path on the server)")
	f.StringVar(&req.RootFS, "rootfs", "", "root filesystem directory or tarball (a path on the server)")
	f.StringVar(&req.Tag, "tag", "", "which image of an OCI layout or docker archive")
	f.BoolVar(&req.UseImageCmd, "use-image-cmd", false, "run the image's ENTRYPOINT/CMD as the sandbox's entrypoint")
	flags.add(cmd)
	return cmd
}

func (c *cli) templateBuildCmd() *cobra.Command {
	var (
		req      torpor.TemplateBuildRequest
		packages []string
		flags    templateFlags
		e2b      bool
	)
	cmd := &cobra.Command{
		Use:   "build NAME [--debian SUITE] [--packages PKG,...] [flags] [-- ENTRYPOINT...] | build --e2b [NAME...]",
		Short: "Build a Debian template with debootstrap",
		Long: `Build a minimal Debian root filesystem with debootstrap on the server, with
the packages you name, from the server's Debian mirror, and make it a
template. Progress is printed as it downloads; it takes a minute or more.
Needs an admin key, and debootstrap on the server.

--e2b builds the templates E2B programs get (e2b-base and
e2b-code-interpreter, or those named), skipping those that exist: Debian
with bash, coreutils, curl, git, python3, ca-certificates, procps, sudo and
a "user" account owning /home/user. The daemon also builds them on first
use.`,
		Example: `  torpor template build python --debian bookworm --packages python3
  torpor create --template python -- python3 -m http.server 8080
  torpor template build --e2b`,
		Args: func(cmd *cobra.Command, args []string) error {
			if e2b {
				return nil
			}
			return cobra.MinimumNArgs(1)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if e2b {
				return c.buildE2BTemplates(cmd.Context(), args)
			}
			req.Name = args[0]
			var err error
			if req.TemplateOptions, err = flags.options(args[1:]); err != nil {
				return err
			}
			for _, p := range packages {
				for _, name := range strings.Split(p, ",") {
					if name = strings.TrimSpace(name); name != "" {
						req.Packages = append(req.Packages, name)
					}
				}
			}
			return c.withClient(func(cl *client.Client) error {
				t, err := cl.BuildTemplate(cmd.Context(), req, c.progressLine)
				return answer(c, t, err, c.printTemplateName)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Debian, "debian", torpor.DefaultDebianSuite, "Debian suite")
	f.StringArrayVar(&packages, "packages", nil, "packages to install, comma-separated (repeatable)")
	f.StringVar(&req.Mirror, "mirror", "", "Debian mirror URL (default: the server's apt sources)")
	f.BoolVar(&e2b, "e2b", false, "build the templates for E2B programs (e2b-base, e2b-code-interpreter)")
	flags.add(cmd)
	return cmd
}

// buildE2BTemplates builds the E2B templates named (all when none) that
// the server does not have yet.
func (c *cli) buildE2BTemplates(ctx context.Context, names []string) error {
	if len(names) == 0 {
		for _, r := range templates.Recipes() {
			names = append(names, r.Name)
		}
	}
	return c.withClient(func(cl *client.Client) error {
		for _, name := range names {
			req, ok := templates.Recipe(name)
			if !ok {
				return torpor.Invalid("name", "%q is not an E2B template (%s or %s)", name, templates.Base, templates.CodeInterpreter)
			}
			if _, err := cl.Template(ctx, name); err == nil {
				fmt.Fprintf(c.stderr, "template %s exists\n", name)
				fmt.Fprintln(c.stdout, name)
				continue
			} else if !client.IsNotFound(err) {
				return err
			}
			t, err := cl.BuildTemplate(ctx, req, c.progressLine)
			if err := answer(c, t, err, c.printTemplateName); err != nil {
				return err
			}
		}
		return nil
	})
}

// printTemplateName names a made template.
func (c *cli) printTemplateName(t *torpor.Template) error {
	fmt.Fprintln(c.stdout, t.Name)
	return nil
}
