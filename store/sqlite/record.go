package sqlite

import (
	"encoding/json"
	"fmt"

	"github.com/torpor-dev/torpor"
)

// sandboxRecord is the stored JSON form of the parts of a Sandbox that are
// not columns. It is the store's own format, independent of the API's JSON
// (which hides Env and Handle): change it only in ways that still read the
// records already written.
type sandboxRecord struct {
	Template       string              `json:"template"`
	StateSince     int64               `json:"state_since_us"`
	Failure        *failureRecord      `json:"failure,omitempty"`
	LastActivityAt int64               `json:"last_activity_at_us"`
	TerminatedAt   *int64              `json:"terminated_at_us,omitempty"`
	Resources      resourcesRecord     `json:"resources"`
	Metadata       map[string]string   `json:"metadata"`
	Runtime        runtimeRecord       `json:"runtime"`
	PauseModes     []string            `json:"pause_modes"`
	PauseMode      string              `json:"pause_mode,omitempty"`
	Boots          int                 `json:"boots,omitempty"`
	Env            map[string]string   `json:"env"`
	Handle         string              `json:"handle,omitempty"`
	Timeout        optRecord           `json:"timeout"`
	Lifecycle      *lifecycleRecord    `json:"lifecycle,omitempty"`
	Policy         policyRecord        `json:"lifecycle_policy"`
	Meters         countersRecord      `json:"meters"`
	Hooks          []hookRecord        `json:"hooks,omitempty"`
	IgnoreHooks    bool                `json:"ignore_image_hooks,omitempty"`
	HookFailure    *hookFailRecord     `json:"hook_failure,omitempty"`
	Ports          []portRecord        `json:"ports,omitempty"`
	TrafficToken   string              `json:"traffic_token,omitempty"`
	Secrets        []secretRefRecord   `json:"secrets,omitempty"`
	VolumeMounts   []volumeMountRecord `json:"volume_mounts,omitempty"`
	Snapshot       *snapshotRecord     `json:"snapshot,omitempty"`
	AllowInternet  bool                `json:"allow_internet,omitempty"`
	Network        *networkRecord      `json:"network,omitempty"`
	Accel          *torpor.Accel       `json:"accel,omitempty"`
	KeyID          string              `json:"key_id,omitempty"`
	Pool           string              `json:"pool,omitempty"`
	FromPool       bool                `json:"from_pool,omitempty"`
	UsageKind      string              `json:"usage_kind,omitempty"`
	UsageSince     int64               `json:"usage_since_us,omitempty"`
	EndAt          *int64              `json:"end_at_us,omitempty"`
	EndAfter       int64               `json:"end_after_s,omitempty"`
	OnEnd          string              `json:"on_end,omitempty"`
	// The node itself is a column (node), as tenant and state are.
	NodeEpoch  int64             `json:"node_epoch,omitempty"`
	NodeLabels map[string]string `json:"node_labels,omitempty"`
	Durability string            `json:"durability,omitempty"`
	Remote     *remoteRecord     `json:"remote,omitempty"`
	Archive    *archiveRecord    `json:"archive,omitempty"`
	RestoredAt *int64            `json:"restored_from_archive_at_us,omitempty"`
	Wakeups    []wakeupRecord    `json:"wakeups,omitempty"`
	// Checkpoints and fork (docs/fork.md).
	Checkpoints         []torpor.CheckpointInfo `json:"checkpoints,omitempty"`
	Forking             *torpor.ForkOp          `json:"forking,omitempty"`
	ForkOp              string                  `json:"fork_op,omitempty"`
	RestoringCheckpoint string                  `json:"restoring_checkpoint,omitempty"`
}

// networkRecord is a sandbox's egress rules.
type networkRecord struct {
	AllowOut []string `json:"allow_out,omitempty"`
	DenyOut  []string `json:"deny_out,omitempty"`
}

