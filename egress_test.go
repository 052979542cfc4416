package torpor

import (
	"strings"
	"testing"
)

func TestValidateNetworkRules(t *testing.T) {
	many := make([]string, MaxNetworkRules+1)
	for i := range many {
		many[i] = "10.0.0.1"
	}
	for _, tc := range []struct {
		name      string
		in        NetworkRules
		param     string // empty: valid
		wantAllow []string
	}{
		{"address", NetworkRules{AllowOut: []string{"10.1.2.3"}}, "", []string{"10.1.2.3"}},
		{"cidr masked", NetworkRules{AllowOut: []string{"10.1.2.3/16"}}, "", []string{"10.1.0.0/16"}},
		{"mapped v4", NetworkRules{AllowOut: []string{"::ffff:10.1.2.3"}}, "", []string{"10.1.2.3"}},
		{"name canonical", NetworkRules{AllowOut: []string{"API.Example.COM."}}, "", []string{"api.example.com"}},
		{"deny only", NetworkRules{DenyOut: []string{"0.0.0.0/0"}}, "", nil},
		{"ipv6", NetworkRules{AllowOut: []string{"2001:db8::1"}}, "network.allow_out", nil},
		{"ipv6 cidr", NetworkRules{DenyOut: []string{"2001:db8::/32"}}, "network.deny_out", nil},
		{"bad cidr", NetworkRules{AllowOut: []string{"10.0.0.0/33"}}, "network.allow_out", nil},
		{"empty", NetworkRules{DenyOut: []string{""}}, "network.deny_out", nil},
		{"bad name", NetworkRules{AllowOut: []string{"exa mple.com"}}, "network.allow_out", nil},
		{"digits only", NetworkRules{AllowOut: []string{"10.1.2"}}, "network.allow_out", nil},
		{"label too long", NetworkRules{AllowOut: []string{strings.Repeat("a", 64) + ".com"}}, "network.allow_out", nil},
		{"hyphen edge", NetworkRules{AllowOut: []string{"-a.com"}}, "network.allow_out", nil},
		{"too many", NetworkRules{AllowOut: many}, "network.allow_out", nil},
		{"url", NetworkRules{AllowOut: []string{"http://example.com"}}, "network.allow_out", nil},
		{"wildcard", NetworkRules{AllowOut: []string{"*.Example.com."}}, "", []string{"*.example.com"}},
		{"wildcard of a top-level domain", NetworkRules{AllowOut: []string{"*.com"}}, "network.allow_out", nil},
		{"wildcard inside", NetworkRules{AllowOut: []string{"a.*.example.com"}}, "network.allow_out", nil},
		{"bare star", NetworkRules{DenyOut: []string{"*"}}, "network.deny_out", nil},
		{"star without dot", NetworkRules{AllowOut: []string{"*example.com"}}, "network.allow_out", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.in
			err := ValidateNetworkRules("network", &r)
			if tc.param == "" {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				if strings.Join(r.AllowOut, ",") != strings.Join(tc.wantAllow, ",") {
					t.Fatalf("allow_out %q, want %q", r.AllowOut, tc.wantAllow)
				}
				return
			}
			e, ok := err.(*Error)
			if !ok || e.Code != EInvalid || e.Param != tc.param {
				t.Fatalf("want invalid %s, got %#v", tc.param, err)
			}
		})
	}
}

func TestNetworkRulesHasNames(t *testing.T) {
	if (&NetworkRules{AllowOut: []string{"10.0.0.0/8", "1.2.3.4"}}).HasNames() {
		t.Fatal("addresses are not names")
	}
	if !(&NetworkRules{DenyOut: []string{"example.com"}}).HasNames() {
		t.Fatal("a name is a name")
	}
	if !(&NetworkRules{}).Empty() || (*NetworkRules)(nil).Clone() != nil {
		t.Fatal("empty rules")
	}
}
