package lifecycle

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/torpor-dev/torpor"
)

// trafficFlush is how often traffic noted by the proxy is written to the
// store as activity: in batches, never one write per request or packet.
const trafficFlush = time.Second

// Lookup returns a sandbox whatever its tenant. It is for the port proxy,
// which authorizes by traffic token, never for tenant-facing calls.
func (e *Engine) Lookup(ctx context.Context, id string) (*torpor.Sandbox, error) {
	if !torpor.ValidID(id) {
		return nil, torpor.Errorf(torpor.ENotFound, "no sandbox %q", id)
	}
	sb, err := e.store.GetSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	if sb.Tenant == torpor.PoolTenant {
		// A warm pool's member is no one's yet: nothing reaches it.
		return nil, torpor.Errorf(torpor.ENotFound, "no sandbox %q", id)
	}
	return e.view(sb), nil
}

// WakeForTraffic makes sure a sandbox runs for proxied traffic: a paused or
// hibernated one is resumed when its policy has auto_resume (concurrent
// callers share one resume). It counts as activity.
func (e *Engine) WakeForTraffic(ctx context.Context, id string) (*torpor.Sandbox, error) {
	// A pause under way holds the sandbox: wait for it, within ctx.
	unlock, err := e.locks.LockContext(ctx, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	sb, err := e.store.GetSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	if sb.Tenant == torpor.PoolTenant {
		return nil, torpor.Errorf(torpor.ENotFound, "no sandbox %q", id)
	}
	if err := e.wake(ctx, sb, "proxy to"); err != nil {
		return nil, err
	}
	e.NoteTraffic(id)
	return e.view(sb), nil
}

// DialSandbox connects to a port on a running sandbox's own loopback.
func (e *Engine) DialSandbox(ctx context.Context, sb *torpor.Sandbox, port int) (net.Conn, error) {
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return nil, err
	}
	d, ok := rt.(torpor.Dialer)
	if !ok {
		return nil, fmt.Errorf("the %s runtime cannot reach ports inside a sandbox", rt.Kind())
	}
	return d.DialContext(ctx, ref(sb), "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
}

// NoteTraffic records that traffic reached a sandbox now. It is cheap: the
// activity reaches the store in the next batch (see trafficFlush), and the
// idle engine consults the pending batch before it acts.
func (e *Engine) NoteTraffic(id string) { e.act.noteTraffic(id, e.now(), 0) }

// RequestStarted and RequestEnded bracket a proxied request to a running
// sandbox: traffic at both ends, and while any is under way the idle
// engine does not pause or hibernate the sandbox. The proxy calls
// RequestStarted and then checks that nothing changed since it saw the
// sandbox running (EventsChanged); an idle pause announces its pausing
// state and then checks for requests under way (requestsUnderWay), so
// one of the two always sees the other.
func (e *Engine) RequestStarted(id string) { e.act.noteTraffic(id, e.now(), 1) }

// RequestEnded: see RequestStarted.
func (e *Engine) RequestEnded(id string) { e.act.noteTraffic(id, e.now(), -1) }

// stayForTraffic is what an idle pause or hibernation of a running
// sandbox does once its transition is announced: when a proxied request
// is under way it puts the sandbox back to running, as active now, and
// says so.
func (e *Engine) stayForTraffic(ctx context.Context, sb *torpor.Sandbox, cause string) (bool, error) {
	if cause != CauseIdle || !e.act.requestsUnderWay(sb.ID) {
		return false, nil
	}
	sb.PauseMode = ""
	sb.LastActivityAt = e.now()
	return true, e.setState(ctx, sb, torpor.StateRunning)
}

// awaitRequests is what a pause, hibernation or restart of a running
// sandbox does once its transition is announced: it waits for the
// proxied requests under way to get their answers started, for at most
// the drain timeout, so that a request the proxy let through just before
// is not cut. A request that comes after the announcement sees it (see
// RequestStarted) and waits for the transition, then wakes the sandbox.
// The transition is stored by then, so the wait does not end with ctx:
// the drain timeout bounds it.
func (e *Engine) awaitRequests(ctx context.Context, sb *torpor.Sandbox, verb string) {
	_ = e.waitQuiet(context.WithoutCancel(ctx), sb, verb+" (proxied requests)", e.act.requestsQuiet(sb.ID))
}

// flushTraffic writes the noted traffic as activity, one write per sandbox
// per batch.
func (e *Engine) flushTraffic(ctx context.Context) {
	for id, at := range e.act.takeTraffic() {
		e.recordActivityAt(ctx, id, at)
	}
}

// recordActivityAt moves a running sandbox's idle clock to at (never back).
func (e *Engine) recordActivityAt(ctx context.Context, id string, at time.Time) {
	unlock := e.locks.Lock(id)
	defer unlock()
	sb, err := e.store.GetSandbox(ctx, id)
	if err != nil || sb.State != torpor.StateRunning || !at.After(sb.LastActivityAt) {
		return
	}
	sb.LastActivityAt = at
	if err := e.save(ctx, sb); err != nil {
		e.log.Error("recording traffic", "sandbox", id, "err", err)
	}
}

// runTrafficFlusher flushes noted traffic every trafficFlush until ctx ends.
func (e *Engine) runTrafficFlusher(ctx context.Context) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		t := time.NewTicker(trafficFlush)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				e.flushTraffic(context.WithoutCancel(ctx))
				return
			case <-t.C:
				e.flushTraffic(ctx)
			}
		}
	}()
}
