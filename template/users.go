package template

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/torpor-dev/torpor"
)

// addUsers adds the build's accounts to the root filesystem in root:
// entries in /etc/passwd, group, shadow and gshadow, a home directory
// with /etc/skel's files that the user owns, and a sudoers rule when
// asked. A name or id the system already has is the request's fault.
func addUsers(root string, users []torpor.TemplateUser, now time.Time, progress Progress) error {
	if len(users) == 0 {
		return nil
	}
	etc := filepath.Join(root, "etc")
	passwd, err := readEtc(etc, "passwd")
	if err != nil {
		return err
	}
	group, err := readEtc(etc, "group")
	if err != nil {
		return err
	}
	shell := "/bin/bash"
	if _, err := os.Lstat(filepath.Join(root, "bin", "bash")); err != nil {
		shell = "/bin/sh"
	}
	days := now.Unix() / 86400
	for _, u := range users {
		if taken(passwd, u.Name, u.UID) || taken(group, u.Name, u.UID) {
			return torpor.Invalid("users", "the system already has a user or group named %s or with id %d", u.Name, u.UID)
		}
		if u.Sudo {
			if fi, err := os.Lstat(filepath.Join(etc, "sudoers.d")); err != nil || !fi.IsDir() {
				return torpor.Invalid("users", "user %s: sudo needs the sudo package in packages", u.Name)
			}
		}
		home := "/home/" + u.Name
		for _, e := range []struct{ file, line string }{
			{"passwd", fmt.Sprintf("%s:x:%d:%d::%s:%s", u.Name, u.UID, u.UID, home, shell)},
			{"group", fmt.Sprintf("%s:x:%d:", u.Name, u.UID)},
			{"shadow", fmt.Sprintf("%s:!:%d:0:99999:7:::", u.Name, days)},
			{"gshadow", fmt.Sprintf("%s:!::", u.Name)},
		} {
			if err := appendEtc(etc, e.file, e.line); err != nil {
				return err
			}
		}
		passwd = append(passwd, fmt.Sprintf("%s:x:%d:", u.Name, u.UID))
		group = append(group, fmt.Sprintf("%s:x:%d:", u.Name, u.UID))
		if err := makeHome(root, home, u.UID); err != nil {
			return err
		}
		if u.Sudo {
			rule := fmt.Sprintf("%s ALL=(ALL:ALL) NOPASSWD: ALL\n", u.Name)
			if err := os.WriteFile(filepath.Join(etc, "sudoers.d", u.Name), []byte(rule), 0o440); err != nil {
				return fmt.Errorf("template: sudoers: %w", err)
			}
		}
		how := ""
		if u.Sudo {
			how = ", with sudo"
		}
		progress(fmt.Sprintf("added user %s (uid %d, home %s%s)", u.Name, u.UID, home, how))
	}
	return nil
}

// readEtc reads the lines of /etc/NAME, a regular file.
func readEtc(etc, name string) ([]string, error) {
	p := filepath.Join(etc, name)
	if fi, err := os.Lstat(p); err != nil || !fi.Mode().IsRegular() {
		return nil, torpor.Invalid("users", "the built system has no regular /etc/%s", name)
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	return strings.Split(string(data), "\n"), nil
}

// taken tells whether the lines of passwd or group have name or id.
func taken(lines []string, name string, id int) bool {
	for _, l := range lines {
		f := strings.Split(l, ":")
		if len(f) >= 3 && (f[0] == name || f[2] == fmt.Sprint(id)) {
			return true
		}
	}
	return false
}

// appendEtc adds a line to /etc/NAME, which must be a regular file when
// it exists (gshadow may not), keeping its mode and owner.
func appendEtc(etc, name, line string) error {
	p := filepath.Join(etc, name)
	fi, err := os.Lstat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist) && (name == "gshadow" || name == "shadow"):
		return nil
	case err != nil:
		return fmt.Errorf("template: %w", err)
	case !fi.Mode().IsRegular():
		return torpor.Invalid("users", "/etc/%s of the built system is not a regular file", name)
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("template: %w", err)
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		data = append(data, '\n')
	}
	data = append(data, line+"\n"...)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("template: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("template: %w", err)
	}
	return f.Close()
}

// makeHome makes root/home, owned by uid with /etc/skel's plain files.
func makeHome(root, home string, uid int) error {
	dir := filepath.Join(root, home)
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("template: %w", err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("template: %w", err)
	}
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		return torpor.Invalid("users", "%s of the built system is not a directory", home)
	}
	skel := filepath.Join(root, "etc", "skel")
	entries, _ := os.ReadDir(skel)
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(skel, e.Name()))
		if err != nil {
			return fmt.Errorf("template: %w", err)
		}
		p := filepath.Join(dir, e.Name())
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return fmt.Errorf("template: %w", err)
		}
		if err := os.Lchown(p, uid, uid); err != nil {
			return fmt.Errorf("template: %w", err)
		}
	}
	if err := os.Lchown(dir, uid, uid); err != nil {
		return fmt.Errorf("template: %w", err)
	}
	return nil
}
