package template

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
)

// Builder makes a root filesystem from a build recipe.
type Builder interface {
	// Check says whether the builder can run on this host (an unavailable
	// error that says what to install, when not).
	Check() error
	// Build fills dir, an empty directory, sending progress lines as it
	// goes. A recipe that cannot be built is an invalid_argument error.
	Build(ctx context.Context, req torpor.TemplateBuildRequest, dir string, progress Progress) error
}

// Build makes a Debian template: the builder's root filesystem becomes the
// template's one layer.
func (m *Manager) Build(ctx context.Context, req torpor.TemplateBuildRequest, progress Progress) (*torpor.Template, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if err := m.builder.Check(); err != nil {
		return nil, err
	}
	if progress == nil {
		progress = func(string) {}
	}
	return m.create(ctx, req.Name, progress, func(mk *made) error {
		work, err := m.newBuildDir()
		if err != nil {
			return err
		}
		defer m.removeBuildDir(work)
		root := filepath.Join(work, "root")
		if err := os.Mkdir(root, 0o755); err != nil {
			return fmt.Errorf("template: build: %w", err)
		}
		start := time.Now()
		if err := m.builder.Build(ctx, req, root, progress); err != nil {
			return err
		}
		if err := addUsers(root, req.Users, m.now(), progress); err != nil {
			return err
		}
		progress(fmt.Sprintf("root filesystem built in %s; storing it as a layer", time.Since(start).Round(time.Second)))
		mk.source = torpor.TemplateSource{Kind: torpor.SourceDebootstrap, Ref: req.Debian + "+" + strings.Join(req.Packages, ",")}
		return m.oneLayer(ctx, func() (io.ReadCloser, error) { return dirTar(root), nil }, progress, mk)
	}, req.TemplateOptions)
}

func (m *Manager) buildRoot() string { return filepath.Join(m.dir, "build") }

func (m *Manager) newBuildDir() (string, error) {
	if err := os.MkdirAll(m.buildRoot(), 0o700); err != nil {
		return "", fmt.Errorf("template: build: %w", err)
	}
	d, err := os.MkdirTemp(m.buildRoot(), "build-")
	if err != nil {
		return "", fmt.Errorf("template: build: %w", err)
	}
	return d, nil
}

// removeBuildDir removes a build directory, unmounting first whatever a
// builder left mounted in it (never descending into a mount).
func (m *Manager) removeBuildDir(dir string) {
	if err := unmountBelow(dir); err != nil {
		m.log.Error("template: a build left mounts behind; its directory stays", "dir", dir, "err", err)
		return
	}
	if err := os.RemoveAll(dir); err != nil {
		m.log.Warn("template: removing a build directory", "dir", dir, "err", err)
	}
}

// cleanBuilds removes the build directories of builds a crash interrupted.
func (m *Manager) cleanBuilds() error {
	entries, err := os.ReadDir(m.buildRoot())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("template: %w", err)
	}
	for _, e := range entries {
		m.removeBuildDir(filepath.Join(m.buildRoot(), e.Name()))
	}
	return nil
}

// unmountBelow detaches every mount at or below dir, deepest first.
func unmountBelow(dir string) error {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			points = append(points, mp)
		}
	}
	for i := len(points) - 1; i >= 0; i-- {
		if err := unix.Unmount(points[i], unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmount %s: %w", points[i], err)
		}
	}
	return nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Debootstrap builds Debian root filesystems with debootstrap
// --variant=minbase, from the mirror in the host's apt sources.
type Debootstrap struct {
	// Path is the debootstrap binary ("" looks it up in PATH).
	Path string
	// AptDir is where apt's sources are read ("" is /etc/apt).
	AptDir string
}

// Check finds debootstrap.
func (d Debootstrap) Check() error {
	if _, err := d.binary(); err != nil {
		return &torpor.Error{Code: torpor.EUnavailable, Reason: "debootstrap_missing",
			Message: "building templates needs debootstrap on the server: apt-get install debootstrap"}
	}
	return nil
}

func (d Debootstrap) binary() (string, error) {
	if d.Path != "" {
		return exec.LookPath(d.Path)
	}
	if p, err := exec.LookPath("debootstrap"); err == nil {
		return p, nil
	}
	return exec.LookPath("/usr/sbin/debootstrap")
}

// tailLines is how much of a failed build's output its error keeps.
const tailLines = 8

// Build runs debootstrap into dir, in a mount namespace of its own so that
// the mounts it makes in the target vanish with it, and trims apt's caches
// from the result.
func (d Debootstrap) Build(ctx context.Context, req torpor.TemplateBuildRequest, dir string, progress Progress) error {
	bin, err := d.binary()
	if err != nil {
		return d.Check()
	}
	mirror := req.Mirror
	if mirror == "" {
		mirror = debianMirror(d.aptDir(), req.Debian)
	}
	args := []string{"--variant=minbase"}
	if len(req.Packages) > 0 {
		args = append(args, "--include="+strings.Join(req.Packages, ","))
	}
	args = append(args, req.Debian, dir, mirror)
	progress(fmt.Sprintf("debootstrap %s from %s", strings.Join(args, " "), mirror))
	cmd := debootstrapCmd(ctx, bin, args)
	tail, err := runLines(cmd, progress)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return buildFailure(err, tail, mirror)
	}
	return trimRootFS(dir)
}

