package torpor

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"
	"time"
)

// KeyPrefix starts every API key, so leaked keys are easy to find.
const KeyPrefix = "tpk_"

var tenantRe = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// ValidateTenantName checks a tenant name: lowercase letters, digits, '-'.
func ValidateTenantName(name string) error {
	if !tenantRe.MatchString(name) {
		return Invalid("tenant", "tenant name must be 1-63 lowercase letters, digits or '-', starting with a letter or digit")
	}
	return nil
}

// Key tiers: what GPU rules (and later quotas) read from the key a request
// came with.
const (
	TierStandard = "standard"
	TierFree     = "free"
)

// ValidateTier checks a key tier; empty means standard.
func ValidateTier(tier string) error {
	switch tier {
	case "", TierStandard, TierFree:
		return nil
	}
	return Invalid("tier", "must be %s or %s", TierFree, TierStandard)
}

// NewAPIKey makes a key for tenant. The secret is shown once; only its
// hash is kept.
func NewAPIKey(tenant string, admin bool, now time.Time) (secret string, k APIKey) {
	secret = KeyPrefix + NewID("", 40)
	return secret, APIKey{ID: NewID("key_", 12), Tenant: tenant, Admin: admin, Tier: TierStandard, Hash: HashKey(secret), CreatedAt: now}
}

// HashKey is the stored form of a key's secret.
func HashKey(secret string) string {
	sum := sha256.Sum256([]byte(strings.TrimSpace(secret)))
	return hex.EncodeToString(sum[:])
}
