package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/torpor-dev/torpor"
)

// volumesSchema is the migration that adds tenants' volumes (their
// records; the data is the runtime's). node is the fleet node whose disk
// holds the volume.
const volumesSchema = `
CREATE TABLE volumes (
	tenant     TEXT    NOT NULL REFERENCES tenants (name),
	name       TEXT    NOT NULL,
	id         TEXT    NOT NULL UNIQUE,
	size_mib   INTEGER NOT NULL,
	node       TEXT    NOT NULL,
	created_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL,
	PRIMARY KEY (tenant, name)
) STRICT, WITHOUT ROWID;
`

func volumeNotFound(name string) error {
	err := torpor.Errorf(torpor.ENotFound, "no volume %q", name)
	err.Param = "name"
	return err
}

// VolumeInUse is the conflict of deleting a volume that sandbox mounts.
func VolumeInUse(name, sandbox string) error {
	return &torpor.Error{Code: torpor.EConflict, Reason: "in_use",
		Message: fmt.Sprintf("volume %q is mounted by sandbox %s; delete the sandboxes that mount it first", name, sandbox)}
}

var _ torpor.VolumeStore = (*Store)(nil)

const volumeColumns = `name, id, size_mib, node, created_at, updated_at`

func scanVolume(sc scanner, tenant string) (torpor.Volume, error) {
	v := torpor.Volume{Tenant: tenant}
	var created, updated int64
	if err := sc.Scan(&v.Name, &v.ID, &v.SizeMiB, &v.Node, &created, &updated); err != nil {
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
	return s.inTx(ctx, op, func(tx *sql.Tx) error {
		if err := tenantExists(ctx, tx, v.Tenant); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO volumes (tenant, name, id, size_mib, node, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?)`,
			v.Tenant, v.Name, v.ID, v.SizeMiB, v.Node, micros(v.CreatedAt), micros(v.UpdatedAt))
		if err != nil {
			return wrap(err, fmt.Sprintf("volume %q exists", v.Name), op)
		}
		return nil
	})
}

// ListVolumes returns tenant's volumes by name.
func (s *Store) ListVolumes(ctx context.Context, tenant string) ([]torpor.Volume, error) {
	const op = "list volumes"
	rows, err := s.read.QueryContext(ctx, `SELECT `+volumeColumns+` FROM volumes WHERE tenant = ? ORDER BY name`, tenant)
	if err != nil {
		return nil, wrap(err, "", op)
	}
	defer rows.Close()
	var out []torpor.Volume
	for rows.Next() {
		v, err := scanVolume(rows, tenant)
		if err != nil {
			return nil, wrap(err, "", op)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "", op)
	}
	return out, nil
}

// GetVolume returns one of tenant's volumes, or not_found.
func (s *Store) GetVolume(ctx context.Context, tenant, name string) (torpor.Volume, error) {
	v, err := scanVolume(s.read.QueryRowContext(ctx, `SELECT `+volumeColumns+` FROM volumes WHERE tenant = ? AND name = ?`, tenant, name), tenant)
	if errors.Is(err, sql.ErrNoRows) {
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
	var v torpor.Volume
	err := s.inTx(ctx, op, func(tx *sql.Tx) error {
		var err error
		v, err = scanVolume(tx.QueryRowContext(ctx, `UPDATE volumes SET size_mib = ?, updated_at = ? WHERE tenant = ? AND name = ?
			RETURNING `+volumeColumns, sizeMiB, micros(at), tenant, name), tenant)
		if errors.Is(err, sql.ErrNoRows) {
			return volumeNotFound(name)
		}
		if err != nil {
			return wrap(err, "", op)
		}
		return nil
	})
	return v, err
}

// DeleteVolume removes one of tenant's volumes unless a sandbox of the
// tenant that is not terminated mounts it.
func (s *Store) DeleteVolume(ctx context.Context, tenant, name string) error {
	op := fmt.Sprintf("delete volume %q", name)
	return s.inTx(ctx, op, func(tx *sql.Tx) error {
		var user string
		err := tx.QueryRowContext(ctx,
			`SELECT id FROM sandboxes WHERE tenant = ? AND state != 'terminated'
			 AND EXISTS (SELECT 1 FROM json_each(record, '$.volume_mounts') WHERE json_extract(value, '$.name') = ?)
			 ORDER BY created_at, id LIMIT 1`, tenant, name).Scan(&user)
		switch {
		case err == nil:
			return VolumeInUse(name, user)
		case !errors.Is(err, sql.ErrNoRows):
			return wrap(err, "", op)
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM volumes WHERE tenant = ? AND name = ?`, tenant, name)
		if err != nil {
			return wrap(err, "", op)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return volumeNotFound(name)
		}
		return nil
	})
}
