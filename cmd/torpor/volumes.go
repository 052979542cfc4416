package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

func (c *cli) volumesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "volumes",
		Aliases: []string{"volume", "vol"},
		Short:   "Keep this tenant's persistent volumes, which sandboxes mount with --volume",
		Long: `Keep this tenant's volumes: named file systems of a fixed size that
outlive the sandboxes that mount them (torpor create --volume NAME:/PATH).
Their files are read and written without a sandbox through
/v1/volumes/NAME/files. See docs/volumes.md.`,
	}
	cmd.AddCommand(&cobra.Command{
		Use:     "create NAME SIZE_MIB",
		Short:   "Create a volume of SIZE_MIB mebibytes",
		Example: `  torpor volumes create data 1024`,
		Args:    cobra.ExactArgs(2),
		RunE:    c.sizedVolume((*client.Client).CreateVolume),
	}, &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List volumes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				vs, err := cl.ListVolumes(cmd.Context())
				if vs == nil {
					vs = []torpor.Volume{}
				}
				return answer(c, vs, err, c.printVolumes)
			})
		},
	}, &cobra.Command{
		Use:   "get NAME",
		Short: "Show a volume: size, space used, the sandboxes that mount it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				v, err := cl.GetVolume(cmd.Context(), args[0])
				return answer(c, v, err, func(v *torpor.Volume) error {
					return c.printVolumes([]torpor.Volume{*v})
				})
			})
		},
	}, &cobra.Command{
		Use:     "resize NAME SIZE_MIB",
		Short:   "Grow a volume to SIZE_MIB mebibytes (volumes never shrink)",
		Example: `  torpor volumes resize data 4096`,
		Args:    cobra.ExactArgs(2),
		RunE:    c.sizedVolume((*client.Client).ResizeVolume),
	}, &cobra.Command{
		Use:     "rm NAME",
		Aliases: []string{"delete"},
		Short:   "Remove a volume and its files (refused while a sandbox mounts it)",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				return cl.DeleteVolume(cmd.Context(), args[0])
			})
		},
	})
	return cmd
}

func parseMiB(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("size %q: want a whole number of MiB", s)
	}
	return n, nil
}

func (c *cli) printVolumes(vs []torpor.Volume) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSIZE_MIB\tUSED_MIB\tMOUNTED_BY\tCREATED")
	for _, v := range vs {
		used, by := "-", "-"
		if v.UsedBytes != nil {
			used = strconv.FormatFloat(float64(*v.UsedBytes)/(1<<20), 'f', 1, 64)
		}
		if len(v.MountedBy) > 0 {
			by = strings.Join(v.MountedBy, ",")
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", v.Name, v.SizeMiB, used, by, v.CreatedAt.Local().Format(time.DateTime))
	}
	return tw.Flush()
}

// parseVolumeMounts reads create's --volume flags: NAME:/PATH, or
// NAME:/PATH:ro for a read-only mount.
func parseVolumeMounts(flags []string) ([]torpor.VolumeMount, error) {
	var ms []torpor.VolumeMount
	for _, f := range flags {
		parts := strings.Split(f, ":")
		if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
			return nil, fmt.Errorf("--volume %q: want NAME:/PATH or NAME:/PATH:ro", f)
		}
		m := torpor.VolumeMount{Name: parts[0], Path: parts[1]}
		if len(parts) == 3 {
			switch parts[2] {
			case "ro":
				m.ReadOnly = true
			case "rw":
			default:
				return nil, fmt.Errorf("--volume %q: %q is neither ro nor rw", f, parts[2])
			}
		}
		ms = append(ms, m)
	}
	return ms, nil
}

// sizedVolume runs a verb of NAME SIZE_MIB (create, resize) and prints
// the volume's name and size.
func (c *cli) sizedVolume(call func(*client.Client, context.Context, string, int64) (*torpor.Volume, error)) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		size, err := parseMiB(args[1])
		if err != nil {
			return err
		}
		return c.withClient(func(cl *client.Client) error {
			v, err := call(cl, cmd.Context(), args[0], size)
			return answer(c, v, err, func(v *torpor.Volume) error {
				fmt.Fprintf(c.stdout, "%s %d MiB\n", v.Name, v.SizeMiB)
				return nil
			})
		})
	}
}
