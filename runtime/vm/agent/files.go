package agent

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/files"
	"github.com/torpor-dev/torpor/runtime/vm/proto"
)

// errAnswered: the request sent its response itself.
var errAnswered = errors.New("answered")

// fileOp prepares a file operation; it runs with package files on the
// guest's root, so paths are confined and checked exactly as the runc
// runtime's are on the host.
func (a *agent) fileOp(ctx context.Context, c *proto.Conn, id uint64, op string, req proto.File) func() (any, error) {
	var mode *files.Mode
	if req.Mode != nil {
		m := files.Mode(*req.Mode)
		mode = &m
	}
	withRoot := func(fn func(root *files.Root) (any, error)) func() (any, error) {
		return func() (any, error) {
			root, err := files.OpenRoot("/")
			if err != nil {
				return nil, err
			}
			defer root.Close()
			return fn(root)
		}
	}
	info := func(i files.Info, err error) (any, error) {
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(i)
		return &proto.FileResult{Info: b}, err
	}
	switch op {
	case proto.OpFileOpen:
		return withRoot(func(root *files.Root) (any, error) {
			f, i, err := root.Open(req.Path)
			if err != nil {
				return nil, err
			}
			a.mu.Lock()
			if a.conn != c {
				a.mu.Unlock()
				f.Close()
				return nil, proto.ErrClosed
			}
			a.fileN++
			h := a.fileN
			a.files[h] = f
			a.mu.Unlock()
			b, _ := json.Marshal(i)
			return &proto.FileResult{Info: b, Handle: h}, nil
		})
	case proto.OpFileRead:
		return func() (any, error) {
			a.mu.Lock()
			f := a.files[req.Handle]
			a.mu.Unlock()
			if f == nil {
				return nil, torpor.Errorf(torpor.ENotFound, "no open file %d", req.Handle)
			}
			return nil, c.SendStream(ctx, id, proto.Stdout, io.NewSectionReader(f, req.Offset, req.Length))
		}
	case proto.OpFileClose:
		return func() (any, error) {
			a.mu.Lock()
			f := a.files[req.Handle]
			delete(a.files, req.Handle)
			a.mu.Unlock()
			if f != nil {
				f.Close()
			}
			return nil, nil
		}
	case proto.OpFileStat:
		return withRoot(func(root *files.Root) (any, error) { return info(root.Stat(req.Path)) })
	case proto.OpFileMkdir:
		return withRoot(func(root *files.Root) (any, error) {
			return info(root.Mkdir(req.Path, files.MkdirOptions{Parents: req.Parents, Mode: mode}))
		})
	case proto.OpFileRename:
		return withRoot(func(root *files.Root) (any, error) { return info(root.Rename(req.Path, req.To, req.Overwrite)) })
	case proto.OpFileRemove:
		return withRoot(func(root *files.Root) (any, error) { return nil, root.Remove(req.Path, req.Recursive) })
	case proto.OpFileList:
		return withRoot(func(root *files.Root) (any, error) {
			l, err := root.List(req.Path, req.Depth, req.Max)
			if err != nil {
				return nil, err
			}
			b, err := json.Marshal(l)
			return &proto.FileResult{Listing: b}, err
		})
	case proto.OpFileTar:
		return withRoot(func(root *files.Root) (any, error) {
			pr, pw := io.Pipe()
			done := pump(ctx, c, id, proto.Stdout, pr)
			err := root.WriteTar(pw, req.Path)
			pw.CloseWithError(err)
			<-done
			return nil, err
		})
	case proto.OpFileWrite, proto.OpFileUntar:
		pr, pw := io.Pipe()
		in := c.Receive(id, proto.Stdin, pw)
		go func() {
			select {
			case <-in.Done():
				if in.Wait(ctx) != nil {
					pw.CloseWithError(errors.New("the upload was cut off"))
				}
				pw.Close()
			case <-ctx.Done():
				pw.CloseWithError(errors.New("the upload was cancelled"))
			}
		}()
		return withRoot(func(root *files.Root) (any, error) {
			defer pr.Close()
			if op == proto.OpFileWrite {
				return info(root.Write(req.Path, pr, files.WriteOptions{Mode: mode}))
			}
			res, err := root.ExtractTar(req.Path, pr)
			if err != nil {
				return nil, err
			}
			b, err := json.Marshal(res)
			return &proto.FileResult{Tar: b}, err
		})
	}
	return func() (any, error) { return nil, torpor.Invalid("op", "unknown operation %q", op) }
}

// dial connects to addr inside the guest, answers the request once the
// connection is made, and relays its bytes until both sides are done.
func dial(ctx context.Context, c *proto.Conn, id uint64, req proto.Dial) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, req.Network, req.Addr)
	if err != nil {
		return torpor.Errorf(torpor.EUnavailable, "dial %s %s in the sandbox: %v", req.Network, req.Addr, err)
	}
	defer conn.Close()
	in := c.Receive(id, proto.Stdin, conn)
	if err := c.Send(&proto.Frame{T: proto.TResp, ID: id}); err != nil {
		return errAnswered
	}
	out := pump(ctx, c, id, proto.Stdout, conn)
	go func() {
		_ = in.Wait(ctx)
		if cw, ok := conn.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
	}()
	select {
	case <-out:
	case <-ctx.Done():
	}
	return errAnswered
}
