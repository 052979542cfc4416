package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/torpor-dev/torpor"
)

// templateRecord is the stored JSON form of the parts of a Template that
// are not columns. Like sandboxRecord it is the store's own format: change
// it only in ways that still read the records already written.
type templateRecord struct {
	Layers    []string                `json:"layers,omitempty"`
	Source    torpor.TemplateSource   `json:"source"`
	Digest    string                  `json:"digest,omitempty"`
	SizeBytes int64                   `json:"size_bytes,omitempty"`
	Defaults  torpor.TemplateDefaults `json:"defaults"`
}

// templateColumns are the columns scanTemplate reads, in order; in_use is
// counted from the sandboxes that are not terminated.
const templateColumns = `t.name, t.rootfs, t.created_at, t.record,
	(SELECT count(*) FROM sandboxes s
	  WHERE json_extract(s.record, '$.template') = t.name AND s.state != 'terminated')`

// PutTemplate inserts t, or replaces the template of the same name.
func (s *Store) PutTemplate(ctx context.Context, t torpor.Template) error {
	if t.Name == "" {
		return torpor.Invalid("name", "template name is empty")
	}
	op := fmt.Sprintf("put template %q", t.Name)
	rec, err := json.Marshal(templateRecord{Layers: t.Layers, Source: t.Source, Digest: t.Digest, SizeBytes: t.SizeBytes, Defaults: t.Defaults})
	if err != nil {
		return fmt.Errorf("sqlite store: %s: %w", op, err)
	}
	return s.inTx(ctx, op, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx,
			`INSERT INTO templates (name, rootfs, created_at, record) VALUES (?, ?, ?, ?)
			 ON CONFLICT (name) DO UPDATE SET rootfs = excluded.rootfs, created_at = excluded.created_at, record = excluded.record`,
			t.Name, t.RootFS, micros(t.CreatedAt), string(rec))
		if err != nil {
			return wrap(err, "", op)
		}
		return nil
	})
}

// GetTemplate returns the template called name, or not_found.
func (s *Store) GetTemplate(ctx context.Context, name string) (*torpor.Template, error) {
	row := s.read.QueryRowContext(ctx, `SELECT `+templateColumns+` FROM templates t WHERE t.name = ?`, name)
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
	rows, err := s.read.QueryContext(ctx, `SELECT `+templateColumns+` FROM templates t ORDER BY t.name`)
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

// DeleteTemplate removes the template called name unless a sandbox that
// is not terminated uses it.
func (s *Store) DeleteTemplate(ctx context.Context, name string) error {
	op := fmt.Sprintf("delete template %q", name)
	return s.inTx(ctx, op, func(tx *sql.Tx) error {
		var user string
		err := tx.QueryRowContext(ctx,
			`SELECT id FROM sandboxes WHERE json_extract(record, '$.template') = ? AND state != 'terminated'
			 ORDER BY created_at, id LIMIT 1`, name).Scan(&user)
		switch {
		case err == nil:
			return &torpor.Error{Code: torpor.EConflict, Reason: "in_use",
				Message: fmt.Sprintf("template %q is in use by sandbox %s; delete the sandboxes made from it first", name, user)}
		case !errors.Is(err, sql.ErrNoRows):
			return wrap(err, "", op)
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM templates WHERE name = ?`, name)
		if err != nil {
			return wrap(err, "", op)
		}
		if n, err := res.RowsAffected(); err != nil {
			return wrap(err, "", op)
		} else if n == 0 {
			return torpor.Errorf(torpor.ENotFound, "template %q not found", name)
		}
		return nil
	})
}

// scanTemplate reads the columns of templateColumns.
func scanTemplate(sc scanner) (torpor.Template, error) {
	var (
		t       torpor.Template
		created int64
		record  string
	)
	if err := sc.Scan(&t.Name, &t.RootFS, &created, &record, &t.InUse); err != nil {
		return t, err
	}
	t.CreatedAt = fromMicros(created)
	var rec templateRecord
	if err := json.Unmarshal([]byte(record), &rec); err != nil {
		return t, fmt.Errorf("template %q: bad record: %w", t.Name, err)
	}
	t.Layers, t.Source, t.Digest, t.SizeBytes, t.Defaults = rec.Layers, rec.Source, rec.Digest, rec.SizeBytes, rec.Defaults
	return t, nil
}
