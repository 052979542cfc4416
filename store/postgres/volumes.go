package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/store/sqlite"
)

var _ torpor.VolumeStore = (*Store)(nil)

func volumeNotFound(name string) error {
	err := torpor.Errorf(torpor.ENotFound, "no volume %q", name)
	err.Param = "name"
	return err
}

const volumeColumns = `name, id, size_mib, node, created_at, updated_at`

func scanVolume(row pgx.Row, tenant string) (torpor.Volume, error) {
	v := torpor.Volume{Tenant: tenant}
	var created, updated int64
	if err := row.Scan(&v.Name, &v.ID, &v.SizeMiB, &v.Node, &created, &updated); err != nil {
		return v, err
	}
	v.CreatedAt, v.UpdatedAt = fromMicros(created), fromMicros(updated)
	return v, nil
}

// CreateVolume inserts v; its tenant must exist and not have the name.
func (s *Store) CreateVolume(ctx context.Context, v torpor.Volume) error {
	if err := torpor.ValidateVolumeName(v.Name); err != nil {
		return err
	}
	if err := torpor.ValidateVolumeSize(v.SizeMiB); err != nil {
		return err
	}
	op := fmt.Sprintf("create volume %q", v.Name)
	return s.inTx(ctx, op, func(tx pgx.Tx) error {
		if err := tenantExists(ctx, tx, v.Tenant); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO volumes (tenant, name, id, size_mib, node, created_at, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`,
			v.Tenant, v.Name, v.ID, v.SizeMiB, v.Node, micros(v.CreatedAt), micros(v.UpdatedAt))
		if err != nil {
			return wrap(err, fmt.Sprintf("volume %q exists", v.Name), op)
		}
		return nil
	})
}

// ListVolumes returns tenant's volumes by name.
func (s *Store) ListVolumes(ctx context.Context, tenant string) ([]torpor.Volume, error) {
	return query(ctx, s, "list volumes", func(row pgx.CollectableRow) (torpor.Volume, error) {
		return scanVolume(row, tenant)
	}, `SELECT `+volumeColumns+` FROM volumes WHERE tenant = $1 ORDER BY name`, tenant)
}

// GetVolume returns one of tenant's volumes, or not_found.
func (s *Store) GetVolume(ctx context.Context, tenant, name string) (torpor.Volume, error) {
	v, err := scanVolume(s.pool.QueryRow(ctx, `SELECT `+volumeColumns+` FROM volumes WHERE tenant = $1 AND name = $2`, tenant, name), tenant)
	if errors.Is(err, pgx.ErrNoRows) {
		return torpor.Volume{}, volumeNotFound(name)
	}
	if err != nil {
		return torpor.Volume{}, wrap(err, "", fmt.Sprintf("get volume %q", name))
	}
	return v, nil
}

// ResizeVolume sets the size of one of tenant's volumes.
func (s *Store) ResizeVolume(ctx context.Context, tenant, name string, sizeMiB int64, at time.Time) (torpor.Volume, error) {
	if err := torpor.ValidateVolumeSize(sizeMiB); err != nil {
		return torpor.Volume{}, err
	}
	op := fmt.Sprintf("resize volume %q", name)
	v, err := scanVolume(s.pool.QueryRow(ctx, `UPDATE volumes SET size_mib = $1, updated_at = $2 WHERE tenant = $3 AND name = $4
		RETURNING `+volumeColumns, sizeMiB, micros(at), tenant, name), tenant)
	if errors.Is(err, pgx.ErrNoRows) {
		return torpor.Volume{}, volumeNotFound(name)
	}
	if err != nil {
		return torpor.Volume{}, wrap(err, "", op)
	}
	return v, nil
}

// DeleteVolume removes one of tenant's volumes unless a sandbox of the
// tenant that is not terminated mounts it. The volume's row is locked
// first, so that the check and the removal see the same sandboxes.
func (s *Store) DeleteVolume(ctx context.Context, tenant, name string) error {
	op := fmt.Sprintf("delete volume %q", name)
	return s.inTx(ctx, op, func(tx pgx.Tx) error {
		var one int
		err := tx.QueryRow(ctx, `SELECT 1 FROM volumes WHERE tenant = $1 AND name = $2 FOR UPDATE`, tenant, name).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return volumeNotFound(name)
		}
		if err != nil {
			return wrap(err, "", op)
		}
		var user string
		err = tx.QueryRow(ctx, `SELECT id FROM sandboxes WHERE tenant = $1 AND state <> 'terminated'
			AND (record::jsonb -> 'volume_mounts') @> jsonb_build_array(jsonb_build_object('name', $2::text))
			ORDER BY created_at, id LIMIT 1`, tenant, name).Scan(&user)
		switch {
		case err == nil:
			return sqlite.VolumeInUse(name, user)
		case !errors.Is(err, pgx.ErrNoRows):
			return wrap(err, "", op)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM volumes WHERE tenant = $1 AND name = $2`, tenant, name); err != nil {
			return wrap(err, "", op)
		}
		return nil
	})
}
