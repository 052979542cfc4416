package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/torpor-dev/torpor"
)

var _ torpor.SecretStore = (*Store)(nil)

func secretNotFound(name string) error {
	err := torpor.Errorf(torpor.ENotFound, "no secret %q", name)
	err.Param = "name"
	return err
}

// SetSecret creates or rotates tenant's secret name, sealed with the
// webhook key as the SQLite store seals it; its tenant must exist. The
// version starts at 1 and moves by one on each set, whichever daemon
// sets it.
func (s *Store) SetSecret(ctx context.Context, tenant, name string, value []byte, at time.Time) (torpor.Secret, error) {
	if err := torpor.ValidateSecretName(name); err != nil {
		return torpor.Secret{}, err
	}
	if err := torpor.ValidateSecretValue(value); err != nil {
		return torpor.Secret{}, err
	}
	op := fmt.Sprintf("set secret %q", name)
	now := micros(at)
	sec := torpor.Secret{Tenant: tenant, Name: name, UpdatedAt: fromMicros(now)}
	err := s.inTx(ctx, op, func(tx pgx.Tx) error {
		if err := tenantExists(ctx, tx, tenant); err != nil {
			return err
		}
		var created int64
		err := tx.QueryRow(ctx, `INSERT INTO secrets (tenant, name, value, version, created_at, updated_at)
			VALUES ($1, $2, $3, 1, $4, $4)
			ON CONFLICT (tenant, name) DO UPDATE SET value = excluded.value, version = secrets.version + 1, updated_at = excluded.updated_at
			RETURNING version, created_at`,
			tenant, name, s.secrets.SealSecret(tenant, name, value), now).Scan(&sec.Version, &created)
		if err != nil {
			return wrap(err, "", op)
		}
		sec.CreatedAt = fromMicros(created)
		return nil
	})
	if err != nil {
		return torpor.Secret{}, err
	}
	return sec, nil
}

// ListSecrets returns tenant's secrets by name, without values.
func (s *Store) ListSecrets(ctx context.Context, tenant string) ([]torpor.Secret, error) {
	return query(ctx, s, "list secrets", func(row pgx.CollectableRow) (torpor.Secret, error) {
		sec := torpor.Secret{Tenant: tenant}
		var created, updated int64
		if err := row.Scan(&sec.Name, &sec.Version, &created, &updated); err != nil {
			return sec, err
		}
		sec.CreatedAt, sec.UpdatedAt = fromMicros(created), fromMicros(updated)
		return sec, nil
	}, `SELECT name, version, created_at, updated_at FROM secrets WHERE tenant = $1 ORDER BY name`, tenant)
}

// GetSecret returns one of tenant's secrets, without its value, or
// not_found.
func (s *Store) GetSecret(ctx context.Context, tenant, name string) (torpor.Secret, error) {
	sec := torpor.Secret{Tenant: tenant, Name: name}
	var created, updated int64
	err := s.pool.QueryRow(ctx, `SELECT version, created_at, updated_at FROM secrets WHERE tenant = $1 AND name = $2`,
		tenant, name).Scan(&sec.Version, &created, &updated)
	if errors.Is(err, pgx.ErrNoRows) {
		return torpor.Secret{}, secretNotFound(name)
	}
	if err != nil {
		return torpor.Secret{}, wrap(err, "", fmt.Sprintf("get secret %q", name))
	}
	sec.CreatedAt, sec.UpdatedAt = fromMicros(created), fromMicros(updated)
	return sec, nil
}

// DeleteSecret removes one of tenant's secrets, or returns not_found.
func (s *Store) DeleteSecret(ctx context.Context, tenant, name string) error {
	op := fmt.Sprintf("delete secret %q", name)
	return s.inTx(ctx, op, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM secrets WHERE tenant = $1 AND name = $2`, tenant, name)
		if err != nil {
			return wrap(err, "", op)
		}
		if tag.RowsAffected() == 0 {
			return secretNotFound(name)
		}
		return nil
	})
}

// SecretValue returns the value of tenant's secret name, opened, or
// not_found.
func (s *Store) SecretValue(ctx context.Context, tenant, name string) ([]byte, error) {
	var stored string
	err := s.pool.QueryRow(ctx, `SELECT value FROM secrets WHERE tenant = $1 AND name = $2`, tenant, name).Scan(&stored)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, secretNotFound(name)
	}
	if err != nil {
		return nil, wrap(err, "", fmt.Sprintf("read secret %q", name))
	}
	v, err := s.secrets.OpenSecret(tenant, name, stored)
	if err != nil {
		return nil, fmt.Errorf("postgres store: %w", err)
	}
	return v, nil
}

// sealedSecrets names the tenants' secrets sealed with the webhook key,
// which a new key would lose.
func sealedSecrets(ctx context.Context, s *Store) ([]string, error) {
	return query(ctx, s, "secrets", func(row pgx.CollectableRow) (string, error) {
		var tenant, name string
		err := row.Scan(&tenant, &name)
		return "secret " + tenant + "/" + name, err
	}, `SELECT tenant, name FROM secrets ORDER BY tenant, name`)
}
