package e2b

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/files"
)

// E2B's volumes (the SDK's Volume class) are torpor's tenant volumes
// (docs/volumes.md): the same store and data as /v1/volumes, so a volume
// made with the SDK is mounted by a native create and one made with
// `torpor volumes create` is listed by the SDK.
//
//   - POST /volumes {name}, GET /volumes, GET and DELETE
//     /volumes/{volumeID} are the management calls, with the API key.
//     volumeID is torpor's volume id ("vol_..."); a lookup also takes
//     the volume's name. E2B's create has no size: a volume made here is
//     DefaultVolumeMiB (sparse: only what is written takes space), and
//     grows with PATCH /v1/volumes/{name}.
//   - /volumecontent/{volumeID}/{dir,path,file} are the file calls. The
//     SDK sends them with the token that create and getInfo answer, as
//     "Authorization: Bearer <token>", to E2B_VOLUME_API_URL (set it to
//     torpor's API URL, as E2B_API_URL). A token names its tenant and
//     volume and is signed with the server's key: it opens that volume
//     only, while the volume lives (a volume deleted and made again has
//     a new id). An API key of the tenant is taken there too.
//   - An entry's atime and ctime are its mtime (torpor's files API keeps
//     one time); mode, uid and gid are numbers, as E2B's are.

// DefaultVolumeMiB is the size of a volume made through E2B's API.
const DefaultVolumeMiB = 1024

const volumeTokenPrefix = "e2bvol_"

type volumeInfo struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
}

type volumeAndToken struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
	Token    string `json:"token"`
}

// volumeEntry is E2B's VolumeEntryStat.
type volumeEntry struct {
	Name   string    `json:"name"`
	Path   string    `json:"path"`
	Type   string    `json:"type"`
	Size   int64     `json:"size"`
	Mode   uint32    `json:"mode"`
	UID    uint32    `json:"uid"`
	GID    uint32    `json:"gid"`
	Atime  time.Time `json:"atime"`
	Mtime  time.Time `json:"mtime"`
	Ctime  time.Time `json:"ctime"`
	Target string    `json:"target,omitempty"`
}

func entryOf(i files.Info) volumeEntry {
	t := "unknown"
	switch i.Type {
	case files.TypeFile:
		t = "file"
	case files.TypeDir:
		t = "directory"
	case files.TypeSymlink:
		t = "symlink"
	}
	return volumeEntry{Name: i.Name, Path: i.Path, Type: t, Size: i.Size, Mode: uint32(i.Mode), UID: i.UID, GID: i.GID,
		Atime: i.ModTime, Mtime: i.ModTime, Ctime: i.ModTime, Target: i.LinkTarget}
}

// newVolumeKey is a random key for a server that was given none: its
// tokens then last as long as the process.
func newVolumeKey() []byte {
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	return k
}

func (a *API) volumeMAC(tenant, id string) []byte {
	m := hmac.New(sha256.New, a.volKey)
	m.Write([]byte("torpor e2b volume token\x00" + tenant + "\x00" + id))
	return m.Sum(nil)
}

// volumeToken is the token that opens tenant's volume id's files.
func (a *API) volumeToken(tenant, id string) string {
	return volumeTokenPrefix + base64.RawURLEncoding.EncodeToString([]byte(tenant)) + "." + id + "." +
		base64.RawURLEncoding.EncodeToString(a.volumeMAC(tenant, id))
}

// parseVolumeToken checks a token and returns the tenant and volume id
// it names.
func (a *API) parseVolumeToken(tok string) (tenant, id string, ok bool) {
	rest, ok := strings.CutPrefix(tok, volumeTokenPrefix)
	if !ok {
		return "", "", false
	}
	f := strings.Split(rest, ".")
	if len(f) != 3 {
		return "", "", false
	}
	t, err1 := base64.RawURLEncoding.DecodeString(f[0])
	mac, err2 := base64.RawURLEncoding.DecodeString(f[2])
	if err1 != nil || err2 != nil || !torpor.ValidID(f[1]) || !hmac.Equal(mac, a.volumeMAC(string(t), f[1])) {
		return "", "", false
	}
	return string(t), f[1], true
}

// findVolume finds tenant's volume by id, or else by name; not_found
// otherwise (another tenant's volume included).
func (a *API) findVolume(r *http.Request, tenant, ref string) (torpor.Volume, error) {
	vs, err := a.eng.ListVolumes(r.Context(), tenant)
	if err != nil {
		return torpor.Volume{}, err
	}
	for _, v := range vs {
		if v.ID == ref {
			return v, nil
		}
	}
	for _, v := range vs {
		if v.Name == ref {
			return v, nil
		}
	}
	return torpor.Volume{}, torpor.Errorf(torpor.ENotFound, "volume %s not found", truncateRef(ref))
}

