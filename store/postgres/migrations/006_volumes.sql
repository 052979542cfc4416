-- 6: tenants' volumes (the SQLite store's version 12): their records;
-- the data is the runtime's. node is the fleet node whose disk holds the
-- volume.
CREATE TABLE volumes (
	tenant     TEXT COLLATE "C" NOT NULL REFERENCES tenants (name),
	name       TEXT COLLATE "C" NOT NULL,
	id         TEXT COLLATE "C" NOT NULL UNIQUE,
	size_mib   BIGINT           NOT NULL,
	node       TEXT COLLATE "C" NOT NULL,
	created_at BIGINT           NOT NULL,
	updated_at BIGINT           NOT NULL,
	PRIMARY KEY (tenant, name)
);
