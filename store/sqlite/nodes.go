package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/torpor-dev/torpor"
)

// nodesSchema is migration 9: the fleet's nodes, and the node that owns
// each sandbox as a column, so that a node's sandboxes are found (and
// counted) by an index rather than by reading every record.
const nodesSchema = `
ALTER TABLE sandboxes ADD COLUMN node TEXT NOT NULL DEFAULT '';
CREATE INDEX sandboxes_by_node ON sandboxes (node, state);

-- record holds the node's labels, runtimes and capacity (nodeRecord), and
-- used what it last reported in a heartbeat (resourcesRecord).
CREATE TABLE nodes (
	name          TEXT    NOT NULL PRIMARY KEY,
	address       TEXT    NOT NULL,
	proxy_address TEXT    NOT NULL,
	host          TEXT    NOT NULL,
	state         TEXT    NOT NULL,
	epoch         INTEGER NOT NULL,
	joined_at     INTEGER NOT NULL,
	heartbeat_at  INTEGER NOT NULL,
	record        TEXT    NOT NULL,
	used          TEXT    NOT NULL
) STRICT;
`

// nodeInstanceSchema is migration 10: the instance (an id of the data
// dir) that a node last joined from, so that another data dir under the
// same name is refused while the node is up (JoinNode). Rows from before
// it have none, which matches any.
const nodeInstanceSchema = `ALTER TABLE nodes ADD COLUMN instance TEXT NOT NULL DEFAULT '';`

var _ torpor.NodeStore = (*Store)(nil)

// nodeRecord is the stored JSON form of the parts of a Node that are not
// columns. Like sandboxRecord it is the store's own format. GPUs came
// after the table did: a record without them (a node that joined before,
// or has no GPU host) reads as none, so they need no migration.
type nodeRecord struct {
	Labels   map[string]string `json:"labels"`
	Runtimes []string          `json:"runtimes"`
	Capacity resourcesRecord   `json:"capacity"`
	GPUs     *nodeGPUsRecord   `json:"gpus,omitempty"`
}

// nodeGPUsRecord is a node's GPU capacity (torpor.NodeGPUs less what is
// used, which goes in the used column).
type nodeGPUsRecord struct {
	Count   int    `json:"count"`
	Model   string `json:"model,omitempty"`
	VRAMMiB int64  `json:"vram_mib"`
}

// nodeUseRecord is the used column: what the node's sandboxes hold, and
// the VRAM its GPU leases hold (absent in a row from before: none).
type nodeUseRecord struct {
	resourcesRecord
	GPUVRAMMiB int64 `json:"gpu_vram_mib,omitempty"`
}

// encodeNode returns the record and used columns of n.
func encodeNode(n torpor.Node) (record, used string, err error) {
	r := nodeRecord{Labels: n.Labels, Runtimes: n.Runtimes, Capacity: resourcesRecord(n.Capacity)}
	if g := n.GPUs; g.Count > 0 {
		r.GPUs = &nodeGPUsRecord{Count: g.Count, Model: g.Model, VRAMMiB: g.VRAMMiB}
	}
	b, err := json.Marshal(r)
	if err != nil {
		return "", "", fmt.Errorf("encode node %q: %w", n.Name, err)
	}
	if used, err = encodeNodeUse(n.Used, n.GPUs.UsedVRAMMiB); err != nil {
		return "", "", err
	}
	return string(b), used, nil
}

// decodeNode fills n's non-column fields from its record and used columns.
func decodeNode(n *torpor.Node, record, used string) error {
	var r nodeRecord
	if err := json.Unmarshal([]byte(record), &r); err != nil {
		return fmt.Errorf("node %q: bad record: %w", n.Name, err)
	}
	n.Labels, n.Runtimes, n.Capacity = r.Labels, r.Runtimes, torpor.Resources(r.Capacity)
	n.GPUs = torpor.NodeGPUs{}
	if g := r.GPUs; g != nil {
		n.GPUs = torpor.NodeGPUs{Count: g.Count, Model: g.Model, VRAMMiB: g.VRAMMiB}
	}
	var u nodeUseRecord
	if err := json.Unmarshal([]byte(used), &u); err != nil {
		return fmt.Errorf("node %q: bad resources: %w", n.Name, err)
	}
	n.Used = torpor.Resources(u.resourcesRecord)
	n.GPUs.UsedVRAMMiB = u.GPUVRAMMiB
	return nil
}

