package torpor

import (
	"context"
	"strconv"
	"strings"
)

// PoolTenant owns the ready members of warm pools (docs/pools.md). It is
// no valid tenant name (ValidateTenantName refuses the underscore), so no
// key can ever act as it: a member is invisible to every tenant until a
// create claims it and it becomes that tenant's.
const PoolTenant = "_pool"

// MaxPoolSize bounds one template's warm pool.
const MaxPoolSize = 64

// PoolConfig is what a warm pool keeps: Size members of Template, booted
// with the template's defaults and, with AllowInternet, a way out to the
// internet (a create matches only a pool booted as it asks, see
// docs/pools.md).
type PoolConfig struct {
	Template      string `json:"template"`
	Size          int    `json:"size"`
	AllowInternet bool   `json:"allow_internet"`
}

// Validate checks a pool's config.
func (c PoolConfig) Validate() error {
	if c.Template == "" {
		return Invalid("template", "template name is empty")
	}
	return ValidatePoolSize("size", c.Size)
}

// PoolStatus is one warm pool as GET /v1/pools shows it.
type PoolStatus struct {
	PoolConfig
	// Ready is how many members the pool has now (the rest are booting,
	// or wait for capacity).
	Ready int `json:"ready"`
	// Hits counts the creates that matched the pool and claimed a member,
	// Misses those that matched it but found none ready and booted cold,
	// since the daemon started.
	Hits   int64 `json:"hits"`
	Misses int64 `json:"misses"`
	// LastError is why the pool's last refill failed, empty after one that
	// worked.
	LastError string `json:"last_error,omitempty"`
}

// PoolRequest is the body of PUT /v1/pools/{template}: the size, and
// whether members reach the internet (absent: as the pool had it).
type PoolRequest struct {
	Size          *int  `json:"size"`
	AllowInternet *bool `json:"allow_internet,omitempty"`
}

// ValidatePoolSize checks a pool size: 0 (no pool) to MaxPoolSize.
func ValidatePoolSize(param string, n int) error {
	if n < 0 || n > MaxPoolSize {
		return Invalid(param, "a pool size is 0 to %d", MaxPoolSize)
	}
	return nil
}

// poolInternet is the suffix of a pool spec whose members reach the
// internet.
const poolInternet = ":internet"

// ParsePoolSpec reads TEMPLATE=N or TEMPLATE=N:internet, the form of
// `torpor serve --warm-pool`.
func ParsePoolSpec(s string) (PoolConfig, error) {
	name, n, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return PoolConfig{}, Invalid("warm_pool", "%q is not TEMPLATE=N or TEMPLATE=N:internet", s)
	}
	c := PoolConfig{Template: name}
	n, c.AllowInternet = strings.CutSuffix(n, poolInternet)
	size, err := strconv.Atoi(n)
	if err != nil {
		return PoolConfig{}, Invalid("warm_pool", "%q: the size %q is not a number", s, n)
	}
	c.Size = size
	if err := c.Validate(); err != nil {
		return PoolConfig{}, err
	}
	return c, nil
}

// PoolStore keeps the pools set at run time, so that a restarted daemon
// keeps them.
type PoolStore interface {
	// SetPool stores a pool's config, replacing the template's; a size of
	// 0 is stored too (a pool turned off stays off over a restart).
	SetPool(ctx context.Context, c PoolConfig) error
	// PoolConfigs returns every stored pool config, by template name.
	PoolConfigs(ctx context.Context) ([]PoolConfig, error)
}
