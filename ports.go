package torpor

import "fmt"

// PortSpec opens a port of a sandbox through the proxy. Ports are private
// unless Public: a private port needs the sandbox's traffic token.
type PortSpec struct {
	Port   int  `json:"port"`
	Public bool `json:"public"`
}

const maxPorts = 64

// ValidatePorts checks a list of port settings.
func ValidatePorts(ps []PortSpec) error {
	if len(ps) > maxPorts {
		return Invalid("ports", "at most %d ports", maxPorts)
	}
	seen := map[int]bool{}
	for i, p := range ps {
		if p.Port < 1 || p.Port > 65535 {
			return Invalid(fmt.Sprintf("ports[%d].port", i), "must be between 1 and 65535")
		}
		if seen[p.Port] {
			return Invalid(fmt.Sprintf("ports[%d].port", i), "port %d is listed twice", p.Port)
		}
		seen[p.Port] = true
	}
	return nil
}

// PortPublic reports whether a port of s is open to anyone who can reach
// the proxy.
func (s *Sandbox) PortPublic(port int) bool {
	for _, p := range s.Ports {
		if p.Port == port {
			return p.Public
		}
	}
	return false
}