// remoteRecord is where the object store keeps a sandbox's state.
type remoteRecord struct {
	Manifest   string `json:"manifest"`
	Bytes      int64  `json:"bytes"`
	Boots      int    `json:"boots,omitempty"`
	UploadedAt int64  `json:"uploaded_at_us"`
	Host       string `json:"host,omitempty"`
}

// archiveRecord is where an archived sandbox's disk is kept.
type archiveRecord struct {
	Key        string `json:"key"`
	Kind       string `json:"kind,omitempty"`
	Bytes      int64  `json:"bytes,omitempty"`
	ArchivedAt int64  `json:"archived_at_us,omitempty"`
}

// secretRefRecord is a sandbox's reference to a secret: its name and
// where it goes, never its value.
type secretRefRecord struct {
	Name string `json:"name"`
	Env  string `json:"env,omitempty"`
	Path string `json:"path,omitempty"`
}

// volumeMountRecord is a sandbox's volume mount; DeleteVolume's check
// reads its name ($.volume_mounts[*].name).
type volumeMountRecord struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

type snapshotRecord struct {
	Path      string `json:"path"`
	SizeBytes int64  `json:"size_bytes"`
}

type portRecord struct {
	Port   int  `json:"port"`
	Public bool `json:"public,omitempty"`
}

type hookRecord struct {
	Type           string   `json:"type"`
	On             string   `json:"on"`
	Path           string   `json:"path"`
	Arguments      []string `json:"arguments,omitempty"`
	Port           int      `json:"port,omitempty"`
	Wait           bool     `json:"wait,omitempty"`
	TimeoutSeconds int64    `json:"timeout_seconds,omitempty"`
}

type hookFailRecord struct {
	On      string `json:"on"`
	Index   int    `json:"index"`
	Type    string `json:"type"`
	Message string `json:"message"`
	At      int64  `json:"at_us"`
}

// optRecord keeps absent, null and a number apart.
type optRecord struct {
	Set   bool  `json:"set,omitempty"`
	Null  bool  `json:"null,omitempty"`
	Value int64 `json:"value,omitempty"`
}

type lifecycleRecord struct {
	OnTimeout  string `json:"on_timeout,omitempty"`
	AutoResume *bool  `json:"auto_resume,omitempty"`
	PauseMode  string `json:"pause_mode,omitempty"`
}

type policyRecord struct {
	PauseAfterIdle       optRecord `json:"pause_after_idle"`
	HibernateAfterPaused optRecord `json:"hibernate_after_paused"`
	ConnectionIdle       optRecord `json:"connection_idle"`
	ArchiveAfter         optRecord `json:"archive_after_hibernated,omitzero"`
}

type countersRecord struct {
	RunningS        float64 `json:"running_s,omitempty"`
	FrozenS         float64 `json:"frozen_s,omitempty"`
	SnapshotPausedS float64 `json:"snapshot_paused_s,omitempty"`
	HibernatedS     float64 `json:"hibernated_s,omitempty"`
	ArchivedS       float64 `json:"archived_s,omitempty"`
	ResidentS       float64 `json:"resident_s,omitempty"`
	BilledS         float64 `json:"billed_s,omitempty"`
	Cost            float64 `json:"cost,omitempty"`

	Pauses         int64 `json:"pauses,omitempty"`
	AutoPaused     int64 `json:"auto_paused,omitempty"`
	Resumes        int64 `json:"resumes,omitempty"`
	AutoResumed    int64 `json:"auto_resumed,omitempty"`
	Hibernations   int64 `json:"hibernations,omitempty"`
	AutoHibernated int64 `json:"auto_hibernated,omitempty"`
}

func metersRecord(m torpor.Meters) countersRecord {
	u := m.UsageSeconds
	return countersRecord{RunningS: u.RunningS, FrozenS: u.FrozenS, SnapshotPausedS: u.SnapshotPausedS, HibernatedS: u.HibernatedS, ArchivedS: u.ArchivedS,
		ResidentS: u.ResidentS, BilledS: u.BilledS, Cost: m.Cost, Pauses: m.Pauses, AutoPaused: m.AutoPaused, Resumes: m.Resumes,
		AutoResumed: m.AutoResumed, Hibernations: m.Hibernations, AutoHibernated: m.AutoHibernated}
}

