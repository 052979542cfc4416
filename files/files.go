// Package files works on the files of a sandbox's root filesystem from the
// host, confined to it. Everything in that tree is under the control of the
// processes inside the sandbox (they make symlinks, swap them while the
// daemon works, create fifos), so every path is resolved by the kernel with
// openat2(2) relative to a directory opened once (Root): RESOLVE_IN_ROOT
// makes "..", absolute symlinks and relative symlinks that climb out stay
// inside it, as a chroot would, and RESOLVE_NO_MAGICLINKS and
// RESOLVE_NO_XDEV refuse /proc magic links and other mounts. Operations on
// a final component (mkdir, rename, remove, lstat) resolve its parent that
// way and then use the *at system calls on the name, never following a
// final symlink.
//
// Paths given to this package are sandbox paths: absolute ("/root/x") or
// relative to the sandbox's root ("root/x"); they are cleaned lexically, so
// "/../x" is "/x". The sandbox's own mounts (/proc, /sys, /dev, /.torpor)
// are not part of its disk and are refused.
//
// The types in this file are portable (the Go client uses them); the
// operations are Linux-only.
package files

import (
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
)

// Limits on what a caller may ask for.
const (
	// MaxPath is the longest path accepted, in bytes (PATH_MAX).
	MaxPath = 4096
	// MaxDepth is the deepest List may go.
	MaxDepth = 10
	// MaxEntries bounds the entries one List returns.
	MaxEntries = 10000
	// MaxMode is the largest permission value (rwx for all, setuid,
	// setgid, sticky).
	MaxMode = 0o7777
)

// reserved are the sandbox's own mounts: the runtime mounts them inside
// the sandbox, over its disk, so what the disk holds there is not what the
// sandbox sees. They are refused rather than shown wrong.
var reserved = []string{"/proc", "/sys", "/dev", "/.torpor"}

// Clean validates a sandbox path and returns it cleaned and absolute ("/"
// for the root). param names the input in the error.
func Clean(param, p string) (string, error) {
	switch {
	case p == "":
		return "", torpor.Invalid(param, "a path is required")
	case len(p) > MaxPath:
		return "", torpor.Invalid(param, "the path is longer than %d bytes", MaxPath)
	case strings.IndexByte(p, 0) >= 0:
		return "", torpor.Invalid(param, "the path holds a NUL byte")
	}
	c := path.Clean("/" + p)
	if r := reservedPrefix(c); r != "" {
		return "", torpor.Invalid(param, "%s is mounted by the sandbox's runtime and is not part of its disk; use exec to read it", r)
	}
	return c, nil
}

// reservedPrefix returns the reserved mount that p (clean, absolute) is or
// lies under, or "".
func reservedPrefix(p string) string {
	for _, r := range reserved {
		if p == r || strings.HasPrefix(p, r+"/") {
			return r
		}
	}
	return ""
}

// rel turns a clean absolute sandbox path into the form openat2 takes
// relative to the root: "." for the root itself.
func rel(p string) string {
	if p == "/" {
		return "."
	}
	return p[1:]
}

// Type is the kind of a file.
type Type string

// The kinds of file.
const (
	TypeFile    Type = "file"
	TypeDir     Type = "dir"
	TypeSymlink Type = "symlink"
	TypeFifo    Type = "fifo"
	TypeSocket  Type = "socket"
	TypeDevice  Type = "device"
)

// Mode is a file's permission bits (0..07777). JSON carries it as octal
// text, "0644".
type Mode uint32

// String returns the mode as four octal digits.
func (m Mode) String() string { return fmt.Sprintf("%04o", uint32(m)) }

// MarshalJSON writes the mode as octal text.
func (m Mode) MarshalJSON() ([]byte, error) { return json.Marshal(m.String()) }

// UnmarshalJSON reads the mode from octal text.
func (m *Mode) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a mode is octal text such as \"0644\": %w", err)
	}
	v, err := ParseMode("mode", s)
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// ParseMode reads a mode written in octal ("644", "0644" or "0o644").
func ParseMode(param, s string) (Mode, error) {
	t := strings.TrimPrefix(strings.TrimPrefix(s, "0o"), "0O")
	v, err := strconv.ParseUint(t, 8, 32)
	if err != nil || t == "" || v > MaxMode {
		return 0, torpor.Invalid(param, "must be an octal mode between 0 and 7777, got %q", s)
	}
	return Mode(v), nil
}

// Info describes one file, as lstat(2) sees it: a symlink is described
// itself, with its target as text.
type Info struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Type    Type      `json:"type"`
	Size    int64     `json:"size"`
	Mode    Mode      `json:"mode"`
	UID     uint32    `json:"uid"`
	GID     uint32    `json:"gid"`
	ModTime time.Time `json:"mtime"`
	// LinkTarget is a symlink's target, exactly as stored (it is resolved
	// inside the sandbox, never on the host).
	LinkTarget string `json:"link_target,omitempty"`
}

// Listing is the answer of List: the entries under a directory, depth
// first, each directory's entries sorted by name.
type Listing struct {
	Path    string `json:"path"`
	Entries []Info `json:"entries"`
	// Truncated says that more entries exist than were returned.
	Truncated bool `json:"truncated"`
}

// Owner is a file's numeric owner, as the sandbox's /etc/passwd and
// /etc/group number them.
type Owner struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

// WriteOptions tune Write.
type WriteOptions struct {
	// Mode sets the permission bits; nil keeps those of the file being
	// replaced, or 0644 for a new file.
	Mode *Mode
	// Owner owns the file written and the parent directories Write makes;
	// nil: a replaced file keeps its owner, new ones get their directory's.
	Owner *Owner
}

// MkdirOptions tune Mkdir.
type MkdirOptions struct {
	// Parents creates missing parents and accepts an existing directory.
	Parents bool
	// Mode of the new directory; nil is 0755.
	Mode *Mode
	// Owner owns the directories made; nil: the owner of the directory
	// each is made in.
	Owner *Owner
}

// TarResult tells what an extraction did.
type TarResult struct {
	// Entries counts the entries extracted.
	Entries int `json:"entries"`
	// Bytes counts the file contents written.
	Bytes int64 `json:"bytes"`
	// Skipped lists entries left out and why (at most MaxSkipped; the
	// count is in SkippedCount).
	Skipped      []SkippedEntry `json:"skipped"`
	SkippedCount int            `json:"skipped_count"`
}

// MaxSkipped bounds TarResult.Skipped.
const MaxSkipped = 100

// SkippedEntry is a tar entry that was not extracted.
type SkippedEntry struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

func (r *TarResult) skip(name, reason string) {
	r.SkippedCount++
	if len(r.Skipped) < MaxSkipped {
		r.Skipped = append(r.Skipped, SkippedEntry{Name: name, Reason: reason})
	}
}
