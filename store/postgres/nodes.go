package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/store/sqlite"
)

var _ torpor.NodeStore = (*Store)(nil)

// nowMicros is the database's clock in the unit times are stored in: the
// nodes of a fleet compare heartbeats by one clock, not by their own.
// (now() is the transaction's start, the same for every statement of it.)
const nowMicros = `(extract(epoch FROM now()) * 1000000)::bigint`

// fenceSteps are the first steps of a sandbox write of a handle that
// joined a fleet: a transaction advisory lock on the node, shared with
// its other writes, then a check that the node still has the handle's
// epoch and instance and is not down, which refuses the write where it
// does not. A handle whose lock another daemon took (nodeLock) writes
// nothing: fenceSteps returns its error.
// DeclareDown takes the same lock exclusively before it marks the node
// down, which waits for the writes in flight to commit; a write that
// comes after waits for DeclareDown and then finds the new epoch (its
// check is a statement of its own, so it reads what committed while it
// waited). So no write of a node commits once the node is down.
//
// A lock of the lock manager rather than a lock on the node's row: a row
// lock held in share mode lets more sharers in while DeclareDown waits,
// so busy writers could hold it off for good, where the lock manager
// queues them behind it; and heartbeats, which update the row, never
// wait for writes. A handle that never joined writes unfenced, as a lone
// daemon does.
func (s *Store) fenceSteps() ([]step, error) {
	if err := s.lockLost(); err != nil {
		return nil, err
	}
	f := s.fence.Load()
	if f == nil {
		return nil, nil
	}
	return []step{
		{sql: `SELECT pg_advisory_xact_lock_shared($1)`, args: []any{lockKey("fence", f.Node)}, op: "take the node's fence lock"},
		{sql: `SELECT 1 FROM nodes WHERE name = $1 AND epoch = $2 AND state <> 'down' AND (instance = '' OR $3 = '' OR instance = $3)`,
			args: []any{f.Node, f.Epoch, f.Instance}, op: "check the node's epoch",
			check: func(ct pgconn.CommandTag) error {
				if ct.RowsAffected() == 0 {
					return torpor.Fenced(f.Node)
				}
				return nil
			}},
	}, nil
}

