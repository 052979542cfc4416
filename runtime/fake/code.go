package fake

import (
	"context"
	"strings"

	"github.com/torpor-dev/torpor"
)

var _ torpor.CodeRunner = (*Runtime)(nil)

// RunCode runs a toy interpreter that keeps, per instance, only whether
// it ran before (so context is new after a reboot): each line "print X"
// prints X, "raise NAME" raises NAME, and "exit N" sets the exit code.
func (r *Runtime) RunCode(ctx context.Context, ref torpor.InstanceRef, req torpor.CodeRequest) (torpor.CodeResult, error) {
	if err := checkID(ref.SandboxID); err != nil {
		return torpor.CodeResult{}, err
	}
	if err := torpor.ValidateCode(req); err != nil {
		return torpor.CodeResult{}, err
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	if err := r.h.takeFail("code"); err != nil {
		return torpor.CodeResult{}, err
	}
	in, err := r.live(ref.SandboxID)
	if err != nil {
		return torpor.CodeResult{}, err
	}
	if in.state == torpor.InstanceFrozen {
		return torpor.CodeResult{}, torpor.Errorf(torpor.EConflict, "sandbox %s is frozen", ref.SandboxID)
	}
	if req.Language == torpor.LanguagePython && r.h.NoPython {
		return torpor.CodeResult{}, torpor.Invalid("language", "python3 is not installed in this sandbox")
	}
	res := torpor.CodeResult{Context: torpor.ContextExisting}
	if in.code == nil {
		in.code = map[string]bool{}
	}
	if !in.code[req.Language] {
		res.Context = torpor.ContextNew
		in.code[req.Language] = true
	}
	var out strings.Builder
	code := 0
	for _, line := range strings.Split(req.Code, "\n") {
		switch {
		case strings.HasPrefix(line, "print "):
			out.WriteString(strings.TrimPrefix(line, "print ") + "\n")
		case strings.HasPrefix(line, "raise "):
			res.Error = &torpor.CodeError{Name: strings.TrimPrefix(line, "raise "), Traceback: "line 1"}
			code = 1
		case strings.HasPrefix(line, "exit "):
			code = len(strings.TrimPrefix(line, "exit "))
		}
	}
	res.Stdout = out.String()
	if req.Language == torpor.LanguageShell {
		res.ExitCode = &code
	}
	return res, nil
}
