package runc

import (
	"bufio"
	"io"
	"strconv"
	"strings"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/files"
)

// resolveUser turns an exec's user (a name, or uid[:gid]) into the
// numeric uid:gid runc takes, reading names from the sandbox's own
// /etc/passwd, opened confined to its root.
func (r *Runtime) resolveUser(id, user string) (string, error) {
	if uid, gid, ok := strings.Cut(user, ":"); isNum(uid) && (!ok || isNum(gid)) {
		if !ok {
			return uid + ":" + uid, nil
		}
		return user, nil
	}
	root, err := files.OpenRoot(r.rootfsDir(id))
	if err != nil {
		return "", torpor.Errorf(torpor.EConflict, "sandbox %s has no mounted root to look up user %q in", id, user)
	}
	defer root.Close()
	f, _, err := root.Open("/etc/passwd")
	if err != nil {
		return "", torpor.Invalid("user", "the sandbox has no /etc/passwd to look up %q in; give uid[:gid]", user)
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, 1<<20))
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) >= 4 && fields[0] == user && isNum(fields[2]) && isNum(fields[3]) {
			return fields[2] + ":" + fields[3], nil
		}
	}
	return "", torpor.Invalid("user", "no user %q in the sandbox's /etc/passwd", user)
}

func isNum(s string) bool {
	n, err := strconv.ParseUint(s, 10, 32)
	return err == nil && n < 1<<31
}
