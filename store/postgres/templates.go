package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/store/sqlite"
)

// templateColumns are the columns scanTemplate reads, in order; in_use is
// counted from the sandboxes that are not terminated.
const templateColumns = `t.name, t.rootfs, t.created_at, t.record,
	(SELECT count(*) FROM sandboxes s WHERE s.template = t.name AND s.state <> 'terminated')`

// PutTemplate inserts t, or replaces the template of the same name.
func (s *Store) PutTemplate(ctx context.Context, t torpor.Template) error {
	if t.Name == "" {
		return torpor.Invalid("name", "template name is empty")
	}
	op := fmt.Sprintf("put template %q", t.Name)
	rec, err := sqlite.EncodeTemplateRecord(t)
	if err != nil {
		return fmt.Errorf("postgres store: %s: %w", op, err)
	}
	return s.inTx(ctx, op, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO templates (name, rootfs, created_at, record) VALUES ($1, $2, $3, $4)
			ON CONFLICT (name) DO UPDATE SET rootfs = excluded.rootfs, created_at = excluded.created_at, record = excluded.record`,
			t.Name, t.RootFS, micros(t.CreatedAt), rec)
		if err != nil {
			return wrap(err, "", op)
		}
		return nil
	})
}

// GetTemplate returns the template called name, or not_found.
func (s *Store) GetTemplate(ctx context.Context, name string) (*torpor.Template, error) {
	t, err := scanTemplate(s.pool.QueryRow(ctx, `SELECT `+templateColumns+` FROM templates t WHERE t.name = $1`, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, torpor.Errorf(torpor.ENotFound, "template %q not found", name)
	}
	if err != nil {
		return nil, wrap(err, "", fmt.Sprintf("get template %q", name))
	}
	return &t, nil
}

// ListTemplates returns every template, sorted by name.
func (s *Store) ListTemplates(ctx context.Context) ([]torpor.Template, error) {
	return query(ctx, s, "list templates", func(row pgx.CollectableRow) (torpor.Template, error) { return scanTemplate(row) },
		`SELECT `+templateColumns+` FROM templates t ORDER BY t.name`)
}

// DeleteTemplate removes the template called name unless a sandbox that
// is not terminated uses it. The template's row is locked first, so two
// daemons deleting it serialise.
func (s *Store) DeleteTemplate(ctx context.Context, name string) error {
	op := fmt.Sprintf("delete template %q", name)
	return s.inTx(ctx, op, func(tx pgx.Tx) error {
		var one int
		err := tx.QueryRow(ctx, `SELECT 1 FROM templates WHERE name = $1 FOR UPDATE`, name).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return torpor.Errorf(torpor.ENotFound, "template %q not found", name)
		}
		if err != nil {
			return wrap(err, "", op)
		}
		var user string
		err = tx.QueryRow(ctx, `SELECT id FROM sandboxes WHERE template = $1 AND state <> 'terminated'
			ORDER BY created_at, id LIMIT 1`, name).Scan(&user)
		switch {
		case err == nil:
			return &torpor.Error{Code: torpor.EConflict, Reason: "in_use",
				Message: fmt.Sprintf("template %q is in use by sandbox %s; delete the sandboxes made from it first", name, user)}
		case !errors.Is(err, pgx.ErrNoRows):
			return wrap(err, "", op)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM templates WHERE name = $1`, name); err != nil {
			return wrap(err, "", op)
		}
		return nil
	})
}

// scanTemplate reads the columns of templateColumns.
func scanTemplate(row pgx.Row) (torpor.Template, error) {
	var (
		t       torpor.Template
		created int64
		record  string
	)
	if err := row.Scan(&t.Name, &t.RootFS, &created, &record, &t.InUse); err != nil {
		return t, err
	}
	t.CreatedAt = fromMicros(created)
	return t, sqlite.DecodeTemplateRecord(&t, record)
}
