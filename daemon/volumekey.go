package daemon

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// volumeTokenKeyFile holds the key that signs the E2B API's volume
// tokens (e2b/volumes.go), so that a token outlives a daemon restart.
const volumeTokenKeyFile = "e2b-volume-token.key"

// volumeTokenKey reads the key from the data directory, making it on
// first use.
func volumeTokenKey(dataDir string) ([]byte, error) {
	p := filepath.Join(dataDir, volumeTokenKeyFile)
	b, err := os.ReadFile(p)
	if err == nil && len(b) == 32 {
		return b, nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return nil, err
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, k, 0o600); err != nil {
		return nil, fmt.Errorf("the E2B volume token key: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return nil, fmt.Errorf("the E2B volume token key: %w", err)
	}
	return k, nil
}
