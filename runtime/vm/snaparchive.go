package vm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/network"
	"github.com/torpor-dev/torpor/runtime/diskarchive"
	"github.com/torpor-dev/torpor/runtime/instances"
)

var _ torpor.SnapshotArchiver = (*Runtime)(nil)

// A snapshot-paused sandbox travels whole: its disk (as ExportDisk sends
// it, the whole disk the guest sees), the state file QEMU migrated the VM
// into and, for lazy memory, the guest's memory file, with what its
// restore needs to know of the machine. The stream is
//
//	magic    13 bytes  "torpor-vmsnap"
//	version   1 byte   1
//
// then parts, each a tag byte and its body in chunks (length:4 big-endian,
// 1 ≤ length ≤ 1 MiB, then the bytes; a length of 0 ends the body):
//
//	'M'  JSON (snapArchiveMeta), at most 1 MiB
//	'D'  the disk: a diskarchive image stream of the raw disk
//	'S'  the state file: a diskarchive image stream
//	'L'  lazy memory only: the memory file, a diskarchive image stream
//	'Z'  digest:32, the SHA-256 of every byte before the digest
//
// in that order, and nothing after. Each diskarchive stream has its own
// digest; the last one covers the framing and the machine description.
//
// The machine travels without its host paths: the importing node puts
// the disk, the state and the memory file in the sandbox's directory and
// names its own guest kernel and initramfs. The snapshot restores only
// where the guest finds what it left: the same QEMU, acceleration, guest
// kernel, CPU model and sandbox network (gateway and MTU; the guest keeps
// its address) — Host, which the fleet compares before it sends a
// snapshot to a node; ImportSnapshot checks it again before it reads
// more than the description.

const (
	snapMagic   = "torpor-vmsnap"
	snapVersion = 1
	// snapChunkMax bounds a chunk of a part's body.
	snapChunkMax = 1 << 20
)

// Names, in the sandbox's directory, of what an export or an import of a
// snapshot writes on its way; a crash leaves them, the next one removes
// them.
const (
	importStateName = "snapshot.state.import"
	importMemName   = "mem.import"
)

// Bounds of a machine a stream describes.
const (
	maxSnapVCPUs     = 256
	maxSnapMemoryMiB = 1 << 22
)

// snapPart is a part of the stream made of a file.
type snapPart struct {
	tag  byte
	path string
}

// snapArchiveMeta is the 'M' part: the exporting host and the machine.
type snapArchiveMeta struct {
	Host    string   `json:"host"`
	Machine machine  `json:"machine"`
	Meta    snapMeta `json:"meta"`
}

// Host describes what a snapshot of this runtime needs of a host to be
// restored on it: QEMU's version, the acceleration, the guest kernel (its
// version and a hash of the file), the CPU model (KVM gives the guest the
// host's CPU) and, with a sandbox network, its gateway and MTU.
func (r *Runtime) Host() string {
	r.hostOnce.Do(func() {
		parts := []string{"qemu " + r.info.QEMUVersion, "accel " + r.info.Accel, "kernel " + r.info.Kernel + " " + fileHash(filepath.Join(r.kernelDir, "vmlinux"))}
		if r.info.Accel == AccelKVM {
			parts = append(parts, "cpu "+cpuModel())
		}
		if r.net != nil {
			parts = append(parts, fmt.Sprintf("net %s mtu %d", r.net.Gateway(), r.net.MTU()))
		}
		r.host = strings.Join(parts, "; ")
	})
	return r.host
}

// hostState is Host, worked out once.
type hostState struct {
	hostOnce sync.Once
	host     string
}

