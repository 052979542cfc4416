// Package fleet carries requests between the nodes of a fleet
// (docs/fleet.md). Any node answers the whole API for every sandbox; a
// request for a sandbox another node owns is forwarded to that node,
// streaming (Forward). Node-to-node requests are authenticated with the
// fleet's shared secret, never with a user's key: the node a request came
// to authenticates the user itself, drops the user's credentials and
// signs the identity it found (Sign); the owner trusts that identity only
// when the signature verifies (Verify).
//
// The package is transport only: which node owns a sandbox is the
// engine's to say (lifecycle.Engine.Route and PlaceCreate).
package fleet

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
)

// The headers of a signed node-to-node request. Every receiving listener
// removes them from a request before anything else reads it (Verify), so
// that a user cannot send them.
const (
	HeaderNode      = "X-Torpor-Fleet-Node"
	HeaderIdentity  = "X-Torpor-Fleet-Identity"
	HeaderTime      = "X-Torpor-Fleet-Time"
	HeaderSignature = "X-Torpor-Fleet-Signature"
)

var fleetHeaders = [...]string{HeaderNode, HeaderIdentity, HeaderTime, HeaderSignature}

// MinSecretBytes is the least length of a fleet secret: an HMAC-SHA256 key
// shorter than this is guessable sooner than the hash is broken.
const MinSecretBytes = 32

// MaxSkew is how far the time a request was signed at may be from the
// receiver's clock. It bounds both the nodes' clock difference and how
// long a captured request can be replayed.
const MaxSkew = 60 * time.Second

// DefaultDialTimeout bounds the connection to another node: a node that
// does not accept within it is answered as unavailable, to be retried.
const DefaultDialTimeout = 3 * time.Second

// Secret is the key the nodes of a fleet share, from their configs.
type Secret []byte

// Identity is who a forwarded request acts for: the principal the front
// node found for the user's key. The zero Identity goes with requests
// whose credentials are the sandbox's own tokens (the port proxy's, envd's),
// which the owner checks itself.
type Identity struct {
	Tenant string
	KeyID  string
	Tier   string
	Admin  bool
	// Node is the node that signed the request; Verify sets it, Sign
	// ignores it (a node signs as itself).
	Node string
}

// encode is the identity as it travels (Node apart: it has its header).
func (id Identity) encode() string {
	v := url.Values{"tenant": {id.Tenant}, "key": {id.KeyID}, "tier": {id.Tier}, "admin": {strconv.FormatBool(id.Admin)}}
	return v.Encode()
}

func decodeIdentity(s string) (Identity, error) {
	v, err := url.ParseQuery(s)
	if err != nil {
		return Identity{}, err
	}
	admin, err := strconv.ParseBool(v.Get("admin"))
	if err != nil {
		return Identity{}, err
	}
	return Identity{Tenant: v.Get("tenant"), KeyID: v.Get("key"), Tier: v.Get("tier"), Admin: admin}, nil
}

// Config is what a Fleet needs.
type Config struct {
	// Self is this node's name, which it signs as.
	Self string
	// Secret is the fleet's shared secret (at least MinSecretBytes).
	Secret Secret
	// Clock dates signatures and checks their age (default: the system's).
	Clock torpor.Clock
	// DialTimeout bounds a connection to another node (default
	// DefaultDialTimeout).
	DialTimeout time.Duration
	Logger      *slog.Logger
}

// Fleet is one node's side of the traffic between nodes: it signs and
// verifies node-to-node requests and forwards requests to other nodes.
// A nil *Fleet is no fleet: Verify removes the fleet headers and trusts
// none.
type Fleet struct {
	self   string
	secret Secret
	clock  torpor.Clock
	log    *slog.Logger
	fwd    forwarder
}

// New returns the fleet side of node cfg.Self.
func New(cfg Config) (*Fleet, error) {
	if len(cfg.Secret) < MinSecretBytes {
		return nil, fmt.Errorf("fleet: the fleet secret has %d bytes; it needs at least %d (e.g. openssl rand -hex 32)", len(cfg.Secret), MinSecretBytes)
	}
	if cfg.Self == "" {
		return nil, errors.New("fleet: this node needs a name")
	}
	f := &Fleet{self: cfg.Self, secret: append(Secret(nil), cfg.Secret...), clock: cfg.Clock, log: cfg.Logger}
	if f.clock == nil {
		f.clock = torpor.SystemClock{}
	}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	dial := cfg.DialTimeout
	if dial <= 0 {
		dial = DefaultDialTimeout
	}
	f.fwd = newForwarder(f, &net.Dialer{Timeout: dial, KeepAlive: 30 * time.Second})
	return f, nil
}

