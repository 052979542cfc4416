package sqlite

// SchemaVersion is the schema version this build migrates to, for tests
// that check it (it grows with every migration).
func SchemaVersion() int { return len(migrations()) }

// Migration returns the SQL of step i (0: the first schema).
func Migration(i int) string { return migrations()[i] }
