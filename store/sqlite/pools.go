package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/torpor-dev/torpor"
)

// poolsSchema keeps the warm pools set at run time. A row is a template's
// pool, a size of 0 included: a pool turned off through the API stays off
// after a restart whatever the flags say.
const poolsSchema = `
CREATE TABLE pools (
	template       TEXT    NOT NULL PRIMARY KEY,
	size           INTEGER NOT NULL,
	allow_internet INTEGER NOT NULL
) STRICT;
`

var _ torpor.PoolStore = (*Store)(nil)

// SetPool stores c, replacing the pool of its template.
func (s *Store) SetPool(ctx context.Context, c torpor.PoolConfig) error {
	if err := c.Validate(); err != nil {
		return err
	}
	op := fmt.Sprintf("set the pool of template %q", c.Template)
	return s.inTx(ctx, op, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx,
			`INSERT INTO pools (template, size, allow_internet) VALUES (?, ?, ?)
			 ON CONFLICT (template) DO UPDATE SET size = excluded.size, allow_internet = excluded.allow_internet`,
			c.Template, c.Size, c.AllowInternet)
		if err != nil {
			return wrap(err, "", op)
		}
		return nil
	})
}

// PoolConfigs returns every stored pool, by template name.
func (s *Store) PoolConfigs(ctx context.Context) ([]torpor.PoolConfig, error) {
	const op = "list pools"
	rows, err := s.read.QueryContext(ctx, `SELECT template, size, allow_internet FROM pools ORDER BY template`)
	if err != nil {
		return nil, wrap(err, "", op)
	}
	defer rows.Close()
	var out []torpor.PoolConfig
	for rows.Next() {
		var c torpor.PoolConfig
		if err := rows.Scan(&c.Template, &c.Size, &c.AllowInternet); err != nil {
			return nil, wrap(err, "", op)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "", op)
	}
	return out, nil
}
