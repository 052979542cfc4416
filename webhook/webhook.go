// Package webhook delivers each tenant's events to its registered
// endpoints: signed with HMAC-SHA256 over the timestamp and the body,
// retried with backoff until acknowledged, in order, at least once, from a
// cursor kept in the store so that a daemon restart loses nothing.
package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/torpor-dev/torpor"
)

// Headers of a delivery.
const (
	HeaderSignature = "Torpor-Signature"
	HeaderTimestamp = "Torpor-Timestamp"
	HeaderWebhookID = "Torpor-Webhook-Id"
	HeaderEventSeq  = "Torpor-Event-Seq"
)

// Store is what the dispatcher reads and writes.
type Store interface {
	torpor.WebhookStore
	ListEvents(ctx context.Context, f torpor.EventFilter) ([]torpor.Event, error)
}

// Config is what a Dispatcher needs.
type Config struct {
	Store Store
	// Changed returns a channel closed when new events are stored (the
	// engine's EventsChanged); the dispatcher also polls every second.
	Changed func() <-chan struct{}
	Logger  *slog.Logger
	// Client sends deliveries; nil uses one that dials only what Guard
	// allows, follows no redirect and times out after 10 s.
	Client *http.Client
	// Guard decides which addresses the default Client may dial; nil:
	// NewGuard(GuardConfig{}), which refuses the host's own networks.
	Guard *Guard
	// Backoff is the first wait after a failed delivery (default 1 s); it
	// doubles up to MaxBackoff (default 5 minutes).
	Backoff, MaxBackoff time.Duration
	// Clock stamps the delivery state (nil: the system clock). Backoff
	// waits and signature timestamps use the real time.
	Clock torpor.Clock
}

// Dispatcher runs one delivery loop per webhook.
type Dispatcher struct {
	cfg     Config
	log     *slog.Logger
	mu      sync.Mutex
	workers map[string]context.CancelFunc
	wg      sync.WaitGroup
	ctx     context.Context
	// states is each webhook's delivery state, in memory only: a restart
	// starts it again (the cursor, in the store, is what survives).
	states map[string]*state
}

// state is what the dispatcher remembers of a webhook's attempts.
type state struct {
	delivered   int64
	cursor      int64 // the last seq acknowledged, maybe ahead of the store
	lastAt      time.Time
	lastStatus  int
	lastErr     string
	failures    int
	nextRetryAt time.Time
}

// New returns a dispatcher; Run starts it.
func New(cfg Config) *Dispatcher {
	if cfg.Guard == nil {
		cfg.Guard = NewGuard(GuardConfig{})
	}
	if cfg.Client == nil {
		cfg.Client = cfg.Guard.client()
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = time.Second
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 5 * time.Minute
	}
	if cfg.Changed == nil {
		never := make(chan struct{})
		cfg.Changed = func() <-chan struct{} { return never }
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = torpor.SystemClock{}
	}
	return &Dispatcher{cfg: cfg, log: log, workers: map[string]context.CancelFunc{}, states: map[string]*state{}}
}

// Run starts a loop for every stored webhook and returns; the loops stop
// when ctx ends. Call Refresh after adding or removing webhooks.
func (d *Dispatcher) Run(ctx context.Context) error {
	d.mu.Lock()
	d.ctx = ctx
	d.mu.Unlock()
	return d.Refresh(ctx)
}

// Wait waits for every loop to stop after Run's context ended.
func (d *Dispatcher) Wait() { d.wg.Wait() }

// Refresh starts loops for new webhooks and stops those of deleted ones.
func (d *Dispatcher) Refresh(ctx context.Context) error {
	hooks, err := d.cfg.Store.ListWebhooks(ctx, "")
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx == nil {
		return nil // not running
	}
	seen := map[string]bool{}
	for _, w := range hooks {
		seen[w.ID] = true
		if _, ok := d.workers[w.ID]; ok {
			continue
		}
		wctx, cancel := context.WithCancel(d.ctx)
		d.workers[w.ID] = cancel
		d.wg.Add(1)
		go func(w torpor.Webhook) {
			defer d.wg.Done()
			d.loop(wctx, w)
		}(w)
	}
	for id, cancel := range d.workers {
		if !seen[id] {
			cancel()
			delete(d.workers, id)
			delete(d.states, id)
		}
	}
	return nil
}

// loop delivers w's tenant's events in order from w's cursor.
func (d *Dispatcher) loop(ctx context.Context, w torpor.Webhook) {
	cursor := w.Cursor
	for ctx.Err() == nil {
		changed := d.cfg.Changed()
		evs, err := d.cfg.Store.ListEvents(ctx, torpor.EventFilter{After: cursor, Tenant: w.Tenant, Limit: 100})
		if err != nil || len(evs) == 0 {
			select {
			case <-ctx.Done():
			case <-changed:
			case <-time.After(time.Second):
			}
			continue
		}
		for _, ev := range evs {
			if !d.deliverWithRetry(ctx, w, ev) {
				return
			}
			cursor = ev.Seq
			if err := d.cfg.Store.SetWebhookCursor(context.WithoutCancel(ctx), w.ID, cursor); err != nil {
				d.log.Error("webhook cursor", "webhook", w.ID, "err", err)
			}
		}
	}
}

