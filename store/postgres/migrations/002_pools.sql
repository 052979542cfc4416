-- 2: the warm pools set at run time (the SQLite store's version 8). A row
-- is a template's pool, a size of 0 included: a pool turned off through
-- the API stays off after a restart whatever the flags say.
CREATE TABLE pools (
	template       TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	size           BIGINT           NOT NULL,
	allow_internet BOOLEAN          NOT NULL
);
