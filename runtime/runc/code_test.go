package runc

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/torpor-dev/torpor/initproc"
)

func TestDialCodeRefusesSymlinks(t *testing.T) {
	run, elsewhere := t.TempDir(), t.TempDir()
	host := filepath.Join(elsewhere, "host.sock")
	l, err := net.Listen("unix", host)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	sock := filepath.Join(run, initproc.CodeSocket)
	if err := os.Symlink(host, sock); err != nil {
		t.Fatal(err)
	}
	if c, err := dialCode(run); err == nil {
		c.Close()
		t.Fatal("dialCode followed a symlink to a host socket")
	}
	os.Remove(sock)
	// A regular file is not a socket.
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err := dialCode(run); err == nil {
		c.Close()
		t.Fatal("dialCode connected to a regular file")
	}
	os.Remove(sock)
	// The real thing connects, through the /proc/self/fd link.
	l2, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	c, err := dialCode(run)
	if err != nil {
		t.Fatalf("dialCode on a real socket: %v", err)
	}
	c.Close()
	// Nothing listening: an error (the caller starts the server).
	l2.Close()
	if c, err := dialCode(run); err == nil {
		c.Close()
		t.Fatal("dialCode connected to a closed socket")
	}
}
