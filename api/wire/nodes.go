package wire

import "github.com/torpor-dev/torpor"

// Node is a fleet node as GET /v1/nodes shows it: the node, what it has
// left to lend, and whether it is the node that answered.
type Node struct {
	torpor.Node
	// Free is Capacity less Used, field by field, never below 0 (a node
	// may hold more than it lends while paused sandboxes resume).
	Free torpor.Resources `json:"free"`
	// Self is true for the node that answered the request.
	Self bool `json:"self"`
}

// NodeList is the body of GET /v1/nodes.
type NodeList struct {
	Nodes []Node `json:"nodes"`
}

// NewNode is n as the API shows it; self says n is the node answering.
// Empty maps and lists are shown as such rather than as null, so that a
// script can index them.
func NewNode(n torpor.Node, self bool) Node {
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	if n.Runtimes == nil {
		n.Runtimes = []string{}
	}
	if n.Sandboxes == nil {
		n.Sandboxes = map[torpor.State]int{}
	}
	return Node{Node: n, Free: free(n.Capacity, n.Used), Self: self}
}

// free is capacity less used, each field at least 0.
func free(capacity, used torpor.Resources) torpor.Resources {
	return torpor.Resources{
		VCPUs:     max(0, capacity.VCPUs-used.VCPUs),
		MemoryMiB: max(0, capacity.MemoryMiB-used.MemoryMiB),
		Pids:      max(0, capacity.Pids-used.Pids),
		DiskMiB:   max(0, capacity.DiskMiB-used.DiskMiB),
	}
}

// Held counts the sandboxes a node still holds by state: every state but
// terminated and failed, which a drain does not move. A drain is over when
// it is 0.
func (n Node) Held() int {
	total := 0
	for st, c := range n.Sandboxes {
		if st != torpor.StateTerminated && st != torpor.StateFailed {
			total += c
		}
	}
	return total
}
