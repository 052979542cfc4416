package envd

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/e2b/envd/proto/process"
	"github.com/torpor-dev/torpor/e2b/envd/proto/process/processconnect"
)

// The process.Process service runs E2B's commands as background
// processes of the sandbox's process table (lifecycle.Engine.StartProcess),
// which lives inside the sandbox: a process survives a freeze or a
// snapshot pause and is listed after the resume. A stream follows a
// process by long-polling reads of its output (Engine.ReadProcess) that
// neither wake the sandbox nor count as activity: while the sandbox
// sleeps the stream only sends keep-alives.

// Headers of the process calls.
const (
	// procHeaderKeepalive is the keep-alive interval a stream asks for, in
	// seconds.
	procHeaderKeepalive = "Keepalive-Ping-Interval"
	// procHeaderTimeout is Connect's deadline, which bounds a started
	// process's whole life as envd does (0 or absent: no limit).
	procHeaderTimeout = "Connect-Timeout-Ms"
)

const (
	// procDefaultKeepalive is the keep-alive interval when a stream asks none.
	procDefaultKeepalive = 50 * time.Second
	// procMinKeepalive bounds how often keep-alives are sent.
	procMinKeepalive = time.Second
	// procDataChunk bounds the bytes of one data event.
	procDataChunk = 64 << 10
	// procReadRetries is how many reads in a row may fail while the sandbox
	// runs before the stream gives up.
	procReadRetries = 3
	// procReadRetryDelay is the pause between such reads.
	procReadRetryDelay = 200 * time.Millisecond
)

// processRoutes mounts the process.Process Connect service.
func (s *Server) processRoutes() {
	path, h := processconnect.NewProcessHandler(processService{s})
	s.mux.Handle(path, h)
}

// processService implements processconnect.ProcessHandler.
type processService struct{ s *Server }

var _ processconnect.ProcessHandler = processService{}

// procUser is the user a request runs as: the one its Basic
// Authorization names (E2B sends "user:" with an empty password), else
// the sandbox's default user (defaultUser).
func (ps processService) procUser(ctx context.Context, h http.Header, sb *torpor.Sandbox) (string, error) {
	name, err := basicUser(h)
	if err != nil {
		return "", connect.NewError(connect.CodeInvalidArgument, err)
	}
	if name != "" {
		return name, nil
	}
	return ps.s.defaultUser(ctx, sb), nil
}

// procTimeout reads the process's life limit from Connect-Timeout-Ms.
func procTimeout(h http.Header) (time.Duration, error) {
	v := h.Get(procHeaderTimeout)
	if v == "" {
		return 0, nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 0 || ms > math.MaxInt64/int64(time.Millisecond) {
		return 0, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s must be a number of milliseconds", procHeaderTimeout))
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// procKeepalive reads the keep-alive interval a stream asks for.
func procKeepalive(h http.Header) time.Duration {
	v, err := strconv.ParseInt(h.Get(procHeaderKeepalive), 10, 32)
	if err != nil || v <= 0 {
		return procDefaultKeepalive
	}
	return max(time.Duration(v)*time.Second, procMinKeepalive)
}

// procError turns an engine error into a Connect error in the codes the
// SDK branches on; internal details do not leak.
func procError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	case errors.Is(err, context.Canceled):
		return connect.NewError(connect.CodeCanceled, err)
	}
	e := torpor.AsError(err)
	msg := e.Message
	if e.Param != "" && e.Code == torpor.EInvalid {
		msg = e.Param + ": " + msg
	}
	code := connect.CodeInternal
	switch e.Code {
	case torpor.EInvalid:
		code = connect.CodeInvalidArgument
	case torpor.ENotFound, torpor.EGone:
		code = connect.CodeNotFound
	case torpor.EConflict:
		code = connect.CodeFailedPrecondition
	case torpor.EUnauthenticated:
		code = connect.CodeUnauthenticated
	case torpor.EForbidden:
		code = connect.CodePermissionDenied
	case torpor.EUnavailable:
		code = connect.CodeUnavailable
	}
	return connect.NewError(code, errors.New(msg))
}

func procInvalid(format string, args ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, args...))
}

