import ast, base64, builtins, contextlib, io, json, os, signal, sys, traceback

_proto = os.fdopen(3, "w", encoding="utf-8", errors="replace")
_in = sys.stdin
sys.stdin = open(os.devnull)
_globals = {"__name__": "__main__", "__builtins__": __builtins__}
# What the running snippet displayed, and whether one runs (an interrupt
# that comes between snippets is dropped).
_state = {"displays": None, "busy": False, "size": 0}
# The rich outputs of one snippet are bounded all together.
_MAX_DISPLAY = 32 << 20
os.environ.setdefault("MPLBACKEND", "Agg")
# What a snippet prints goes straight to fds 1 and 2, write by write, as
# its subprocesses' output does: the code server reads it from there, so
# it can be streamed while the snippet runs, in the order it was written.
_live_out = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="replace", write_through=True)
_live_err = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="replace", write_through=True)

# A notebook's formatters: method name, MIME type, whether it gives bytes.
_FORMATS = (
    ("_repr_html_", "text/html", False),
    ("_repr_markdown_", "text/markdown", False),
    ("_repr_svg_", "image/svg+xml", False),
    ("_repr_png_", "image/png", True),
    ("_repr_jpeg_", "image/jpeg", True),
    ("_repr_pdf_", "application/pdf", True),
    ("_repr_latex_", "text/latex", False),
    ("_repr_json_", "application/json", False),
    ("_repr_javascript_", "application/javascript", False),
)


def _sigint(signum, frame):
    if _state["busy"]:
        raise KeyboardInterrupt


signal.signal(signal.SIGINT, _sigint)


def _encode(v, binary):
    if isinstance(v, tuple) and len(v) == 2:  # (data, metadata)
        v = v[0]
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(bytes(v)).decode("ascii") if binary else bytes(v).decode("utf-8", "replace")
    if isinstance(v, str):
        return v
    return json.dumps(v)


def _figure_png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _bundle(obj):
    """The MIME bundle of obj, as a notebook would show it."""
    data = {"text/plain": repr(obj)}
    cls = type(obj)
    # An object that claims every attribute has no rich formats.
    if getattr(cls, "_ipython_canary_method_should_not_exist_", None) is not None:
        return data
    mb = getattr(cls, "_repr_mimebundle_", None)
    if mb is not None:
        try:
            got = obj._repr_mimebundle_()
            if isinstance(got, tuple):
                got = got[0]
            if isinstance(got, dict):
                for k, v in got.items():
                    if isinstance(k, str) and v is not None:
                        data[k] = _encode(v, k.startswith(("image/png", "image/jpeg", "application/pdf")))
        except Exception:
            pass
    for meth, mime, binary in _FORMATS:
        if mime in data or getattr(cls, meth, None) is None:
            continue
        try:
            v = getattr(obj, meth)()
        except Exception:
            continue
        if v is not None:
            data[mime] = _encode(v, binary)
    if "image/png" not in data and cls.__module__.startswith("matplotlib") and hasattr(obj, "savefig"):
        try:
            data["image/png"] = _figure_png(obj)
        except Exception:
            pass
    return data


def _add(main, data):
    size = sum(len(v) for v in data.values())
    if _state["size"] + size > _MAX_DISPLAY:
        print("[torpor: a display was dropped: the snippet's displays are over %d bytes]" % _MAX_DISPLAY, file=sys.stderr)
        return
    _state["size"] += size
    _state["displays"].append({"main": main, "data": data})


def display(*objs, **kwargs):
    """Shows each object as a rich output of the snippet."""
    for obj in objs:
        if _state["displays"] is None:
            print(repr(obj))
        else:
            _add(False, _bundle(obj))


builtins.display = display


def _flush_figures():
    """Shows the pyplot figures a snippet left open, then closes them."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        for num in plt.get_fignums():
            _add(False, {"text/plain": "<Figure>", "image/png": _figure_png(plt.figure(num))})
        plt.close("all")
    except Exception:
        pass
    if not getattr(plt.show, "_torpor", False):
        def show(*args, **kwargs):
            _flush_figures()
        show._torpor = True
        plt.show = show


def _run(code):
    res = {"stdout": "", "stderr": "", "result": None, "error": None, "displays": []}
    _state["displays"], _state["size"] = res["displays"], 0
    with contextlib.redirect_stdout(_live_out), contextlib.redirect_stderr(_live_err):
        try:
            _state["busy"] = True
            tree = ast.parse(code, "<code>", "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, "<code>", "exec"), _globals)
            if last is not None:
                v = eval(compile(last, "<code>", "eval"), _globals)
                if v is not None:
                    res["result"] = repr(v)
                    main = _bundle(v)
                    main["text/plain"] = res["result"]
                    _add(True, main)
            _flush_figures()
        except BaseException as e:
            _state["busy"] = False
            tb = e.__traceback__
            # Drop the driver's own frames.
            while tb is not None and tb.tb_frame.f_code.co_filename != "<code>":
                tb = tb.tb_next
            res["error"] = {
                "name": type(e).__name__,
                "value": str(e),
                "traceback": "".join(traceback.format_exception(type(e), e, tb)),
            }
        finally:
            _state["busy"] = False
    _state["displays"] = None
    return res


def _with_env(env, code):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return _run(code)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


for line in _in:
    req = None
    try:
        req = json.loads(line)
        res = _with_env(req.get("env") or {}, req["code"])
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
