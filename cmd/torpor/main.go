// Command torpor is the torpor daemon (`torpor serve`) and its CLI.
package main

import (
	"os"

	"github.com/torpor-dev/torpor/initproc"
)

func main() {
	// Inside a sandbox the same binary is the init process (pid 1).
	if len(os.Args) > 1 && os.Args[1] == "init" {
		os.Exit(initproc.Main(os.Args[2:]))
	}
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int { return 0 }