func (r countersRecord) meters() torpor.Meters {
	return torpor.Meters{
		UsageSeconds: torpor.UsageSeconds{RunningS: r.RunningS, FrozenS: r.FrozenS, SnapshotPausedS: r.SnapshotPausedS,
			HibernatedS: r.HibernatedS, ArchivedS: r.ArchivedS, ResidentS: r.ResidentS, BilledS: r.BilledS},
		Cost: r.Cost, Pauses: r.Pauses, AutoPaused: r.AutoPaused, Resumes: r.Resumes, AutoResumed: r.AutoResumed,
		Hibernations: r.Hibernations, AutoHibernated: r.AutoHibernated}
}

type failureRecord struct {
	Code     string `json:"code"`
	Message  string `json:"message"`
	ExitCode *int   `json:"exit_code,omitempty"`
}

type resourcesRecord struct {
	VCPUs     float64 `json:"vcpus,omitempty"`
	MemoryMiB int64   `json:"memory_mib,omitempty"`
	Pids      int64   `json:"pids,omitempty"`
	DiskMiB   int64   `json:"disk_mib,omitempty"`
}

type runtimeRecord struct {
	Kind       string   `json:"kind,omitempty"`
	Setup      []string `json:"setup"`
	Entrypoint []string `json:"entrypoint"`
}

