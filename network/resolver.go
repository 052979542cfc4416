package network

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"golang.org/x/net/dns/dnsmessage"
)

// NameVerdict is what a sandbox's rules say of a host name.
type NameVerdict int

const (
	// NameUnruled: no rule names it; the sandbox's other rules decide
	// where its addresses may be reached.
	NameUnruled NameVerdict = iota
	// NameAllowed: an allow_out name matches it and no deny_out name.
	NameAllowed
	// NameDenied: a deny_out name matches it (deny wins).
	NameDenied
)

// nameMatches reports whether rule covers name (both in lower case,
// without a trailing dot): "example.com" only itself, "*.example.com"
// every name under example.com but not example.com itself.
func nameMatches(rule, name string) bool {
	if suffix, ok := strings.CutPrefix(rule, "*"); ok {
		return strings.HasPrefix(suffix, ".") && len(name) > len(suffix) && strings.HasSuffix(name, suffix)
	}
	return rule == name
}

// MatchName says what eg's rules say of name (any case, a trailing dot
// or not). Deny wins over allow.
func (eg *Egress) MatchName(name string) NameVerdict {
	if eg == nil {
		return NameUnruled
	}
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	for _, r := range eg.DenyNames {
		if nameMatches(r, name) {
			return NameDenied
		}
	}
	for _, r := range eg.AllowNames {
		if nameMatches(r, name) {
			return NameAllowed
		}
	}
	return NameUnruled
}

// Resolver is the DNS resolver torpor runs for the sandboxes with host
// name rules (docs/egress.md). It answers queries over UDP, forwarding
// them to Upstreams; before it answers an allowed name, Learn has put the
// answer's IPv4 addresses in the sandbox's allow set, so a sandbox
// reaches a name's addresses only through torpor's own lookup of it. A
// denied name is looked up too, its addresses learned as denied, and
// answered REFUSED.
type Resolver struct {
	// Upstreams are the resolvers queries go to ("host:port"), tried in
	// order.
	Upstreams []string
	// Rules returns the egress rules of the sandbox at src; false when
	// there is none with host name rules there (its queries are refused).
	Rules func(src netip.Addr) (*Egress, bool)
	// Learn records the addresses answered for name to the sandbox at
	// src (deny: for a denied name), in the kernel, before the answer
	// goes.
	Learn func(src netip.Addr, name string, addrs []netip.Addr, deny bool) error
	Log   *slog.Logger
	// Timeout bounds one upstream exchange (default 2s).
	Timeout time.Duration

	once  sync.Once
	sem   chan struct{}
	cache *answerCache
}

// MaxInFlight bounds the queries a Resolver handles at once; more are
// dropped (the client retries).
const MaxInFlight = 64

// maxCached bounds the answers the resolver caches; maxCacheTTL and
// negativeTTL how long it keeps one.
const (
	maxCached   = 4096
	maxCacheTTL = 5 * time.Minute
	negativeTTL = 30 * time.Second
)

func (r *Resolver) init() {
	r.once.Do(func() {
		r.sem = make(chan struct{}, MaxInFlight)
		r.cache = &answerCache{m: map[string]cached{}}
		if r.Log == nil {
			r.Log = slog.Default()
		}
		if r.Timeout <= 0 {
			r.Timeout = 2 * time.Second
		}
	})
}

// Serve answers the queries that arrive on pc until it is closed.
func (r *Resolver) Serve(pc net.PacketConn) error {
	r.init()
	buf := make([]byte, 65535)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		ua, ok := from.(*net.UDPAddr)
		if !ok {
			continue
		}
		src, _ := netip.AddrFromSlice(ua.IP)
		q := append([]byte(nil), buf[:n]...)
		select {
		case r.sem <- struct{}{}:
		default:
			continue // too many in flight: dropped, the client retries
		}
		go func() {
			defer func() { <-r.sem }()
			ctx, cancel := context.WithTimeout(context.Background(), 2*r.Timeout)
			defer cancel()
			if resp := r.Answer(ctx, src.Unmap(), q); resp != nil {
				_, _ = pc.WriteTo(resp, from)
			}
		}()
	}
}

