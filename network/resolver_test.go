package network

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

func TestMatchName(t *testing.T) {
	eg := EgressOf([]string{"api.example.com", "*.cdn.test", "10.0.0.0/8"}, []string{"bad.cdn.test", "*.evil.test"})
	for _, tc := range []struct {
		name string
		want NameVerdict
	}{
		{"api.example.com", NameAllowed},
		{"API.Example.COM.", NameAllowed},
		{"example.com", NameUnruled},
		{"x.api.example.com", NameUnruled}, // exact names cover only themselves
		{"a.cdn.test", NameAllowed},
		{"a.b.cdn.test", NameAllowed},
		{"cdn.test", NameUnruled}, // *.cdn.test is under cdn.test only
		{"xcdn.test", NameUnruled},
		{"bad.cdn.test", NameDenied}, // deny wins over *.cdn.test
		{"evil.test", NameUnruled},
		{"x.evil.test", NameDenied},
		{"10.1.2.3", NameUnruled},
	} {
		if got := eg.MatchName(tc.name); got != tc.want {
			t.Errorf("MatchName(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
	if !eg.HasNames() || EgressOf([]string{"10.0.0.0/8"}, nil).HasNames() {
		t.Error("HasNames")
	}
	if !slices.Equal(eg.AllowNames, []string{"api.example.com", "*.cdn.test"}) || len(eg.Allow) != 1 {
		t.Errorf("EgressOf split %+v", eg)
	}
}

// fakeUpstream answers A queries from zone on a local UDP port and counts
// the queries it gets.
func fakeUpstream(t *testing.T, zone map[string][]netip.Addr) (string, *int) {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	var mu sync.Mutex
	count := new(int)
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			mu.Lock()
			*count++
			mu.Unlock()
			var p dnsmessage.Parser
			h, err := p.Start(buf[:n])
			if err != nil {
				continue
			}
			q, err := p.Question()
			if err != nil {
				continue
			}
			addrs, ok := zone[strings.ToLower(q.Name.String())]
			rc := dnsmessage.RCodeSuccess
			if !ok {
				rc = dnsmessage.RCodeNameError
			}
			b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, RCode: rc})
			b.StartQuestions()
			b.Question(q)
			b.StartAnswers()
			if q.Type == dnsmessage.TypeA {
				for _, a := range addrs {
					b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AResource{A: a.As4()})
				}
			}
			out, _ := b.Finish()
			pc.WriteTo(out, from)
		}
	}()
	return pc.LocalAddr().String(), count
}

func query(t *testing.T, id uint16, name string, typ dnsmessage.Type) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	b.StartQuestions()
	if err := b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}); err != nil {
		t.Fatal(err)
	}
	out, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

type learned struct {
	src   netip.Addr
	name  string
	addrs []netip.Addr
	deny  bool
}