// encodeRecord returns the record column of sb.
func encodeRecord(sb *torpor.Sandbox) (string, error) {
	r := sandboxRecord{
		Template:       sb.Template,
		StateSince:     micros(sb.StateSince),
		LastActivityAt: micros(sb.LastActivityAt),
		Resources:      resourcesRecord(sb.Resources),
		Metadata:       sb.Metadata,
		Runtime:        runtimeRecord(sb.Runtime),
		PauseMode:      string(sb.PauseMode),
		Boots:          sb.Boots,
		Env:            sb.Env,
		Handle:         sb.Handle,
		Timeout:        optRecord(sb.Timeout),
		Policy: policyRecord{
			PauseAfterIdle:       optRecord(sb.LifecyclePolicy.PauseAfterIdleSeconds),
			HibernateAfterPaused: optRecord(sb.LifecyclePolicy.HibernateAfterPausedSeconds),
			ConnectionIdle:       optRecord(sb.LifecyclePolicy.ConnectionIdleSeconds),
			ArchiveAfter:         optRecord(sb.LifecyclePolicy.ArchiveAfterHibernatedSeconds),
		},
		Meters: metersRecord(sb.Meters),
	}
	if l := sb.Lifecycle; l != nil {
		r.Lifecycle = &lifecycleRecord{OnTimeout: l.OnTimeout, AutoResume: l.AutoResume, PauseMode: string(l.PauseMode)}
	}
	for _, h := range sb.Hooks {
		r.Hooks = append(r.Hooks, hookRecord(h))
	}
	r.IgnoreHooks = sb.IgnoreImageHooks
	for _, p := range sb.Ports {
		r.Ports = append(r.Ports, portRecord(p))
	}
	r.TrafficToken = sb.TrafficToken
	r.Wakeups = wakeupRecords(sb.Wakeups)
	for _, ref := range sb.Secrets {
		r.Secrets = append(r.Secrets, secretRefRecord(ref))
	}
	for _, m := range sb.VolumeMounts {
		r.VolumeMounts = append(r.VolumeMounts, volumeMountRecord(m))
	}
	if sb.Snapshot != nil {
		r.Snapshot = &snapshotRecord{Path: sb.Snapshot.Path, SizeBytes: sb.Snapshot.SizeBytes}
	}
	r.AllowInternet = sb.AllowInternet
	if n := sb.Network.Clone(); n != nil {
		r.Network = &networkRecord{AllowOut: n.AllowOut, DenyOut: n.DenyOut}
	}
	r.Accel = sb.Accel
	r.KeyID = sb.KeyID
	r.Pool, r.FromPool = sb.Pool, sb.FromPool
	r.UsageKind = string(sb.Usage.Kind)
	if !sb.Usage.Since.IsZero() {
		r.UsageSince = micros(sb.Usage.Since)
	}
	if hf := sb.HookFailure; hf != nil {
		r.HookFailure = &hookFailRecord{On: hf.On, Index: hf.Index, Type: hf.Type, Message: hf.Message, At: micros(hf.At)}
	}
	if f := sb.Failure; f != nil {
		r.Failure = &failureRecord{Code: f.Code, Message: f.Message, ExitCode: f.ExitCode}
	}
	if sb.TerminatedAt != nil {
		us := micros(*sb.TerminatedAt)
		r.TerminatedAt = &us
	}
	if sb.EndAt != nil {
		us := micros(*sb.EndAt)
		r.EndAt = &us
	}
	r.EndAfter, r.OnEnd = sb.EndAfterSeconds, sb.OnEnd
	r.NodeEpoch, r.NodeLabels, r.Durability = sb.NodeEpoch, sb.NodeLabels, string(sb.Durability)
	if rs := sb.Remote; rs != nil {
		r.Remote = &remoteRecord{Manifest: rs.Manifest, Bytes: rs.Bytes, Boots: rs.Boots, UploadedAt: micros(rs.UploadedAt), Host: rs.Host}
	}
	if a := sb.Archive; a != nil {
		r.Archive = &archiveRecord{Key: a.Key, Kind: a.Kind, Bytes: a.Bytes}
		if !a.ArchivedAt.IsZero() {
			r.Archive.ArchivedAt = micros(a.ArchivedAt)
		}
	}
	if t := sb.RestoredFromArchiveAt; t != nil {
		us := micros(*t)
		r.RestoredAt = &us
	}
	r.Checkpoints, r.Forking, r.ForkOp, r.RestoringCheckpoint = sb.Checkpoints, sb.Forking, sb.ForkOp, sb.RestoringCheckpoint
	if sb.PauseModes != nil {
		r.PauseModes = make([]string, len(sb.PauseModes))
		for i, m := range sb.PauseModes {
			r.PauseModes[i] = string(m)
		}
	}
	b, err := json.Marshal(r)
	if err != nil {
		return "", fmt.Errorf("sqlite store: encode sandbox %q: %w", sb.ID, err)
	}
	return string(b), nil
}

