-- 4: the instance (an id of the daemon's data dir) that each node last
-- joined from (the SQLite store's version 10), so that another data dir
-- under the same name is refused while the node is up (nodes.go). Rows
-- from before it have none, which matches any.
ALTER TABLE nodes ADD COLUMN instance TEXT NOT NULL DEFAULT '';
