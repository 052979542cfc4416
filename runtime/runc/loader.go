package runc

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
)

// libMount is the directory inside the sandbox where a dynamically linked
// init binary's ELF interpreter and shared libraries are bind-mounted.
const libMount = "/.torpor/lib"

// initBinary is how the torpor binary runs inside a sandbox.
//
// A static binary (CGO_ENABLED=0, as scripts/install.sh builds it) runs as
// itself. A plain `go build` or `go install` on a host with a C compiler
// links it against the host's C library, which the sandbox's root file
// system may lack or have in another version; such a binary runs through
// the host's own ELF interpreter, bind-mounted read-only with the
// libraries the binary needs, named explicitly on the command line
// (`ld.so --library-path DIR BINARY ARG...`), so that nothing of the
// sandbox's own libraries is used. Init needs no name service of the C
// library (initproc reads /etc/passwd itself and uses the network only
// through unix sockets), so the sandbox's NSS modules are never loaded
// either. The interpreter does read the sandbox's environment, though:
// LD_PRELOAD and /etc/ld.so.preload there are loaded into the init
// processes of a dynamic binary as into any other process of the
// sandbox.
type initBinary struct {
	// argv runs the binary inside the sandbox; its arguments follow.
	argv []string
	// mounts are the binary's bind mounts: itself at initMount, and for a
	// dynamic binary its interpreter and libraries under libMount.
	mounts []ociMount
}

// staticInitArgv runs a static init binary, and every init booted before
// the runtime recorded how its init runs.
var staticInitArgv = []string{initMount}

// inspectInit reads the ELF headers of the torpor binary at p (absolute)
// and finds, for a dynamically linked one, its interpreter and the
// libraries it needs on the host, the way the interpreter would.
func inspectInit(p string) (initBinary, error) {
	f, err := elf.Open(p)
	if err != nil {
		return initBinary{}, fmt.Errorf("runc: init binary: %w", err)
	}
	defer f.Close()
	ro := []string{"bind", "ro", "nosuid", "nodev"}
	b := initBinary{argv: staticInitArgv, mounts: []ociMount{{Destination: initMount, Type: "bind", Source: p, Options: ro}}}
	interp, err := interpreter(f)
	if err != nil {
		return initBinary{}, fmt.Errorf("runc: init binary %s: %w", p, err)
	}
	if interp == "" {
		return b, nil
	}
	libs, err := neededLibraries(f, interp)
	if err != nil {
		return initBinary{}, fmt.Errorf("runc: init binary %s is dynamically linked and %w; build torpor with CGO_ENABLED=0 for a static binary", p, err)
	}
	ldso := path.Join(libMount, filepath.Base(interp))
	b.argv = []string{ldso, "--library-path", libMount, initMount}
	b.mounts = append(b.mounts, ociMount{Destination: ldso, Type: "bind", Source: libs[interp], Options: ro})
	names := make([]string, 0, len(libs))
	for name := range libs {
		if name != interp {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		if dst := path.Join(libMount, name); dst != ldso {
			b.mounts = append(b.mounts, ociMount{Destination: dst, Type: "bind", Source: libs[name], Options: ro})
		}
	}
	return b, nil
}

// interpreter returns the path in the binary's PT_INTERP header, "" for a
// static binary.
func interpreter(f *elf.File) (string, error) {
	for _, prog := range f.Progs {
		if prog.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(prog.Open(), 4096))
		if err != nil {
			return "", fmt.Errorf("program interpreter: %w", err)
		}
		s := string(bytes.TrimRight(b, "\x00"))
		if !filepath.IsAbs(s) {
			return "", fmt.Errorf("program interpreter %q is not an absolute path", s)
		}
		return s, nil
	}
	return "", nil
}

