package proxy

import (
	"fmt"
	"strconv"
	"strings"
)

// Ports is a set of ports, as ranges.
type Ports []PortRange

// PortRange is the ports From to To, both included.
type PortRange struct{ From, To int }

// ParsePorts reads "5432,6379,8000-8099" (spaces allowed; "" is none).
func ParsePorts(s string) (Ports, error) {
	var ps Ports
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(f, "-")
		from, err1 := strconv.Atoi(strings.TrimSpace(lo))
		to, err2 := from, error(nil)
		if isRange {
			to, err2 = strconv.Atoi(strings.TrimSpace(hi))
		}
		if err1 != nil || err2 != nil || from < 1 || to > 65535 || from > to {
			return nil, fmt.Errorf("%q is not a port (1-65535) or a range of ports such as 8000-8099", f)
		}
		ps = append(ps, PortRange{from, to})
	}
	return ps, nil
}

// Contains tells whether port is in the set.
func (ps Ports) Contains(port int) bool {
	for _, r := range ps {
		if port >= r.From && port <= r.To {
			return true
		}
	}
	return false
}

// String writes the set as ParsePorts reads it.
func (ps Ports) String() string {
	parts := make([]string, len(ps))
	for i, r := range ps {
		parts[i] = strconv.Itoa(r.From)
		if r.To != r.From {
			parts[i] += "-" + strconv.Itoa(r.To)
		}
	}
	return strings.Join(parts, ",")
}
