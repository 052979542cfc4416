-- 3: the fleet's nodes (the SQLite store's version 9), and the node that
-- owns each sandbox as a column, so that a node's sandboxes are found and
-- counted by an index. Times are microseconds since the Unix epoch, by the
-- database's clock (nodes.go), so that the nodes' clocks need not agree.
ALTER TABLE sandboxes ADD COLUMN node TEXT COLLATE "C" NOT NULL DEFAULT '';
CREATE INDEX sandboxes_by_node ON sandboxes (node, state);

-- record holds the node's labels, runtimes and capacity, and used what it
-- last reported in a heartbeat (the SQLite store's nodeRecord and
-- resourcesRecord). Every sandbox write of a node checks its epoch here
-- under the node's fence lock (nodes.go).
CREATE TABLE nodes (
	name          TEXT COLLATE "C" NOT NULL PRIMARY KEY,
	address       TEXT             NOT NULL,
	proxy_address TEXT             NOT NULL,
	host          TEXT             NOT NULL,
	state         TEXT             NOT NULL,
	epoch         BIGINT           NOT NULL,
	joined_at     BIGINT           NOT NULL,
	heartbeat_at  BIGINT           NOT NULL,
	record        TEXT             NOT NULL,
	used          TEXT             NOT NULL
);