// Answer returns the answer to the query q from the sandbox at src (nil:
// none, for a packet that is not a query).
func (r *Resolver) Answer(ctx context.Context, src netip.Addr, q []byte) []byte {
	r.init()
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil || h.Response {
		return nil
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 || h.OpCode != 0 {
		return refusal(h, qs, dnsmessage.RCodeFormatError)
	}
	question := qs[0]
	eg, ok := r.Rules(src)
	if !ok {
		return refusal(h, qs, dnsmessage.RCodeRefused)
	}
	name := strings.ToLower(strings.TrimSuffix(question.Name.String(), "."))
	verdict := eg.MatchName(name)
	resp, err := r.forward(ctx, q)
	if err != nil {
		r.Log.Warn("network: resolver: upstream", "name", strconv.Quote(name), "sandbox", src, "err", err)
		if verdict == NameDenied {
			return refusal(h, qs, dnsmessage.RCodeRefused)
		}
		return refusal(h, qs, dnsmessage.RCodeServerFailure)
	}
	if verdict != NameUnruled && question.Class == dnsmessage.ClassINET {
		addrs := answerAddrs(resp)
		if len(addrs) > 0 {
			if err := r.Learn(src, name, addrs, verdict == NameDenied); err != nil {
				r.Log.Warn("network: resolver: learning an answer", "name", strconv.Quote(name), "sandbox", src, "err", err)
				if verdict == NameAllowed {
					return refusal(h, qs, dnsmessage.RCodeServerFailure)
				}
			}
		}
	}
	if verdict == NameDenied {
		return refusal(h, qs, dnsmessage.RCodeRefused)
	}
	resp[0], resp[1] = byte(h.ID>>8), byte(h.ID)
	return resp
}

// refusal is an answer of rcode alone to a query.
func refusal(h dnsmessage.Header, qs []dnsmessage.Question, rcode dnsmessage.RCode) []byte {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode,
		RecursionDesired: h.RecursionDesired, RecursionAvailable: true, RCode: rcode})
	if len(qs) == 1 {
		_ = b.StartQuestions()
		_ = b.Question(qs[0])
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// answerAddrs are the IPv4 addresses of the A records of a successful
// answer (those of a CNAME's target included: they are what the name
// reaches).
func answerAddrs(resp []byte) []netip.Addr {
	var p dnsmessage.Parser
	h, err := p.Start(resp)
	if err != nil || h.RCode != dnsmessage.RCodeSuccess {
		return nil
	}
	if err := p.SkipAllQuestions(); err != nil {
		return nil
	}
	var out []netip.Addr
	for {
		rh, err := p.AnswerHeader()
		if err != nil {
			return out
		}
		if rh.Type != dnsmessage.TypeA || rh.Class != dnsmessage.ClassINET {
			if err := p.SkipAnswer(); err != nil {
				return out
			}
			continue
		}
		a, err := p.AResource()
		if err != nil {
			return out
		}
		out = append(out, netip.AddrFrom4(a.A))
	}
}

// forward sends q to the upstreams (from the cache when it can) and
// returns the first answer that matches it, with q's ID.
func (r *Resolver) forward(ctx context.Context, q []byte) ([]byte, error) {
	key := string(q[2:])
	if resp, ok := r.cache.get(key); ok {
		return resp, nil
	}
	if len(r.Upstreams) == 0 {
		return nil, errors.New("no upstream resolver")
	}
	var errs []error
	for _, up := range r.Upstreams {
		resp, err := r.exchange(ctx, up, q)
		if err == nil {
			r.cache.put(key, resp)
			return resp, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", up, err))
	}
	return nil, errors.Join(errs...)
}

// exchange asks one upstream, under a fresh ID, and checks that the
// answer is to the same question.
func (r *Resolver) exchange(ctx context.Context, up string, q []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, r.Timeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp", up)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	out := append([]byte(nil), q...)
	var id [2]byte
	_, _ = rand.Read(id[:])
	out[0], out[1] = id[0], id[1]
	if _, err := c.Write(out); err != nil {
		return nil, err
	}
	buf := make([]byte, 65535)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return nil, err
		}
		resp := buf[:n]
		if n < 12 || resp[0] != id[0] || resp[1] != id[1] || !sameQuestion(q, resp) {
			continue // stray or forged: keep waiting until the deadline
		}
		return append([]byte(nil), resp...), nil
	}
}

// sameQuestion reports whether resp is an answer to q's question.
func sameQuestion(q, resp []byte) bool {
	var pq, pr dnsmessage.Parser
	if _, err := pq.Start(q); err != nil {
		return false
	}
	h, err := pr.Start(resp)
	if err != nil || !h.Response {
		return false
	}
	a, err1 := pq.Question()
	b, err2 := pr.Question()
	return err1 == nil && err2 == nil && a.Type == b.Type && a.Class == b.Class &&
		strings.EqualFold(a.Name.String(), b.Name.String())
}

// answerCache keeps upstream answers by query (less its ID), for their
// shortest TTL (at most maxCacheTTL; negativeTTL without records), at
// most maxCached of them. The TTLs of a cached answer are not counted
// down.
type answerCache struct {
	mu sync.Mutex
	m  map[string]cached
}

type cached struct {
	resp    []byte
	expires time.Time
}

func (c *answerCache) get(key string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok || time.Now().After(e.expires) {
		delete(c.m, key)
		return nil, false
	}
	return append([]byte(nil), e.resp...), true
}

