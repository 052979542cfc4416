package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/store/sqlite"
)

var _ torpor.WebhookStore = (*Store)(nil)

// CreateWebhook inserts w; its tenant must exist. Its cursor starts at the
// newest committed event: a new endpoint gets what happens from then on
// (an event still being written commits with a larger seq, events.go).
// Its secret is stored sealed.
func (s *Store) CreateWebhook(ctx context.Context, w torpor.Webhook) error {
	if w.ID == "" || w.Secret == "" {
		return torpor.Invalid("id", "a webhook needs an id and a secret")
	}
	op := fmt.Sprintf("create webhook %q", w.ID)
	return s.inTx(ctx, op, func(tx pgx.Tx) error {
		if err := tenantExists(ctx, tx, w.Tenant); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO webhooks (id, tenant, url, secret, created_at, cursor)
			VALUES ($1, $2, $3, $4, $5, (SELECT coalesce(max(seq), 0) FROM events))`,
			w.ID, w.Tenant, w.URL, s.secrets.Seal(w.ID, w.Secret), micros(w.CreatedAt))
		if err != nil {
			return wrap(err, fmt.Sprintf("webhook %q already exists", w.ID), op)
		}
		return nil
	})
}

// ListWebhooks returns tenant's webhooks, or every tenant's for "", oldest
// first.
func (s *Store) ListWebhooks(ctx context.Context, tenant string) ([]torpor.Webhook, error) {
	return query(ctx, s, "list webhooks", func(row pgx.CollectableRow) (torpor.Webhook, error) {
		var (
			w       torpor.Webhook
			created int64
		)
		if err := row.Scan(&w.ID, &w.Tenant, &w.URL, &w.Secret, &created, &w.Cursor); err != nil {
			return w, err
		}
		w.CreatedAt = fromMicros(created)
		var err error
		w.Secret, _, err = s.secrets.Open(w.ID, w.Secret)
		return w, err
	}, `SELECT id, tenant, url, secret, created_at, cursor FROM webhooks WHERE $1 = '' OR tenant = $1 ORDER BY created_at, id`, tenant)
}

// DeleteWebhook removes one of tenant's webhooks, or returns not_found.
func (s *Store) DeleteWebhook(ctx context.Context, tenant, id string) error {
	op := fmt.Sprintf("delete webhook %q", id)
	return s.inTx(ctx, op, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM webhooks WHERE id = $1 AND tenant = $2`, id, tenant)
		if err != nil {
			return wrap(err, "", op)
		}
		if tag.RowsAffected() == 0 {
			return torpor.Errorf(torpor.ENotFound, "no webhook %q", id)
		}
		return nil
	})
}

// SetWebhookCursor records that events up to seq were delivered. The
// cursor never moves back, whichever daemon writes first.
func (s *Store) SetWebhookCursor(ctx context.Context, id string, seq int64) error {
	op := fmt.Sprintf("set cursor of webhook %q", id)
	return s.inTx(ctx, op, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE webhooks SET cursor = GREATEST(cursor, $1) WHERE id = $2`, seq, id); err != nil {
			return wrap(err, "", op)
		}
		return nil
	})
}

// openWebhookSecrets loads the webhook key from keyDir, making it on first
// use unless secrets sealed with a lost one remain, and seals the secrets
// still stored in plaintext (a copy from an old SQLite file).
func (s *Store) openWebhookSecrets(ctx context.Context, keyDir string) error {
	const op = "webhook secrets"
	rows, err := s.pool.Query(ctx, `SELECT id, secret FROM webhooks ORDER BY id`)
	if err != nil {
		return wrap(err, "", op)
	}
	stored := map[string]string{}
	var sealed []string
	for rows.Next() {
		var id, secret string
		if err := rows.Scan(&id, &secret); err != nil {
			rows.Close()
			return wrap(err, "", op)
		}
		stored[id] = secret
		if sqlite.IsSealed(secret) {
			sealed = append(sealed, id)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return wrap(err, "", op)
	}
	// Tenants' secrets are sealed with the same key (secrets.go).
	more, err := sealedSecrets(ctx, s)
	if err != nil {
		return err
	}
	if s.secrets, err = sqlite.LoadWebhookKey(keyDir, append(sealed, more...)); err != nil {
		return fmt.Errorf("postgres store: %w", err)
	}
	return s.inTx(ctx, op, func(tx pgx.Tx) error {
		for id, v := range stored {
			secret, wasSealed, err := s.secrets.Open(id, v)
			if err != nil {
				return fmt.Errorf("postgres store: %w", err)
			}
			if wasSealed {
				continue
			}
			if _, err := tx.Exec(ctx, `UPDATE webhooks SET secret = $1 WHERE id = $2 AND secret = $3`, s.secrets.Seal(id, secret), id, v); err != nil {
				return wrap(err, "", op)
			}
		}
		return nil
	})
}