// TestResolverAnswers: an allowed name's addresses are learned before the
// answer; a denied one's are learned as denied and it is answered
// REFUSED; an unruled name is forwarded and nothing is learned; a
// sandbox without name rules is refused; answers are cached.
func TestResolverAnswers(t *testing.T) {
	allowedA, deniedA := netip.MustParseAddr("198.18.0.2"), netip.MustParseAddr("198.18.0.6")
	up, count := fakeUpstream(t, map[string][]netip.Addr{
		"allowed.test.": {allowedA},
		"denied.test.":  {deniedA},
		"other.test.":   {netip.MustParseAddr("198.18.0.10")},
	})
	sb, stranger := netip.MustParseAddr("10.213.0.5"), netip.MustParseAddr("10.213.0.6")
	eg := EgressOf([]string{"allowed.test"}, []string{"denied.test"})
	var got []learned
	r := &Resolver{
		Upstreams: []string{up},
		Rules: func(src netip.Addr) (*Egress, bool) {
			if src == sb {
				return eg, true
			}
			return nil, false
		},
		Learn: func(src netip.Addr, name string, addrs []netip.Addr, deny bool) error {
			got = append(got, learned{src, name, addrs, deny})
			return nil
		},
	}
	ctx := context.Background()
	answer := func(src netip.Addr, id uint16, name string, typ dnsmessage.Type) (dnsmessage.Header, []netip.Addr) {
		t.Helper()
		resp := r.Answer(ctx, src, query(t, id, name, typ))
		if resp == nil {
			t.Fatalf("no answer to %s", name)
		}
		var p dnsmessage.Parser
		h, err := p.Start(resp)
		if err != nil {
			t.Fatal(err)
		}
		if h.ID != id || !h.Response {
			t.Fatalf("answer to %s has ID %d (want %d), response %v", name, h.ID, id, h.Response)
		}
		p.SkipAllQuestions()
		var addrs []netip.Addr
		for {
			rh, err := p.AnswerHeader()
			if err != nil {
				break
			}
			if rh.Type == dnsmessage.TypeA {
				a, _ := p.AResource()
				addrs = append(addrs, netip.AddrFrom4(a.A))
			} else {
				p.SkipAnswer()
			}
		}
		return h, addrs
	}

	h, addrs := answer(sb, 7, "Allowed.Test.", dnsmessage.TypeA)
	if h.RCode != dnsmessage.RCodeSuccess || !slices.Equal(addrs, []netip.Addr{allowedA}) {
		t.Fatalf("allowed.test: %v %v", h.RCode, addrs)
	}
	if len(got) != 1 || got[0].name != "allowed.test" || got[0].deny || !slices.Equal(got[0].addrs, []netip.Addr{allowedA}) {
		t.Fatalf("learned %+v", got)
	}
	h, addrs = answer(sb, 8, "denied.test.", dnsmessage.TypeA)
	if h.RCode != dnsmessage.RCodeRefused || len(addrs) != 0 {
		t.Fatalf("denied.test: %v %v", h.RCode, addrs)
	}
	if len(got) != 2 || got[1].name != "denied.test" || !got[1].deny || !slices.Equal(got[1].addrs, []netip.Addr{deniedA}) {
		t.Fatalf("learned %+v", got)
	}
	h, addrs = answer(sb, 9, "other.test.", dnsmessage.TypeA)
	if h.RCode != dnsmessage.RCodeSuccess || len(addrs) != 1 || len(got) != 2 {
		t.Fatalf("other.test: %v %v, learned %+v", h.RCode, addrs, got)
	}
	if h, _ := answer(stranger, 10, "allowed.test.", dnsmessage.TypeA); h.RCode != dnsmessage.RCodeRefused {
		t.Fatalf("a sandbox without name rules: %v", h.RCode)
	}
	// NXDOMAIN passes through, and nothing is learned.
	if h, _ := answer(sb, 11, "missing.test.", dnsmessage.TypeA); h.RCode != dnsmessage.RCodeNameError || len(got) != 2 {
		t.Fatalf("missing.test: %v, learned %+v", h.RCode, got)
	}
	// The cache answers again, under the new ID, and still learns.
	before := *count
	if h, addrs := answer(sb, 12, "Allowed.Test.", dnsmessage.TypeA); h.RCode != dnsmessage.RCodeSuccess || len(addrs) != 1 {
		t.Fatalf("cached: %v %v", h.RCode, addrs)
	}
	if *count != before || len(got) != 3 {
		t.Fatalf("a cached answer went upstream (%d → %d) or was not learned (%d)", before, *count, len(got))
	}
	// Not a query: no answer; two questions: FORMERR.
	if r.Answer(ctx, sb, []byte{1, 2, 3}) != nil {
		t.Fatal("garbage answered")
	}
}

// TestResolverUpstreamDown: a name whose upstream does not answer gets
// SERVFAIL, and nothing is learned.
func TestResolverUpstreamDown(t *testing.T) {
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close() // reads nothing: every query times out
	eg := EgressOf([]string{"allowed.test"}, nil)
	r := &Resolver{Upstreams: []string{pc.LocalAddr().String()}, Timeout: 50e6,
		Rules: func(netip.Addr) (*Egress, bool) { return eg, true },
		Learn: func(netip.Addr, string, []netip.Addr, bool) error { t.Fatal("learned"); return nil }}
	resp := r.Answer(context.Background(), netip.MustParseAddr("10.213.0.5"), query(t, 3, "allowed.test.", dnsmessage.TypeA))
	var p dnsmessage.Parser
	if h, err := p.Start(resp); err != nil || h.RCode != dnsmessage.RCodeServerFailure {
		t.Fatalf("%v %v", h.RCode, err)
	}
}

// TestLearnedElems: deny wins; learned addresses of names the rules no
// longer cover join neither set.
func TestLearnedElems(t *testing.T) {
	eg := EgressOf([]string{"*.test"}, []string{"denied.test"})
	a, b := netip.MustParseAddr("198.18.0.2"), netip.MustParseAddr("198.18.0.6")
	eg.Learned = []Learned{{"allowed.test", a}, {"alias.test", b}, {"denied.test", b}, {"gone.example", a}}
	allow, deny := learnedElems(eg)
	if len(allow) != 2 || len(deny) != 1 || netip.AddrFrom4([4]byte(deny[0].Key)) != b {
		t.Fatalf("allow %v deny %v", allow, deny)
	}
}
