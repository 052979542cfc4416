package sqlite

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/torpor-dev/torpor"
)

// The functions below share this store's record formats and webhook key
// with store/postgres, so that both stores keep one format (a record moves
// between them as it is, by `torpor store copy`) and one key file.

// EncodeSandboxRecord returns the stored JSON form of the parts of sb that
// are not columns (the record column).
func EncodeSandboxRecord(sb *torpor.Sandbox) (string, error) { return encodeRecord(sb) }

// DecodeSandboxRecord fills sb's non-column fields from a record column.
func DecodeSandboxRecord(sb *torpor.Sandbox, data string) error { return decodeRecord(sb, data) }

// EncodeNodeRecord returns the stored JSON forms of the parts of n that
// are not columns: its record (labels, runtimes, capacity) and what it
// uses.
func EncodeNodeRecord(n torpor.Node) (record, used string, err error) { return encodeNode(n) }

// NodeColumns are the columns of the nodes table that a NodeRow scans, in
// its order.
const NodeColumns = `name, address, proxy_address, host, state, epoch, joined_at, heartbeat_at, record, used, instance`

// NodeRow is a row of NodeColumns as it is scanned: Scan it into Dest,
// then Node decodes it.
type NodeRow struct {
	n                   torpor.Node
	state, record, used string
	joined, beat        int64
}

// Dest returns where a scan of NodeColumns goes, in their order.
func (nr *NodeRow) Dest() []any {
	n := &nr.n
	return []any{&n.Name, &n.Address, &n.ProxyAddress, &n.Host, &nr.state, &n.Epoch, &nr.joined, &nr.beat, &nr.record, &nr.used, &n.Instance}
}

// Node returns the node scanned, its times in UTC and its record and used
// columns decoded.
func (nr *NodeRow) Node() (torpor.Node, error) {
	n := nr.n
	n.State, n.JoinedAt, n.HeartbeatAt = torpor.NodeState(nr.state), fromMicros(nr.joined), fromMicros(nr.beat)
	return n, decodeNode(&n, nr.record, nr.used)
}

// EncodeNodeUse returns the stored JSON form of a node's used column:
// what its sandboxes use (r) and the VRAM its GPU leases hold.
func EncodeNodeUse(r torpor.Resources, gpuVRAMMiB int64) (string, error) {
	return encodeNodeUse(r, gpuVRAMMiB)
}

// EncodeTemplateRecord returns the stored JSON form of the parts of t that
// are not columns.
func EncodeTemplateRecord(t torpor.Template) (string, error) {
	b, err := json.Marshal(templateRecord{Layers: t.Layers, Source: t.Source, Digest: t.Digest, SizeBytes: t.SizeBytes, Defaults: t.Defaults})
	if err != nil {
		return "", fmt.Errorf("encode template %q: %w", t.Name, err)
	}
	return string(b), nil
}

// DecodeTemplateRecord fills t's non-column fields from a record column.
func DecodeTemplateRecord(t *torpor.Template, data string) error {
	var rec templateRecord
	if err := json.Unmarshal([]byte(data), &rec); err != nil {
		return fmt.Errorf("template %q: bad record: %w", t.Name, err)
	}
	t.Layers, t.Source, t.Digest, t.SizeBytes, t.Defaults = rec.Layers, rec.Source, rec.Digest, rec.SizeBytes, rec.Defaults
	return nil
}

// SecretBox seals and opens webhook secrets with the key in WebhookKeyFile.
type SecretBox struct{ box *secretBox }

// Seal encrypts the secret of webhook id.
func (b *SecretBox) Seal(id, secret string) string { return b.box.seal(id, secret) }

// Open returns the secret stored for webhook id and whether it was sealed
// (a plaintext one is returned as it is).
func (b *SecretBox) Open(id, stored string) (secret string, sealed bool, err error) {
	return b.box.open(id, stored)
}

// IsSealed reports whether a stored secret is sealed.
func IsSealed(stored string) bool { return strings.HasPrefix(stored, sealedPrefix) }

// LoadWebhookKey reads WebhookKeyFile in dir, making it when it is missing
// unless secrets are already sealed with it (sealed names their webhooks):
// a new key would lose them for good.
func LoadWebhookKey(dir string, sealed []string) (*SecretBox, error) {
	path := filepath.Join(dir, WebhookKeyFile)
	key, err := readWebhookKey(path)
	if errors.Is(err, fs.ErrNotExist) {
		if len(sealed) > 0 {
			return nil, fmt.Errorf("%s is missing, and %d values (%s) are sealed with it: restore it, or delete those webhooks and secrets",
				path, len(sealed), strings.Join(sealed, ", "))
		}
		key, err = createWebhookKey(path)
	}
	if err != nil {
		return nil, err
	}
	box, err := newSecretBox(key)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &SecretBox{box: box}, nil
}
