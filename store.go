package torpor

import (
	"context"
	"time"
)

// SandboxStore keeps sandbox records and their events.
type SandboxStore interface {
	// CreateSandbox inserts sb (Version becomes 1) together with events.
	// An existing id is a conflict.
	CreateSandbox(ctx context.Context, sb *Sandbox, events ...Event) error
	// GetSandbox returns the record, or not_found.
	GetSandbox(ctx context.Context, id string) (*Sandbox, error)
	// ListSandboxes returns the records that match f, oldest first (by
	// CreatedAt, then ID), past f.After and at most f.Limit of them.
	ListSandboxes(ctx context.Context, f SandboxFilter) ([]*Sandbox, error)
	// UpdateSandbox replaces the record if its stored Version equals
	// sb.Version (a conflict otherwise), increments sb.Version, and appends
	// events, all in one transaction.
	UpdateSandbox(ctx context.Context, sb *Sandbox, events ...Event) error
	// UpdateSandboxUsage is UpdateSandbox that also appends rows to the
	// usage ledger in the same transaction, so that moving a sandbox's
	// metering frontier (Usage.Since) and writing the rows for the seconds
	// it passes over happen together or not at all. A row that would start
	// where one of the same sandbox already starts is a conflict.
	UpdateSandboxUsage(ctx context.Context, sb *Sandbox, usage []UsageRecord, events ...Event) error
	// MarkSeen records that the instances of the sandboxes ids were alive
	// at t (their Usage.SeenAt), without touching their records' versions.
	MarkSeen(ctx context.Context, t time.Time, ids ...string) error
	// ListUsage returns ledger rows that match f, in ledger order.
	ListUsage(ctx context.Context, f UsageFilter) ([]UsageRecord, error)
	// ListEvents returns events after a cursor, oldest first.
	ListEvents(ctx context.Context, f EventFilter) ([]Event, error)
}

// SandboxFilter selects sandboxes. Zero fields match everything.
type SandboxFilter struct {
	Tenant string
	// ExceptTenant leaves out the sandboxes of this tenant (the engine's
	// "every tenant" view hides PoolTenant's with it).
	ExceptTenant string
	// Node keeps only the sandboxes this fleet node owns ("" matches
	// every node's and none's).
	Node string
	// States keeps only these states. Empty: every state but terminated,
	// unless IncludeTerminated.
	States            []State
	IncludeTerminated bool
	// Metadata keeps sandboxes whose metadata has every key with its value.
	Metadata map[string]string
	// After, when its ID is set, keeps the sandboxes that come after this
	// position in the list's order (CreatedAt, then ID): the next page.
	After ListPosition
	// Limit, when positive, returns at most this many sandboxes.
	Limit int
}

// ListPosition is a place in the sandbox list's order: a sandbox's
// creation time (to the microsecond, as stores keep it) and its id.
type ListPosition struct {
	CreatedAt time.Time
	ID        string
}

// EventFilter selects events.
type EventFilter struct {
	After  int64
	Tenant string
	// ExceptTenant leaves out the events of this tenant (the engine's
	// "every tenant" view hides PoolTenant's with it).
	ExceptTenant string
	SandboxID    string
	Limit        int
	// Newest returns only the newest of the events that match (none
	// when there is none after After), ignoring Limit: the cursor a
	// reader that wants only what happens next starts from.
	Newest bool
}

// AuthStore keeps tenants and API keys.
type AuthStore interface {
	// CreateTenant inserts a tenant (with its quota); an existing name
	// is a conflict.
	CreateTenant(ctx context.Context, t Tenant) error
	GetTenant(ctx context.Context, name string) (*Tenant, error)
	ListTenants(ctx context.Context) ([]Tenant, error)
	// SetTenantQuota replaces the quota of the tenant called name; an
	// unknown name is not_found.
	SetTenantQuota(ctx context.Context, name string, q Quota) error
	// CreateAPIKey inserts a key; its tenant must exist. A key without a
	// tier is stored as TierStandard.
	CreateAPIKey(ctx context.Context, k APIKey) error
	// APIKeyByHash finds a key by the hash of its secret, or not_found.
	APIKeyByHash(ctx context.Context, hash string) (*APIKey, error)
}

// TemplateStore keeps the templates sandboxes are made from.
type TemplateStore interface {
	// PutTemplate inserts or replaces a template (InUse is not stored).
	PutTemplate(ctx context.Context, t Template) error
	// GetTemplate returns the template with InUse filled in, or not_found.
	GetTemplate(ctx context.Context, name string) (*Template, error)
	// ListTemplates returns every template, sorted by name, with InUse.
	ListTemplates(ctx context.Context) ([]Template, error)
	// DeleteTemplate removes a template, in one transaction with the check
	// that no sandbox that is not terminated uses it: otherwise it is a
	// conflict whose message names such a sandbox. A missing template is
	// not_found.
	DeleteTemplate(ctx context.Context, name string) error
}

// Store is everything the daemon persists.
type Store interface {
	SandboxStore
	AuthStore
	TemplateStore
	WebhookStore
	PoolStore
	SecretStore
	VolumeStore
	Close() error
}