func truncateRef(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

func (a *API) createVolume(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	var body struct {
		Name *string `json:"name"`
	}
	if _, err := decode(r, &body); err != nil {
		return err
	}
	if body.Name == nil {
		return torpor.Invalid("name", "a name is required")
	}
	v, err := a.eng.CreateVolume(r.Context(), tenant, *body.Name, DefaultVolumeMiB)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, volumeAndToken{VolumeID: v.ID, Name: v.Name, Token: a.volumeToken(tenant, v.ID)})
	return nil
}

func (a *API) listVolumes(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	vs, err := a.eng.ListVolumes(r.Context(), tenant)
	if err != nil {
		return err
	}
	out := make([]volumeInfo, 0, len(vs))
	for _, v := range vs {
		out = append(out, volumeInfo{VolumeID: v.ID, Name: v.Name})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (a *API) getVolume(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	v, err := a.findVolume(r, tenant, r.PathValue("volumeID"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, volumeAndToken{VolumeID: v.ID, Name: v.Name, Token: a.volumeToken(tenant, v.ID)})
	return nil
}

func (a *API) deleteVolume(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	v, err := a.findVolume(r, tenant, r.PathValue("volumeID"))
	if err != nil {
		return err
	}
	if err := a.eng.DeleteVolume(r.Context(), tenant, v.Name); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// serveVolumeContent serves a /volumecontent route sent with a volume
// token; a request without one is served as any other, with its API key.
func (a *API) serveVolumeContent(w http.ResponseWriter, r *http.Request, h handler) (bool, error) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || !strings.HasPrefix(tok, volumeTokenPrefix) {
		return false, nil
	}
	if a.ready != nil && !a.ready() {
		return true, &torpor.Error{Code: torpor.EUnavailable, Message: "the daemon is starting", RetryAfter: time.Second}
	}
	tenant, id, ok := a.parseVolumeToken(tok)
	if !ok || id != r.PathValue("volumeID") {
		return true, torpor.Errorf(torpor.EUnauthenticated, "the volume token is not valid for this volume")
	}
	if err := a.limiter.Take("e2b-volume-token\x00" + tenant); err != nil {
		return true, err
	}
	return true, h(w, r, tenant, torpor.Caller{})
}

// volumeFS opens the files of the request's volume.
func (a *API) volumeFS(r *http.Request, tenant string) (files.FS, error) {
	v, err := a.findVolume(r, tenant, r.PathValue("volumeID"))
	if err != nil {
		return nil, err
	}
	return a.eng.VolumeFS(r.Context(), tenant, v.Name)
}

// volumeAt reads the request's ?path= and then opens its volume's files.
func (a *API) volumeAt(r *http.Request, tenant string) (string, files.FS, error) {
	p, err := contentPath(r)
	if err != nil {
		return "", nil, err
	}
	fsys, err := a.volumeFS(r, tenant)
	return p, fsys, err
}

// volumeAtWithAttrs is volumeAt that also reads the attributes a new file
// or directory gets (attrQuery), after the path and before the volume.
func (a *API) volumeAtWithAttrs(r *http.Request, tenant string) (string, *files.Mode, *files.Owner, files.FS, error) {
	p, err := contentPath(r)
	if err != nil {
		return "", nil, nil, nil, err
	}
	mode, owner, err := attrQuery(r)
	if err != nil {
		return "", nil, nil, nil, err
	}
	fsys, err := a.volumeFS(r, tenant)
	return p, mode, owner, fsys, err
}

// contentPath reads ?path=, relative to the volume's root or absolute.
func contentPath(r *http.Request) (string, error) {
	p := r.URL.Query().Get("path")
	if p == "" {
		return "", torpor.Invalid("path", "a path is required")
	}
	return files.Clean("path", p)
}

// attrQuery reads ?uid=&gid=&mode= (decimal numbers, as E2B sends them).
func attrQuery(r *http.Request) (*files.Mode, *files.Owner, error) {
	q := r.URL.Query()
	num := func(name string, max uint64) (*uint64, error) {
		s := q.Get(name)
		if s == "" {
			return nil, nil
		}
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil || n > max {
			return nil, torpor.Invalid(name, "%s must be a number from 0 to %d", name, max)
		}
		return &n, nil
	}
	return attrs(num)
}

func attrs(num func(string, uint64) (*uint64, error)) (*files.Mode, *files.Owner, error) {
	m, err := num("mode", files.MaxMode)
	if err != nil {
		return nil, nil, err
	}
	uid, err := num("uid", 1<<32-1)
	if err != nil {
		return nil, nil, err
	}
	gid, err := num("gid", 1<<32-1)
	if err != nil {
		return nil, nil, err
	}
	var mode *files.Mode
	if m != nil {
		v := files.Mode(*m)
		mode = &v
	}
	var owner *files.Owner
	switch {
	case uid != nil && gid != nil:
		owner = &files.Owner{UID: uint32(*uid), GID: uint32(*gid)}
	case uid != nil || gid != nil:
		return nil, nil, torpor.Invalid("uid", "uid and gid are set together")
	}
	return mode, owner, nil
}

func (a *API) volumeListDir(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	p, err := contentPath(r)
	if err != nil {
		return err
	}
	depth := 1
	if s := r.URL.Query().Get("depth"); s != "" {
		if depth, err = strconv.Atoi(s); err != nil || depth < 1 || depth > 32 {
			return torpor.Invalid("depth", "depth must be from 1 to 32")
		}
	}
	fsys, err := a.volumeFS(r, tenant)
	if err != nil {
		return err
	}
	defer fsys.Close()
	l, err := fsys.List(p, depth, 100_000)
	if err != nil {
		return err
	}
	out := make([]volumeEntry, 0, len(l.Entries))
	for _, e := range l.Entries {
		out = append(out, entryOf(e))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (a *API) volumeMakeDir(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	p, mode, owner, fsys, err := a.volumeAtWithAttrs(r, tenant)
	if err != nil {
		return err
	}
	defer fsys.Close()
	info, err := fsys.Mkdir(p, files.MkdirOptions{Parents: r.URL.Query().Get("force") == "true", Mode: mode, Owner: owner})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, entryOf(info))
	return nil
}

func (a *API) volumeStat(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	p, fsys, err := a.volumeAt(r, tenant)
	if err != nil {
		return err
	}
	defer fsys.Close()
	info, err := fsys.Stat(p)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, entryOf(info))
	return nil
}

// attrSetter is what an FS of the host's files (a volume's) can do more.
type attrSetter interface {
	SetAttrs(p string, mode *files.Mode, owner *files.Owner) (files.Info, error)
}

func (a *API) volumeUpdateMetadata(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	p, err := contentPath(r)
	if err != nil {
		return err
	}
	var body struct {
		UID  *uint32 `json:"uid"`
		GID  *uint32 `json:"gid"`
		Mode *uint32 `json:"mode"`
	}
	if _, err := decode(r, &body); err != nil {
		return err
	}
	fsys, err := a.volumeFS(r, tenant)
	if err != nil {
		return err
	}
	defer fsys.Close()
	set, ok := fsys.(attrSetter)
	if !ok {
		return torpor.Errorf(torpor.EUnavailable, "this volume's files cannot change their metadata")
	}
	var mode *files.Mode
	if body.Mode != nil {
		if *body.Mode > files.MaxMode {
			return torpor.Invalid("mode", "mode must be from 0 to %d", files.MaxMode)
		}
		m := files.Mode(*body.Mode)
		mode = &m
	}
	var owner *files.Owner
	if body.UID != nil || body.GID != nil {
		cur, err := fsys.Stat(p)
		if err != nil {
			return err
		}
		owner = &files.Owner{UID: cur.UID, GID: cur.GID}
		if body.UID != nil {
			owner.UID = *body.UID
		}
		if body.GID != nil {
			owner.GID = *body.GID
		}
	}
	info, err := set.SetAttrs(p, mode, owner)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, entryOf(info))
	return nil
}

func (a *API) volumeReadFile(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	p, fsys, err := a.volumeAt(r, tenant)
	if err != nil {
		return err
	}
	defer fsys.Close()
	f, info, err := fsys.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(info.Size, 10))
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(w, f)
	return nil
}

func (a *API) volumeWriteFile(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	p, mode, owner, fsys, err := a.volumeAtWithAttrs(r, tenant)
	if err != nil {
		return err
	}
	defer fsys.Close()
	info, err := fsys.Write(p, r.Body, files.WriteOptions{Mode: mode, Owner: owner})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, entryOf(info))
	return nil
}

func (a *API) volumeRemove(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	p, fsys, err := a.volumeAt(r, tenant)
	if err != nil {
		return err
	}
	defer fsys.Close()
	if err := fsys.Remove(p, true); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
