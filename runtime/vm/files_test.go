package vm

import (
	"archive/tar"
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/files"
)

// TestGuestServices uses what the agent serves besides exec on one VM:
// its files through SandboxFS (package files' operations run in the
// guest), a server on its loopback through DialContext, run_code and
// background processes through the guest's code server, its CPU time.
func TestGuestServices(t *testing.T) {
	needHost(t)
	rt := newRuntime(t, testConfig(t))
	ctx := testCtx(t)
	spec := torpor.BootSpec{SandboxID: torpor.NewID("rt_", 12), Template: baseTemplate(t),
		Resources: torpor.Resources{VCPUs: 1, MemoryMiB: 256}}
	h, err := rt.Boot(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	ref := torpor.InstanceRef{SandboxID: spec.SandboxID, Handle: h}

	t.Run("Files", func(t *testing.T) {
		fs, err := rt.SandboxFS(testCtx(t), ref)
		if err != nil {
			t.Fatal(err)
		}
		defer fs.Close()
		big := bytes.Repeat([]byte("0123456789abcdef"), 40000) // 640 KB: several reads
		info, err := fs.Write("/root/dir/big", bytes.NewReader(big), files.WriteOptions{})
		if err != nil || info.Size != int64(len(big)) || info.Type != files.TypeFile {
			t.Fatalf("write: %+v, %v", info, err)
		}
		if out := sh(t, rt, ref, "md5sum < /root/dir/big"); !strings.HasPrefix(out, md5hex(big)) {
			t.Errorf("the guest sees %q", out)
		}
		f, info, err := fs.Open("/root/dir/big")
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(f)
		if err != nil || !bytes.Equal(got, big) {
			t.Errorf("read back %d bytes (%v), want %d", len(got), err, len(big))
		}
		if _, err := f.Seek(-6, io.SeekEnd); err != nil {
			t.Fatal(err)
		}
		tailb, _ := io.ReadAll(f)
		if string(tailb) != "abcdef" {
			t.Errorf("read after seek: %q", tailb)
		}
		f.Close()
		if _, err := fs.Mkdir("/root/a/b", files.MkdirOptions{Parents: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := fs.Rename("/root/dir/big", "/root/a/b/moved", false); err != nil {
			t.Fatal(err)
		}
		l, err := fs.List("/root", 3, files.MaxEntries)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range l.Entries {
			names = append(names, e.Path)
		}
		if !strings.Contains(strings.Join(names, " "), "/root/a/b/moved") {
			t.Errorf("list: %v", names)
		}
		var tb bytes.Buffer
		if err := fs.WriteTar(&tb, "/root/a"); err != nil {
			t.Fatal(err)
		}
		archive := append([]byte(nil), tb.Bytes()...)
		tr := tar.NewReader(&tb)
		n := 0
		for {
			if _, err := tr.Next(); err != nil {
				break
			}
			n++
		}
		if n < 2 {
			t.Errorf("tar of /root/a has %d entries", n)
		}
		if res, err := fs.ExtractTar("/root/copy", bytes.NewReader(archive)); err != nil || res.Entries < 2 {
			t.Errorf("extract: %+v, %v", res, err)
		}
		if out := sh(t, rt, ref, "md5sum < /root/copy/b/moved"); !strings.HasPrefix(out, md5hex(big)) {
			t.Errorf("extracted file: %q", out)
		}
		if err := fs.Remove("/root/a", true); err != nil {
			t.Fatal(err)
		}
		if _, err := fs.Stat("/root/a"); !torpor.IsCode(err, torpor.ENotFound) {
			t.Errorf("stat after remove: %v, want not_found", err)
		}
		// Confined: a symlink out of the root resolves inside it.
		sh(t, rt, ref, "ln -s ../../../etc /root/escape")
		if info, err := fs.Stat("/root/escape/hostname"); err == nil && info.Type != files.TypeFile {
			t.Errorf("stat through a symlink: %+v", info)
		}
		if _, err := fs.Stat("/proc/1/environ"); !torpor.IsCode(err, torpor.EInvalid) {
			t.Errorf("stat in /proc: %v, want invalid_argument", err)
		}
		// A failing upload leaves nothing.
		_, err = fs.Write("/root/partial", io.MultiReader(strings.NewReader("part"), failing{}), files.WriteOptions{})
		var re *files.ReadError
		if !asReadError(err, &re) {
			t.Errorf("write from a failing reader: %v, want a ReadError", err)
		}
		if _, err := fs.Stat("/root/partial"); !torpor.IsCode(err, torpor.ENotFound) {
			t.Errorf("a failed upload left a file: %v", err)
		}
	})

	t.Run("Dial", func(t *testing.T) {
		sh(t, rt, ref, "mkdir -p /www && echo hello-from-guest > /www/index.html && httpd -p 127.0.0.1:8080 -h /www")
		c, err := rt.DialContext(testCtx(t), ref, "tcp", "127.0.0.1:8080")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, "GET /index.html HTTP/1.0\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(body) != "hello-from-guest\n" {
			t.Errorf("GET: %d %q", resp.StatusCode, body)
		}
		if _, err := rt.DialContext(testCtx(t), ref, "tcp", "127.0.0.1:1"); err == nil {
			t.Error("dial to a closed port succeeded")
		}
	})

	t.Run("RunCode", func(t *testing.T) {
		run := func(code string) torpor.CodeResult {
			res, err := rt.RunCode(testCtx(t), ref, torpor.CodeRequest{Language: torpor.LanguageShell, Code: code})
			if err != nil {
				t.Fatalf("run_code %q: %v", code, err)
			}
			return res
		}
		if res := run("x=41; echo set"); res.Stdout != "set\n" || res.Context != torpor.ContextNew {
			t.Errorf("first snippet: %+v", res)
		}
		if res := run("echo $((x+1))"); res.Stdout != "42\n" || res.Context != torpor.ContextExisting {
			t.Errorf("second snippet: %+v", res)
		}
		_, err := rt.RunCode(testCtx(t), ref, torpor.CodeRequest{Language: torpor.LanguagePython, Code: "1"})
		if !torpor.IsCode(err, torpor.EInvalid) {
			t.Errorf("python in a busybox sandbox: %v, want invalid_argument", err)
		}
	})

	t.Run("Processes", func(t *testing.T) {
		ctx := testCtx(t)
		p, err := rt.StartProcess(ctx, ref, torpor.ProcessRequest{Cmd: []string{"/bin/sh", "-c", "read line; echo got $line"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := rt.WriteProcessStdin(ctx, ref, p.ID, []byte("hello\n"), true); err != nil {
			t.Fatal(err)
		}
		var out torpor.ProcessOutput
		waitFor(t, "the process's output", func() bool {
			out, err = rt.ProcessOutput(ctx, ref, p.ID, 0)
			return err == nil && out.Ended
		})
		if out.Data != "got hello\n" || out.ExitCode == nil || *out.ExitCode != 0 {
			t.Errorf("output %+v", out)
		}
		list, err := rt.ListProcesses(ctx, ref)
		if err != nil || len(list) != 1 || list[0].ID != p.ID {
			t.Errorf("list %+v, %v", list, err)
		}
		if _, err := rt.ProcessOutput(ctx, ref, p.ID+100, 0); !torpor.IsCode(err, torpor.ENotFound) {
			t.Errorf("output of an unknown process: %v", err)
		}
	})

	t.Run("CPUUsage", func(t *testing.T) {
		d, err := rt.CPUUsage(testCtx(t), ref)
		if err != nil || d <= 0 {
			t.Errorf("cpu usage %v, %v", d, err)
		}
	})

	t.Run("FrozenIsConflict", func(t *testing.T) {
		if err := rt.Freeze(testCtx(t), ref); err != nil {
			t.Fatal(err)
		}
		defer rt.Thaw(testCtx(t), ref)
		if _, err := rt.SandboxFS(testCtx(t), ref); !torpor.IsCode(err, torpor.EConflict) {
			t.Errorf("files of a frozen VM: %v, want conflict", err)
		}
	})
}

type failing struct{}

func (failing) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }
