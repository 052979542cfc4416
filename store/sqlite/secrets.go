package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/torpor-dev/torpor"
)

// secretsSchema is the migration that adds tenants' secrets. value is
// sealed with the webhook key (webhook_secrets.go), with the tenant and
// the name as additional data (SecretAD).
const secretsSchema = `
CREATE TABLE secrets (
	tenant     TEXT    NOT NULL REFERENCES tenants (name),
	name       TEXT    NOT NULL,
	value      TEXT    NOT NULL,
	version    INTEGER NOT NULL,
	created_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL,
	PRIMARY KEY (tenant, name)
) STRICT, WITHOUT ROWID;
`

// SecretAD is the additional data a tenant's secret name is sealed with,
// so that a sealed value opens only in its own row (not another name's,
// another tenant's, nor as a webhook's secret, whose ids never hold a
// NUL).
func SecretAD(tenant, name string) string { return "secret\x00" + tenant + "\x00" + name }

// SealSecret encrypts the value of tenant's secret name with the webhook
// key.
func (b *SecretBox) SealSecret(tenant, name string, value []byte) string {
	return b.box.seal(SecretAD(tenant, name), string(value))
}

// OpenSecret decrypts the stored value of tenant's secret name. Unlike a
// webhook's, a secret is never stored in plaintext: one that is not
// sealed does not open. The error names the secret, never its value.
func (b *SecretBox) OpenSecret(tenant, name, stored string) ([]byte, error) {
	v, sealed, err := b.box.open(SecretAD(tenant, name), stored)
	if err != nil {
		return nil, fmt.Errorf("the value of secret %q of tenant %q does not open with %s (another key's, or another row's?)", name, tenant, WebhookKeyFile)
	}
	if !sealed {
		return nil, fmt.Errorf("the value of secret %q of tenant %q is not sealed", name, tenant)
	}
	return []byte(v), nil
}

func secretNotFound(name string) error {
	err := torpor.Errorf(torpor.ENotFound, "no secret %q", name)
	err.Param = "name"
	return err
}

var _ torpor.SecretStore = (*Store)(nil)

// SetSecret creates or rotates tenant's secret name, sealed; its tenant
// must exist. The version starts at 1 and moves by one on each set.
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
	err := s.inTx(ctx, op, func(tx *sql.Tx) error {
		if err := tenantExists(ctx, tx, tenant); err != nil {
			return err
		}
		var created int64
		err := tx.QueryRowContext(ctx, `INSERT INTO secrets (tenant, name, value, version, created_at, updated_at)
			VALUES (?, ?, ?, 1, ?, ?)
			ON CONFLICT (tenant, name) DO UPDATE SET value = excluded.value, version = version + 1, updated_at = excluded.updated_at
			RETURNING version, created_at`,
			tenant, name, s.secrets.seal(SecretAD(tenant, name), string(value)), now, now).Scan(&sec.Version, &created)
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
	const op = "list secrets"
	rows, err := s.read.QueryContext(ctx, `SELECT name, version, created_at, updated_at FROM secrets WHERE tenant = ? ORDER BY name`, tenant)
	if err != nil {
		return nil, wrap(err, "", op)
	}
	defer rows.Close()
	var out []torpor.Secret
	for rows.Next() {
		sec := torpor.Secret{Tenant: tenant}
		var created, updated int64
		if err := rows.Scan(&sec.Name, &sec.Version, &created, &updated); err != nil {
			return nil, wrap(err, "", op)
		}
		sec.CreatedAt, sec.UpdatedAt = fromMicros(created), fromMicros(updated)
		out = append(out, sec)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "", op)
	}
	return out, nil
}

// GetSecret returns one of tenant's secrets, without its value, or
// not_found.
func (s *Store) GetSecret(ctx context.Context, tenant, name string) (torpor.Secret, error) {
	sec := torpor.Secret{Tenant: tenant, Name: name}
	var created, updated int64
	err := s.read.QueryRowContext(ctx, `SELECT version, created_at, updated_at FROM secrets WHERE tenant = ? AND name = ?`,
		tenant, name).Scan(&sec.Version, &created, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return torpor.Secret{}, secretNotFound(name)
	}
	if err != nil {
		return torpor.Secret{}, wrap(err, "", fmt.Sprintf("get secret %q", name))
	}
	sec.CreatedAt, sec.UpdatedAt = fromMicros(created), fromMicros(updated)
	return sec, nil
}

// DeleteSecret removes one of tenant's secrets, or returns not_found.
// Sandboxes that reference it keep running; their next boot fails.
func (s *Store) DeleteSecret(ctx context.Context, tenant, name string) error {
	op := fmt.Sprintf("delete secret %q", name)
	return s.inTx(ctx, op, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM secrets WHERE tenant = ? AND name = ?`, tenant, name)
		if err != nil {
			return wrap(err, "", op)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return secretNotFound(name)
		}
		return nil
	})
}

// SecretValue returns the value of tenant's secret name, opened, or
// not_found.
func (s *Store) SecretValue(ctx context.Context, tenant, name string) ([]byte, error) {
	var stored string
	err := s.read.QueryRowContext(ctx, `SELECT value FROM secrets WHERE tenant = ? AND name = ?`, tenant, name).Scan(&stored)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, secretNotFound(name)
	}
	if err != nil {
		return nil, wrap(err, "", fmt.Sprintf("read secret %q", name))
	}
	v, err := (&SecretBox{box: s.secrets}).OpenSecret(tenant, name, stored)
	if err != nil {
		return nil, fmt.Errorf("sqlite store: %w", err)
	}
	return v, nil
}

// sealedSecrets names the tenants' secrets sealed with the webhook key,
// which a new key would lose.
func (s *Store) sealedSecrets(ctx context.Context) ([]string, error) {
	const op = "secrets"
	rows, err := s.write.QueryContext(ctx, `SELECT tenant, name FROM secrets ORDER BY tenant, name`)
	if err != nil {
		return nil, wrap(err, "", op)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var tenant, name string
		if err := rows.Scan(&tenant, &name); err != nil {
			return nil, wrap(err, "", op)
		}
		out = append(out, "secret "+tenant+"/"+name)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "", op)
	}
	return out, nil
}