// deliverWithRetry sends ev until the endpoint acknowledges it; false when
// ctx ended first.
func (d *Dispatcher) deliverWithRetry(ctx context.Context, w torpor.Webhook, ev torpor.Event) bool {
	wait := d.cfg.Backoff
	for attempt := 1; ; attempt++ {
		status, err := d.deliver(ctx, w, ev)
		if err == nil {
			d.record(w.ID, func(s *state) {
				s.delivered++
				s.cursor = ev.Seq
				s.lastAt, s.lastStatus, s.lastErr = d.cfg.Clock.Now(), status, ""
				s.failures, s.nextRetryAt = 0, time.Time{}
			})
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		d.record(w.ID, func(s *state) {
			now := d.cfg.Clock.Now()
			s.lastAt, s.lastStatus, s.lastErr = now, status, describe(err, status)
			s.failures++
			s.nextRetryAt = now.Add(wait)
		})
		d.log.Warn("webhook delivery failed; retrying", "webhook", w.ID, "seq", ev.Seq, "attempt", attempt, "in", wait, "err", err)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
		wait = min(wait*2, d.cfg.MaxBackoff)
	}
}

// record changes id's state under the lock.
func (d *Dispatcher) record(id string, change func(*state)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, running := d.workers[id]; !running {
		return // removed meanwhile: keep no state for it
	}
	s := d.states[id]
	if s == nil {
		s = &state{}
		d.states[id] = s
	}
	change(s)
}

// WebhookDelivery returns w's delivery state: what this dispatcher saw
// since it started, and how many of the tenant's events wait after the
// cursor. Counting those, not subtracting seqs, keeps other tenants'
// events (which share the seq) out of it.
func (d *Dispatcher) WebhookDelivery(ctx context.Context, w torpor.Webhook) torpor.WebhookDelivery {
	var out torpor.WebhookDelivery
	cursor := w.Cursor
	d.mu.Lock()
	if s := d.states[w.ID]; s != nil {
		out.Delivered, out.LastStatus, out.LastError, out.ConsecutiveFailures = s.delivered, s.lastStatus, s.lastErr, s.failures
		if !s.lastAt.IsZero() {
			t := s.lastAt.UTC()
			out.LastAttemptAt = &t
		}
		if !s.nextRetryAt.IsZero() {
			t := s.nextRetryAt.UTC()
			out.NextRetryAt = &t
		}
		cursor = max(cursor, s.cursor)
	}
	d.mu.Unlock()
	evs, err := d.cfg.Store.ListEvents(ctx, torpor.EventFilter{After: cursor, Tenant: w.Tenant, Limit: torpor.MaxWebhookBehind})
	if err != nil {
		d.log.Warn("webhook backlog", "webhook", w.ID, "err", err)
	}
	out.Behind = int64(len(evs))
	return out
}

// describe says why an attempt failed in words fit for the tenant: the
// status, or the kind of network failure, never the URL (which may carry
// a token), the secret, or the guard's reasons.
func describe(err error, status int) string {
	var nerr net.Error
	var dnsErr *net.DNSError
	var opErr *net.OpError
	switch {
	case status != 0:
		return fmt.Sprintf("the endpoint answered %d %s", status, http.StatusText(status))
	case errors.Is(err, ErrGuarded):
		return "the address is refused by the daemon's webhook guard"
	case errors.As(err, &nerr) && nerr.Timeout():
		return "the endpoint did not answer in time"
	case errors.As(err, &dnsErr):
		return "could not resolve the endpoint's host"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "the endpoint refused the connection"
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return "could not connect to the endpoint"
	case errors.As(err, new(*tls.CertificateVerificationError)) || errors.As(err, new(tls.RecordHeaderError)):
		return "the TLS handshake with the endpoint failed"
	default:
		return "the delivery failed before an answer"
	}
}

// deliver POSTs one event, signed; the status is 0 when no answer came.
func (d *Dispatcher) deliver(ctx context.Context, w torpor.Webhook, ev torpor.Event) (int, error) {
	body, err := json.Marshal(ev)
	if err != nil {
		return 0, err
	}
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderTimestamp, ts)
	req.Header.Set(HeaderSignature, "v1="+Sign(w.Secret, ts, body))
	req.Header.Set(HeaderWebhookID, w.ID)
	req.Header.Set(HeaderEventSeq, strconv.FormatInt(ev.Seq, 10))
	resp, err := d.cfg.Client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, fmt.Errorf("the endpoint answered %s", resp.Status)
	}
	return resp.StatusCode, nil
}

// Sign returns the hex HMAC-SHA256, keyed with secret, of the timestamp, a
// dot and the body: what a receiver recomputes to check a delivery.
func Sign(secret, timestamp string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(timestamp))
	m.Write([]byte("."))
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// Verify checks a delivery's signature header against secret, and that its
// timestamp is within tolerance of now (0: any age).
func Verify(secret string, header http.Header, body []byte, tolerance time.Duration, now time.Time) error {
	ts := header.Get(HeaderTimestamp)
	sig, ok := bytes.CutPrefix([]byte(header.Get(HeaderSignature)), []byte("v1="))
	if ts == "" || !ok {
		return errors.New("webhook: unsigned delivery")
	}
	if !hmac.Equal(sig, []byte(Sign(secret, ts, body))) {
		return errors.New("webhook: bad signature")
	}
	if tolerance > 0 {
		sec, err := strconv.ParseInt(ts, 10, 64)
		if err != nil || now.Sub(time.Unix(sec, 0)).Abs() > tolerance {
			return errors.New("webhook: stale or malformed timestamp")
		}
	}
	return nil
}
