// Command s3server runs a real S3-compatible server for torpor's tests:
// Versity's S3 gateway (github.com/versity/versitygw) with its POSIX
// backend, embedded through its embedgw package. It has a go.mod of its
// own so that the gateway's dependencies stay out of torpor's.
//
//	s3server -listen ADDR -root DIR -meta DIR
//
// ADDR is host:port or the absolute path of a UNIX socket. The root
// account's keys are read from S3SERVER_ACCESS_KEY and
// S3SERVER_SECRET_KEY. The server stops on SIGINT or SIGTERM, and when
// its standard input reaches its end (the test process that started it
// with a pipe there is gone), so that a killed test leaves no server
// behind.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/versity/versitygw/backend/meta"
	"github.com/versity/versitygw/backend/posix"
	"github.com/versity/versitygw/embedgw"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "s3server:", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", "", "address to serve S3 on: host:port or a UNIX socket's absolute path")
	root := flag.String("root", "", "directory that holds the buckets")
	metaDir := flag.String("meta", "", "directory for the objects' metadata (outside -root)")
	region := flag.String("region", "us-east-1", "region reported to clients")
	watchStdin := flag.Bool("watch-stdin", false, "stop when standard input reaches its end")
	flag.Parse()
	access, secret := os.Getenv("S3SERVER_ACCESS_KEY"), os.Getenv("S3SERVER_SECRET_KEY")
	switch {
	case *listen == "" || *root == "" || *metaDir == "":
		return errors.New("-listen, -root and -meta are required")
	case access == "" || secret == "":
		return errors.New("S3SERVER_ACCESS_KEY and S3SERVER_SECRET_KEY must be set")
	}

	// The backend changes the working directory to the root: make the
	// paths absolute first.
	for _, p := range []*string{root, metaDir} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return err
		}
		*p = abs
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *watchStdin {
		go func() {
			io.Copy(io.Discard, os.Stdin)
			stop()
		}()
	}

	// Metadata (content types, user metadata, ETags) goes to a side-car
	// directory rather than extended attributes, which a temporary
	// directory's file system (tmpfs before Linux 6.6) may not have.
	ms, err := meta.NewSideCar(*metaDir)
	if err != nil {
		return fmt.Errorf("metadata directory: %w", err)
	}
	opts := posix.PosixOpts{SideCarDir: *metaDir}
	be, err := posix.New(*root, ms, opts)
	if err != nil {
		return fmt.Errorf("posix backend: %w", err)
	}
	defer be.Shutdown()

	return embedgw.RunVersityGW(ctx, be, &embedgw.Config{
		RootUserAccess:    access,
		RootUserSecret:    secret,
		Region:            *region,
		Ports:             []string{*listen},
		MaxConnections:    1000,
		MaxRequests:       1000,
		MultipartMaxParts: 10000,
		KeepAlive:         true,
		Quiet:             true,
	})
}
