// Package initproc is the init process (pid 1) of a sandbox: the torpor
// binary runs it inside the container as `torpor init`.
package initproc

// Main runs init with its arguments and returns the exit status.
func Main(args []string) int { return 0 }
