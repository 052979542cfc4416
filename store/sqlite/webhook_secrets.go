package sqlite

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// WebhookKeyFile is the name, in the database's directory, of the key
// that webhook signing secrets are encrypted with: 32 random bytes, mode
// 0600, made when the store is first opened. A copy of the database is
// of no use to whoever lacks it, and whoever restores the database from a
// backup needs it too.
const WebhookKeyFile = "webhook.key"

// sealedPrefix starts a secret sealed with the webhook key: version 1 is
// AES-256-GCM, then the base64 of a random 12-byte nonce and the
// ciphertext, with the webhook's id as additional data so that a sealed
// secret cannot be moved to another row. A secret without it is plaintext,
// as written by a torpor before encryption; Open seals those.
const sealedPrefix = "sealed:v1:"

// secretBox seals and opens webhook secrets.
type secretBox struct{ aead cipher.AEAD }

func newSecretBox(key []byte) (*secretBox, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &secretBox{aead: aead}, nil
}

// seal encrypts the secret of webhook id with a fresh nonce.
func (b *secretBox) seal(id, secret string) string {
	nonce := make([]byte, b.aead.NonceSize())
	_, _ = rand.Read(nonce) // crypto/rand.Read never fails
	return sealedPrefix + base64.RawStdEncoding.EncodeToString(b.aead.Seal(nonce, nonce, []byte(secret), []byte(id)))
}

// open returns the secret stored for webhook id: decrypted when sealed,
// as is when plaintext; sealed reports which.
func (b *secretBox) open(id, stored string) (secret string, sealed bool, err error) {
	enc, ok := strings.CutPrefix(stored, sealedPrefix)
	if !ok {
		return stored, false, nil
	}
	raw, err := base64.RawStdEncoding.DecodeString(enc)
	n := b.aead.NonceSize()
	if err != nil || len(raw) < n {
		return "", true, fmt.Errorf("the secret of webhook %q is not a sealed value", id)
	}
	plain, err := b.aead.Open(nil, raw[:n], raw[n:], []byte(id))
	if err != nil {
		return "", true, fmt.Errorf("the secret of webhook %q does not open with %s (another key's?)", id, WebhookKeyFile)
	}
	return string(plain), true, nil
}

// openWebhookSecrets loads the webhook key, making it on first use, and
// seals the secrets still stored in plaintext. It refuses to make a new
// key while secrets sealed with a lost one remain: they would be lost
// for good, and deliveries unsigned.
func (s *Store) openWebhookSecrets(ctx context.Context) error {
	const op = "webhook secrets"
	rows, err := s.write.QueryContext(ctx, `SELECT id, secret FROM webhooks`)
	if err != nil {
		return wrap(err, "", op)
	}
	stored := map[string]string{}
	var sealed []string
	for rows.Next() {
		var id, secret string
		if err := rows.Scan(&id, &secret); err != nil {
			rows.Close()
			return wrap(err, "", op)
		}
		stored[id] = secret
		if strings.HasPrefix(secret, sealedPrefix) {
			sealed = append(sealed, id)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return wrap(err, "", op)
	}
	// Tenants' secrets are sealed with the same key (secrets.go).
	more, err := s.sealedSecrets(ctx)
	if err != nil {
		return err
	}
	sealed = append(sealed, more...)
	path := filepath.Join(filepath.Dir(s.path), WebhookKeyFile)
	key, err := readWebhookKey(path)
	if errors.Is(err, fs.ErrNotExist) {
		if len(sealed) > 0 {
			return fmt.Errorf("sqlite store: %s is missing, and %d values (%s) are sealed with it: restore it, or delete those webhooks and secrets",
				path, len(sealed), strings.Join(sealed, ", "))
		}
		key, err = createWebhookKey(path)
	}
	if err != nil {
		return fmt.Errorf("sqlite store: %w", err)
	}
	if s.secrets, err = newSecretBox(key); err != nil {
		return fmt.Errorf("sqlite store: %s: %w", path, err)
	}
	return s.inTx(ctx, op, func(tx *sql.Tx) error {
		for id, v := range stored {
			secret, wasSealed, err := s.secrets.open(id, v)
			if err != nil {
				return fmt.Errorf("sqlite store: %w", err)
			}
			if wasSealed {
				continue
			}
			if _, err := tx.ExecContext(ctx, `UPDATE webhooks SET secret = ? WHERE id = ?`, s.secrets.seal(id, secret), id); err != nil {
				return wrap(err, "", op)
			}
		}
		return nil
	})
}

// readWebhookKey reads the key file, which must hold 32 bytes.
func readWebhookKey(path string) ([]byte, error) {
	key, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("%s holds %d bytes, want a 32-byte key", path, len(key))
	}
	return key, nil
}

// createWebhookKey writes a new random key, mode 0600, and makes it
// durable before any secret is sealed with it.
func createWebhookKey(path string) ([]byte, error) {
	key := make([]byte, 32)
	_, _ = rand.Read(key) // crypto/rand.Read never fails
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	_, err = f.Write(key)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	if dir, err := os.Open(filepath.Dir(path)); err == nil {
		_ = dir.Sync()
		dir.Close()
	}
	return key, nil
}
