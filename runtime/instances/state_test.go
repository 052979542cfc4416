package instances

import (
	"context"
	"errors"
	"testing"

	"github.com/torpor-dev/torpor"
)

func TestStateErrors(t *testing.T) {
	for _, c := range []struct {
		state torpor.InstanceState
		code  torpor.ErrorCode // of StateError; "" for none
		exec  torpor.ErrorCode // of ExecStateError
	}{
		{torpor.InstanceRunning, "", ""},
		{torpor.InstanceFrozen, "", torpor.EConflict},
		{torpor.InstanceStopped, torpor.EConflict, torpor.EConflict},
		{torpor.InstanceMissing, torpor.ENotFound, torpor.ENotFound},
	} {
		st := torpor.InstanceStatus{State: c.state}
		if err := StateError("freeze", st); (c.code == "" && err != nil) || (c.code != "" && !torpor.IsCode(err, c.code)) {
			t.Errorf("StateError(%s) = %v, want code %q", c.state, err, c.code)
		}
		if err := ExecStateError(st); (c.exec == "" && err != nil) || (c.exec != "" && !torpor.IsCode(err, c.exec)) {
			t.Errorf("ExecStateError(%s) = %v, want code %q", c.state, err, c.exec)
		}
	}
}

func TestCheckRef(t *testing.T) {
	bad := errors.New("bad handle")
	parse := func(id, h string) error {
		if h != "" && h != "ok:"+id {
			return bad
		}
		return nil
	}
	if id, err := CheckRef(torpor.InstanceRef{SandboxID: "sbx1", Handle: "ok:sbx1"}, parse); id != "sbx1" || err != nil {
		t.Errorf("a good ref: %q, %v", id, err)
	}
	if _, err := CheckRef(torpor.InstanceRef{SandboxID: "../x"}, parse); !torpor.IsCode(err, torpor.EInvalid) {
		t.Errorf("a bad id: %v, want invalid_argument", err)
	}
	if _, err := CheckRef(torpor.InstanceRef{SandboxID: "sbx1", Handle: "ok:other"}, parse); !errors.Is(err, bad) {
		t.Errorf("a bad handle: %v, want the parser's error", err)
	}
}

func TestWaitLooksUntilTheInstanceStops(t *testing.T) {
	states := []torpor.InstanceState{torpor.InstanceRunning, torpor.InstanceFrozen, torpor.InstanceStopped}
	looks, waits := 0, 0
	inspect := func(ctx context.Context, id string) (torpor.InstanceStatus, int, error) {
		st := torpor.InstanceStatus{State: states[looks]}
		looks++
		return st, looks, nil
	}
	check := func(ref torpor.InstanceRef) (string, error) { return ref.SandboxID, nil }
	ref := torpor.InstanceRef{SandboxID: "sbx1"}
	st, err := Wait(context.Background(), ref, check, inspect, func(ctx context.Context, id string, look int) error {
		if look != looks {
			t.Errorf("wait got the record of look %d, want %d", look, looks)
		}
		waits++
		return nil
	})
	if err != nil || st.State != torpor.InstanceStopped || looks != 3 || waits != 2 {
		t.Errorf("Wait = %v, %v after %d looks and %d waits; want stopped after 3 and 2", st.State, err, looks, waits)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	looks = 0
	if _, err := Wait(ctx, ref, check, inspect, func(ctx context.Context, _ string, _ int) error { return ctx.Err() }); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait with an ended context = %v", err)
	}
}

func TestValidateExec(t *testing.T) {
	for _, c := range []struct {
		req   torpor.ExecRequest
		param string // "" for valid
	}{
		{torpor.ExecRequest{Cmd: []string{"ls"}, Cwd: "/tmp", User: "1000"}, ""},
		{torpor.ExecRequest{}, "cmd"},
		{torpor.ExecRequest{Cmd: []string{"ls", "a\x00b"}}, "cmd"},
		{torpor.ExecRequest{Cmd: []string{"ls"}, Cwd: "tmp"}, "cwd"},
		{torpor.ExecRequest{Cmd: []string{"ls"}, Timeout: -1}, "timeout"},
		{torpor.ExecRequest{Cmd: []string{"ls"}, User: "a\x00"}, "user"},
	} {
		err := ValidateExec(c.req)
		var te *torpor.Error
		switch {
		case c.param == "" && err != nil:
			t.Errorf("ValidateExec(%+v) = %v", c.req, err)
		case c.param != "" && (!errors.As(err, &te) || te.Param != c.param):
			t.Errorf("ValidateExec(%+v) = %v, want invalid %s", c.req, err, c.param)
		}
	}
}
