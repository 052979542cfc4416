package envd

// Watching directories (WatchDir, and the polled CreateWatcher,
// GetWatcherEvents and RemoveWatcher).
//
// A watch is inotify on the sandbox's own root file system, set up
// through package files (files.Watcher): each watched directory is opened
// confined to the sandbox and watched by its descriptor, which is closed
// at once. inotify marks live on the inodes of the sandbox's overlay, so
// a change made inside the container (through the same mount) is seen
// the moment it happens, without polling, and nothing of the sandbox is
// held: the engine's Files operation ends as soon as the watch is set up,
// so a watch is no activity and never keeps the sandbox from an idle
// pause (a frozen sandbox simply makes no changes), and it ends when the
// root is unmounted (the sandbox hibernated or killed). Polling through
// the engine instead would count as activity at every poll and keep the
// sandbox awake.
//
// Runtimes whose files are not on the host (microVMs, reached through the
// guest agent) do not offer files.Watcher yet; watching there is refused
// as unimplemented.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/torpor-dev/torpor"
	pb "github.com/torpor-dev/torpor/e2b/envd/proto/filesystem"
	"github.com/torpor-dev/torpor/files"
)

// Keepalives on a watch stream: every Keepalive-Ping-Interval seconds
// without an event (the SDK sends 50), by default every 90.
const (
	headerKeepalive   = "Keepalive-Ping-Interval"
	defaultKeepalive  = 90 * time.Second
	maxWatchersPerBox = 64
	// Watches open at once (streams and polled watchers alike), per
	// sandbox and in the whole daemon: each holds an inotify instance of
	// the host, of which a user has 128 by default
	// (fs.inotify.max_user_instances), so one sandbox must not take them
	// all from the others and from the host.
	maxWatchesPerSandbox = 16
	maxWatchesInAll      = 96
	// maxPendingEvents bounds what a polled watcher keeps between two
	// GetWatcherEvents; beyond it the watcher fails (events were lost).
	maxPendingEvents = 10000
	// endedWatcherTTL is how long a polled watcher that ended (its sandbox
	// or directory gone) is kept for its last GetWatcherEvents.
	endedWatcherTTL = 5 * time.Minute
)

// startWatch watches the directory path of the sandbox of ctx, as the
// request's user resolves it.
func (f *fsService) startWatch(ctx context.Context, h http.Header, p string, recursive bool) (files.Watch, error) {
	c, done, err := f.openRPC(ctx, h, false)
	if err != nil {
		return nil, err
	}
	defer done()
	if p, err = resolve("path", p, c.user); err != nil {
		return nil, err
	}
	dir, err := c.statDir(p)
	if err != nil {
		return nil, err
	}
	wr, ok := c.fs.(files.Watcher)
	if !ok {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("watching directories is not available for this sandbox's runtime"))
	}
	release, err := f.budget.take(sandboxOf(ctx).ID)
	if err != nil {
		return nil, err
	}
	w, err := wr.Watch(dir, recursive)
	if err != nil {
		release()
		return nil, err
	}
	return &budgeted{Watch: w, release: release}, nil
}

// watchBudget counts the watches open, per sandbox and in all.
type watchBudget struct {
	mu    sync.Mutex
	total int
	per   map[string]int
}

// take counts one more watch of the sandbox, or refuses it past a bound;
// release gives it back.
func (b *watchBudget) take(sandbox string) (release func(), err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.per[sandbox] >= maxWatchesPerSandbox:
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("this sandbox already has %d directory watches open: stop one first", maxWatchesPerSandbox))
	case b.total >= maxWatchesInAll:
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("the node has %d directory watches open, its most: retry later", maxWatchesInAll))
	}
	if b.per == nil {
		b.per = map[string]int{}
	}
	b.per[sandbox]++
	b.total++
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.total--
			if b.per[sandbox]--; b.per[sandbox] <= 0 {
				delete(b.per, sandbox)
			}
		})
	}, nil
}

// budgeted is a watch that gives its place in the budget back when it is
// closed.
type budgeted struct {
	files.Watch
	release func()
}

func (b *budgeted) Close() error {
	defer b.release()
	return b.Watch.Close()
}

// fsEvents turns a change into envd's events, one per operation, in
// envd's order.
func fsEvents(ev files.Event) []*pb.FilesystemEvent {
	var out []*pb.FilesystemEvent
	for _, m := range []struct {
		op files.Op
		t  pb.EventType
	}{
		{files.OpCreate, pb.EventType_EVENT_TYPE_CREATE},
		{files.OpRename, pb.EventType_EVENT_TYPE_RENAME},
		{files.OpChmod, pb.EventType_EVENT_TYPE_CHMOD},
		{files.OpWrite, pb.EventType_EVENT_TYPE_WRITE},
		{files.OpRemove, pb.EventType_EVENT_TYPE_REMOVE},
	} {
		if ev.Op.Has(m.op) {
			out = append(out, &pb.FilesystemEvent{Name: ev.Name, Type: m.t})
		}
	}
	return out
}

// keepaliveInterval reads the interval a watch asks for; one of more
// than 2^31 seconds is no interval (it would overflow a Duration).
func keepaliveInterval(h http.Header) time.Duration {
	if n, err := strconv.ParseInt(h.Get(headerKeepalive), 10, 32); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return defaultKeepalive
}