func (d Debootstrap) aptDir() string {
	if d.AptDir != "" {
		return d.AptDir
	}
	return "/etc/apt"
}

// debootstrapCmd runs debootstrap in its own mount namespace (through
// unshare, when there is one) and process group, killed as a group when
// ctx ends.
func debootstrapCmd(ctx context.Context, bin string, args []string) *exec.Cmd {
	name := bin
	if unshare, err := exec.LookPath("unshare"); err == nil {
		name, args = unshare, append([]string{"--mount", "--propagation", "private", "--", bin}, args...)
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	return cmd
}

// runLines runs cmd, passing each line of its output (stdout and stderr
// together) to progress, and returns the last lines.
func runLines(cmd *exec.Cmd, progress Progress) ([]string, error) {
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan []string)
	go func() {
		var tail []string
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if line == "" {
				continue
			}
			progress(line)
			if tail = append(tail, line); len(tail) > tailLines {
				tail = tail[1:]
			}
		}
		_, _ = io.Copy(io.Discard, pr)
		done <- tail
	}()
	err := cmd.Wait()
	pw.Close()
	return <-done, err
}

// buildFailure explains a failed debootstrap: a suite or packages the
// mirror does not have are the request's fault. The addresses in its
// output other than the mirror's own (the resolver, what the mirror's name
// resolved to) are hidden.
func buildFailure(err error, tail []string, mirror string) error {
	out := hideAddrs(strings.Join(tail, "\n"), mirror)
	param := "packages"
	if strings.Contains(out, "release file") || strings.Contains(out, "Release") {
		param = "debian"
	}
	return torpor.Invalid(param, "debootstrap failed (%v):\n%s", err, out)
}

// trimmed are apt's caches, which a template does not need.
var trimmed = []string{"var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*_*", "var/log/*.log", "var/log/apt/*"}

// trimRootFS removes apt's caches from a built root filesystem.
func trimRootFS(dir string) error {
	for _, g := range trimmed {
		matches, err := filepath.Glob(filepath.Join(dir, g))
		if err != nil {
			return err
		}
		for _, p := range matches {
			if err := os.RemoveAll(p); err != nil {
				return fmt.Errorf("template: trim %s: %w", p, err)
			}
		}
	}
	return nil
}

// defaultMirror is used when apt's sources name no Debian mirror.
const defaultMirror = "http://deb.debian.org/debian"

// debianMirror returns the mirror apt's sources use for suite, or failing
// that any Debian archive they name.
func debianMirror(aptDir, suite string) string {
	var any string
	for _, src := range aptSources(aptDir) {
		if src.uri == "" || strings.Contains(src.uri, "security") {
			continue
		}
		for _, s := range src.suites {
			if s == suite {
				return src.uri
			}
		}
		if any == "" && strings.HasSuffix(strings.TrimRight(src.uri, "/"), "/debian") {
			any = src.uri
		}
	}
	if any != "" {
		return any
	}
	return defaultMirror
}

type aptSource struct {
	uri    string
	suites []string
}

// aptSources reads sources.list, sources.list.d/*.list (one-line format)
// and sources.list.d/*.sources (deb822) for binary ("deb") entries.
func aptSources(aptDir string) []aptSource {
	var out []aptSource
	files := []string{filepath.Join(aptDir, "sources.list")}
	more, _ := filepath.Glob(filepath.Join(aptDir, "sources.list.d", "*"))
	files = append(files, more...)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if strings.HasSuffix(f, ".sources") {
			out = append(out, deb822Sources(string(data))...)
		} else if strings.HasSuffix(f, ".list") || filepath.Base(f) == "sources.list" {
			out = append(out, oneLineSources(string(data))...)
		}
	}
	return out
}

// oneLineSources parses "deb [options] URI SUITE COMPONENT..." lines.
func oneLineSources(text string) []aptSource {
	var out []aptSource
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(strings.SplitN(line, "#", 2)[0])
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") {
			for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
				f = f[1:]
			}
			if len(f) > 0 {
				f = f[1:]
			}
		}
		if len(f) >= 2 {
			out = append(out, aptSource{uri: f[0], suites: []string{f[1]}})
		}
	}
	return out
}

// deb822Sources parses stanzas of "Types:", "URIs:" and "Suites:".
func deb822Sources(text string) []aptSource {
	var out []aptSource
	for _, stanza := range strings.Split(text, "\n\n") {
		fields := map[string][]string{}
		for _, line := range strings.Split(stanza, "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			k, v, ok := strings.Cut(line, ":")
			if !ok || strings.HasPrefix(line, " ") {
				continue
			}
			fields[strings.ToLower(strings.TrimSpace(k))] = strings.Fields(v)
		}
		if !contains(fields["types"], "deb") {
			continue
		}
		for _, u := range fields["uris"] {
			out = append(out, aptSource{uri: u, suites: fields["suites"]})
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
