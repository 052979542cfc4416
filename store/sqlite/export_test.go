package sqlite

import "database/sql"

// DBsForTest returns the writer and the reader pools, for tests that check
// connection settings.
func (s *Store) DBsForTest() []*sql.DB { return []*sql.DB{s.write, s.read} }
