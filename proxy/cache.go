package proxy

import (
	"context"
	"encoding/binary"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/torpor-dev/torpor"
)

// cache keeps what the engine said about running sandboxes, and whether
// their ports speak cleartext HTTP/2, until the engine's next event (a
// state change, a change of ports): a request to a running sandbox then
// costs no store read.
type cache struct {
	mu  sync.Mutex
	sbs map[string]cached
	h2  map[string]cachedBool
	// sweepAt is the size at which an insert sweeps the stale entries
	// first (see full).
	sweepAt int
}

type cached struct {
	sb  *torpor.Sandbox
	gen <-chan struct{}
}

type cachedBool struct {
	v   bool
	gen <-chan struct{}
}

// maxCached bounds the cache; past it, stale entries are dropped.
const maxCached = 4096

// minSweep is the least size at which the cache is swept.
const minSweep = 64

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// lookup returns the sandbox, from the cache when nothing happened since
// the engine said it was running, and the channel that closes when
// something does (see fresh).
func (p *Proxy) lookup(ctx context.Context, id string) (*torpor.Sandbox, <-chan struct{}, error) {
	c := &p.cache
	c.mu.Lock()
	e, ok := c.sbs[id]
	c.mu.Unlock()
	if ok && !closed(e.gen) {
		return e.sb, e.gen, nil
	}
	// Read the generation first: an event after it closes it.
	gen := p.eng.EventsChanged()
	sb, err := p.eng.Lookup(ctx, id)
	if err != nil || sb.State != torpor.StateRunning {
		return sb, gen, err
	}
	c.mu.Lock()
	if c.full() {
		c.sweep()
	}
	c.sbs[id] = cached{sb: sb, gen: gen}
	c.mu.Unlock()
	return sb, gen, nil
}

// admit counts a request to a running sandbox as under way
// (RequestStarted) when what the proxy knows of it still holds; false
// (nothing counted) when the sandbox changed since gen: then look again.
// Counting first and checking after is what keeps a request from
// reaching a sandbox that an idle pause is freezing (see
// lifecycle.Engine.RequestStarted).
func (p *Proxy) admit(id string, gen <-chan struct{}) bool {
	p.eng.RequestStarted(id)
	if closed(gen) {
		p.eng.RequestEnded(id)
		return false
	}
	return true
}

// full tells whether the cache is due a sweep before an insert: at
// twice the entries the last sweep left (and at least minSweep), so that
// the entries of sandboxes gone or changed since (any event makes them
// stale) never outnumber the fresh ones by much while a sweep's cost,
// spread over the inserts since the last, stays constant per insert; and
// at maxCached.
func (c *cache) full() bool {
	return c.sbs == nil || max(len(c.sbs), len(c.h2)) >= min(maxCached, max(minSweep, c.sweepAt))
}

// sweep drops stale entries (all of them when the cache stays full).
func (c *cache) sweep() {
	defer func() { c.sweepAt = 2 * max(len(c.sbs), len(c.h2)) }()
	if c.sbs == nil {
		c.sbs, c.h2 = map[string]cached{}, map[string]cachedBool{}
		return
	}
	for k, e := range c.sbs {
		if closed(e.gen) {
			delete(c.sbs, k)
		}
	}
	for k, e := range c.h2 {
		if closed(e.gen) {
			delete(c.h2, k)
		}
	}
	if len(c.sbs) >= maxCached || len(c.h2) >= maxCached {
		c.sbs, c.h2 = map[string]cached{}, map[string]cachedBool{}
	}
}

// h2Preface is what a cleartext HTTP/2 client sends first: the connection
// preface and an empty SETTINGS frame.
var h2Preface = []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")

// h2Probe bounds the wait for a server's answer to the preface.
const h2Probe = 2 * time.Second

// speaksH2C tells whether the server on the sandbox's port answers the
// HTTP/2 preface with a SETTINGS frame (gRPC and other h2c servers do;
// an HTTP/1 server answers 400 or closes). It asks once per port until
// the engine's next event.
func (p *Proxy) speaksH2C(ctx context.Context, sb *torpor.Sandbox, port int) bool {
	key := sb.ID + ":" + strconv.Itoa(port)
	c := &p.cache
	c.mu.Lock()
	e, ok := c.h2[key]
	c.mu.Unlock()
	if ok && !closed(e.gen) {
		return e.v
	}
	gen := p.eng.EventsChanged()
	conn, err := p.eng.DialSandbox(ctx, sb, port)
	if err != nil {
		return false // the forward will fail and say so
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(h2Probe))
	var hdr [9]byte
	h2 := false
	if _, err := conn.Write(h2Preface); err == nil {
		if _, err := io.ReadFull(conn, hdr[:]); err == nil {
			const frameSettings = 4
			h2 = hdr[3] == frameSettings && binary.BigEndian.Uint32(hdr[5:])&0x7fffffff == 0
		}
	}
	c.mu.Lock()
	if c.full() {
		c.sweep()
	}
	c.h2[key] = cachedBool{v: h2, gen: gen}
	c.mu.Unlock()
	return h2
}