func (c *answerCache) put(key string, resp []byte) {
	ttl := answerTTL(resp)
	if ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if len(c.m) >= maxCached {
		for k, e := range c.m {
			if now.After(e.expires) {
				delete(c.m, k)
			}
		}
		for k := range c.m { // still full: any one goes
			if len(c.m) < maxCached {
				break
			}
			delete(c.m, k)
		}
	}
	c.m[key] = cached{resp: append([]byte(nil), resp...), expires: now.Add(ttl)}
}

// answerTTL is how long an answer may be cached: 0 for a failure or a
// truncated answer.
func answerTTL(resp []byte) time.Duration {
	var p dnsmessage.Parser
	h, err := p.Start(resp)
	if err != nil || h.Truncated || (h.RCode != dnsmessage.RCodeSuccess && h.RCode != dnsmessage.RCodeNameError) {
		return 0
	}
	if err := p.SkipAllQuestions(); err != nil {
		return 0
	}
	ttl := maxCacheTTL
	n := 0
	for {
		rh, err := p.AnswerHeader()
		if err != nil {
			break
		}
		n++
		ttl = min(ttl, time.Duration(rh.TTL)*time.Second)
		if err := p.SkipAnswer(); err != nil {
			return 0
		}
	}
	if n == 0 {
		return negativeTTL
	}
	return ttl
}

// DNSPort is the port of the resolver on the bridge's address.
const DNSPort = 53

// StartResolver serves torpor's resolver on the bridge's address (port
// 53, UDP) for the sandboxes with host name rules, forwarding to
// upstreams; Close stops it. The rules and the learned addresses live in
// the leases, so a resolver answers the sandboxes of every torpor on the
// bridge, and a restarted daemon keeps what its sandboxes learned.
func (n *Network) StartResolver(upstreams []string) error {
	pc, err := net.ListenPacket("udp4", netip.AddrPortFrom(n.gw, DNSPort).String())
	if err != nil {
		return fmt.Errorf("network: resolver: %w", err)
	}
	r := &Resolver{Upstreams: upstreams, Rules: n.namedRules, Learn: n.learn, Log: n.log}
	n.mu.Lock()
	n.resolver = pc
	n.mu.Unlock()
	go func() {
		if err := r.Serve(pc); err != nil {
			n.log.Warn("network: resolver stopped", "err", err)
		}
	}()
	n.log.Info("network: resolver for sandboxes with host name rules", "addr", pc.LocalAddr().String(), "upstreams", upstreams)
	return nil
}

// stopResolver closes the resolver's socket, if it runs.
func (n *Network) stopResolver() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.resolver != nil {
		n.resolver.Close()
		n.resolver = nil
	}
}

// namedRules reads the egress rules of the sandbox at src from its lease
// (written whole by rename, so read without the lock).
func (n *Network) namedRules(src netip.Addr) (*Egress, bool) {
	if !src.Is4() || !n.inRange(src) {
		return nil, false
	}
	b, err := os.ReadFile(n.leasePath(src))
	if err != nil {
		return nil, false
	}
	var l lease
	if json.Unmarshal(b, &l) != nil || !l.Egress.HasNames() {
		return nil, false
	}
	return l.Egress, true
}

// learn adds addrs, answered for name, to the learned addresses of the
// sandbox at src: in its lease and in its sets, in the kernel, before it
// returns. Past MaxLearned the oldest are forgotten.
func (n *Network) learn(src netip.Addr, name string, addrs []netip.Addr, deny bool) error {
	unlock, err := n.lock()
	if err != nil {
		return err
	}
	defer unlock()
	path := n.leasePath(src)
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var l lease
	if err := json.Unmarshal(b, &l); err != nil {
		return err
	}
	if !l.Egress.HasNames() {
		return errors.New("the sandbox has no host name rules")
	}
	eg := l.Egress
	have := map[Learned]bool{}
	for _, x := range eg.Learned {
		have[x] = true
	}
	added := false
	for _, a := range addrs {
		x := Learned{Name: name, Addr: a}
		if !have[x] {
			have[x] = true
			eg.Learned = append(eg.Learned, x)
			added = true
		}
	}
	if !added {
		return nil
	}
	if over := len(eg.Learned) - MaxLearned; over > 0 {
		eg.Learned = append([]Learned(nil), eg.Learned[over:]...)
	}
	body, err := json.Marshal(l)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(path, body); err != nil {
		return err
	}
	// The sets are written whole from the lease: what was forgotten goes,
	// what is new comes, in one transaction.
	c, err := nftables.New()
	if err != nil {
		return err
	}
	la, ld := n.learnedSets(src)
	if _, err := c.GetSetByName(la.Table, la.Name); err != nil {
		return nil // not plugged: its next Attach writes them
	}
	ea, ed := learnedElems(eg)
	for _, s := range []struct {
		set *nftables.Set
		els []nftables.SetElement
	}{{la, ea}, {ld, ed}} {
		c.FlushSet(s.set)
		if len(s.els) > 0 {
			if err := c.SetAddElements(s.set, s.els); err != nil {
				return err
			}
		}
	}
	return c.Flush()
}
