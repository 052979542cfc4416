package vm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/files"
	"github.com/torpor-dev/torpor/runtime/vm/proto"
)

var _ files.FS = (*guestFS)(nil)

// SandboxFS returns the sandbox's files, reached through the agent: the
// operations run inside the guest with package files, confined to the
// sandbox's root as on the host. The VM must be running: a frozen guest
// cannot answer (a conflict, as a stopped one).
func (r *Runtime) SandboxFS(ctx context.Context, ref torpor.InstanceRef) (files.FS, error) {
	id, err := checkRef(ref)
	if err != nil {
		return nil, err
	}
	ac, release, err := r.liveAgent(ctx, id, "use the files of")
	if err != nil {
		return nil, err
	}
	return &guestFS{ctx: ctx, id: id, ac: ac, release: release}, nil
}

// guestFS is files.FS carried out by a guest's agent.
type guestFS struct {
	ctx     context.Context
	id      string
	ac      *agentConn
	release func()
}

func (g *guestFS) Close() error {
	g.release()
	return nil
}

func mode(m *files.Mode) *int {
	if m == nil {
		return nil
	}
	v := int(*m)
	return &v
}

// call runs a file operation without streams.
func (g *guestFS) call(op string, req proto.File) (proto.FileResult, error) {
	var res proto.FileResult
	err := g.ac.call(g.ctx, op, req, &res)
	return res, g.err(err)
}

func (g *guestFS) err(err error) error {
	if err == nil {
		return nil
	}
	return agentError(g.id, err)
}

func decodeInfo(res proto.FileResult, err error) (files.Info, error) {
	var info files.Info
	if err != nil {
		return info, err
	}
	if err := json.Unmarshal(res.Info, &info); err != nil {
		return info, fmt.Errorf("vm: agent's file info: %w", err)
	}
	return info, nil
}

func (g *guestFS) Stat(p string) (files.Info, error) {
	return decodeInfo(g.call(proto.OpFileStat, proto.File{Path: p}))
}

func (g *guestFS) Mkdir(p string, o files.MkdirOptions) (files.Info, error) {
	return decodeInfo(g.call(proto.OpFileMkdir, proto.File{Path: p, Parents: o.Parents, Mode: mode(o.Mode)}))
}

func (g *guestFS) Rename(from, to string, overwrite bool) (files.Info, error) {
	return decodeInfo(g.call(proto.OpFileRename, proto.File{Path: from, To: to, Overwrite: overwrite}))
}

func (g *guestFS) Remove(p string, recursive bool) error {
	_, err := g.call(proto.OpFileRemove, proto.File{Path: p, Recursive: recursive})
	return err
}

func (g *guestFS) List(p string, depth, max int) (files.Listing, error) {
	var l files.Listing
	res, err := g.call(proto.OpFileList, proto.File{Path: p, Depth: depth, Max: max})
	if err != nil {
		return l, err
	}
	if err := json.Unmarshal(res.Listing, &l); err != nil {
		return l, fmt.Errorf("vm: agent's listing: %w", err)
	}
	return l, nil
}

// upload sends src as the input stream of a request; a failure to read
// src cancels the request (the guest keeps nothing of it) and is
// returned as a *files.ReadError.
func (g *guestFS) upload(op string, req proto.File, src io.Reader, result any) error {
	ac := g.ac
	rid := ac.newID()
	defer ac.c.Drop(rid)
	ch, err := ac.send(rid, op, req)
	if err != nil {
		return g.err(err)
	}
	ctx, cancel := context.WithCancel(g.ctx)
	defer cancel()
	sent := make(chan error, 1)
	go func() { sent <- ac.c.SendStream(ctx, rid, proto.Stdin, src) }()
	resp := make(chan error, 1)
	go func() { resp <- ac.await(ctx, rid, ch, result) }()
	select {
	case err := <-sent:
		if err != nil && ctx.Err() == nil {
			cancel() // tells the agent to give up the request
			<-resp
			return &files.ReadError{Err: err}
		}
		return g.err(<-resp)
	case err := <-resp:
		return g.err(err)
	}
}

func (g *guestFS) Write(p string, src io.Reader, o files.WriteOptions) (files.Info, error) {
	var res proto.FileResult
	if err := g.upload(proto.OpFileWrite, proto.File{Path: p, Mode: mode(o.Mode)}, src, &res); err != nil {
		return files.Info{}, err
	}
	return decodeInfo(res, nil)
}

func (g *guestFS) ExtractTar(dir string, src io.Reader) (files.TarResult, error) {
	var res proto.FileResult
	var tr files.TarResult
	if err := g.upload(proto.OpFileUntar, proto.File{Path: dir}, src, &res); err != nil {
		return tr, err
	}
	if err := json.Unmarshal(res.Tar, &tr); err != nil {
		return tr, fmt.Errorf("vm: agent's tar result: %w", err)
	}
	return tr, nil
}

// download runs a request whose output stream goes to w.
func (g *guestFS) download(op string, req proto.File, w io.Writer) error {
	ac := g.ac
	rid := ac.newID()
	defer ac.c.Drop(rid)
	in := ac.c.Receive(rid, proto.Stdout, w)
	ch, err := ac.send(rid, op, req)
	if err != nil {
		ac.c.Drop(rid)
		return g.err(err)
	}
	if err := ac.await(g.ctx, rid, ch, nil); err != nil {
		return g.err(err)
	}
	if err := in.Wait(g.ctx); err != nil {
		return g.err(err)
	}
	return nil
}

func (g *guestFS) WriteTar(w io.Writer, p string) error {
	return g.download(proto.OpFileTar, proto.File{Path: p}, w)
}

func (g *guestFS) Open(p string) (files.File, files.Info, error) {
	res, err := g.call(proto.OpFileOpen, proto.File{Path: p})
	info, err := decodeInfo(res, err)
	if err != nil {
		return nil, info, err
	}
	return &guestFile{g: g, handle: res.Handle, size: info.Size}, info, nil
}

// guestFile reads a file the agent holds open, a block at a time.
type guestFile struct {
	g      *guestFS
	handle uint64
	size   int64

	mu     sync.Mutex
	off    int64
	buf    []byte
	bufOff int64
	closed bool
}

// readAhead is how much one read asks of the agent.
const readAhead = 256 << 10

func (f *guestFile) Read(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return 0, errors.New("file already closed")
	}
	if len(p) == 0 {
		return 0, nil
	}
	if f.off < f.bufOff || f.off >= f.bufOff+int64(len(f.buf)) {
		var b bytes.Buffer
		n := max(int64(len(p)), readAhead)
		if err := f.g.download(proto.OpFileRead, proto.File{Handle: f.handle, Offset: f.off, Length: n}, &b); err != nil {
			return 0, err
		}
		f.buf, f.bufOff = b.Bytes(), f.off
		if len(f.buf) == 0 {
			return 0, io.EOF
		}
	}
	n := copy(p, f.buf[f.off-f.bufOff:])
	f.off += int64(n)
	return n, nil
}

func (f *guestFile) Seek(offset int64, whence int) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch whence {
	case io.SeekCurrent:
		offset += f.off
	case io.SeekEnd:
		offset += f.size
	}
	if offset < 0 {
		return 0, errors.New("negative offset")
	}
	f.off = offset
	return offset, nil
}

func (f *guestFile) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	_, err := f.g.call(proto.OpFileClose, proto.File{Handle: f.handle})
	return err
}
