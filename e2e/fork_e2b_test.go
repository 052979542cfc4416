package e2e

import (
	"testing"
)

// TestE2BSDKSnapshots runs the official E2B SDK's snapshot calls
// (createSnapshot, listSnapshots, create from a snapshot,
// deleteSnapshot) against a real daemon with runc sandboxes of the base
// template, which the E2B name "native" stands for here (no E2B template
// to build; e2b/snapshots.test.mjs).
func TestE2BSDKSnapshots(t *testing.T) {
	node := needsE2BSDK(t)
	d := startDaemon(t, torporBin(t), t.TempDir(), "TORPOR_E2B_TEMPLATES=native=base")
	runNode(t, node, append(e2bEnv(t, d), "TORPOR_E2B_TEMPLATE=native"), "snapshots.test.mjs")
}
