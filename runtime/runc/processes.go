package runc

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/initproc"
)

var _ torpor.ProcessRunner = (*Runtime)(nil)

// procTimeout bounds one process-table operation (a stdin write may wait
// up to 5 s for the process to read).
const procTimeout = 15 * time.Second

// sendProc carries one process-table request to the sandbox's code
// server (see RunCode) and brings back its answer; initproc.ProcessClient
// does the rest.
func (r *Runtime) sendProc(ctx context.Context, ref torpor.InstanceRef, req initproc.CodeRequest) (*initproc.CodeResponse, error) {
	id, err := checkRef(ref)
	if err != nil {
		return nil, err
	}
	c, err := r.codeConn(ctx, ref, id)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	_ = c.SetDeadline(time.Now().Add(procTimeout))
	b, _ := json.Marshal(req)
	if _, err := c.Write(append(b, '\n')); err != nil {
		return nil, r.codeFailure(ctx, id, err)
	}
	line, err := bufio.NewReaderSize(io.LimitReader(c, 4*torpor.MaxProcessOutputRead+(1<<20)), 64<<10).ReadBytes('\n')
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, r.codeFailure(ctx, id, err)
	}
	var res initproc.CodeResponse
	if err := json.Unmarshal(line, &res); err != nil {
		return nil, fmt.Errorf("runc: code server of %s answered badly: %w", id, err)
	}
	return &res, nil
}
