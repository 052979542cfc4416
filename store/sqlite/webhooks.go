package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/torpor-dev/torpor"
)

// webhooksSchema is the migration that adds webhooks and their cursors.
const webhooksSchema = `
CREATE TABLE webhooks (
  id         TEXT PRIMARY KEY,
  tenant     TEXT NOT NULL REFERENCES tenants (name),
  url        TEXT NOT NULL,
  secret     TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  cursor     INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE INDEX webhooks_by_tenant ON webhooks (tenant, created_at);
`

// CreateWebhook inserts w; its tenant must exist. Its cursor starts at the
// newest stored event: a new endpoint gets what happens from then on. Its
// secret is stored sealed (webhook_secrets.go).
func (s *Store) CreateWebhook(ctx context.Context, w torpor.Webhook) error {
	if w.ID == "" || w.Secret == "" {
		return torpor.Invalid("id", "a webhook needs an id and a secret")
	}
	op := fmt.Sprintf("create webhook %q", w.ID)
	return s.inTx(ctx, op, func(tx *sql.Tx) error {
		if err := tenantExists(ctx, tx, w.Tenant); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO webhooks (id, tenant, url, secret, created_at, cursor)
			VALUES (?, ?, ?, ?, ?, (SELECT coalesce(max(seq), 0) FROM events))`,
			w.ID, w.Tenant, w.URL, s.secrets.seal(w.ID, w.Secret), micros(w.CreatedAt))
		if err != nil {
			return wrap(err, fmt.Sprintf("webhook %q already exists", w.ID), op)
		}
		return nil
	})
}

// ListWebhooks returns tenant's webhooks, or every tenant's for "", oldest
// first.
func (s *Store) ListWebhooks(ctx context.Context, tenant string) ([]torpor.Webhook, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT id, tenant, url, secret, created_at, cursor FROM webhooks
		WHERE ? = '' OR tenant = ? ORDER BY created_at, id`, tenant, tenant)
	if err != nil {
		return nil, wrap(err, "", "list webhooks")
	}
	defer rows.Close()
	var out []torpor.Webhook
	for rows.Next() {
		var (
			w       torpor.Webhook
			created int64
		)
		if err := rows.Scan(&w.ID, &w.Tenant, &w.URL, &w.Secret, &created, &w.Cursor); err != nil {
			return nil, wrap(err, "", "list webhooks")
		}
		if w.Secret, _, err = s.secrets.open(w.ID, w.Secret); err != nil {
			return nil, fmt.Errorf("sqlite store: list webhooks: %w", err)
		}
		w.CreatedAt = fromMicros(created)
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "", "list webhooks")
	}
	return out, nil
}

// DeleteWebhook removes one of tenant's webhooks, or returns not_found.
func (s *Store) DeleteWebhook(ctx context.Context, tenant, id string) error {
	op := fmt.Sprintf("delete webhook %q", id)
	return s.inTx(ctx, op, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM webhooks WHERE id = ? AND tenant = ?`, id, tenant)
		if err != nil {
			return wrap(err, "", op)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return torpor.Errorf(torpor.ENotFound, "no webhook %q", id)
		}
		return nil
	})
}

// SetWebhookCursor records that events up to seq were delivered. The
// cursor never moves back.
func (s *Store) SetWebhookCursor(ctx context.Context, id string, seq int64) error {
	op := fmt.Sprintf("set cursor of webhook %q", id)
	return s.inTx(ctx, op, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE webhooks SET cursor = max(cursor, ?) WHERE id = ?`, seq, id); err != nil {
			return wrap(err, "", op)
		}
		return nil
	})
}

var _ torpor.WebhookStore = (*Store)(nil)
