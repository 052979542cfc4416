package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/torpor-dev/torpor"
)

var _ torpor.PoolStore = (*Store)(nil)

// SetPool stores c, replacing the pool of its template.
func (s *Store) SetPool(ctx context.Context, c torpor.PoolConfig) error {
	if err := c.Validate(); err != nil {
		return err
	}
	op := fmt.Sprintf("set the pool of template %q", c.Template)
	return s.inTx(ctx, op, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO pools (template, size, allow_internet) VALUES ($1, $2, $3)
			ON CONFLICT (template) DO UPDATE SET size = excluded.size, allow_internet = excluded.allow_internet`,
			c.Template, c.Size, c.AllowInternet); err != nil {
			return wrap(err, "", op)
		}
		return nil
	})
}

// PoolConfigs returns every stored pool, by template name.
func (s *Store) PoolConfigs(ctx context.Context) ([]torpor.PoolConfig, error) {
	return query(ctx, s, "list pools", func(row pgx.CollectableRow) (c torpor.PoolConfig, err error) {
		return c, row.Scan(&c.Template, &c.Size, &c.AllowInternet)
	}, `SELECT template, size, allow_internet FROM pools ORDER BY template`)
}
