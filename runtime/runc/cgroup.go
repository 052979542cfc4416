package runc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// cgroupRoot is where the cgroup file systems are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// cgroups addresses the host's cgroup hierarchies: the unified v2 one, or
// the v1 controllers (possibly with a v2 hierarchy beside them, the
// "hybrid" layout, where runc still uses v1). Paths handed to its methods
// are relative to a hierarchy's root, like "torpor/sb_1".
type cgroups struct {
	v2 bool
	// root is the v2 mount point (v2 only).
	root string
	// controllers maps a v1 controller ("freezer", "memory") to the mount
	// point of its hierarchy (v1 only).
	controllers map[string]string
	// hierarchies lists every cgroup mount point (v1 controllers, named v1
	// hierarchies and any v2 one): runc creates the container's cgroup in
	// each, and cleanup removes it from each.
	hierarchies []string
}

// detectCgroups finds out which cgroup version the host runs, the way runc
// does: v2 only when /sys/fs/cgroup itself is a cgroup2 mount.
func detectCgroups() (*cgroups, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(cgroupRoot, &st); err != nil {
		return nil, fmt.Errorf("cgroups: %w", err)
	}
	c := &cgroups{controllers: map[string]string{}}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		c.v2, c.root = true, cgroupRoot
		c.hierarchies = []string{cgroupRoot}
		return c, nil
	}
	mounts, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	for _, m := range mounts {
		if c.isKnown(m.dir) {
			continue
		}
		c.hierarchies = append(c.hierarchies, m.dir)
		if m.fstype != "cgroup" {
			continue
		}
		for _, opt := range strings.Split(m.opts, ",") {
			if _, seen := c.controllers[opt]; !seen {
				c.controllers[opt] = m.dir
			}
		}
	}
	for _, need := range []string{"freezer", "memory"} {
		if c.controllers[need] == "" {
			return nil, fmt.Errorf("cgroups: no cgroup v1 %s controller mounted", need)
		}
	}
	return c, nil
}

func (c *cgroups) isKnown(dir string) bool {
	for _, h := range c.hierarchies {
		if h == dir {
			return true
		}
	}
	return false
}

type cgroupMount struct {
	dir, fstype, opts string
}

// cgroupMounts lists the cgroup and cgroup2 mounts of /proc/self/mountinfo.
func cgroupMounts() ([]cgroupMount, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("cgroups: %w", err)
	}
	var out []cgroupMount
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		// id parent major:minor root mountpoint opts [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 || (g[0] != "cgroup" && g[0] != "cgroup2") {
			continue
		}
		out = append(out, cgroupMount{dir: unescapeMountinfo(f[4]), fstype: g[0], opts: g[2]})
	}
	return out, sc.Err()
}

// unescapeMountinfo decodes the octal escapes (\040 for a space) of a
// mountinfo path.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func (c *cgroups) freezerDir(rel string) string {
	if c.v2 {
		return filepath.Join(c.root, rel)
	}
	return filepath.Join(c.controllers["freezer"], rel)
}

func (c *cgroups) memoryDir(rel string) string {
	if c.v2 {
		return filepath.Join(c.root, rel)
	}
	return filepath.Join(c.controllers["memory"], rel)
}

// swapLimitable reports whether memory+swap can be limited (v1 needs swap
// accounting for memory.memsw.limit_in_bytes).
func (c *cgroups) swapLimitable() bool {
	if c.v2 {
		return true
	}
	_, err := os.Stat(filepath.Join(c.controllers["memory"], "memory.memsw.limit_in_bytes"))
	return err == nil
}

// frozen reports whether the cgroup rel is frozen (or freezing: not
// every process stopped yet).
func (c *cgroups) frozen(rel string) (bool, error) {
	dir := c.freezerDir(rel)
	if c.v2 {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.freeze"))
		if err != nil {
			return false, err
		}
		return strings.TrimSpace(string(b)) == "1", nil
	}
	b, err := os.ReadFile(filepath.Join(dir, "freezer.state"))
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(string(b)) != "THAWED", nil
}

// freeze stops every process of the cgroup and returns once the kernel
// says they all are stopped. runc reads the same files, so `runc state`
// reports the container paused.
func (c *cgroups) freeze(ctx context.Context, rel string) error {
	if c.v2 {
		return c.setFreezeV2(ctx, rel, "1")
	}
	return c.setFreezerV1(ctx, rel, "FROZEN")
}

