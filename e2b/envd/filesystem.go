package envd

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"path"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/torpor-dev/torpor"
	pb "github.com/torpor-dev/torpor/e2b/envd/proto/filesystem"
	"github.com/torpor-dev/torpor/e2b/envd/proto/filesystem/filesystemconnect"
	"github.com/torpor-dev/torpor/files"
)

// filesystemRoutes mounts the filesystem.Filesystem Connect service.
func (s *Server) filesystemRoutes() {
	p, h := filesystemconnect.NewFilesystemHandler(&fsService{s: s, watchers: newWatchers(), budget: &watchBudget{}})
	s.mux.Handle(p, h)
}

// fsService is envd's filesystem.Filesystem, carried out on the sandbox's
// confined files (package files) as the request's user.
type fsService struct {
	s        *Server
	watchers *watchers // watch.go
	budget   *watchBudget
}

var _ filesystemconnect.FilesystemHandler = (*fsService)(nil)

// account is a user of the sandbox, from its /etc/passwd.
type account struct {
	name     string
	uid, gid uint32
	home     string
}

func (a account) owner() *files.Owner { return &files.Owner{UID: a.uid, GID: a.gid} }

// accounts are the sandbox's users and groups, read from its own
// /etc/passwd and /etc/group through the confined files.
type accounts struct {
	users  []account
	groups map[uint32]string
}

// maxAccountFile bounds what is read of /etc/passwd and /etc/group.
const maxAccountFile = 1 << 20

func readAccounts(fsys files.FS) *accounts {
	a := &accounts{groups: map[uint32]string{}}
	eachLine(fsys, "/etc/passwd", func(f []string) {
		if len(f) < 6 {
			return
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 == nil && err2 == nil && f[0] != "" {
			a.users = append(a.users, account{name: f[0], uid: uint32(uid), gid: uint32(gid), home: f[5]})
		}
	})
	eachLine(fsys, "/etc/group", func(f []string) {
		if len(f) < 3 {
			return
		}
		if gid, err := strconv.ParseUint(f[2], 10, 32); err == nil && f[0] != "" {
			if _, dup := a.groups[uint32(gid)]; !dup {
				a.groups[uint32(gid)] = f[0]
			}
		}
	})
	return a
}

// eachLine calls fn with the colon-separated fields of each line of the
// sandbox file p; a missing file has none.
func eachLine(fsys files.FS, p string, fn func([]string)) {
	f, _, err := fsys.Open(p)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, maxAccountFile))
	for sc.Scan() {
		fn(strings.Split(sc.Text(), ":"))
	}
}

func (a *accounts) lookup(name string) (account, bool) {
	for _, u := range a.users {
		if u.name == name {
			return u, true
		}
	}
	return account{}, false
}

// userName is the name of uid, or the number as text (as envd shows it).
func (a *accounts) userName(uid uint32) string {
	for _, u := range a.users {
		if u.uid == uid {
			return u.name
		}
	}
	return strconv.FormatUint(uint64(uid), 10)
}

func (a *accounts) groupName(gid uint32) string {
	if g, ok := a.groups[gid]; ok {
		return g
	}
	return strconv.FormatUint(uint64(gid), 10)
}

// requestUser returns the sandbox user a call is made as: name, or
// DefaultUser when name is empty. A sandbox without DefaultUser (a
// template that never made one) works as root; a name the sandbox does
// not know is refused, as envd refuses it.
func (a *accounts) requestUser(name string) (account, error) {
	if name != "" {
		if u, ok := a.lookup(name); ok {
			return u, nil
		}
		return account{}, torpor.Errorf(torpor.EUnauthenticated, "invalid username: '%s' is not a user of the sandbox", name)
	}
	if u, ok := a.lookup(DefaultUser); ok {
		return u, nil
	}
	if u, ok := a.lookup("root"); ok {
		return u, nil
	}
	return account{name: "root", home: "/root"}, nil
}