// Self is the name of this node.
func (f *Fleet) Self() string { return f.self }

// Close closes the idle connections to other nodes.
func (f *Fleet) Close() {
	f.fwd.h1.CloseIdleConnections()
	f.fwd.h2c.CloseIdleConnections()
}

// Sign marks r, a request this node sends to another, as sent by this
// node for id: it sets the fleet headers, replacing any. It signs what
// the receiver checks: the node, the time, the method, the request URI
// (the authority for CONNECT), the Host, the identity and the
// X-Forwarded-For and X-Forwarded-Proto headers, which the receiver may
// then believe. The body is not signed: it streams.
func (f *Fleet) Sign(r *http.Request, id Identity) {
	host := r.Host
	if host == "" && r.URL != nil {
		host = r.URL.Host
	}
	uri := host
	if r.Method != http.MethodConnect {
		uri = r.URL.RequestURI()
	}
	ts := strconv.FormatInt(f.clock.Now().Unix(), 10)
	ident := id.encode()
	r.Header.Set(HeaderNode, f.self)
	r.Header.Set(HeaderIdentity, ident)
	r.Header.Set(HeaderTime, ts)
	r.Header.Set(HeaderSignature, f.mac(f.self, ts, r.Method, uri, host, ident, r.Header))
}

// Present tells whether h carries any of the fleet headers.
func Present(h http.Header) bool {
	for _, k := range fleetHeaders {
		if _, ok := h[k]; ok {
			return true
		}
	}
	return false
}

// Strip removes the fleet headers from h.
func Strip(h http.Header) {
	for _, k := range fleetHeaders {
		delete(h, k)
	}
}

// Verify checks the fleet signature of r, a request this node received,
// and removes the fleet headers from it whatever it finds, so that nothing
// after it reads them. Without fleet headers it returns false and no
// error: an ordinary request. With them, it returns the identity the
// sending node signed, or an unauthenticated error (answered 401) when
// the signature is wrong, stale or from this node itself, or when this
// node is in no fleet (a nil Fleet).
func (f *Fleet) Verify(r *http.Request) (Identity, bool, error) {
	if !Present(r.Header) {
		return Identity{}, false, nil
	}
	node, ident, ts, sig := r.Header.Get(HeaderNode), r.Header.Get(HeaderIdentity), r.Header.Get(HeaderTime), r.Header.Get(HeaderSignature)
	Strip(r.Header)
	refuse := func(why string) (Identity, bool, error) {
		if f != nil {
			f.log.Warn("fleet: refused a signed request", "from", node, "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "why", why)
		}
		return Identity{}, false, torpor.Errorf(torpor.EUnauthenticated, "the fleet signature of this request does not verify (%s)", why)
	}
	if f == nil {
		return refuse("this server is not part of a fleet")
	}
	if node == "" || sig == "" || ts == "" {
		return refuse("incomplete fleet headers")
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return refuse("bad time")
	}
	if skew := f.clock.Now().Sub(time.Unix(sec, 0)); skew > MaxSkew || skew < -MaxSkew {
		return refuse("signed " + skew.Round(time.Second).String() + " away from this node's clock")
	}
	uri := r.RequestURI
	if uri == "" && r.URL != nil { // a request made in process
		uri = r.URL.RequestURI()
	}
	want := f.mac(node, ts, r.Method, uri, r.Host, ident, r.Header)
	if !hmac.Equal([]byte(sig), []byte(want)) {
		return refuse("wrong signature")
	}
	if node == f.self {
		// A node never forwards to itself: a request signed as this
		// node came from elsewhere.
		return refuse("signed as this node")
	}
	id, err := decodeIdentity(ident)
	if err != nil {
		return refuse("bad identity")
	}
	id.Node = node
	return id, true, nil
}

// mac is the hex HMAC-SHA256 of the signed fields, one per line (none can
// hold a line break: net/http refuses them in headers and request lines).
func (f *Fleet) mac(node, ts, method, uri, host, ident string, h http.Header) string {
	m := hmac.New(sha256.New, f.secret)
	for _, s := range []string{"torpor-fleet-v1", node, ts, method, uri, strings.ToLower(host), ident,
		strings.Join(h.Values("X-Forwarded-For"), ", "), strings.Join(h.Values("X-Forwarded-Proto"), ", ")} {
		m.Write([]byte(s))
		m.Write([]byte{'\n'})
	}
	return hex.EncodeToString(m.Sum(nil))
}