// thaw lets the cgroup's processes continue.
func (c *cgroups) thaw(ctx context.Context, rel string) error {
	if c.v2 {
		return c.setFreezeV2(ctx, rel, "0")
	}
	return c.setFreezerV1(ctx, rel, "THAWED")
}

func (c *cgroups) setFreezerV1(ctx context.Context, rel, want string) error {
	file := filepath.Join(c.freezerDir(rel), "freezer.state")
	write := func() error { return os.WriteFile(file, []byte(want), 0) }
	again := write
	if want == "FROZEN" {
		// A v1 freeze that caught a task at the wrong moment (one being
		// forked or exec'ing, as a sandbox's init is just after its boot)
		// can stay FREEZING however often FROZEN is written; thawing and
		// freezing again gets past it (runc's freezer retries the same way).
		again = func() error {
			if err := os.WriteFile(file, []byte("THAWED"), 0); err != nil {
				return err
			}
			return write()
		}
	}
	return settle(ctx, write, again, func() (bool, error) {
		b, err := os.ReadFile(file)
		return strings.TrimSpace(string(b)) == want, err
	})
}

func (c *cgroups) setFreezeV2(ctx context.Context, rel, want string) error {
	dir := c.freezerDir(rel)
	write := func() error {
		return os.WriteFile(filepath.Join(dir, "cgroup.freeze"), []byte(want), 0)
	}
	return settle(ctx, write, write, func() (bool, error) {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
		if err != nil {
			return false, err
		}
		return eventValue(b, "frozen") == want, nil
	})
}

// settle writes, then polls done with a short backoff until it holds,
// calling again every 50 ms meanwhile (a v1 freeze can stall in FREEZING,
// and its again thaws and freezes anew).
func settle(ctx context.Context, write, again func() error, done func() (bool, error)) error {
	if err := write(); err != nil {
		return err
	}
	delay := 50 * time.Microsecond
	last := time.Now()
	for polls := 0; ; polls++ {
		ok, err := done()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Since(last) > 50*time.Millisecond {
			if err := again(); err != nil {
				return err
			}
			last = time.Now()
		}
		// The first re-reads come at once: a freeze of idle processes
		// usually completes within a read or two.
		if polls < 8 {
			runtime.Gosched()
			continue
		}
		time.Sleep(delay)
		if delay < time.Millisecond {
			delay *= 2
		}
	}
}

// eventValue returns the value of key in a "key value" lines file.
func eventValue(b []byte, key string) string {
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// oomKills returns how many processes the kernel's OOM killer killed in
// the cgroup (0 when it cannot tell).
func (c *cgroups) oomKills(rel string) int64 {
	file := "memory.oom_control"
	if c.v2 {
		file = "memory.events"
	}
	b, err := os.ReadFile(filepath.Join(c.memoryDir(rel), file))
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(eventValue(b, "oom_kill"), 10, 64)
	return n
}

// remove kills whatever still runs in the cgroup rel and removes it from
// every hierarchy. A missing cgroup is not an error.
func (c *cgroups) remove(ctx context.Context, rel string) error {
	if frozen, err := c.frozen(rel); err == nil && frozen {
		_ = c.thaw(ctx, rel)
	}
	var errs []error
	for _, h := range c.hierarchies {
		if err := removeTree(ctx, filepath.Join(h, rel)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeTree removes a cgroup directory and its children, deepest first,
// killing the processes left in them.
func removeTree(ctx context.Context, dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := removeTree(ctx, filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	for delay := time.Millisecond; ; delay *= 2 {
		killProcs(dir)
		err := syscall.Rmdir(dir)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || delay > 2*time.Second {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("remove cgroup %s: %w", dir, ctx.Err())
		case <-time.After(delay):
		}
	}
}

// killProcs sends SIGKILL to every process listed in the cgroup dir.
func killProcs(dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// children lists the names of the cgroups under rel in every hierarchy.
func (c *cgroups) children(rel string) []string {
	seen := map[string]bool{}
	var out []string
	for _, h := range c.hierarchies {
		entries, err := os.ReadDir(filepath.Join(h, rel))
		if err != nil {
			continue
		}
		for _, e := range entries {
			if e.IsDir() && !seen[e.Name()] {
				seen[e.Name()] = true
				out = append(out, e.Name())
			}
		}
	}
	return out
}
