package api

import (
	"encoding/base64"
	"strconv"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
)

// maxListLimit is the most sandboxes one page of GET /v1/sandboxes holds.
const maxListLimit = 1000

// listCursor encodes a position in the sandbox list as the opaque cursor
// of GET /v1/sandboxes?after=: the creation time in microseconds and the
// id, base64url without padding. Clients pass it back as it is.
func listCursor(sb *torpor.Sandbox) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(sb.CreatedAt.UnixMicro(), 10) + ":" + sb.ID))
}

// parseListCursor reads a cursor made by listCursor.
func parseListCursor(s string) (torpor.ListPosition, error) {
	bad := torpor.Invalid("after", "must be the next cursor of an earlier page")
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return torpor.ListPosition{}, bad
	}
	at, id, ok := strings.Cut(string(raw), ":")
	if !ok || id == "" || len(id) > 256 || strings.ContainsFunc(id, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
		return torpor.ListPosition{}, bad
	}
	us, err := strconv.ParseInt(at, 10, 64)
	if err != nil || us < 0 {
		return torpor.ListPosition{}, bad
	}
	return torpor.ListPosition{CreatedAt: time.UnixMicro(us).UTC(), ID: id}, nil
}
