package main

import (
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/files"
)

// filesCmd groups the commands on a sandbox's files (docs/files.md).
func (c *cli) filesCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "files",
		Short: "Read, write and manage the files of a sandbox",
		Long: `Read, write and manage the files of a sandbox. Paths are sandbox paths
("/root/x"). Reading the files of a paused sandbox does not wake it;
writing wakes it when its auto-resume is on.`,
	}
	cmd.AddCommand(c.filesLsCmd(), c.filesCatCmd(), c.filesPutCmd(), c.filesStatCmd(),
		c.filesMkdirCmd(), c.filesMvCmd(), c.filesRmCmd())
	return cmd
}

func (c *cli) filesLsCmd() *cobra.Command {
	var depth int
	cmd := &cobra.Command{
		Use:   "ls ID [PATH]",
		Short: "List a directory (default /)",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			p := "/"
			if len(args) == 2 {
				p = args[1]
			}
			return c.withClient(func(cl *client.Client) error {
				l, err := cl.ListFiles(cmd.Context(), args[0], p, depth)
				return answer(c, l, err, func(l *client.FileList) error {
					c.printFiles(l.Entries)
					if l.Truncated {
						fmt.Fprintf(c.stderr, "torpor: the listing was cut at %d entries\n", len(l.Entries))
					}
					return nil
				})
			})
		},
	}
	cmd.Flags().IntVarP(&depth, "depth", "d", 1, fmt.Sprintf("levels to list (1..%d)", files.MaxDepth))
	return cmd
}

// printFiles lists files, one a row.
func (c *cli) printFiles(infos []client.FileInfo) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TYPE\tMODE\tSIZE\tMODIFIED\tPATH")
	for _, f := range infos {
		name := f.Path
		if f.Type == files.TypeSymlink {
			name += " -> " + f.LinkTarget
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", f.Type, f.Mode, f.Size, f.ModTime.Local().Format(time.DateTime), name)
	}
	tw.Flush()
	return nil
}

// eachPath runs f on each path of an `ID PATH...` command in turn and
// stops at the first error, which names its path.
func eachPath(paths []string, f func(p string) error) error {
	for _, p := range paths {
		if err := f(p); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

func (c *cli) filesCatCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "cat ID PATH...",
		Short: "Print files",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				return eachPath(args[1:], func(p string) error {
					rc, err := cl.ReadFile(cmd.Context(), args[0], p)
					if err != nil {
						return err
					}
					defer rc.Close()
					_, err = io.Copy(c.stdout, rc)
					return err
				})
			})
		},
	}
}

func (c *cli) filesPutCmd() *cobra.Command {
	var mode string
	cmd := &cobra.Command{
		Use:   "put ID PATH [LOCAL_FILE]",
		Short: "Write a file from a local file or standard input (made atomically, parents made)",
		Args:  cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := writeOptions(mode)
			if err != nil {
				return err
			}
			var src io.Reader = c.stdin
			if len(args) == 3 && args[2] != "-" {
				f, err := os.Open(args[2])
				if err != nil {
					return err
				}
				defer f.Close()
				src = f
			}
			return c.withClient(func(cl *client.Client) error {
				info, err := cl.WriteFile(cmd.Context(), args[0], args[1], src, o)
				return answer(c, info, err, nil)
			})
		},
	}
	cmd.Flags().StringVar(&mode, "mode", "", "permission bits in octal, e.g. 0755 (default: kept, or 0644)")
	return cmd
}

// writeOptions turns a --mode flag into write options.
func writeOptions(mode string) (*client.WriteOptions, error) {
	if mode == "" {
		return nil, nil
	}
	m, err := files.ParseMode("mode", mode)
	if err != nil {
		return nil, err
	}
	return &client.WriteOptions{Mode: &m}, nil
}

func (c *cli) filesStatCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "stat ID PATH...",
		Short: "Describe files (a symlink itself, with its target)",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				var infos []client.FileInfo
				err := eachPath(args[1:], func(p string) error {
					info, err := cl.StatFile(cmd.Context(), args[0], p)
					if err == nil {
						infos = append(infos, *info)
					}
					return err
				})
				if err != nil {
					return err
				}
				if c.json && len(infos) == 1 {
					// One path is answered with an object, several with a list.
					return c.printJSON(infos[0])
				}
				return show(c, infos, c.printFiles)
			})
		},
	}
}

func (c *cli) filesMkdirCmd() *cobra.Command {
	var (
		parents bool
		mode    string
	)
	cmd := &cobra.Command{
		Use:   "mkdir ID PATH...",
		Short: "Make directories",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			o := &client.MkdirOptions{Parents: parents}
			if mode != "" {
				m, err := files.ParseMode("mode", mode)
				if err != nil {
					return err
				}
				o.Mode = &m
			}
			return c.withClient(func(cl *client.Client) error {
				return eachPath(args[1:], func(p string) error {
					_, err := cl.Mkdir(cmd.Context(), args[0], p, o)
					return err
				})
			})
		},
	}
	cmd.Flags().BoolVarP(&parents, "parents", "p", false, "make missing parents; an existing directory is fine")
	cmd.Flags().StringVar(&mode, "mode", "", "permission bits in octal (default 0755)")
	return cmd
}

func (c *cli) filesMvCmd() *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "mv ID FROM TO",
		Short: "Rename or move a file or directory",
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				info, err := cl.Rename(cmd.Context(), args[0], args[1], args[2], force)
				return answer(c, info, err, nil)
			})
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "replace an existing TO")
	return cmd
}

func (c *cli) filesRmCmd() *cobra.Command {
	var recursive bool
	cmd := &cobra.Command{
		Use:   "rm ID PATH...",
		Short: "Remove files, symlinks and empty directories (-r: trees)",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				return eachPath(args[1:], func(p string) error {
					return cl.RemoveFile(cmd.Context(), args[0], p, recursive)
				})
			})
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "remove directories and everything in them")
	return cmd
}
