package vm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/instances"
	"github.com/torpor-dev/torpor/runtime/vm/proto"
)

// Files of a sandbox's snapshot directory.
const (
	stateFile = "state"
	metaFile  = "meta.json"
)

// snapMeta describes a snapshot: what machine it must be restored into.
type snapMeta struct {
	Fingerprint string    `json:"fingerprint"`
	QEMUVersion string    `json:"qemu_version"`
	Lazy        bool      `json:"lazy"`
	MemoryMiB   int64     `json:"memory_mib"`
	Time        time.Time `json:"time"`
}

// migrateTimeout bounds writing or reading a snapshot.
const migrateTimeout = 10 * time.Minute

// Snapshot writes the running (or frozen) VM to the sandbox's snapshot
// directory and ends QEMU: the guest's file systems are flushed (when it
// runs), its vCPUs stopped, and QEMU migrates it into a file — all of
// its memory (eager), or only the device state while the memory stays in
// its backing file (lazy). Afterwards Inspect reports InstanceMissing
// with the disk there; Restore continues it. Snapshotting a snapshotted
// sandbox returns the snapshot.
func (r *Runtime) Snapshot(ctx context.Context, ref torpor.InstanceRef) (torpor.SnapshotInfo, error) {
	id, err := checkRef(ref)
	if err != nil {
		return torpor.SnapshotInfo{}, err
	}
	defer r.locks.Lock(id)()
	st, in, err := r.inspect(ctx, id)
	if err != nil {
		return torpor.SnapshotInfo{}, err
	}
	if st.State == torpor.InstanceMissing {
		if info, ok := r.snapshotInfo(id); ok {
			return info, nil
		}
	}
	if err := instances.StateError("snapshot", st); err != nil {
		return torpor.SnapshotInfo{}, err
	}
	var m machine
	if ok, err := r.loadJSON(id, "machine.json", &m); err != nil || !ok {
		return torpor.SnapshotInfo{}, fmt.Errorf("vm: snapshot %s: no machine record: %v", id, err)
	}
	if st.State == torpor.InstanceRunning {
		// What the guest has not written back yet would otherwise live
		// only in the snapshot's memory, lost if it is dropped.
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if ac, release, err := r.agents.get(sctx, r.sandboxPath(id, agentSock)); err == nil {
			_ = ac.call(sctx, proto.OpSync, nil, nil)
			release()
		}
		cancel()
	}
	r.agents.drop(r.sandboxPath(id, agentSock))
	if err := r.writeSnapshot(ctx, id, m); err != nil {
		// Leave the VM as it was.
		if st.State == torpor.InstanceRunning {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			_ = qmpDo(cctx, r.sandboxPath(id, qmpSock), "cont", nil, nil)
			cancel()
		}
		return torpor.SnapshotInfo{}, fmt.Errorf("vm: snapshot %s: %w", id, err)
	}
	r.endQEMU(ctx, id, *in)
	// The namespace and its tap go with QEMU; Restore makes them again
	// for the address the guest keeps.
	r.detach(ctx, id)
	if err := r.removeFiles(id, "instance.json", "result.json", qmpSock, agentSock, pidFile); err != nil {
		return torpor.SnapshotInfo{}, fmt.Errorf("vm: snapshot %s: %w", id, err)
	}
	info, _ := r.snapshotInfo(id)
	return info, nil
}

// writeSnapshot migrates the stopped VM into the snapshot directory and
// flushes it to disk, meta last.
func (r *Runtime) writeSnapshot(ctx context.Context, id string, m machine) error {
	dir := r.snapshotDir(id)
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	mctx, cancel := context.WithTimeout(ctx, migrateTimeout)
	defer cancel()
	q, err := dialQMP(mctx, r.sandboxPath(id, qmpSock))
	if err != nil {
		return err
	}
	defer q.close()
	if err := q.do(mctx, "stop", nil, nil); err != nil {
		return err
	}
	if err := setMigration(mctx, q, m.Lazy); err != nil {
		return err
	}
	tmp := filepath.Join(dir, stateFile+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	err = q.passFD(mctx, "snap", f)
	f.Close()
	if err != nil {
		return err
	}
	if err := q.do(mctx, "migrate", map[string]any{"uri": "fd:snap"}, nil); err != nil {
		return err
	}
	if err := awaitMigration(mctx, q, nil); err != nil {
		return err
	}
	if err := syncFile(tmp); err != nil {
		return err
	}
	if m.Lazy {
		if err := syncFile(m.MemPath); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, filepath.Join(dir, stateFile)); err != nil {
		return err
	}
	meta := snapMeta{Fingerprint: m.fingerprint(), QEMUVersion: m.QEMUVersion, Lazy: m.Lazy, MemoryMiB: m.MemoryMiB, Time: time.Now().UTC()}
	if err := r.saveJSON(id, filepath.Join("snapshot", metaFile), meta); err != nil {
		return err
	}
	return syncFile(dir)
}

// setMigration sets what both ends of a migration agree on: no bandwidth
// cap (QEMU's default is 32 MiB/s, meant for live migration over a
// network) and, for lazy memory, leaving the shared memory file out.
func setMigration(ctx context.Context, q *qmp, lazy bool) error {
	if err := q.do(ctx, "migrate-set-capabilities", map[string]any{"capabilities": []map[string]any{
		{"capability": "x-ignore-shared", "state": lazy},
	}}, nil); err != nil {
		return err
	}
	return q.do(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}, nil)
}

