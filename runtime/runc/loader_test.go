package runc

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/runtimetest"
)

func TestStaticInitRunsAsItself(t *testing.T) {
	p := runtimetest.BuildInit(t)
	b, err := inspectInit(p)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(b.argv, []string{initMount}) || len(b.mounts) != 1 || b.mounts[0].Source != p || b.mounts[0].Destination != initMount {
		t.Fatalf("static init: argv %q, mounts %+v", b.argv, b.mounts)
	}
}

// dynamicBinary returns a dynamically linked program of the host and its
// interpreter, or skips.
func dynamicBinary(t *testing.T) (string, string) {
	t.Helper()
	p, err := exec.LookPath("ls")
	if err != nil {
		t.Skip("no ls to try")
	}
	f, err := elf.Open(p)
	if err != nil {
		t.Skipf("%s: %v", p, err)
	}
	defer f.Close()
	interp, err := interpreter(f)
	if err != nil || interp == "" {
		t.Skipf("%s is not dynamically linked (%v)", p, err)
	}
	return p, interp
}

// TestDynamicInitRunsThroughTheHostInterpreter: a dynamically linked
// binary is run by the host's interpreter, bind-mounted with every library
// it needs (resolved through symbolic links to regular files of the host),
// none of the sandbox's.
func TestDynamicInitRunsThroughTheHostInterpreter(t *testing.T) {
	p, interp := dynamicBinary(t)
	b, err := inspectInit(p)
	if err != nil {
		t.Fatal(err)
	}
	ldso := libMount + "/" + filepath.Base(interp)
	if want := []string{ldso, "--library-path", libMount, initMount}; !slices.Equal(b.argv, want) {
		t.Errorf("argv %q, want %q", b.argv, want)
	}
	byDst := map[string]string{}
	for _, m := range b.mounts {
		fi, err := os.Lstat(m.Source)
		if err != nil || !fi.Mode().IsRegular() {
			t.Errorf("mount %s from %s: not a regular file (%v)", m.Destination, m.Source, err)
		}
		if !slices.Contains(m.Options, "ro") || m.Type != "bind" {
			t.Errorf("mount %s: %s %q, want a read-only bind mount", m.Destination, m.Type, m.Options)
		}
		if _, dup := byDst[m.Destination]; dup {
			t.Errorf("%s is mounted twice", m.Destination)
		}
		byDst[m.Destination] = m.Source
	}
	if real, _ := filepath.EvalSymlinks(interp); byDst[ldso] != real {
		t.Errorf("interpreter mounted from %q, want %q", byDst[ldso], real)
	}
	if byDst[initMount] != p {
		t.Errorf("binary mounted from %q, want %q", byDst[initMount], p)
	}
	f, _ := elf.Open(p)
	defer f.Close()
	needed, _ := f.ImportedLibraries()
	if len(needed) == 0 {
		t.Fatalf("%s needs no library", p)
	}
	for _, lib := range needed {
		if byDst[libMount+"/"+lib] == "" {
			t.Errorf("library %s is not mounted: %+v", lib, b.mounts)
		}
	}
}

func TestDynamicInitSpec(t *testing.T) {
	p, _ := dynamicBinary(t)
	b, err := inspectInit(p)
	if err != nil {
		t.Fatal(err)
	}
	spec := buildSpec(specInput{Boot: torpor.BootSpec{SandboxID: "sb_1", Entrypoint: []string{"/bin/server"}}, Init: b, RunDir: "/run"})
	want := append(slices.Clone(b.argv), "init", "-run", runMount, "--", "/bin/server")
	if !slices.Equal(spec.Process.Args, want) {
		t.Errorf("args %q, want %q", spec.Process.Args, want)
	}
	var dsts []string
	for _, m := range spec.Mounts {
		dsts = append(dsts, m.Destination)
	}
	for _, m := range b.mounts {
		if !slices.Contains(dsts, m.Destination) {
			t.Errorf("the spec does not mount %s: %q", m.Destination, dsts)
		}
	}
	// The exec helper and the code server run through the same command.
	args := execArgs("/root", "sb_1", b.argv, torpor.ExecRequest{Cmd: codeServerCmd(b.argv)})
	line := strings.Join(args, " ")
	if !strings.Contains(line, "sb_1 "+strings.Join(b.argv, " ")+" init exec ") || !strings.Contains(line, "--cap CAP_SETUID") {
		t.Errorf("exec of the code server: %s", line)
	}
	if !strings.Contains(line, "-- "+strings.Join(b.argv, " ")+" init code-server -socket "+runMount+"/") || !strings.Contains(line, " -self="+b.argv[0]) {
		t.Errorf("code server command: %s", line)
	}
}

// TestInitOfAnOlderInstance: an instance keeps the init command it was
// booted with; records without one ran a static binary.
func TestInitOfAnOlderInstance(t *testing.T) {
	if got := initArgvOf(&instance{}); !slices.Equal(got, []string{initMount}) {
		t.Errorf("record without init: %q", got)
	}
	dyn := []string{libMount + "/ld.so", "--library-path", libMount, initMount}
	if got := initArgvOf(&instance{Init: dyn}); !slices.Equal(got, dyn) {
		t.Errorf("record with init: %q", got)
	}
	if code := codeServerCmd(staticInitArgv); slices.ContainsFunc(code, func(w string) bool { return strings.HasPrefix(w, "-self") }) {
		t.Errorf("a static init's code server is told how to run itself: %q", code)
	}
}