// decodeRecord fills sb's non-column fields from a record column.
func decodeRecord(sb *torpor.Sandbox, data string) error {
	var r sandboxRecord
	if err := json.Unmarshal([]byte(data), &r); err != nil {
		return fmt.Errorf("sqlite store: decode sandbox %q: %w", sb.ID, err)
	}
	sb.Template = r.Template
	sb.StateSince = fromMicros(r.StateSince)
	sb.LastActivityAt = fromMicros(r.LastActivityAt)
	sb.Resources = torpor.Resources(r.Resources)
	sb.Metadata = r.Metadata
	sb.Runtime = torpor.RuntimeConfig(r.Runtime)
	sb.PauseMode = torpor.PauseMode(r.PauseMode)
	sb.Boots = r.Boots
	sb.Env = r.Env
	sb.Handle = r.Handle
	sb.Timeout = torpor.OptSeconds(r.Timeout)
	sb.LifecyclePolicy = torpor.LifecyclePolicy{
		PauseAfterIdleSeconds:         torpor.OptSeconds(r.Policy.PauseAfterIdle),
		HibernateAfterPausedSeconds:   torpor.OptSeconds(r.Policy.HibernateAfterPaused),
		ConnectionIdleSeconds:         torpor.OptSeconds(r.Policy.ConnectionIdle),
		ArchiveAfterHibernatedSeconds: torpor.OptSeconds(r.Policy.ArchiveAfter),
	}
	sb.Meters = r.Meters.meters()
	if l := r.Lifecycle; l != nil {
		sb.Lifecycle = &torpor.Lifecycle{OnTimeout: l.OnTimeout, AutoResume: l.AutoResume, PauseMode: torpor.PauseMode(l.PauseMode)}
	}
	for _, h := range r.Hooks {
		sb.Hooks = append(sb.Hooks, torpor.Hook(h))
	}
	sb.IgnoreImageHooks = r.IgnoreHooks
	for _, p := range r.Ports {
		sb.Ports = append(sb.Ports, torpor.PortSpec(p))
	}
	sb.TrafficToken = r.TrafficToken
	sb.Wakeups = wakeupsOf(r.Wakeups)
	for _, ref := range r.Secrets {
		sb.Secrets = append(sb.Secrets, torpor.SecretRef(ref))
	}
	for _, m := range r.VolumeMounts {
		sb.VolumeMounts = append(sb.VolumeMounts, torpor.VolumeMount(m))
	}
	if r.Snapshot != nil {
		sb.Snapshot = &torpor.SnapshotInfo{Path: r.Snapshot.Path, SizeBytes: r.Snapshot.SizeBytes}
	}
	sb.AllowInternet = r.AllowInternet
	if r.Network != nil {
		sb.Network = (&torpor.NetworkRules{AllowOut: r.Network.AllowOut, DenyOut: r.Network.DenyOut}).Clone()
	}
	sb.Accel = r.Accel
	sb.KeyID = r.KeyID
	sb.Pool, sb.FromPool = r.Pool, r.FromPool
	sb.Usage.Kind = torpor.UsageKind(r.UsageKind)
	if r.UsageSince != 0 {
		sb.Usage.Since = fromMicros(r.UsageSince)
	}
	if hf := r.HookFailure; hf != nil {
		sb.HookFailure = &torpor.HookFailure{On: hf.On, Index: hf.Index, Type: hf.Type, Message: hf.Message, At: fromMicros(hf.At)}
	}
	if f := r.Failure; f != nil {
		sb.Failure = &torpor.Failure{Code: f.Code, Message: f.Message, ExitCode: f.ExitCode}
	}
	if r.TerminatedAt != nil {
		t := fromMicros(*r.TerminatedAt)
		sb.TerminatedAt = &t
	}
	if r.EndAt != nil {
		t := fromMicros(*r.EndAt)
		sb.EndAt = &t
	}
	sb.EndAfterSeconds, sb.OnEnd = r.EndAfter, r.OnEnd
	// A record written before fleets has no durability: "" (the engine
	// reads it as node).
	sb.NodeEpoch, sb.NodeLabels, sb.Durability = r.NodeEpoch, r.NodeLabels, torpor.Durability(r.Durability)
	if rs := r.Remote; rs != nil {
		sb.Remote = &torpor.RemoteState{Manifest: rs.Manifest, Bytes: rs.Bytes, Boots: rs.Boots, UploadedAt: fromMicros(rs.UploadedAt), Host: rs.Host}
	}
	if a := r.Archive; a != nil {
		sb.Archive = &torpor.ArchiveInfo{Key: a.Key, Kind: a.Kind, Bytes: a.Bytes}
		if a.ArchivedAt != 0 {
			sb.Archive.ArchivedAt = fromMicros(a.ArchivedAt)
		}
	}
	if r.RestoredAt != nil {
		t := fromMicros(*r.RestoredAt)
		sb.RestoredFromArchiveAt = &t
	}
	sb.Checkpoints, sb.Forking, sb.ForkOp, sb.RestoringCheckpoint = r.Checkpoints, r.Forking, r.ForkOp, r.RestoringCheckpoint
	if r.PauseModes != nil {
		sb.PauseModes = make([]torpor.PauseMode, len(r.PauseModes))
		for i, m := range r.PauseModes {
			sb.PauseModes[i] = torpor.PauseMode(m)
		}
	}
	return nil
}
