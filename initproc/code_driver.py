import ast, contextlib, io, json, os, sys, traceback

_proto = os.fdopen(3, "w", encoding="utf-8", errors="replace")
_in = sys.stdin
sys.stdin = open(os.devnull)
_globals = {"__name__": "__main__", "__builtins__": __builtins__}


def _run(code):
    out, err = io.StringIO(), io.StringIO()
    res = {"stdout": "", "stderr": "", "result": None, "error": None}
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            tree = ast.parse(code, "<code>", "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, "<code>", "exec"), _globals)
            if last is not None:
                v = eval(compile(last, "<code>", "eval"), _globals)
                if v is not None:
                    res["result"] = repr(v)
        except BaseException as e:
            tb = e.__traceback__
            # Drop the driver's own frames.
            while tb is not None and tb.tb_frame.f_code.co_filename != "<code>":
                tb = tb.tb_next
            res["error"] = {
                "name": type(e).__name__,
                "value": str(e),
                "traceback": "".join(traceback.format_exception(type(e), e, tb)),
            }
    res["stdout"], res["stderr"] = out.getvalue(), err.getvalue()
    return res


for line in _in:
    req = None
    try:
        req = json.loads(line)
        res = _run(req["code"])
    except BaseException as e:
        res = {"stdout": "", "stderr": "", "result": None,
               "error": {"name": type(e).__name__, "value": str(e), "traceback": ""}}
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    mark = req.get("mark") if isinstance(req, dict) else None
    if mark:
        # After everything the snippet's subprocesses wrote to fds 1 and 2.
        for fd in (1, 2):
            try:
                os.write(fd, mark.encode())
            except OSError:
                pass
    _proto.write(json.dumps(res) + "\n")
    _proto.flush()