var errProcNoPTY = connect.NewError(connect.CodeUnimplemented,
	errors.New("this sandbox serves no PTY: run the command without pty (commands.run) instead"))

// Start starts a process and streams its events until it ends.
func (ps processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	sb := sandboxOf(ctx)
	m := req.Msg
	if m.Pty != nil {
		return errProcNoPTY
	}
	cfg := m.GetProcess()
	if cfg == nil || cfg.GetCmd() == "" {
		return procInvalid("process.cmd is required")
	}
	user, err := ps.procUser(ctx, req.Header(), sb)
	if err != nil {
		return err
	}
	life, err := procTimeout(req.Header())
	if err != nil {
		return err
	}
	pr := torpor.ProcessRequest{
		Cmd:     append([]string{cfg.GetCmd()}, cfg.GetArgs()...),
		Env:     cfg.GetEnvs(),
		Cwd:     cfg.GetCwd(),
		User:    user,
		Tag:     m.GetTag(),
		NoStdin: m.Stdin != nil && !m.GetStdin(),
		Stderr:  true,
		Timeout: life,
	}
	if err := torpor.ValidateProcess(pr); err != nil {
		return procError(err)
	}
	info, err := ps.s.eng.StartProcess(ctx, sb.Tenant, sb.ID, pr)
	if err != nil {
		return procError(err)
	}
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.StartResponse{Event: ev}) }
	if err := send(procStartEvent(info.Pid)); err != nil {
		return err
	}
	return ps.follow(ctx, info.ID, 0, procKeepalive(req.Header()), send)
}

// Connect re-attaches to a running process: its output from now on and
// its end.
func (ps processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	sb := sandboxOf(ctx)
	info, err := ps.find(ctx, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	// Where its output is now: a read past the end answers the end.
	now, err := ps.s.eng.ReadProcess(ctx, sb.Tenant, sb.ID, info.ID, torpor.ProcessRead{Offset: math.MaxInt64})
	if err != nil {
		return procError(err)
	}
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.ConnectResponse{Event: ev}) }
	if err := send(procStartEvent(info.Pid)); err != nil {
		return err
	}
	return ps.follow(ctx, info.ID, now.Next, procKeepalive(req.Header()), send)
}

func procStartEvent(pid int) *process.ProcessEvent {
	return &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: uint32(pid)}}}
}

func procKeepaliveEvent() *process.ProcessEvent {
	return &process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}
}

// follow streams process id's output from offset, then its end, with a
// keep-alive whenever the stream was quiet for a keep-alive interval.
// Each read waits for output at most until the next keep-alive is due.
// While the sandbox is not running the stream only waits (and keeps
// alive); a killed sandbox ends it.
func (ps processService) follow(ctx context.Context, id int, offset int64, keepalive time.Duration, send func(*process.ProcessEvent) error) error {
	sb := sandboxOf(ctx)
	due := time.Now().Add(keepalive)
	failures := 0
	for {
		if ctx.Err() != nil {
			return procError(ctx.Err())
		}
		if !time.Now().Before(due) {
			if err := send(procKeepaliveEvent()); err != nil {
				return err
			}
			due = time.Now().Add(keepalive)
		}
		wait := min(time.Until(due), torpor.MaxProcessWait)
		out, err := ps.s.eng.ReadProcess(ctx, sb.Tenant, sb.ID, id, torpor.ProcessRead{Offset: offset, Wait: wait, Split: true})
		if err != nil {
			if ctx.Err() != nil {
				return procError(ctx.Err())
			}
			var te *torpor.Error
			switch {
			case errors.As(err, &te) && te.State == torpor.StateTerminated,
				torpor.IsCode(err, torpor.ENotFound) && !ps.exists(ctx):
				return connect.NewError(connect.CodeUnavailable, fmt.Errorf("sandbox %s was killed", sb.ID))
			case errors.As(err, &te) && te.State != "":
				// Not running: wait for it to run again.
				failures = 0
				if err := ps.awaitRunning(ctx, &due, keepalive, send); err != nil {
					return err
				}
				continue
			case torpor.IsCode(err, torpor.ENotFound), torpor.IsCode(err, torpor.EGone), torpor.IsCode(err, torpor.EInvalid):
				return procError(err)
			}
			// A read cut short while the sandbox paused, or a hiccup: look
			// at the sandbox again, a few times.
			if failures++; failures >= procReadRetries {
				ps.s.log.Warn("envd: following a process failed", "sandbox", sb.ID, "process", id, "err", err)
				return procError(err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(procReadRetryDelay):
			}
			continue
		}
		failures = 0
		for _, c := range out.Chunks {
			for d := c.Data; len(d) > 0; {
				n := min(len(d), procDataChunk)
				ev := &process.ProcessEvent_DataEvent{}
				if c.Stderr {
					ev.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: d[:n]}
				} else {
					ev.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: d[:n]}
				}
				if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: ev}}); err != nil {
					return err
				}
				d = d[n:]
			}
			due = time.Now().Add(keepalive)
		}
		offset = out.Next
		if out.Ended {
			return send(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: procEndEvent(out)}})
		}
	}
}

