-- 5: tenants' secrets (the SQLite store's version 11). value is sealed
-- with the webhook key, with the tenant and the name as additional data
-- (sqlite.SecretAD), so that a sealed value opens only in its own row.
CREATE TABLE secrets (
	tenant     TEXT COLLATE "C" NOT NULL REFERENCES tenants (name),
	name       TEXT COLLATE "C" NOT NULL,
	value      TEXT             NOT NULL,
	version    BIGINT           NOT NULL,
	created_at BIGINT           NOT NULL,
	updated_at BIGINT           NOT NULL,
	PRIMARY KEY (tenant, name)
);