// neededLibraries resolves the interpreter and, transitively, every
// DT_NEEDED library of f to a regular file on the host (symbolic links
// followed). The result maps the interpreter's path and each library's
// name, as DT_NEEDED gives it, to that file.
func neededLibraries(f *elf.File, interp string) (map[string]string, error) {
	real, err := filepath.EvalSymlinks(interp)
	if err != nil {
		return nil, fmt.Errorf("its interpreter is missing: %w", err)
	}
	out := map[string]string{interp: real}
	dirs := librarySearchDirs(f, interp, real)
	queue := []*elf.File{f}
	for len(queue) > 0 {
		obj := queue[0]
		queue = queue[1:]
		needed, err := obj.ImportedLibraries()
		if err != nil {
			return nil, fmt.Errorf("its libraries cannot be read: %w", err)
		}
		for _, name := range needed {
			if _, done := out[name]; done {
				continue
			}
			if strings.Contains(name, "/") {
				return nil, fmt.Errorf("it needs the library %q by path", name)
			}
			lib, file, err := findLibrary(name, dirs, f)
			if err != nil {
				return nil, err
			}
			out[name] = file
			if lib != nil {
				defer lib.Close()
				queue = append(queue, lib)
			}
		}
	}
	return out, nil
}

// librarySearchDirs are where the interpreter looks for libraries that are
// not in its cache: the binary's own run path (absolute entries only), the
// interpreter's directories, and the usual library directories of Debian
// (multiarch), Fedora (lib64) and Alpine.
func librarySearchDirs(f *elf.File, interp, realInterp string) []string {
	var dirs []string
	for _, tag := range []elf.DynTag{elf.DT_RPATH, elf.DT_RUNPATH} {
		vals, _ := f.DynString(tag)
		for _, v := range vals {
			for _, d := range filepath.SplitList(v) {
				if filepath.IsAbs(d) {
					dirs = append(dirs, d)
				}
			}
		}
	}
	dirs = append(dirs, filepath.Dir(realInterp), filepath.Dir(interp))
	if triplet := multiarchTriplet(); triplet != "" {
		dirs = append(dirs, "/lib/"+triplet, "/usr/lib/"+triplet)
	}
	dirs = append(dirs, "/lib64", "/usr/lib64", "/lib", "/usr/lib")
	var uniq []string
	for _, d := range dirs {
		if !slices.Contains(uniq, d) {
			uniq = append(uniq, d)
		}
	}
	return uniq
}

// multiarchTriplet is Debian's library directory name for the running
// architecture.
func multiarchTriplet() string {
	switch runtime.GOARCH {
	case "amd64":
		return "x86_64-linux-gnu"
	case "arm64":
		return "aarch64-linux-gnu"
	case "386":
		return "i386-linux-gnu"
	case "riscv64":
		return "riscv64-linux-gnu"
	case "ppc64le":
		return "powerpc64le-linux-gnu"
	case "s390x":
		return "s390x-linux-gnu"
	}
	return ""
}

// findLibrary returns the first file named name in dirs that is an ELF
// object of bin's class and machine (a 32-bit library of the same name
// is skipped, as the interpreter skips it), opened, and its path with
// symbolic links followed.
func findLibrary(name string, dirs []string, bin *elf.File) (*elf.File, string, error) {
	for _, d := range dirs {
		p, err := filepath.EvalSymlinks(filepath.Join(d, name))
		if err != nil {
			continue
		}
		lib, err := elf.Open(p)
		if err != nil {
			continue
		}
		if lib.Class != bin.Class || lib.Machine != bin.Machine {
			lib.Close()
			continue
		}
		return lib, p, nil
	}
	return nil, "", fmt.Errorf("its library %s is in none of %s", name, strings.Join(dirs, ", "))
}

// initArgvOf returns the command that runs the init of the instance
// recorded in: the one it was booted with, which a daemon built another
// way (static or not) since then would not use.
func initArgvOf(in *instance) []string {
	if in == nil || len(in.Init) == 0 {
		return staticInitArgv
	}
	return in.Init
}