func (f *fsService) WatchDir(ctx context.Context, req *connect.Request[pb.WatchDirRequest], stream *connect.ServerStream[pb.WatchDirResponse]) error {
	w, err := f.startWatch(ctx, req.Header(), req.Msg.GetPath(), req.Msg.GetRecursive())
	if err != nil {
		return f.s.rpcError(err)
	}
	defer w.Close()
	if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Start{Start: &pb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	every := keepaliveInterval(req.Header())
	keepalive := time.NewTicker(every)
	defer keepalive.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-keepalive.C:
			if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Keepalive{Keepalive: &pb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case ev, ok := <-w.Events():
			if !ok {
				// The directory or the sandbox's file system went away:
				// the stream ends.
				return f.s.rpcError(w.Err())
			}
			for _, e := range fsEvents(ev) {
				if err := stream.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Filesystem{Filesystem: e}}); err != nil {
					return err
				}
			}
			keepalive.Reset(every)
		}
	}
}

// watchers are the polled watchers of every sandbox.
type watchers struct {
	mu   sync.Mutex
	byID map[string]*polled
}

func newWatchers() *watchers { return &watchers{byID: map[string]*polled{}} }

// polled is a watcher whose events wait for GetWatcherEvents.
type polled struct {
	sandbox string
	w       files.Watch

	mu      sync.Mutex
	events  []*pb.FilesystemEvent
	err     error
	ended   bool
	endedAt time.Time
}

// collect gathers the watch's events until it ends.
func (p *polled) collect() {
	for ev := range p.w.Events() {
		p.mu.Lock()
		p.events = append(p.events, fsEvents(ev)...)
		over := len(p.events) > maxPendingEvents
		if over {
			p.events = nil
			p.err = torpor.Errorf(torpor.EUnavailable, "more than %d events waited for GetWatcherEvents: events were lost; watch again", maxPendingEvents)
		}
		p.mu.Unlock()
		if over {
			p.w.Close()
		}
	}
	p.mu.Lock()
	p.ended, p.endedAt = true, time.Now()
	if p.err == nil {
		p.err = p.w.Err()
	}
	p.mu.Unlock()
	p.w.Close() // gives its place in the budget back
}

func (f *fsService) CreateWatcher(ctx context.Context, req *connect.Request[pb.CreateWatcherRequest]) (*connect.Response[pb.CreateWatcherResponse], error) {
	sb := sandboxOf(ctx)
	ws := f.watchers
	ws.mu.Lock()
	n := 0
	for id, p := range ws.byID {
		p.mu.Lock()
		stale := p.ended && time.Since(p.endedAt) > endedWatcherTTL
		p.mu.Unlock()
		if stale {
			delete(ws.byID, id)
		} else if p.sandbox == sb.ID {
			n++
		}
	}
	ws.mu.Unlock()
	if n >= maxWatchersPerBox {
		return nil, connect.NewError(connect.CodeResourceExhausted, errors.New("too many watchers on this sandbox; remove some with RemoveWatcher"))
	}
	// The watch outlives this request: it must not end with its context.
	w, err := f.startWatch(ctx, req.Header(), req.Msg.GetPath(), req.Msg.GetRecursive())
	if err != nil {
		return nil, f.s.rpcError(err)
	}
	p := &polled{sandbox: sb.ID, w: w}
	go p.collect()
	id := "w" + torpor.NewID("", 16)
	ws.mu.Lock()
	ws.byID[id] = p
	ws.mu.Unlock()
	return connect.NewResponse(&pb.CreateWatcherResponse{WatcherId: id}), nil
}

// get returns the sandbox's watcher id.
func (ws *watchers) get(ctx context.Context, id string) (*polled, error) {
	ws.mu.Lock()
	p, ok := ws.byID[id]
	ws.mu.Unlock()
	if !ok || p.sandbox != sandboxOf(ctx).ID {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("watcher with id "+id+" not found"))
	}
	return p, nil
}

func (f *fsService) GetWatcherEvents(ctx context.Context, req *connect.Request[pb.GetWatcherEventsRequest]) (*connect.Response[pb.GetWatcherEventsResponse], error) {
	p, err := f.watchers.get(ctx, req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	events, perr, ended := p.events, p.err, p.ended
	p.events = nil
	p.mu.Unlock()
	if perr != nil && len(events) == 0 {
		return nil, f.s.rpcError(perr)
	}
	if ended && len(events) == 0 {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("the watcher ended: its directory or the sandbox's file system is gone"))
	}
	if events == nil {
		events = []*pb.FilesystemEvent{}
	}
	return connect.NewResponse(&pb.GetWatcherEventsResponse{Events: events}), nil
}

func (f *fsService) RemoveWatcher(ctx context.Context, req *connect.Request[pb.RemoveWatcherRequest]) (*connect.Response[pb.RemoveWatcherResponse], error) {
	p, err := f.watchers.get(ctx, req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	p.w.Close()
	f.watchers.mu.Lock()
	delete(f.watchers.byID, req.Msg.GetWatcherId())
	f.watchers.mu.Unlock()
	return connect.NewResponse(&pb.RemoveWatcherResponse{}), nil
}
