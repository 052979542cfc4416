package e2b

import (
	"encoding/json"
	"math"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/e2b/envd"
)

// The bodies of E2B's control plane, as its OpenAPI document and SDKs
// name them.

// newSandbox is the body of POST /sandboxes and /v2/sandboxes.
type newSandbox struct {
	TemplateID  *string           `json:"templateID"`
	Timeout     *int64            `json:"timeout"`
	Metadata    map[string]string `json:"metadata"`
	EnvVars     map[string]string `json:"envVars"`
	AutoPause   *bool             `json:"autoPause"`
	AutoPauseMu *bool             `json:"autoPauseMemory"`
	AutoResume  *autoResume       `json:"autoResume"`
	// Lifecycle is the newer form of autoPause/autoResume.
	Lifecycle           *lifecycleBody `json:"lifecycle"`
	AllowInternetAccess *bool          `json:"allow_internet_access"`
	Secure              *bool          `json:"secure"`
	// Network: allowOut and denyOut, as egress rules (networkBody).
	Network json.RawMessage `json:"network"`
	// What torpor does not serve: refused when given.
	MCP json.RawMessage `json:"mcp"`
	IAM json.RawMessage `json:"iam"`
	// VolumeMounts: [{name, path}] of the tenant's volumes.
	VolumeMounts json.RawMessage `json:"volumeMounts"`
}

type autoResume struct {
	Enabled *bool `json:"enabled"`
}

type lifecycleBody struct {
	OnTimeout  *string `json:"onTimeout"`
	AutoResume *bool   `json:"autoResume"`
	// The CubeSandbox spelling of the same two (spec 000).
	OnTimeoutSnake  *string `json:"on_timeout"`
	AutoResumeSnake *bool   `json:"auto_resume"`
}

// sandboxAnswer is E2B's Sandbox: the answer of create, resume and
// connect.
type sandboxAnswer struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken string  `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// listedSandbox is E2B's ListedSandbox.
type listedSandbox struct {
	SandboxID    string            `json:"sandboxID"`
	TemplateID   string            `json:"templateID"`
	Alias        string            `json:"alias,omitempty"`
	ClientID     string            `json:"clientID"`
	StartedAt    time.Time         `json:"startedAt"`
	EndAt        time.Time         `json:"endAt"`
	CPUCount     int               `json:"cpuCount"`
	MemoryMB     int64             `json:"memoryMB"`
	DiskSizeMB   int64             `json:"diskSizeMB"`
	Metadata     map[string]string `json:"metadata"`
	State        string            `json:"state"`
	EnvdVersion  string            `json:"envdVersion"`
	VolumeMounts []volumeMount     `json:"volumeMounts"`
}

// sandboxDetail is E2B's SandboxDetail (GET /sandboxes/{id}).
type sandboxDetail struct {
	listedSandbox
	EnvdAccessToken     string           `json:"envdAccessToken"`
	AllowInternetAccess bool             `json:"allowInternetAccess"`
	Domain              *string          `json:"domain"`
	Lifecycle           sandboxLifecycle `json:"lifecycle"`
	// Network is the sandbox's egress rules, absent without any.
	Network *sandboxNetwork `json:"network,omitempty"`
}

// sandboxNetwork is E2B's SandboxNetworkConfig, as far as torpor has it.
type sandboxNetwork struct {
	AllowOut []string `json:"allowOut,omitempty"`
	DenyOut  []string `json:"denyOut,omitempty"`
}

type sandboxLifecycle struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"`
}

// metric is E2B's SandboxMetric. A figure the runtime cannot tell is left
// out, never made up.
type metric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    *float64  `json:"cpuUsedPct,omitempty"`
	MemUsed       *int64    `json:"memUsed,omitempty"`
	MemCache      *int64    `json:"memCache,omitempty"`
	MemTotal      int64     `json:"memTotal"`
	DiskUsed      *int64    `json:"diskUsed,omitempty"`
	DiskTotal     int64     `json:"diskTotal"`
}

// template is E2B's Template (GET /templates).
type template struct {
	TemplateID    string     `json:"templateID"`
	BuildID       string     `json:"buildID"`
	CPUCount      int        `json:"cpuCount"`
	MemoryMB      int64      `json:"memoryMB"`
	DiskSizeMB    int64      `json:"diskSizeMB"`
	Public        bool       `json:"public"`
	Aliases       []string   `json:"aliases"`
	Names         []string   `json:"names"`
	CreatedAt     time.Time  `json:"createdAt"`
	UpdatedAt     time.Time  `json:"updatedAt"`
	CreatedBy     *struct{}  `json:"createdBy"`
	LastSpawnedAt *time.Time `json:"lastSpawnedAt"`
	SpawnCount    int        `json:"spawnCount"`
	BuildCount    int        `json:"buildCount"`
	BuildStatus   string     `json:"buildStatus"`
	EnvdVersion   string     `json:"envdVersion"`
}