// passFD hands QEMU a file descriptor under a name (getfd).
func (q *qmp) passFD(ctx context.Context, name string, f *os.File) error {
	stop := q.bound(ctx)
	defer stop()
	_, err := q.call("getfd", map[string]any{"fdname": name}, f)
	return ctxErr(ctx, err)
}

// awaitMigration polls query-migrate until the migration completes or
// fails; alive, when given, reports whether QEMU still runs (an incoming
// migration that fails ends it).
func awaitMigration(ctx context.Context, q *qmp, alive func() bool) error {
	for delay := time.Millisecond; ; delay = min(2*delay, 20*time.Millisecond) {
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := q.do(ctx, "query-migrate", nil, &st); err != nil {
			return err
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			if st.ErrorDesc == "" {
				st.ErrorDesc = st.Status
			}
			return errors.New("migration failed: " + st.ErrorDesc)
		}
		if alive != nil && !alive() {
			return errors.New("QEMU exited while loading the snapshot")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

// syncFile flushes a file (or directory) to disk.
func syncFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// snapshotInfo describes the sandbox's snapshot, if it has a complete one.
func (r *Runtime) snapshotInfo(id string) (torpor.SnapshotInfo, bool) {
	var meta snapMeta
	if ok, err := r.loadJSON(id, filepath.Join("snapshot", metaFile), &meta); err != nil || !ok {
		return torpor.SnapshotInfo{}, false
	}
	dir := r.snapshotDir(id)
	size := allocated(filepath.Join(dir, stateFile))
	if meta.Lazy {
		size += allocated(r.sandboxPath(id, memFile))
	}
	return torpor.SnapshotInfo{Path: dir, SizeBytes: size}, true
}

// allocated is the disk space a file takes (sparse files count only
// what they hold).
func allocated(p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}

// dropSnapshot removes the sandbox's snapshot (and a lazy guest's memory
// file, whose contents only a snapshot needs).
func (r *Runtime) dropSnapshot(id string) error {
	if err := os.RemoveAll(r.snapshotDir(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return r.removeFiles(id, memFile)
}

// snapshotError is the error of a snapshot that cannot be restored.
func snapshotError(format string, args ...any) error {
	return &torpor.Error{Code: torpor.EConflict, Reason: torpor.FailureSnapshot,
		Message: "the snapshot cannot be restored: " + fmt.Sprintf(format, args...) + "; the disk is kept, start the sandbox afresh"}
}

// Restore starts QEMU on the snapshot (the same machine, waiting for an
// incoming migration), loads it, continues the VM and reconnects to the
// agent. A snapshot that is missing, corrupt or made by another QEMU or
// machine is an *torpor.Error with Reason torpor.FailureSnapshot; the
// disk and the snapshot's files are left as they are. Restoring a
// sandbox whose VM runs returns its handle.
func (r *Runtime) Restore(ctx context.Context, ref torpor.InstanceRef) (string, error) {
	id, err := checkRef(ref)
	if err != nil {
		return "", err
	}
	defer r.locks.Lock(id)()
	st, in, err := r.inspect(ctx, id)
	if err != nil {
		return "", err
	}
	if instances.Live(st) {
		return in.handle(id), nil
	}
	var meta snapMeta
	ok, err := r.loadJSON(id, filepath.Join("snapshot", metaFile), &meta)
	if err != nil {
		return "", snapshotError("its description is unreadable: %v", err)
	}
	if !ok {
		return "", snapshotError("the sandbox has no snapshot")
	}
	var m machine
	if ok, err := r.loadJSON(id, "machine.json", &m); err != nil || !ok {
		return "", snapshotError("the machine it was made on is not recorded")
	}
	switch {
	case m.fingerprint() != meta.Fingerprint:
		return "", snapshotError("it was made on another machine configuration")
	case m.QEMUVersion != r.info.QEMUVersion:
		return "", snapshotError("it was made by QEMU %s and this is QEMU %s", m.QEMUVersion, r.info.QEMUVersion)
	}
	for _, p := range []string{m.Kernel, m.Initramfs, m.Disk, filepath.Join(r.snapshotDir(id), stateFile)} {
		if _, err := os.Stat(p); err != nil {
			return "", snapshotError("%s is missing", filepath.Base(p))
		}
	}
	if m.Lazy {
		if fi, err := os.Stat(m.MemPath); err != nil || fi.Size() != m.MemoryMiB<<20 {
			return "", snapshotError("its memory file is missing or has the wrong size")
		}
	}
	r.removeFiles(id, "result.json")
	r.setBooting(id, true)
	defer r.setBooting(id, false)
	if err := r.retakeVolumes(ctx, m); err != nil {
		return "", err
	}
	if err := r.reattach(ctx, id, m); err != nil {
		return "", err
	}
	in2, err := r.restore(ctx, id, m)
	if err != nil {
		r.detach(ctx, id)
		var te *torpor.Error
		if errors.As(err, &te) || ctx.Err() != nil {
			return "", err
		}
		return "", snapshotError("%v", err)
	}
	if err := os.Remove(filepath.Join(r.snapshotDir(id), stateFile)); err != nil {
		r.log.Warn("vm: drop the restored snapshot", "sandbox", id, "err", err)
	}
	_ = os.RemoveAll(r.snapshotDir(id))
	return in2.handle(id), nil
}

// restore starts the incoming QEMU, loads the state and waits for the
// agent; on failure nothing of it is left running.
func (r *Runtime) restore(ctx context.Context, id string, m machine) (in instance, err error) {
	t0 := time.Now()
	p, err := r.startQEMU(ctx, r.sandboxDir(id), m, true)
	if err != nil {
		return instance{}, err
	}
	in = instance{Proc: p, Boot: time.Now().UnixNano()}
	defer func() {
		if err != nil {
			r.agents.drop(r.sandboxPath(id, agentSock))
			_ = p.Kill(context.Background())
			_ = r.removeFiles(id, "instance.json")
		}
	}()
	mctx, cancel := context.WithTimeout(ctx, migrateTimeout)
	defer cancel()
	q, err := dialQMP(mctx, r.sandboxPath(id, qmpSock))
	if err != nil {
		return instance{}, err
	}
	defer q.close()
	if err := setMigration(mctx, q, m.Lazy); err != nil {
		return instance{}, err
	}
	f, err := os.Open(filepath.Join(r.snapshotDir(id), stateFile))
	if err != nil {
		return instance{}, err
	}
	err = q.passFD(mctx, "snap", f)
	f.Close()
	if err != nil {
		return instance{}, err
	}
	if err := q.do(mctx, "migrate-incoming", map[string]any{"uri": "fd:snap"}, nil); err != nil {
		return instance{}, err
	}
	t1 := time.Now()
	if err := awaitMigration(mctx, q, p.Alive); err != nil {
		if !p.Alive() {
			return instance{}, fmt.Errorf("%v: %s", err, instances.ReadTail(r.sandboxPath(id, qemuLog), 1024))
		}
		return instance{}, err
	}
	if err := q.do(mctx, "cont", nil, nil); err != nil {
		return instance{}, err
	}
	if err := r.saveJSON(id, "instance.json", in); err != nil {
		return instance{}, err
	}
	t2 := time.Now()
	actx, acancel := context.WithTimeout(ctx, restoreAgentTimeout)
	defer acancel()
	_, release, err := r.agents.get(actx, r.sandboxPath(id, agentSock))
	if err != nil {
		return instance{}, fmt.Errorf("the restored guest's agent does not answer: %w", err)
	}
	release()
	r.log.Debug("vm: restored", "sandbox", id, "qemu_start", t1.Sub(t0), "load", t2.Sub(t1), "agent", time.Since(t2))
	return in, nil
}

// restoreAgentTimeout bounds the wait for a restored guest's agent.
const restoreAgentTimeout = 30 * time.Second
