package template

import (
	"net"
	"regexp"
	"strings"
)

// addrPattern finds what may be an IP address in a message, with a port:
// dotted IPv4, IPv6 in brackets, and bare IPv6 (checked by net.ParseIP,
// since times and digests have colons too).
var addrPattern = regexp.MustCompile(`\[[0-9A-Fa-f:.%]+\](?::\d+)?|(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?|[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?:%\w+)?`)

// hideAddrs replaces the IP addresses in msg, an error from a library or
// a tool, with "(address)", except those the request itself named in one
// of given: a registry, mirror or resolver address the server found by
// itself is its own business, not the caller's.
func hideAddrs(msg string, given ...string) string {
	return addrPattern.ReplaceAllStringFunc(msg, func(m string) string {
		ip := m
		if h, _, err := net.SplitHostPort(m); err == nil {
			ip = h
		}
		ip = strings.Trim(ip, "[]")
		if i := strings.IndexByte(ip, '%'); i >= 0 {
			ip = ip[:i]
		}
		if net.ParseIP(ip) == nil {
			return m
		}
		for _, g := range given {
			if strings.Contains(g, ip) {
				return m
			}
		}
		return "(address)"
	})
}