// basicUser returns the user named by an Authorization: Basic header, as
// the SDKs send it (base64 of "user:"); "" when there is none.
func basicUser(h http.Header) (string, error) {
	v := h.Get("Authorization")
	if v == "" {
		return "", nil
	}
	scheme, cred, _ := strings.Cut(v, " ")
	if !strings.EqualFold(scheme, "Basic") {
		return "", torpor.Errorf(torpor.EUnauthenticated, "the Authorization header names the user as Basic base64(user:)")
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return "", torpor.Errorf(torpor.EUnauthenticated, "the Authorization header is not valid base64")
	}
	name, _, _ := strings.Cut(string(raw), ":")
	return name, nil
}

// resolve turns a path as the SDK sends it into a clean absolute sandbox
// path: "" is the user's home, "~" and "~/x" are under it, a relative
// path is relative to it. Everything then stays inside the sandbox
// (files.Clean, and the confined FS).
func resolve(param, p string, u account) (string, error) {
	switch {
	case p == "":
		p = u.home
	case p == "~" || strings.HasPrefix(p, "~/"):
		p = u.home + p[1:]
	case strings.HasPrefix(p, "~"):
		return "", torpor.Invalid(param, "cannot expand another user's home directory in %q", p)
	case !strings.HasPrefix(p, "/"):
		p = u.home + "/" + p
	}
	return files.Clean(param, p)
}

// fsCall is one call's view of the sandbox: its confined files, its
// accounts and the user the call is made as.
type fsCall struct {
	fs   files.FS
	acct *accounts
	user account
}

// open prepares a call for the sandbox of ctx as the user named (empty:
// the default user); done must be called when it ends.
func (s *Server) open(ctx context.Context, username string, write bool) (*fsCall, func(), error) {
	sb := sandboxOf(ctx)
	if sb == nil {
		return nil, nil, torpor.Errorf(torpor.EInternal, "envd: no sandbox in the request")
	}
	fsys, done, err := s.eng.Files(ctx, sb.Tenant, sb.ID, write)
	if err != nil {
		return nil, nil, err
	}
	c := &fsCall{fs: fsys, acct: readAccounts(fsys)}
	if c.user, err = c.acct.requestUser(username); err != nil {
		done()
		return nil, nil, err
	}
	return c, done, nil
}

// openRPC is open for a Connect call, whose user is in its Authorization.
func (f *fsService) openRPC(ctx context.Context, h http.Header, write bool) (*fsCall, func(), error) {
	name, err := basicUser(h)
	if err != nil {
		return nil, nil, err
	}
	return f.s.open(ctx, name, write)
}

// maxLinks bounds the symlinks followed to describe one (as the kernel's
// limit).
const maxLinks = 40

// follow resolves the symlink p (described by info) inside the sandbox,
// a link at a time, and returns the path it ends at with its description;
// ok is false when the chain ends nowhere (dangling, a loop, refused).
func (c *fsCall) follow(p string, info files.Info) (string, files.Info, bool) {
	for i := 0; i < maxLinks && info.Type == files.TypeSymlink; i++ {
		t := info.LinkTarget
		if !strings.HasPrefix(t, "/") {
			t = path.Join(path.Dir(p), t)
		}
		next, err := files.Clean("path", t)
		if err != nil {
			return t, info, false
		}
		p = next
		if info, err = c.fs.Stat(p); err != nil {
			return p, info, false
		}
	}
	return p, info, info.Type != files.TypeSymlink
}

// stat describes p as envd does: a symlink is listed as what it points
// to (type and mode) with its resolved target.
func (c *fsCall) stat(p string) (*pb.EntryInfo, error) {
	info, err := c.fs.Stat(p)
	if err != nil {
		return nil, err
	}
	return c.entry(info), nil
}

// statDir returns p, which must be a directory or a symlink to one, and
// the path of that directory.
func (c *fsCall) statDir(p string) (string, error) {
	info, err := c.fs.Stat(p)
	if err != nil {
		return "", err
	}
	dir := p
	if info.Type == files.TypeSymlink {
		var ok bool
		if dir, info, ok = c.follow(p, info); !ok {
			return "", torpor.Errorf(torpor.ENotFound, "%s: the symbolic link points nowhere", p)
		}
	}
	if info.Type != files.TypeDir {
		return "", torpor.Invalid("path", "path is not a directory: %s", p)
	}
	return dir, nil
}