// encodeNodeUse returns the used column of a node that uses r, and whose
// GPU leases hold gpuVRAMMiB.
func encodeNodeUse(r torpor.Resources, gpuVRAMMiB int64) (string, error) {
	b, err := json.Marshal(nodeUseRecord{resourcesRecord: resourcesRecord(r), GPUVRAMMiB: gpuVRAMMiB})
	if err != nil {
		return "", fmt.Errorf("encode resources: %w", err)
	}
	return string(b), nil
}

// Fence is the node a store handle writes sandboxes as, once it joined
// (in this store and in store/postgres): a write is refused
// (torpor.Fenced) unless the node still has this epoch and instance and
// is not down.
type Fence struct {
	Node     string
	Epoch    int64
	Instance string // "": any
}

// InstanceOf is the instance the handle of f joined node name as ("" when
// it did not join as that node, or f is nil: it never joined).
func (f *Fence) InstanceOf(name string) string {
	if f != nil && f.Node == name {
		return f.Instance
	}
	return ""
}

// sameInstance reports whether a node's stored instance and one a caller
// gives are the same daemon's; an empty one, on either side, is any.
func sameInstance(stored, given string) bool {
	return stored == "" || given == "" || stored == given
}

// checkFence refuses, inside the write transaction tx, a sandbox write of
// a handle whose node was declared down since it joined. A handle that
// never joined writes unfenced, as a lone daemon does.
func (s *Store) checkFence(ctx context.Context, tx *sql.Tx) error {
	f := s.fence.Load()
	if f == nil {
		return nil
	}
	var (
		epoch           int64
		state, instance string
	)
	err := tx.StmtContext(ctx, s.stmts.fence).QueryRowContext(ctx, f.Node).Scan(&epoch, &state, &instance)
	if errors.Is(err, sql.ErrNoRows) || err == nil && (epoch != f.Epoch || torpor.NodeState(state) == torpor.NodeDown || !sameInstance(instance, f.Instance)) {
		return torpor.Fenced(f.Node)
	}
	if err != nil {
		return wrap(err, "", "check the node's epoch")
	}
	return nil
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
	record, used, err := encodeNode(n)
	if err != nil {
		return 0, err
	}
	now := micros(time.Now())
	op := fmt.Sprintf("join node %q", n.Name)
	var epoch int64
	err = s.inTx(ctx, op, func(tx *sql.Tx) error {
		// The WHERE of the upsert skips the update, and so returns no
		// row, for a node that another instance runs; a join with no
		// instance keeps the one stored.
		err := tx.QueryRowContext(ctx, `INSERT INTO nodes (name, address, proxy_address, host, state, epoch, joined_at, heartbeat_at, record, used, instance)
			VALUES (?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?)
			ON CONFLICT (name) DO UPDATE SET address = excluded.address, proxy_address = excluded.proxy_address, host = excluded.host,
				state = excluded.state, joined_at = excluded.joined_at, heartbeat_at = excluded.heartbeat_at,
				record = excluded.record, used = excluded.used,
				instance = CASE WHEN excluded.instance = '' THEN nodes.instance ELSE excluded.instance END
			WHERE nodes.state = ? OR nodes.instance = '' OR excluded.instance = '' OR nodes.instance = excluded.instance
			RETURNING epoch`,
			n.Name, n.Address, n.ProxyAddress, n.Host, string(torpor.NodeUp), now, now, record, used, n.Instance,
			string(torpor.NodeDown)).Scan(&epoch)
		if errors.Is(err, sql.ErrNoRows) {
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
	s.fence.Store(&Fence{Node: n.Name, Epoch: epoch, Instance: n.Instance})
	return epoch, nil
}

// Heartbeat records that node name, at epoch, is alive now and uses used
// (and usedVRAMMiB of its GPUs). Where this handle joined as the node,
// the node must still be its instance's.
func (s *Store) Heartbeat(ctx context.Context, name string, epoch int64, used torpor.Resources, usedVRAMMiB int64) (torpor.NodeState, error) {
	u, err := encodeNodeUse(used, usedVRAMMiB)
	if err != nil {
		return "", err
	}
	op := fmt.Sprintf("heartbeat of node %q", name)
	inst := s.fence.Load().InstanceOf(name)
	var state string
	err = s.inTx(ctx, op, func(tx *sql.Tx) error {
		err := tx.QueryRowContext(ctx, `UPDATE nodes SET heartbeat_at = ?, used = ?
			WHERE name = ? AND epoch = ? AND state <> ? AND (instance = '' OR ? = '' OR instance = ?)
			RETURNING state`,
			micros(time.Now()), u, name, epoch, string(torpor.NodeDown), inst, inst).Scan(&state)
		if errors.Is(err, sql.ErrNoRows) {
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
func missingOrFenced(ctx context.Context, tx *sql.Tx, name string) error {
	var one int
	err := tx.QueryRowContext(ctx, `SELECT 1 FROM nodes WHERE name = ?`, name).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return NodeNotJoined(name)
	}
	if err != nil {
		return wrap(err, "", fmt.Sprintf("read node %q", name))
	}
	return torpor.Fenced(name)
}

// NodeNotJoined is the not_found of a node that has no row (in this store
// and in store/postgres).
func NodeNotJoined(name string) error {
	return torpor.Errorf(torpor.ENotFound, "node %q not found; it has not joined", name)
}

// scanNode reads a row of NodeColumns.
func scanNode(sc scanner) (torpor.Node, error) {
	var nr NodeRow
	if err := sc.Scan(nr.Dest()...); err != nil {
		return torpor.Node{}, err
	}
	return nr.Node()
}

// ListNodes returns every node, by name, with the counts by state of its
// sandboxes that are not terminated.
func (s *Store) ListNodes(ctx context.Context) ([]torpor.Node, error) {
	const op = "list nodes"
	// One read transaction: the counts are of the same moment as the nodes.
	tx, err := s.read.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, wrap(err, "", op)
	}
	defer tx.Rollback()
	nodes, err := collect(ctx, tx, op, scanNode, `SELECT `+NodeColumns+` FROM nodes ORDER BY name`)
	if err != nil || len(nodes) == 0 {
		return nodes, err
	}
	type count struct {
		node, state string
		n           int
	}
	counts, err := collect(ctx, tx, op, func(sc scanner) (count, error) {
		var c count
		return c, sc.Scan(&c.node, &c.state, &c.n)
	}, `SELECT node, state, count(*) FROM sandboxes WHERE node <> '' AND state <> ? GROUP BY node, state`, string(torpor.StateTerminated))
	if err != nil {
		return nil, err
	}
	return fillCounts(nodes, counts, func(c count) (string, torpor.State, int) { return c.node, torpor.State(c.state), c.n }), nil
}

// fillCounts gives every node a Sandboxes map (empty when it has none)
// and adds counts to the nodes they name.
func fillCounts[C any](nodes []torpor.Node, counts []C, parts func(C) (string, torpor.State, int)) []torpor.Node {
	byName := make(map[string]*torpor.Node, len(nodes))
	for i := range nodes {
		nodes[i].Sandboxes = map[torpor.State]int{}
		byName[nodes[i].Name] = &nodes[i]
	}
	for _, c := range counts {
		name, st, n := parts(c)
		if nd := byName[name]; nd != nil {
			nd.Sandboxes[st] = n
		}
	}
	return nodes
}

// collect runs a query in tx and scans every row.
func collect[T any](ctx context.Context, tx *sql.Tx, op string, scan func(scanner) (T, error), query string, args ...any) ([]T, error) {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, wrap(err, "", op)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, wrap(err, "", op)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "", op)
	}
	return out, nil
}

// SetNodeState sets an up node draining or a draining one up; setting the
// state a node has is a success.
func (s *Store) SetNodeState(ctx context.Context, name string, st torpor.NodeState) error {
	if err := CheckNodeState(st); err != nil {
		return err
	}
	op := fmt.Sprintf("set node %q %s", name, st)
	return s.inTx(ctx, op, func(tx *sql.Tx) error {
		var cur string
		err := tx.QueryRowContext(ctx, `SELECT state FROM nodes WHERE name = ?`, name).Scan(&cur)
		if errors.Is(err, sql.ErrNoRows) {
			return torpor.Errorf(torpor.ENotFound, "node %q not found", name)
		}
		if err != nil {
			return wrap(err, "", op)
		}
		if torpor.NodeState(cur) == torpor.NodeDown {
			return NodeIsDown(name, st)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE nodes SET state = ? WHERE name = ?`, string(st), name); err != nil {
			return wrap(err, "", op)
		}
		return nil
	})
}

// CheckNodeState refuses a state that SetNodeState cannot set (in this
// store and in store/postgres): a node is set up or draining; down is
// DeclareDown's.
func CheckNodeState(st torpor.NodeState) error {
	if st != torpor.NodeUp && st != torpor.NodeDraining {
		return torpor.Invalid("state", "a node can be set %s or %s, not %q", torpor.NodeUp, torpor.NodeDraining, st)
	}
	return nil
}

// NodeIsDown is the conflict of a state change asked of a down node (in
// this store and in store/postgres).
func NodeIsDown(name string, st torpor.NodeState) error {
	return &torpor.Error{Code: torpor.EConflict, Reason: "node_down",
		Message: fmt.Sprintf("node %q is down; it can be set %s only once it joins again", name, st)}
}

// DeclareDown marks down every up or draining node whose last heartbeat
// is timeout or more ago, each with a new epoch, and returns them as they
// were, by name.
func (s *Store) DeclareDown(ctx context.Context, timeout time.Duration) ([]torpor.Node, error) {
	const op = "declare nodes down"
	cutoff := micros(time.Now().Add(-timeout))
	var out []torpor.Node
	err := s.inTx(ctx, op, func(tx *sql.Tx) error {
		var err error
		out, err = collect(ctx, tx, op, scanNode, `SELECT `+NodeColumns+` FROM nodes WHERE state <> ? AND heartbeat_at <= ? ORDER BY name`,
			string(torpor.NodeDown), cutoff)
		if err != nil {
			return err
		}
		for _, n := range out {
			if _, err := tx.ExecContext(ctx, `UPDATE nodes SET state = ?, epoch = epoch + 1 WHERE name = ?`, string(torpor.NodeDown), n.Name); err != nil {
				return wrap(err, "", op)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// exclusiveLocks are the locks of Exclusive: one SQLite file has one
// daemon, so a lock in the process is the fleet-wide lock.
type exclusiveLocks struct {
	mu    sync.Mutex
	byKey map[string]*sync.Mutex
}

func (l *exclusiveLocks) get(name string) *sync.Mutex {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byKey == nil {
		l.byKey = map[string]*sync.Mutex{}
	}
	m := l.byKey[name]
	if m == nil {
		m = &sync.Mutex{}
		l.byKey[name] = m
	}
	return m
}

// Exclusive runs fn while holding the lock called name, or returns false
// at once when another caller holds it.
func (s *Store) Exclusive(ctx context.Context, name string, fn func(ctx context.Context) error) (bool, error) {
	m := s.exclusive.get(name)
	if !m.TryLock() {
		return false, nil
	}
	defer m.Unlock()
	return true, fn(ctx)
}
