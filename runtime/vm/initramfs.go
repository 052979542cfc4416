package vm

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/torpor-dev/torpor/rootfs"
	"github.com/torpor-dev/torpor/runtime/instances"
)

// guestModules are the kernel modules the guest needs (Debian's cloud
// kernel builds them as modules): the virtio-mmio transport, the disk,
// the serial ports and the network card. Their dependencies are read
// from the modules.
var guestModules = []string{"virtio_mmio", "virtio_blk", "virtio_console", "virtio_net"}

// initramfs returns the path of the guest's initramfs: the agent as
// /init, the modules it loads (in /modules, with /modules/order listing
// them dependencies first) and, when the host has it, static busybox for
// debugging. It is built once per content, named by a hash of it.
func (r *Runtime) initramfs() (string, error) {
	r.buildMu.Lock()
	defer r.buildMu.Unlock()
	mods, err := moduleOrder(filepath.Join(r.kernelDir, "modules"), guestModules)
	if err != nil {
		return "", err
	}
	type entry struct {
		name string
		src  string
		mode uint32
	}
	entries := []entry{{"init", r.agentPath, 0o100755}}
	if _, err := os.Stat(rootfs.BusyboxPath); err == nil {
		entries = append(entries, entry{"bin/busybox", rootfs.BusyboxPath, 0o100755})
	}
	var order strings.Builder
	for _, m := range mods {
		name := "modules/" + filepath.Base(m)
		entries = append(entries, entry{name, m, 0o100644})
		order.WriteString("/" + name + "\n")
	}
	h := sha256.New()
	for _, e := range entries {
		f, err := os.Open(e.src)
		if err != nil {
			return "", fmt.Errorf("initramfs: %w", err)
		}
		fmt.Fprintf(h, "%s\x00", e.name)
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", fmt.Errorf("initramfs: %w", err)
		}
	}
	h.Write([]byte(order.String()))
	sum := hex.EncodeToString(h.Sum(nil))[:16]
	out := filepath.Join(r.dir, "cache", "initramfs-"+sum+".cpio.gz")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	cw := &cpioWriter{w: zw}
	for _, d := range []string{"bin", "dev", "modules", "proc", "sys"} {
		cw.add(d, 0o040755, 0, nil)
	}
	cw.add("dev/console", 0o020600, 5<<8|1, nil)
	for _, e := range entries {
		b, err := os.ReadFile(e.src)
		if err != nil {
			return "", fmt.Errorf("initramfs: %w", err)
		}
		cw.add(e.name, e.mode, 0, b)
	}
	cw.add("modules/order", 0o100644, 0, []byte(order.String()))
	cw.add("TRAILER!!!", 0, 0, nil)
	if cw.err != nil {
		return "", fmt.Errorf("initramfs: %w", cw.err)
	}
	if err := zw.Close(); err != nil {
		return "", err
	}
	if err := instances.WriteFileAtomic(out, buf.Bytes(), 0o644); err != nil {
		return "", fmt.Errorf("initramfs: %w", err)
	}
	return out, nil
}

// cpioWriter writes the "newc" cpio format the kernel unpacks.
type cpioWriter struct {
	w   io.Writer
	ino uint32
	err error
}

func (c *cpioWriter) add(name string, mode, rdev uint32, data []byte) {
	if c.err != nil {
		return
	}
	c.ino++
	nlink := 1
	if mode&0o170000 == 0o040000 {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdev>>8, rdev&0xff, len(name)+1, 0)
	b := append([]byte(hdr), name...)
	b = append(b, 0)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	_, c.err = c.w.Write(b)
}

// moduleOrder finds the named modules under dir and every module they
// depend on (read from each module's .modinfo section) and returns their
// paths, dependencies first.
func moduleOrder(dir string, want []string) ([]string, error) {
	paths := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".ko") {
			paths[strings.ReplaceAll(strings.TrimSuffix(d.Name(), ".ko"), "-", "_")] = p
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("guest kernel modules: %w", err)
	}
	var out []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(name string) error
	visit = func(name string) error {
		switch state[name] {
		case 1:
			return fmt.Errorf("guest kernel modules: dependency loop at %s", name)
		case 2:
			return nil
		}
		p, ok := paths[name]
		if !ok {
			return fmt.Errorf("guest kernel module %s is not in %s (run scripts/install.sh)", name, dir)
		}
		state[name] = 1
		deps, err := moduleDeps(p)
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := visit(d); err != nil {
				return err
			}
		}
		state[name] = 2
		out = append(out, p)
		return nil
	}
	sorted := append([]string(nil), want...)
	sort.Strings(sorted)
	for _, m := range sorted {
		if err := visit(m); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// moduleDeps reads the depends= entry of a module's .modinfo section.
func moduleDeps(p string) ([]string, error) {
	f, err := elf.Open(p)
	if err != nil {
		return nil, fmt.Errorf("module %s: %w", p, err)
	}
	defer f.Close()
	s := f.Section(".modinfo")
	if s == nil {
		return nil, nil
	}
	b, err := s.Data()
	if err != nil {
		return nil, fmt.Errorf("module %s: %w", p, err)
	}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			var deps []string
			for _, d := range strings.Split(string(v), ",") {
				if d = strings.TrimSpace(d); d != "" {
					deps = append(deps, strings.ReplaceAll(d, "-", "_"))
				}
			}
			return deps, nil
		}
	}
	return nil, nil
}