// JoinNode registers n as up and returns its epoch: 1 for a new node, the
// one it has otherwise (DeclareDown gave a node it marked down a new one).
// A node that is not down and joined from another instance is refused
// (torpor.NodeInUse), and left as it was; a down one takes the new
// instance. From then on this handle's sandbox writes are fenced with it.
func (s *Store) JoinNode(ctx context.Context, n torpor.Node) (int64, error) {
	if n.Name == "" {
		return 0, torpor.Invalid("name", "node name is empty")
	}
	if err := s.lockLost(); err != nil {
		return 0, err
	}
	record, used, err := sqlite.EncodeNodeRecord(n)
	if err != nil {
		return 0, fmt.Errorf("postgres store: %w", err)
	}
	op := fmt.Sprintf("join node %q", n.Name)
	var epoch int64
	err = s.inTx(ctx, op, func(tx pgx.Tx) error {
		// The WHERE of the upsert skips the update, and so returns no
		// row, for a node that another instance runs (the row lock the
		// upsert takes orders it with a concurrent DeclareDown); a join
		// with no instance keeps the one stored.
		err := tx.QueryRow(ctx, `INSERT INTO nodes (name, address, proxy_address, host, state, epoch, joined_at, heartbeat_at, record, used, instance)
			VALUES ($1, $2, $3, $4, 'up', 1, `+nowMicros+`, `+nowMicros+`, $5, $6, $7)
			ON CONFLICT (name) DO UPDATE SET address = excluded.address, proxy_address = excluded.proxy_address, host = excluded.host,
				state = excluded.state, joined_at = excluded.joined_at, heartbeat_at = excluded.heartbeat_at,
				record = excluded.record, used = excluded.used,
				instance = CASE WHEN excluded.instance = '' THEN nodes.instance ELSE excluded.instance END
			WHERE nodes.state = 'down' OR nodes.instance = '' OR excluded.instance = '' OR nodes.instance = excluded.instance
			RETURNING epoch`, n.Name, n.Address, n.ProxyAddress, n.Host, record, used, n.Instance).Scan(&epoch)
		if errors.Is(err, pgx.ErrNoRows) {
			return torpor.NodeInUse(n.Name)
		}
		if err != nil {
			return wrap(err, "", op)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	s.fence.Store(&sqlite.Fence{Node: n.Name, Epoch: epoch, Instance: n.Instance})
	return epoch, nil
}

// Heartbeat records that node name, at epoch, is alive now (by the
// database's clock) and uses used (and usedVRAMMiB of its GPUs). Where
// this handle joined as the node, the node must still be its instance's.
func (s *Store) Heartbeat(ctx context.Context, name string, epoch int64, used torpor.Resources, usedVRAMMiB int64) (torpor.NodeState, error) {
	if err := s.lockLost(); err != nil {
		return "", err
	}
	u, err := sqlite.EncodeNodeUse(used, usedVRAMMiB)
	if err != nil {
		return "", fmt.Errorf("postgres store: %w", err)
	}
	op := fmt.Sprintf("heartbeat of node %q", name)
	var state string
	err = s.inTx(ctx, op, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `UPDATE nodes SET heartbeat_at = `+nowMicros+`, used = $1
			WHERE name = $2 AND epoch = $3 AND state <> 'down' AND (instance = '' OR $4 = '' OR instance = $4)
			RETURNING state`, u, name, epoch, s.fence.Load().InstanceOf(name)).Scan(&state)
		if errors.Is(err, pgx.ErrNoRows) {
			return missingOrFenced(ctx, tx, name)
		}
		if err != nil {
			return wrap(err, "", op)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return torpor.NodeState(state), nil
}

// missingOrFenced explains why a node's row did not match: there is none
// (not_found), or the node was declared down (Fenced).
func missingOrFenced(ctx context.Context, tx pgx.Tx, name string) error {
	var one int
	err := tx.QueryRow(ctx, `SELECT 1 FROM nodes WHERE name = $1`, name).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return sqlite.NodeNotJoined(name)
	}
	if err != nil {
		return wrap(err, "", fmt.Sprintf("read node %q", name))
	}
	return torpor.Fenced(name)
}

// scanNode reads a row of sqlite.NodeColumns, and then more.
func scanNode(row pgx.Row, more ...any) (torpor.Node, error) {
	var nr sqlite.NodeRow
	if err := row.Scan(append(nr.Dest(), more...)...); err != nil {
		return torpor.Node{}, err
	}
	return nr.Node()
}

// ListNodes returns every node, by name, with the counts by state of its
// sandboxes that are not terminated, all read in one statement.
func (s *Store) ListNodes(ctx context.Context) ([]torpor.Node, error) {
	return query(ctx, s, "list nodes", func(row pgx.CollectableRow) (torpor.Node, error) {
		var counts string
		n, err := scanNode(row, &counts)
		if err != nil {
			return n, err
		}
		if err := json.Unmarshal([]byte(counts), &n.Sandboxes); err != nil {
			return n, fmt.Errorf("node %q: bad sandbox counts: %w", n.Name, err)
		}
		return n, nil
	}, `SELECT `+sqlite.NodeColumns+`, coalesce((SELECT json_object_agg(c.state, c.n) FROM
			(SELECT state, count(*) AS n FROM sandboxes s WHERE s.node = nodes.name AND s.state <> 'terminated' GROUP BY state) c), '{}')
		FROM nodes ORDER BY name`)
}

// SetNodeState sets an up node draining or a draining one up; setting the
// state a node has is a success.
func (s *Store) SetNodeState(ctx context.Context, name string, st torpor.NodeState) error {
	if err := sqlite.CheckNodeState(st); err != nil {
		return err
	}
	op := fmt.Sprintf("set node %q %s", name, st)
	return s.inTx(ctx, op, func(tx pgx.Tx) error {
		var prev string
		// The row lock makes the check and the change one step against a
		// concurrent DeclareDown.
		err := tx.QueryRow(ctx, `WITH cur AS (SELECT name, state FROM nodes WHERE name = $1 FOR UPDATE)
			UPDATE nodes n SET state = CASE WHEN cur.state = 'down' THEN cur.state ELSE $2 END FROM cur WHERE n.name = cur.name
			RETURNING cur.state`, name, string(st)).Scan(&prev)
		if errors.Is(err, pgx.ErrNoRows) {
			return torpor.Errorf(torpor.ENotFound, "node %q not found", name)
		}
		if err != nil {
			return wrap(err, "", op)
		}
		if torpor.NodeState(prev) == torpor.NodeDown {
			return sqlite.NodeIsDown(name, st)
		}
		return nil
	})
}

// DeclareDown marks down every up or draining node whose last heartbeat
// is timeout or more ago by the database's clock, each with a new epoch,
// and returns them as they were, by name. It takes the fence lock of each
// (fenceSteps), in name order, which waits for their sandbox writes in
// flight; then it marks those still stale, under their row locks, so that
// a heartbeat that committed meanwhile keeps its node up.
func (s *Store) DeclareDown(ctx context.Context, timeout time.Duration) ([]torpor.Node, error) {
	const op = "declare nodes down"
	cutoff := nowMicros + ` - $1`
	var out []torpor.Node
	err := s.inTx(ctx, op, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT name FROM nodes WHERE state <> 'down' AND heartbeat_at <= `+cutoff+` ORDER BY name`,
			timeout.Microseconds())
		if err != nil {
			return wrap(err, "", op)
		}
		stale, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return wrap(err, "", op)
		}
		if len(stale) == 0 {
			return nil
		}
		var steps []step
		for _, name := range stale {
			steps = append(steps, step{sql: `SELECT pg_advisory_xact_lock($1)`, args: []any{lockKey("fence", name)},
				op: fmt.Sprintf("take the fence lock of node %q", name)})
		}
		if err := runSteps(ctx, tx, steps); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `WITH stale AS (SELECT `+sqlite.NodeColumns+` FROM nodes
				WHERE name = ANY($2::text[]) AND state <> 'down' AND heartbeat_at <= `+cutoff+` ORDER BY name FOR UPDATE)
			UPDATE nodes n SET state = 'down', epoch = n.epoch + 1 FROM stale WHERE n.name = stale.name
			RETURNING stale.name, stale.address, stale.proxy_address, stale.host, stale.state, stale.epoch,
				stale.joined_at, stale.heartbeat_at, stale.record, stale.used, stale.instance`, timeout.Microseconds(), stale)
		if err != nil {
			return wrap(err, "", op)
		}
		out, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (torpor.Node, error) { return scanNode(row) })
		if err != nil {
			return wrap(err, "", op)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// RETURNING keeps no order of its own.
	slices.SortFunc(out, func(a, b torpor.Node) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Exclusive runs fn while this store holds the session advisory lock
// called name on a connection of the pool, kept from the pool until fn
// returns, or returns false at once when another session holds it. The
// lock lasts as long as that session: a server restart, or a connection
// lost, ends it, and another node may take the lock. So the connection is
// pinged every exclusiveCheck, and fn's context is cancelled when a ping
// fails (or this handle's own lock was taken, see nodeLock); Exclusive
// then returns an error saying the lock was lost, unless fn returned one
// of its own. What fn does between the end of the session and the
// cancellation must still be safe to overlap with a next holder's
// (fenced writes are).
func (s *Store) Exclusive(ctx context.Context, name string, fn func(ctx context.Context) error) (bool, error) {
	if err := s.lockLost(); err != nil {
		return false, err
	}
	op := fmt.Sprintf("take the lock %q", name)
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return false, wrap(err, "", op)
	}
	key := lockKey("exclusive", name)
	var ok bool
	if err := c.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&ok); err != nil {
		c.Release()
		return false, wrap(err, "", op)
	}
	if !ok {
		c.Release()
		return false, nil
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		var unlocked bool
		if err := c.QueryRow(uctx, `SELECT pg_advisory_unlock($1)`, key).Scan(&unlocked); err != nil || !unlocked {
			// Ending the session frees the lock; the pool replaces the
			// closed connection.
			c.Conn().Close(uctx)
		}
		c.Release()
	}()
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() { s.watchLock(c, name, stop, cancel) })
	err = fn(fctx)
	// The watcher is done with the connection before it is unlocked.
	close(stop)
	watch.Wait()
	if lost := context.Cause(fctx); lost != nil && ctx.Err() == nil && (err == nil || errors.Is(err, context.Canceled)) {
		err = lost
	}
	return true, err
}

// exclusiveCheck is how often Exclusive makes sure its lock's session is
// alive.
const exclusiveCheck = time.Second

// watchLock pings c, which holds the lock called name, every
// exclusiveCheck until stop is closed, and cancels with an error saying
// the lock was lost when a ping fails or takes longer than a few
// seconds, or when this handle's own lock is lost.
func (s *Store) watchLock(c *pgxpool.Conn, name string, stop <-chan struct{}, cancel context.CancelCauseFunc) {
	var lost <-chan struct{}
	if s.lock != nil {
		lost = s.lock.lost
	}
	t := time.NewTicker(exclusiveCheck)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-lost:
			cancel(s.lockLost())
			return
		case <-t.C:
		}
		// Not fn's context: a ping cut short by fn's return would cost
		// the connection.
		pctx, pcancel := context.WithTimeout(context.Background(), 3*time.Second)
		err := c.Ping(pctx)
		pcancel()
		if err != nil {
			cancel(&torpor.Error{Code: torpor.EUnavailable, Reason: ReasonStoreUnavailable, RetryAfter: unavailableRetry,
				Message: fmt.Sprintf("lost the lock %q: its database session ended (%v)", name, redactErr(err, s.url))})
			return
		}
	}
}
