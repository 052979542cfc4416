// Command torpor is the torpor daemon (`torpor serve`) and its CLI.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/torpor-dev/torpor/initproc"
)

func main() {
	// Inside a sandbox the same binary is the init process (pid 1).
	if len(os.Args) > 1 && os.Args[1] == "init" {
		os.Exit(initproc.Main(os.Args[2:]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// exitError carries a command's exit status out of the CLI (torpor exec).
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// Run runs the CLI with its arguments and streams and returns the exit code.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	root := newRoot(&cli{stdin: stdin, stdout: stdout, stderr: stderr, getenv: getenv})
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	}
	fmt.Fprintln(stderr, "torpor:", describe(err))
	return 1
}