// procEndEvent says how a process ended, in the words of Go's os.ProcessState
// that envd reports: "exit status N" or "signal: killed".
func procEndEvent(out torpor.ProcessOutput) *process.ProcessEvent_EndEvent {
	if out.Signal > 0 {
		status := "signal: " + syscall.Signal(out.Signal).String()
		return &process.ProcessEvent_EndEvent{ExitCode: -1, Exited: false, Status: status, Error: &status}
	}
	code := 0
	if out.ExitCode != nil {
		code = *out.ExitCode
	}
	ev := &process.ProcessEvent_EndEvent{ExitCode: int32(code), Exited: true, Status: "exit status " + strconv.Itoa(code)}
	if code != 0 {
		ev.Error = &ev.Status
	}
	return ev
}

// exists tells whether the request's sandbox is still there.
func (ps processService) exists(ctx context.Context) bool {
	sb := sandboxOf(ctx)
	cur, err := ps.s.eng.Get(ctx, sb.Tenant, sb.ID)
	return err == nil && cur.State != torpor.StateTerminated
}

// awaitRunning waits until the request's sandbox runs again, sending
// keep-alives meanwhile; it fails when the sandbox is killed.
func (ps processService) awaitRunning(ctx context.Context, due *time.Time, keepalive time.Duration, send func(*process.ProcessEvent) error) error {
	sb := sandboxOf(ctx)
	for {
		changed := ps.s.eng.EventsChanged()
		cur, err := ps.s.eng.Get(ctx, sb.Tenant, sb.ID)
		switch {
		case ctx.Err() != nil:
			return procError(ctx.Err())
		case torpor.IsCode(err, torpor.ENotFound) || (err == nil && cur.State == torpor.StateTerminated):
			return connect.NewError(connect.CodeUnavailable, fmt.Errorf("sandbox %s was killed", sb.ID))
		case err == nil && cur.State == torpor.StateRunning:
			return nil
		}
		// A store error is waited out like a state.
		t := time.NewTimer(time.Until(*due))
		select {
		case <-ctx.Done():
			t.Stop()
			return procError(ctx.Err())
		case <-changed:
			t.Stop()
		case <-t.C:
			if err := send(procKeepaliveEvent()); err != nil {
				return err
			}
			*due = time.Now().Add(keepalive)
		}
	}
}

// find resolves a selector to one of the sandbox's running processes.
func (ps processService) find(ctx context.Context, sel *process.ProcessSelector) (torpor.ProcessInfo, error) {
	sb := sandboxOf(ctx)
	if sel == nil || sel.Selector == nil {
		return torpor.ProcessInfo{}, procInvalid("process: give a pid or a tag")
	}
	list, err := ps.s.eng.ListProcesses(ctx, sb.Tenant, sb.ID)
	if err != nil {
		return torpor.ProcessInfo{}, procError(err)
	}
	var found *torpor.ProcessInfo
	for i, p := range list {
		if p.State != torpor.ProcessRunning {
			continue
		}
		switch s := sel.Selector.(type) {
		case *process.ProcessSelector_Pid:
			if uint32(p.Pid) == s.Pid {
				found = &list[i]
			}
		case *process.ProcessSelector_Tag:
			if p.Tag != "" && p.Tag == s.Tag {
				found = &list[i] // the newest of that tag
			}
		}
	}
	if found == nil {
		switch s := sel.Selector.(type) {
		case *process.ProcessSelector_Pid:
			return torpor.ProcessInfo{}, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", s.Pid))
		case *process.ProcessSelector_Tag:
			return torpor.ProcessInfo{}, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %s not found", s.Tag))
		}
	}
	return *found, nil
}

