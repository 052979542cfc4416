package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/torpor-dev/torpor"
)

// CreateTenant inserts t with its quota; an existing name is a conflict.
func (s *Store) CreateTenant(ctx context.Context, t torpor.Tenant) error {
	if t.Name == "" {
		return torpor.Invalid("name", "tenant name is empty")
	}
	op := fmt.Sprintf("create tenant %q", t.Name)
	return s.inTx(ctx, op, func(tx pgx.Tx) error {
		q := t.Quota
		_, err := tx.Exec(ctx, `INSERT INTO tenants (name, created_at, max_sandboxes, max_vcpus, max_memory_mib, max_disk_mib) VALUES ($1, $2, $3, $4, $5, $6)`,
			t.Name, micros(t.CreatedAt), q.MaxSandboxes, q.MaxVCPUs, q.MaxMemoryMiB, q.MaxDiskMiB)
		if err != nil {
			return wrap(err, fmt.Sprintf("tenant %q already exists", t.Name), op)
		}
		return nil
	})
}

// SetTenantQuota replaces the quota of the tenant called name, or is
// not_found.
func (s *Store) SetTenantQuota(ctx context.Context, name string, q torpor.Quota) error {
	op := fmt.Sprintf("set the quota of tenant %q", name)
	return s.inTx(ctx, op, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE tenants SET max_sandboxes = $1, max_vcpus = $2, max_memory_mib = $3, max_disk_mib = $4 WHERE name = $5`,
			q.MaxSandboxes, q.MaxVCPUs, q.MaxMemoryMiB, q.MaxDiskMiB, name)
		if err != nil {
			return wrap(err, "", op)
		}
		if tag.RowsAffected() == 0 {
			return torpor.Errorf(torpor.ENotFound, "tenant %q not found", name)
		}
		return nil
	})
}

// tenantColumns are what scanTenant reads, in its order.
const tenantColumns = `name, created_at, max_sandboxes, max_vcpus, max_memory_mib, max_disk_mib`

func scanTenant(row pgx.Row) (torpor.Tenant, error) {
	var (
		t       torpor.Tenant
		created int64
	)
	q := &t.Quota
	if err := row.Scan(&t.Name, &created, &q.MaxSandboxes, &q.MaxVCPUs, &q.MaxMemoryMiB, &q.MaxDiskMiB); err != nil {
		return torpor.Tenant{}, err
	}
	t.CreatedAt = fromMicros(created)
	return t, nil
}

// GetTenant returns the tenant called name, or not_found.
func (s *Store) GetTenant(ctx context.Context, name string) (*torpor.Tenant, error) {
	t, err := scanTenant(s.pool.QueryRow(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE name = $1`, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, torpor.Errorf(torpor.ENotFound, "tenant %q not found", name)
	}
	if err != nil {
		return nil, wrap(err, "", fmt.Sprintf("get tenant %q", name))
	}
	return &t, nil
}

// ListTenants returns every tenant, sorted by name.
func (s *Store) ListTenants(ctx context.Context) ([]torpor.Tenant, error) {
	return query(ctx, s, "list tenants", func(row pgx.CollectableRow) (torpor.Tenant, error) { return scanTenant(row) },
		`SELECT `+tenantColumns+` FROM tenants ORDER BY name`)
}

// CreateAPIKey inserts k. Its tenant must exist (not_found otherwise); an
// existing id or hash is a conflict.
func (s *Store) CreateAPIKey(ctx context.Context, k torpor.APIKey) error {
	switch {
	case k.ID == "":
		return torpor.Invalid("id", "API key id is empty")
	case k.Hash == "":
		return torpor.Invalid("hash", "API key hash is empty")
	}
	op := fmt.Sprintf("create API key %q", k.ID)
	return s.inTx(ctx, op, func(tx pgx.Tx) error {
		if err := tenantExists(ctx, tx, k.Tenant); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO api_keys (id, tenant, admin, hash, created_at, tier) VALUES ($1, $2, $3, $4, $5, $6)`,
			k.ID, k.Tenant, k.Admin, k.Hash, micros(k.CreatedAt), cmp.Or(k.Tier, torpor.TierStandard))
		if err != nil {
			return wrap(err, fmt.Sprintf("an API key with id %q or the same secret already exists", k.ID), op)
		}
		return nil
	})
}

// tenantExists returns not_found unless the tenant called name exists. It
// locks the tenant's row against a concurrent delete until tx ends.
func tenantExists(ctx context.Context, tx pgx.Tx, name string) error {
	var one int
	err := tx.QueryRow(ctx, `SELECT 1 FROM tenants WHERE name = $1 FOR KEY SHARE`, name).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return torpor.Errorf(torpor.ENotFound, "tenant %q not found", name)
	}
	if err != nil {
		return wrap(err, "", fmt.Sprintf("look up tenant %q", name))
	}
	return nil
}

// APIKeyByHash returns the key whose secret hashes to hash, or not_found.
func (s *Store) APIKeyByHash(ctx context.Context, hash string) (*torpor.APIKey, error) {
	var (
		k       = torpor.APIKey{Hash: hash}
		created int64
		tier    string
	)
	err := s.pool.QueryRow(ctx, `SELECT id, tenant, admin, created_at, tier FROM api_keys WHERE hash = $1`, hash).
		Scan(&k.ID, &k.Tenant, &k.Admin, &created, &tier)
	if errors.Is(err, pgx.ErrNoRows) {
		// The hash is a credential: never echo it.
		return nil, torpor.Errorf(torpor.ENotFound, "API key not found")
	}
	if err != nil {
		return nil, wrap(err, "", "look up API key")
	}
	k.CreatedAt, k.Tier = fromMicros(created), tier
	return &k, nil
}