// entry turns a description into envd's EntryInfo.
func (c *fsCall) entry(info files.Info) *pb.EntryInfo {
	e := &pb.EntryInfo{
		Name:        info.Name,
		Path:        info.Path,
		Size:        info.Size,
		Permissions: fileMode(info).String(),
		Owner:       c.acct.userName(info.UID),
		Group:       c.acct.groupName(info.GID),
	}
	if !info.ModTime.IsZero() {
		e.ModifiedTime = timestamppb.New(info.ModTime)
	}
	target := info
	if info.Type == files.TypeSymlink {
		p, t, ok := c.follow(info.Path, info)
		e.SymlinkTarget = &p
		if !ok {
			target = files.Info{Type: "unknown"}
		} else {
			target = t
		}
	}
	e.Type = entryType(target.Type)
	e.Mode = uint32(fileMode(target).Perm())
	return e
}

func entryType(t files.Type) pb.FileType {
	switch t {
	case files.TypeFile:
		return pb.FileType_FILE_TYPE_FILE
	case files.TypeDir:
		return pb.FileType_FILE_TYPE_DIRECTORY
	case files.TypeSymlink:
		return pb.FileType_FILE_TYPE_SYMLINK
	}
	return pb.FileType_FILE_TYPE_UNSPECIFIED
}

// fileMode is info's type and permissions as Go writes them, which is
// how envd shows permissions ("-rw-r--r--", "drwxr-xr-x").
func fileMode(info files.Info) fs.FileMode {
	m := fs.FileMode(info.Mode & 0o777)
	if info.Mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if info.Mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if info.Mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	switch info.Type {
	case files.TypeDir:
		m |= fs.ModeDir
	case files.TypeSymlink:
		m |= fs.ModeSymlink
	case files.TypeFifo:
		m |= fs.ModeNamedPipe
	case files.TypeSocket:
		m |= fs.ModeSocket
	case files.TypeDevice:
		m |= fs.ModeDevice
	}
	return m
}

// rpcError turns an error into the Connect error the SDKs map: not found
// (FileNotFoundError), invalid argument (a wrong type, a bad path), and
// unavailable for a sandbox that is not running.
func (s *Server) rpcError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	e := torpor.AsError(err)
	code := connect.CodeInternal
	switch e.Code {
	case torpor.ENotFound:
		code = connect.CodeNotFound
	case torpor.EInvalid:
		code = connect.CodeInvalidArgument
	case torpor.EConflict:
		switch e.Reason {
		case "no_space":
			code = connect.CodeResourceExhausted
		case "state", "capacity":
			code = connect.CodeUnavailable
		default:
			code = connect.CodeInvalidArgument
		}
	case torpor.EUnauthenticated:
		code = connect.CodeUnauthenticated
	case torpor.EForbidden:
		code = connect.CodePermissionDenied
	case torpor.EGone, torpor.EUnavailable:
		code = connect.CodeUnavailable
	}
	if code == connect.CodeInternal {
		s.log.Error("envd filesystem", "err", err)
	}
	return connect.NewError(code, errors.New(e.Message))
}

func (f *fsService) Stat(ctx context.Context, req *connect.Request[pb.StatRequest]) (*connect.Response[pb.StatResponse], error) {
	c, done, err := f.openRPC(ctx, req.Header(), false)
	if err != nil {
		return nil, f.s.rpcError(err)
	}
	defer done()
	p, err := resolve("path", req.Msg.GetPath(), c.user)
	if err != nil {
		return nil, f.s.rpcError(err)
	}
	e, err := c.stat(p)
	if err != nil {
		return nil, f.s.rpcError(err)
	}
	return connect.NewResponse(&pb.StatResponse{Entry: e}), nil
}