// List lists the running processes.
func (ps processService) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	sb := sandboxOf(ctx)
	list, err := ps.s.eng.ListProcesses(ctx, sb.Tenant, sb.ID)
	if err != nil {
		return nil, procError(err)
	}
	res := &process.ListResponse{Processes: []*process.ProcessInfo{}}
	for _, p := range list {
		if p.State != torpor.ProcessRunning || len(p.Cmd) == 0 {
			continue
		}
		cfg := &process.ProcessConfig{Cmd: p.Cmd[0], Args: p.Cmd[1:], Envs: p.Env}
		if p.Cwd != "" {
			cfg.Cwd = &p.Cwd
		}
		info := &process.ProcessInfo{Config: cfg, Pid: uint32(p.Pid)}
		if p.Tag != "" {
			info.Tag = &p.Tag
		}
		res.Processes = append(res.Processes, info)
	}
	return connect.NewResponse(res), nil
}

// Update resizes a PTY; no process here has one.
func (ps processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	if _, err := ps.find(ctx, req.Msg.GetProcess()); err != nil {
		return nil, err
	}
	return nil, errProcNoPTY
}

// input writes one input to a process's stdin.
func (ps processService) input(ctx context.Context, info torpor.ProcessInfo, in *process.ProcessInput) error {
	sb := sandboxOf(ctx)
	switch v := in.GetInput().(type) {
	case *process.ProcessInput_Stdin:
		if len(v.Stdin) > torpor.MaxProcessStdin {
			return procInvalid("input.stdin: at most %d bytes at a time", torpor.MaxProcessStdin)
		}
		return procError(ps.s.eng.WriteProcessStdin(ctx, sb.Tenant, sb.ID, info.ID, v.Stdin, false))
	case *process.ProcessInput_Pty:
		return errProcNoPTY
	}
	return procInvalid("input: give stdin")
}

// SendInput writes to a process's stdin.
func (ps processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	info, err := ps.find(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := ps.input(ctx, info, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

// StreamInput writes a stream of inputs to a process's stdin.
func (ps processService) StreamInput(ctx context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	var info *torpor.ProcessInfo
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			p, err := ps.find(ctx, ev.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			info = &p
		case *process.StreamInputRequest_Data:
			if info == nil {
				return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("send the start event, naming the process, first"))
			}
			if err := ps.input(ctx, *info, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		case *process.StreamInputRequest_Keepalive:
		default:
			return nil, procInvalid("unknown input event")
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

// CloseStdin closes a process's stdin; closing it again is no error.
func (ps processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	sb := sandboxOf(ctx)
	info, err := ps.find(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := ps.s.eng.WriteProcessStdin(ctx, sb.Tenant, sb.ID, info.ID, nil, true); err != nil && !torpor.IsCode(err, torpor.EConflict) {
		return nil, procError(err)
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

// SendSignal sends SIGTERM or SIGKILL to a process (and its group).
func (ps processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	sb := sandboxOf(ctx)
	var sig string
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL:
		sig = "KILL"
	case process.Signal_SIGNAL_SIGTERM:
		sig = "TERM"
	default:
		return nil, procInvalid("signal must be SIGNAL_SIGTERM or SIGNAL_SIGKILL")
	}
	info, err := ps.find(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := ps.s.eng.SignalProcess(ctx, sb.Tenant, sb.ID, info.ID, sig); err != nil {
		if torpor.IsCode(err, torpor.EConflict) {
			// It exited since it was found.
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", info.Pid))
		}
		return nil, procError(err)
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}
