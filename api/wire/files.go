package wire

import "github.com/torpor-dev/torpor/files"

// The bodies of the files endpoints (docs/files.md). File descriptions,
// listings and extraction results are package files' types.
type (
	// FileInfo describes one file (GET .../files/stat and the answers of
	// PUT .../files, mkdir and rename).
	FileInfo = files.Info
	// FileList is the body of GET .../files/list.
	FileList = files.Listing
	// TarResult answers PUT .../files/tar.
	TarResult = files.TarResult
)

// MkdirRequest is the body of POST .../files/mkdir.
type MkdirRequest struct {
	Path string `json:"path"`
	// Parents makes missing parents and accepts an existing directory.
	Parents bool `json:"parents,omitempty"`
	// Mode is octal text ("0755"); empty is 0755.
	Mode string `json:"mode,omitempty"`
}

// RenameRequest is the body of POST .../files/rename.
type RenameRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
	// Overwrite replaces an existing To (a file, or an empty directory
	// when From is one).
	Overwrite bool `json:"overwrite,omitempty"`
}