// fileHash is the first 16 hex digits of the SHA-256 of a file ("none"
// when it cannot be read).
func fileHash(p string) string {
	f, err := os.Open(p)
	if err != nil {
		return "none"
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "none"
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// cpuModel is the host CPU's model name from /proc/cpuinfo.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// ExportSnapshot writes the state of a snapshotted sandbox (Snapshot
// ended its QEMU) to w and returns the bytes written: its disk, its
// snapshot and its machine. A sandbox whose VM runs, or that has no
// complete snapshot, is a conflict. The sandbox keeps all of it.
func (r *Runtime) ExportSnapshot(ctx context.Context, ref torpor.InstanceRef, w io.Writer) (int64, error) {
	var n int64
	err := instances.Locked(&r.locks, ref, checkRef, "vm: export snapshot", func(id string) error {
		st, _, err := r.inspect(ctx, id)
		if err != nil {
			return err
		}
		var meta snapMeta
		ok, err := r.loadJSON(id, filepath.Join("snapshot", metaFile), &meta)
		if err != nil {
			return err
		}
		if instances.Live(st) || !ok {
			return &torpor.Error{Code: torpor.EConflict, Reason: "state",
				Message: fmt.Sprintf("sandbox %s has no snapshot to export: pause it by snapshot first", id)}
		}
		var m machine
		if ok, err := r.loadJSON(id, "machine.json", &m); err != nil || !ok {
			return fmt.Errorf("no machine record: %v", err)
		}
		sw := newSnapWriter(w)
		mj, err := json.Marshal(snapArchiveMeta{Host: r.Host(), Machine: m, Meta: meta})
		if err != nil {
			return err
		}
		if err := sw.part('M', func(pw io.Writer) error { _, err := pw.Write(mj); return err }); err != nil {
			return err
		}
		raw := r.sandboxPath(id, exportRawName)
		_ = os.Remove(raw)
		defer os.Remove(raw)
		if err := r.convert(ctx, m.DiskFormat, r.diskPath(id), "raw", raw); err != nil {
			return err
		}
		files := []snapPart{{'D', raw}, {'S', filepath.Join(r.snapshotDir(id), stateFile)}}
		if m.Lazy {
			files = append(files, snapPart{'L', r.sandboxPath(id, memFile)})
		}
		for _, f := range files {
			if err := sw.part(f.tag, func(pw io.Writer) error {
				_, err := diskarchive.WriteImage(ctx, pw, f.path)
				return err
			}); err != nil {
				return err
			}
		}
		n, err = sw.end()
		return err
	})
	return n, err
}

// ImportSnapshot makes the disk and snapshot of sandbox id from a stream
// ExportSnapshot wrote, replacing any disk and snapshot it has, ready for
// a Restore. A stream made on another Host is refused (FailureSnapshot)
// after its description, before its data is read; a stream that is cut
// short or corrupt is invalid_argument. Everything is written beside and
// moved into place only once all of the stream has been found good: a
// refused or failed import leaves the sandbox as it was (none, and no
// directory, for a new one). A running or frozen VM is a conflict.
func (r *Runtime) ImportSnapshot(ctx context.Context, id string, src io.Reader) (torpor.SnapshotInfo, error) {
	var info torpor.SnapshotInfo
	err := instances.Locked(&r.locks, torpor.InstanceRef{SandboxID: id}, checkRef, "vm: import snapshot", func(id string) error {
		if err := r.quiesce(ctx, id, "replace the snapshot of"); err != nil {
			return err
		}
		dir := r.sandboxDir(id)
		_, err := os.Lstat(dir)
		made := errors.Is(err, fs.ErrNotExist)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		tmps := []string{r.sandboxPath(id, importRawName), r.sandboxPath(id, importName), r.sandboxPath(id, importStateName), r.sandboxPath(id, importMemName)}
		for _, p := range tmps {
			_ = os.Remove(p)
		}
		defer func() {
			for _, p := range tmps {
				_ = os.Remove(p)
			}
		}()
		err = r.importSnapshot(ctx, id, src)
		if err != nil {
			if made {
				_ = os.RemoveAll(dir)
			}
			return err
		}
		var ok bool
		if info, ok = r.snapshotInfo(id); !ok {
			return errors.New("the imported snapshot is incomplete")
		}
		return nil
	})
	return info, err
}

func (r *Runtime) importSnapshot(ctx context.Context, id string, src io.Reader) error {
	sr, err := newSnapReader(src)
	if err != nil {
		return err
	}
	var am snapArchiveMeta
	if err := sr.part('M', func(p io.Reader) error {
		b, err := io.ReadAll(io.LimitReader(p, 1<<20+1))
		if err != nil {
			return err
		}
		if len(b) > 1<<20 {
			return snapBad("its description is over 1 MiB")
		}
		if err := json.Unmarshal(b, &am); err != nil {
			return snapBad("its description is not JSON: %v", err)
		}
		return nil
	}); err != nil {
		return err
	}
	m := am.Machine
	switch {
	case am.Host != r.Host():
		return snapshotError("it was made on a host of %q and this one is %q", am.Host, r.Host())
	case m.QEMUVersion != r.info.QEMUVersion || m.Accel != r.info.Accel:
		return snapshotError("it was made by QEMU %s (%s) and this is QEMU %s (%s)", m.QEMUVersion, m.Accel, r.info.QEMUVersion, r.info.Accel)
	case m.VCPUs < 1 || m.VCPUs > maxSnapVCPUs || m.MemoryMiB < MinGuestMiB || m.MemoryMiB > maxSnapMemoryMiB:
		return snapBad("its machine (%d vCPUs, %d MiB) is not one this runtime makes", m.VCPUs, m.MemoryMiB)
	case m.Net != nil && r.net == nil:
		return snapshotError("it was made on the sandbox network, which this server does not run")
	case m.Net != nil && (!m.Net.Guest.Addr.Is4() || m.Net.Guest.Gateway != r.net.Gateway() || m.Net.Guest.MTU != r.net.MTU()):
		return snapshotError("its guest is on another sandbox network (%s via %s, MTU %d)", m.Net.Guest.Addr, m.Net.Guest.Gateway, m.Net.Guest.MTU)
	}
	raw, disk := r.sandboxPath(id, importRawName), r.sandboxPath(id, importName)
	state, mem := r.sandboxPath(id, importStateName), r.sandboxPath(id, importMemName)
	parts := []snapPart{{'D', raw}, {'S', state}}
	if m.Lazy {
		parts = append(parts, snapPart{'L', mem})
	}
	for _, pt := range parts {
		if err := sr.part(pt.tag, func(p io.Reader) error { return extractImage(ctx, p, pt.path) }); err != nil {
			return err
		}
	}
	if err := sr.end(); err != nil {
		return err
	}
	if m.Lazy {
		if fi, err := os.Stat(mem); err != nil || fi.Size() != m.MemoryMiB<<20 {
			return snapBad("its memory file does not hold the guest's %d MiB", m.MemoryMiB)
		}
	}
	if err := r.convert(ctx, "raw", raw, "qcow2", disk); err != nil {
		return err
	}
	// This node's own paths: the disk, memory file and namespace in the
	// sandbox's directory, its guest kernel and initramfs (the guest
	// runs from its memory; QEMU only loads them again).
	initrd, err := r.initramfs()
	if err != nil {
		return err
	}
	m.Kernel, m.Initramfs = filepath.Join(r.kernelDir, "vmlinux"), initrd
	m.Disk, m.DiskFormat = r.diskPath(id), "qcow2"
	m.MemPath = ""
	if m.Lazy {
		m.MemPath = r.sandboxPath(id, memFile)
	}
	if m.Net != nil {
		// Nothing of the stream reaches QEMU's command line but numbers
		// and addresses: the tap and the card are this runtime's own.
		m.Net.NetNS, m.Net.Tap, m.Net.MAC = r.netnsPath(id), tapName, network.GuestMAC(m.Net.Guest.Addr).String()
	}
	meta := am.Meta
	meta.Fingerprint, meta.QEMUVersion, meta.Lazy, meta.MemoryMiB = m.fingerprint(), m.QEMUVersion, m.Lazy, m.MemoryMiB
	// Into place, the snapshot's description last: until it is there the
	// sandbox has no snapshot (snapshotInfo).
	if err := r.dropSnapshot(id); err != nil {
		return err
	}
	if err := os.Rename(disk, r.diskPath(id)); err != nil {
		return err
	}
	if m.Lazy {
		if err := os.Rename(mem, m.MemPath); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(r.snapshotDir(id), 0o700); err != nil {
		return err
	}
	if err := os.Rename(state, filepath.Join(r.snapshotDir(id), stateFile)); err != nil {
		return err
	}
	_ = r.removeFiles(id, "instance.json", "result.json")
	if err := r.saveJSON(id, "machine.json", m); err != nil {
		return err
	}
	if err := r.saveJSON(id, filepath.Join("snapshot", metaFile), meta); err != nil {
		return err
	}
	return syncFile(r.snapshotDir(id))
}

// extractImage reads a diskarchive image stream into the new file p.
func extractImage(ctx context.Context, src io.Reader, p string) error {
	rd, err := diskarchive.NewReader(src)
	if err != nil {
		return err
	}
	defer rd.Close()
	if rd.Kind != diskarchive.Image {
		return snapBad("a part holds a %s, not an image", rd.Kind)
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	err = rd.ExtractImage(ctx, f)
	if serr := f.Sync(); err == nil {
		err = serr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// snapBad is the error of a snapshot stream that is refused.
func snapBad(format string, args ...any) error {
	return torpor.Invalid("snapshot", "the snapshot stream is refused: "+format, args...)
}

// snapWriter writes a snapshot stream's framing, hashing all of it.
type snapWriter struct {
	w io.Writer
	h hash.Hash
	n int64
}

func newSnapWriter(w io.Writer) *snapWriter {
	return &snapWriter{w: w, h: sha256.New()}
}

func (s *snapWriter) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	s.h.Write(p[:n])
	s.n += int64(n)
	return n, err
}

// part writes the part tag, then what fill writes, in chunks.
func (s *snapWriter) part(tag byte, fill func(io.Writer) error) error {
	if s.n == 0 {
		if _, err := s.Write(append([]byte(snapMagic), snapVersion)); err != nil {
			return err
		}
	}
	if _, err := s.Write([]byte{tag}); err != nil {
		return err
	}
	bw := bufio.NewWriterSize(chunker{s}, snapChunkMax)
	if err := fill(bw); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	_, err := s.Write([]byte{0, 0, 0, 0})
	return err
}

// end writes the digest and returns the bytes of the stream.
func (s *snapWriter) end() (int64, error) {
	if _, err := s.Write([]byte{'Z'}); err != nil {
		return s.n, err
	}
	sum := s.h.Sum(nil)
	_, err := s.Write(sum)
	return s.n, err
}

// chunker writes each Write as chunks of at most snapChunkMax.
type chunker struct{ s *snapWriter }

func (c chunker) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		k := min(len(p), snapChunkMax)
		var l [4]byte
		binary.BigEndian.PutUint32(l[:], uint32(k))
		if _, err := c.s.Write(l[:]); err != nil {
			return n, err
		}
		if _, err := c.s.Write(p[:k]); err != nil {
			return n, err
		}
		n += k
		p = p[k:]
	}
	return n, nil
}

// snapReader reads a snapshot stream's framing, hashing what it reads (it
// reads no byte ahead of the one it needs).
type snapReader struct {
	r io.Reader
	h hash.Hash
}

func newSnapReader(src io.Reader) (*snapReader, error) {
	s := &snapReader{h: sha256.New()}
	s.r = io.TeeReader(src, s.h)
	head := make([]byte, len(snapMagic)+1)
	if err := s.full(head); err != nil {
		return nil, err
	}
	if string(head[:len(snapMagic)]) != snapMagic {
		return nil, snapBad("it is not a VM snapshot")
	}
	if head[len(snapMagic)] != snapVersion {
		return nil, snapBad("it has version %d; this node reads %d", head[len(snapMagic)], snapVersion)
	}
	return s, nil
}

// full reads len(p) bytes; a stream that ends first is refused, a source
// that fails is that failure.
func (s *snapReader) full(p []byte) error {
	if _, err := io.ReadFull(s.r, p); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return snapBad("it is cut short")
		}
		return err
	}
	return nil
}

// part reads the next part, which must be tag, and hands its body to
// read, which must read all of it.
func (s *snapReader) part(tag byte, read func(io.Reader) error) error {
	var t [1]byte
	if err := s.full(t[:]); err != nil {
		return err
	}
	if t[0] != tag {
		return snapBad("part %q comes where %q should", t[0], tag)
	}
	body := &chunkReader{s: s}
	if err := read(body); err != nil {
		return err
	}
	if n, err := io.Copy(io.Discard, body); err != nil {
		return err
	} else if n > 0 {
		return snapBad("part %q holds %d bytes after its end", tag, n)
	}
	return nil
}

// end reads and checks the digest, and that nothing follows.
func (s *snapReader) end() error {
	var t [1]byte
	if err := s.full(t[:]); err != nil {
		return err
	}
	if t[0] != 'Z' {
		return snapBad("part %q comes where its end should", t[0])
	}
	want := s.h.Sum(nil)
	got := make([]byte, sha256.Size)
	if err := s.full(got); err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		return snapBad("its digest does not match")
	}
	if n, _ := s.r.Read(t[:]); n > 0 {
		return snapBad("bytes follow its end")
	}
	return nil
}

// chunkReader reads one part's body.
type chunkReader struct {
	s    *snapReader
	left int
	done bool
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if c.done {
		return 0, io.EOF
	}
	if c.left == 0 {
		var l [4]byte
		if err := c.s.full(l[:]); err != nil {
			return 0, err
		}
		n := binary.BigEndian.Uint32(l[:])
		if n == 0 {
			c.done = true
			return 0, io.EOF
		}
		if n > snapChunkMax {
			return 0, snapBad("a chunk of %d bytes is over %d", n, snapChunkMax)
		}
		c.left = int(n)
	}
	p = p[:min(len(p), c.left)]
	n, err := io.ReadFull(c.s.r, p)
	c.left -= n
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		err = snapBad("it is cut short")
	}
	return n, err
}
