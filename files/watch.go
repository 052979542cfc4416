package files

// Op is what happened to a watched file. One event may carry several.
type Op uint32

// The operations a Watch reports.
const (
	OpCreate Op = 1 << iota // made, or moved in
	OpWrite                 // its contents changed
	OpRemove                // deleted
	OpRename                // moved away
	OpChmod                 // its attributes changed (mode, owner, times)
)

// Has tells whether o includes x.
func (o Op) Has(x Op) bool { return o&x != 0 }

// Event is one change under a watched directory.
type Event struct {
	// Name is the file's path relative to the watched directory
	// ("a.txt", "sub/a.txt").
	Name string
	Op   Op
}

// Watcher is an optional FS capability: reporting changes under a
// directory as they happen. A watch holds nothing of the sandbox's file
// system open (it never keeps it mounted or busy) and ends when the file
// system goes away.
type Watcher interface {
	// Watch starts watching the directory p (a symlink to one is
	// followed inside the sandbox) and, with recursive, every directory
	// below it, those made later included.
	Watch(p string, recursive bool) (Watch, error)
}

// Watch is a running watch.
type Watch interface {
	// Events delivers the changes; it is closed when the watch ends
	// (Close, or the watched directory or its file system gone).
	Events() <-chan Event
	// Err says why the watch ended on its own, once Events is closed; nil
	// when it was closed or its directory went away.
	Err() error
	Close() error
}