func (f *fsService) MakeDir(ctx context.Context, req *connect.Request[pb.MakeDirRequest]) (*connect.Response[pb.MakeDirResponse], error) {
	c, done, err := f.openRPC(ctx, req.Header(), true)
	if err != nil {
		return nil, f.s.rpcError(err)
	}
	defer done()
	p, err := resolve("path", req.Msg.GetPath(), c.user)
	if err != nil {
		return nil, f.s.rpcError(err)
	}
	if info, err := c.fs.Stat(p); err == nil {
		if info.Type == files.TypeSymlink {
			_, info, _ = c.follow(p, info)
		}
		if info.Type == files.TypeDir {
			return nil, connect.NewError(connect.CodeAlreadyExists, errors.New("directory already exists: "+p))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("path already exists but it is not a directory: "+p))
	}
	if _, err := c.fs.Mkdir(p, files.MkdirOptions{Parents: true, Owner: c.user.owner()}); err != nil {
		return nil, f.s.rpcError(err)
	}
	e, err := c.stat(p)
	if err != nil {
		return nil, f.s.rpcError(err)
	}
	return connect.NewResponse(&pb.MakeDirResponse{Entry: e}), nil
}

func (f *fsService) Move(ctx context.Context, req *connect.Request[pb.MoveRequest]) (*connect.Response[pb.MoveResponse], error) {
	c, done, err := f.openRPC(ctx, req.Header(), true)
	if err != nil {
		return nil, f.s.rpcError(err)
	}
	defer done()
	from, err := resolve("source", req.Msg.GetSource(), c.user)
	if err != nil {
		return nil, f.s.rpcError(err)
	}
	to, err := resolve("destination", req.Msg.GetDestination(), c.user)
	if err != nil {
		return nil, f.s.rpcError(err)
	}
	if _, err := c.fs.Stat(from); err != nil {
		return nil, f.s.rpcError(err)
	}
	if dir := path.Dir(to); dir != "/" {
		if _, err := c.fs.Mkdir(dir, files.MkdirOptions{Parents: true, Owner: c.user.owner()}); err != nil {
			return nil, f.s.rpcError(err)
		}
	}
	if _, err := c.fs.Rename(from, to, true); err != nil {
		return nil, f.s.rpcError(err)
	}
	e, err := c.stat(to)
	if err != nil {
		return nil, f.s.rpcError(err)
	}
	return connect.NewResponse(&pb.MoveResponse{Entry: e}), nil
}

func (f *fsService) ListDir(ctx context.Context, req *connect.Request[pb.ListDirRequest]) (*connect.Response[pb.ListDirResponse], error) {
	c, done, err := f.openRPC(ctx, req.Header(), false)
	if err != nil {
		return nil, f.s.rpcError(err)
	}
	defer done()
	p, err := resolve("path", req.Msg.GetPath(), c.user)
	if err != nil {
		return nil, f.s.rpcError(err)
	}
	if _, err := c.statDir(p); err != nil {
		return nil, f.s.rpcError(err)
	}
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	depth = min(depth, files.MaxDepth)
	// The entries are named under the path asked for, a symlink to the
	// directory included, as envd names them.
	l, err := c.fs.List(p, depth, 0)
	if err != nil {
		return nil, f.s.rpcError(err)
	}
	out := make([]*pb.EntryInfo, 0, len(l.Entries))
	for _, info := range l.Entries {
		out = append(out, c.entry(info))
	}
	return connect.NewResponse(&pb.ListDirResponse{Entries: out}), nil
}

func (f *fsService) Remove(ctx context.Context, req *connect.Request[pb.RemoveRequest]) (*connect.Response[pb.RemoveResponse], error) {
	c, done, err := f.openRPC(ctx, req.Header(), true)
	if err != nil {
		return nil, f.s.rpcError(err)
	}
	defer done()
	p, err := resolve("path", req.Msg.GetPath(), c.user)
	if err != nil {
		return nil, f.s.rpcError(err)
	}
	// As envd (os.RemoveAll): a tree goes whole, and a path that is not
	// there is already removed.
	if err := c.fs.Remove(p, true); err != nil && !torpor.IsCode(err, torpor.ENotFound) {
		return nil, f.s.rpcError(err)
	}
	return connect.NewResponse(&pb.RemoveResponse{}), nil
}
