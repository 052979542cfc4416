// Command torpor-agent is the guest agent of the microVM runtime: it runs
// as /init in each VM's initramfs (see package runtime/vm/agent). Build it
// statically: CGO_ENABLED=0 go build ./cmd/torpor-agent.
package main

import (
	"os"

	"github.com/torpor-dev/torpor/runtime/vm/agent"
)

func main() { os.Exit(agent.Main(os.Args[1:])) }
