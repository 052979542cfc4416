package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/torpor-dev/torpor"
)

// PutTemplate inserts t, or replaces the template of the same name.
func (s *Store) PutTemplate(ctx context.Context, t torpor.Template) error {
	if t.Name == "" {
		return torpor.Invalid("name", "template name is empty")
	}
	op := fmt.Sprintf("put template %q", t.Name)
	return s.inTx(ctx, op, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx,
			`INSERT INTO templates (name, rootfs, created_at) VALUES (?, ?, ?)
			 ON CONFLICT (name) DO UPDATE SET rootfs = excluded.rootfs, created_at = excluded.created_at`,
			t.Name, t.RootFS, micros(t.CreatedAt))
		if err != nil {
			return wrap(err, "", op)
		}
		return nil
	})
}

// GetTemplate returns the template called name, or not_found.
func (s *Store) GetTemplate(ctx context.Context, name string) (*torpor.Template, error) {
	row := s.read.QueryRowContext(ctx, `SELECT name, rootfs, created_at FROM templates WHERE name = ?`, name)
	t, err := scanTemplate(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, torpor.Errorf(torpor.ENotFound, "template %q not found", name)
	}
	if err != nil {
		return nil, wrap(err, "", fmt.Sprintf("get template %q", name))
	}
	return &t, nil
}

// ListTemplates returns every template, sorted by name.
func (s *Store) ListTemplates(ctx context.Context) ([]torpor.Template, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT name, rootfs, created_at FROM templates ORDER BY name`)
	if err != nil {
		return nil, wrap(err, "", "list templates")
	}
	defer rows.Close()
	var out []torpor.Template
	for rows.Next() {
		t, err := scanTemplate(rows)
		if err != nil {
			return nil, wrap(err, "", "list templates")
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "", "list templates")
	}
	return out, nil
}

// scanTemplate reads the columns name, rootfs, created_at.
func scanTemplate(sc scanner) (torpor.Template, error) {
	var (
		t       torpor.Template
		created int64
	)
	err := sc.Scan(&t.Name, &t.RootFS, &created)
	t.CreatedAt = fromMicros(created)
	return t, err
}