// clientID is E2B's deprecated client id, the same for every sandbox.
const clientID = "torpor"

// noEnd is the endAt of a sandbox that has no end (one made through the
// native API without one): E2B's answers always carry a time.
var noEnd = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)

// E2B's states.
const (
	stateRunning = "running"
	statePaused  = "paused"
)

// e2bState is how a torpor state shows on E2B's surface: running (and on
// its way there), or paused: frozen, snapshotted, hibernated (its disk is
// kept; connect boots it) or failed (connect boots it again). Terminated
// sandboxes are not shown at all.
func e2bState(s torpor.State) string {
	switch s {
	case torpor.StateStarting, torpor.StateRunning, torpor.StateResuming, torpor.StateRestarting:
		return stateRunning
	}
	return statePaused
}

// torporStates are the torpor states an E2B state filter selects.
func torporStates(s string) []torpor.State {
	if s == stateRunning {
		return []torpor.State{torpor.StateStarting, torpor.StateRunning, torpor.StateResuming, torpor.StateRestarting}
	}
	return []torpor.State{torpor.StatePausing, torpor.StatePaused, torpor.StateHibernating, torpor.StateHibernated, torpor.StateArchiving, torpor.StateArchived, torpor.StateFailed}
}

func cpuCount(r torpor.Resources) int {
	return max(1, int(math.Ceil(r.VCPUs)))
}

func (a *API) domainPtr() *string {
	if a.domain == "" {
		return nil
	}
	d := a.domain
	return &d
}

// alias is the E2B name of a torpor template.
func (a *API) alias(tmpl string) string {
	if n, ok := a.tmpls.(TemplateNamer); ok {
		if name, ok := n.E2BName(tmpl); ok {
			return name
		}
	}
	return tmpl
}

func (a *API) answer(sb *torpor.Sandbox) sandboxAnswer {
	return sandboxAnswer{
		SandboxID: sb.ID, TemplateID: sb.Template, Alias: a.alias(sb.Template), ClientID: clientID,
		EnvdVersion: envd.Version, EnvdAccessToken: sb.TrafficToken, TrafficAccessToken: sb.TrafficToken,
		Domain: a.domainPtr(),
	}
}

func (a *API) listed(sb *torpor.Sandbox) listedSandbox {
	end := noEnd
	if sb.EndAt != nil {
		end = *sb.EndAt
	}
	md := sb.Metadata
	if md == nil {
		md = map[string]string{}
	}
	return listedSandbox{
		SandboxID: sb.ID, TemplateID: sb.Template, Alias: a.alias(sb.Template), ClientID: clientID,
		StartedAt: sb.CreatedAt, EndAt: end, CPUCount: cpuCount(sb.Resources), MemoryMB: sb.Resources.MemoryMiB,
		DiskSizeMB: sb.Resources.DiskMiB, Metadata: md, State: e2bState(sb.State), EnvdVersion: envd.Version,
		VolumeMounts: volumeMountsOf(sb),
	}
}

func (a *API) detail(sb *torpor.Sandbox) sandboxDetail {
	onTimeout := "kill"
	if sb.OnEnd == torpor.ActionPause || sb.OnEnd == torpor.ActionHibernate {
		onTimeout = "pause"
	}
	d := sandboxDetail{
		listedSandbox: a.listed(sb), EnvdAccessToken: sb.TrafficToken, AllowInternetAccess: sb.AllowInternet,
		Domain: a.domainPtr(), Lifecycle: sandboxLifecycle{AutoResume: sb.Policy().AutoResume, OnTimeout: onTimeout},
	}
	if !sb.Network.Empty() {
		d.Network = &sandboxNetwork{AllowOut: sb.Network.AllowOut, DenyOut: sb.Network.DenyOut}
	}
	return d
}

// volumeMount is E2B's SandboxVolumeMount.
type volumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

func volumeMountsOf(sb *torpor.Sandbox) []volumeMount {
	out := []volumeMount{}
	for _, m := range sb.VolumeMounts {
		out = append(out, volumeMount{Name: m.Name, Path: m.Path})
	}
	return out
}
