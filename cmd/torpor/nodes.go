package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
	"github.com/torpor-dev/torpor/client"
)

// drainPoll is how often torpor nodes drain asks how the drain goes.
const drainPoll = 500 * time.Millisecond

// nodesCmd lists the fleet's nodes (docs/fleet.md) and drains or undrains
// one.
func (c *cli) nodesCmd() *cobra.Command {
	list := func(cmd *cobra.Command, args []string) error {
		return c.withClient(func(cl *client.Client) error {
			nodes, err := cl.Nodes(cmd.Context())
			return answer(c, nodes, err, c.printNodes)
		})
	}
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "List the fleet's nodes: state, capacity and sandboxes (admin)",
		Args:  cobra.NoArgs,
		RunE:  list,
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "ls",
		Short: "List the fleet's nodes (as torpor nodes)",
		Args:  cobra.NoArgs,
		RunE:  list,
	})
	var wait bool
	drain := &cobra.Command{
		Use:   "drain NAME",
		Short: "Move a node's sandboxes to other nodes and give it no new ones (admin)",
		Long: `Drain asks node NAME to move its sandboxes to other nodes and to take no
new ones, then shows how many it still holds until it holds none. Stopping
the wait (Ctrl-C, or --wait=false) does not stop the drain; undrain does.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				n, err := cl.DrainNode(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				if wait {
					if n, err = c.waitDrained(cmd.Context(), cl, n); err != nil {
						return err
					}
				}
				return show(c, n, c.printNode)
			})
		},
	}
	drain.Flags().BoolVar(&wait, "wait", true, "wait until the node holds no sandboxes, showing the count on stderr")
	cmd.AddCommand(drain)
	cmd.AddCommand(&cobra.Command{
		Use:   "undrain NAME",
		Short: "Let a draining node take sandboxes again (admin)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.withClient(func(cl *client.Client) error {
				n, err := cl.UndrainNode(cmd.Context(), args[0])
				return answer(c, n, err, c.printNode)
			})
		},
	})
	return cmd
}

// waitDrained follows node n until it holds no sandboxes (wire.Node.Held),
// showing what it still holds on one line of stderr. A node that stops
// draining (undrained, or declared down) ends the wait with an error.
func (c *cli) waitDrained(ctx context.Context, cl *client.Client, n *wire.Node) (*wire.Node, error) {
	line := c.statusLine()
	defer line.end()
	for {
		if n.Held() == 0 {
			line.set(fmt.Sprintf("Draining %s: no sandboxes left", n.Name))
			return n, nil
		}
		line.set(fmt.Sprintf("Draining %s: %s left", n.Name, heldString(n.Sandboxes)))
		if n.State != torpor.NodeDraining {
			return nil, fmt.Errorf("node %s is %s, no longer draining, and still holds %s", n.Name, n.State, heldString(n.Sandboxes))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(drainPoll):
		}
		nodes, err := cl.Nodes(ctx)
		if err != nil {
			return nil, err
		}
		var found *wire.Node
		for i := range nodes {
			if nodes[i].Name == n.Name {
				found = &nodes[i]
			}
		}
		if found == nil {
			return nil, fmt.Errorf("node %s left the fleet while draining", n.Name)
		}
		n = found
	}
}

// heldString says how many sandboxes a node holds in each state a drain
// moves, e.g. "2 running, 1 hibernated".
func heldString(counts map[torpor.State]int) string {
	var parts []string
	for _, st := range torpor.AllStates {
		if n := counts[st]; n > 0 && st != torpor.StateTerminated && st != torpor.StateFailed {
			parts = append(parts, fmt.Sprintf("%d %s", n, st))
		}
	}
	if len(parts) == 0 {
		return "no sandboxes"
	}
	return strings.Join(parts, ", ")
}

// printNode shows one node as a table of one row.
func (c *cli) printNode(n *wire.Node) error { return c.printNodes([]wire.Node{*n}) }

// printNodes lists nodes, one a row: the answering node's name is marked
// with a '*'.
func (c *cli) printNodes(nodes []wire.Node) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tADDRESS\tCPU\tMEM MiB\tSANDBOXES R/P/H\tHEARTBEAT\tGPUS (VRAM MiB)\tHOST")
	for _, n := range nodes {
		name := n.Name
		if n.Self {
			name += " *"
		}
		addr := n.Address
		if addr == "" {
			addr = "-"
		}
		heartbeat := "-"
		if !n.HeartbeatAt.IsZero() {
			heartbeat = ago(n.HeartbeatAt)
		}
		host := n.Host
		if host == "" {
			host = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d/%d/%d\t%s\t%s\t%s\n", name, n.State, addr,
			usedOf(n.Used.VCPUs, n.Capacity.VCPUs), usedOf(float64(n.Used.MemoryMiB), float64(n.Capacity.MemoryMiB)),
			n.Sandboxes[torpor.StateRunning], n.Sandboxes[torpor.StatePaused], n.Sandboxes[torpor.StateHibernated]+n.Sandboxes[torpor.StateArchived],
			heartbeat, gpusString(n.GPUs), host)
	}
	return tw.Flush()
}

// gpusString shows a node's GPUs as count and model, and the VRAM its GPU
// leases hold of all of it, e.g. "2 H100 (4096/163840)"; "-" for none.
func gpusString(g torpor.NodeGPUs) string {
	if g.Count == 0 {
		return "-"
	}
	model := ""
	if g.Model != "" {
		model = " " + g.Model
	}
	return fmt.Sprintf("%d%s (%d/%d)", g.Count, model, g.UsedVRAMMiB, g.VRAMMiB)
}

// statusLine is one line of a long verb's progress on stderr that each
// set replaces: in place at a terminal, elsewhere (a pipe, a log) as a new
// line each time it changes. With --json it shows nothing, as progress.
type statusLine struct {
	w    io.Writer
	tty  bool
	last string
}

func (c *cli) statusLine() *statusLine {
	if c.json {
		return &statusLine{}
	}
	s := &statusLine{w: c.stderr}
	if f, ok := c.stderr.(*os.File); ok {
		st, err := f.Stat()
		s.tty = err == nil && st.Mode()&os.ModeCharDevice != 0
	}
	return s
}

func (s *statusLine) set(line string) {
	if s.w == nil || line == s.last {
		return
	}
	s.last = line
	if s.tty {
		// Back to the line's start, the new text, and clear what the old
		// one left beyond it.
		fmt.Fprintf(s.w, "\r%s\x1b[K", line)
		return
	}
	fmt.Fprintln(s.w, line)
}

// end ends the line at a terminal, so that what follows starts on its own.
func (s *statusLine) end() {
	if s.w != nil && s.tty && s.last != "" {
		fmt.Fprintln(s.w)
	}
}

// nodeString names the node that owns a sandbox, with its epoch then;
// one that no node owns has its state in the object store, where a node
// that fits it takes it: one with room, its node labels and its GPUs, and
// for a VM snapshot one of the host that made it.
func nodeString(sb *torpor.Sandbox) string {
	switch {
	case sb.Node != "":
		return fmt.Sprintf("%s (epoch %d)", sb.Node, sb.NodeEpoch)
	case sb.Durability == torpor.DurabilityRemote && sb.Remote != nil && sb.Remote.Host != "":
		return fmt.Sprintf("none: its VM snapshot is in the object store; the next request resumes it on a node of the same host (%s) with room", sb.Remote.Host)
	case sb.Durability == torpor.DurabilityRemote:
		return "none: its disk is in the object store; the next request starts it on a node with room" + fitsString(sb)
	}
	return "-"
}

// fitsString says what else a released sandbox asks of the node that
// starts it: its create's node labels and GPUs.
func fitsString(sb *torpor.Sandbox) string {
	var parts []string
	if len(sb.NodeLabels) > 0 {
		parts = append(parts, "its node labels")
	}
	if sb.Accel != nil {
		parts = append(parts, fmt.Sprintf("%d GPU(s) with %d MiB of VRAM free", max(sb.Accel.GPUs, 1), sb.Accel.VRAMMiB))
	}
	if len(parts) == 0 {
		return ""
	}
	return " and " + strings.Join(parts, " and ")
}
