# The Python session driver of sandbox-agent. The agent starts
# `python3 -u -c BOOTSTRAP NAME`; the bootstrap reads this source from the control
# socket on fd 0 and runs it. The agent puts VALUE_CAP and EXCEPTION_CAP in front.
#
# Control messages, both ways: a 4-byte little-endian length, then a JSON object.
#   agent -> driver  {"op": "eval", "code": "..."}
#   driver -> agent  {"value": str|null, "value_truncated": bool, "exception": null|
#                     {"type_name": str, "message": str, "traceback": str}}
#   agent -> driver  {"op": "flush", "marker": "..."}: the driver writes the marker
#                    to its saved stdout and stderr, ending the evaluation's output.
#   agent -> driver  {"op": "reseed", "env": {NAME: VALUE}} -> {"reseeded": [module names]}
#                    (env: the egress proxy variables now in force; the ones it
#                    names replace every proxy variable in os.environ)
# User code never sees the control socket (a private, close-on-exec descriptor; fd 0
# becomes /dev/null) nor the marker (sent only after the code finished).
import ast
import builtins
import json
import linecache
import os
import signal
import sys
import types

CELL_CAP = 256


def _setup():
    ctl = os.dup(0)  # os.dup's copy is close-on-exec: subprocesses never get it
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)  # input() and subprocesses read end of file
    os.close(null)
    # The pipes the agent reads, kept aside: markers go there even after user code
    # redirected or closed fd 1 and 2.
    return ctl, os.dup(1), os.dup(2)


def _read_exact(fd, n):
    data = b""
    while len(data) < n:
        try:
            chunk = os.read(fd, n - len(data))
        except KeyboardInterrupt:
            continue
        if not chunk:
            return None
        data += chunk
    return data


def _recv(fd):
    head = _read_exact(fd, 4)
    if head is None:
        return None
    body = _read_exact(fd, int.from_bytes(head, "little"))
    if body is None:
        return None
    return json.loads(body.decode("utf-8"))


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except KeyboardInterrupt:
            continue


def _send(fd, message):
    body = json.dumps(message, ensure_ascii=False).encode("utf-8")
    _write_all(fd, len(body).to_bytes(4, "little") + body)


def _text(value, cap):
    """`value` as UTF-8-safe text of at most `cap` bytes, and whether it was cut."""
    data = value.encode("utf-8", "backslashreplace")
    if len(data) <= cap:
        return data.decode("utf-8"), False
    return data[:cap].decode("utf-8", "ignore"), True


def _type_name(kind):
    name = getattr(kind, "__qualname__", kind.__name__)
    module = getattr(kind, "__module__", None)
    if module in (None, "builtins", "__main__"):
        return name
    return module + "." + name


def _describe(error, filename):
    """The exception as the agent reports it, its traceback cut to the cell's frames."""
    import traceback

    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    try:
        message = str(error)
    except BaseException:
        message = "<str() of the exception failed>"
    try:
        text = "".join(traceback.format_exception(type(error), error, tb))
    except BaseException:
        text = _type_name(type(error)) + ": " + message + "\n"
    return {
        "type_name": _text(_type_name(type(error)), CELL_CAP)[0],
        "message": _text(message, EXCEPTION_CAP)[0],
        "traceback": _text(text, EXCEPTION_CAP)[0],
    }


def _flush_stdio():
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:
            pass


def _run_cell(code, filename, namespace):
    """Runs one cell like a notebook: every statement, then the value of a trailing
    expression. SIGINT is blocked in the driver and let through only around user
    code, so an interrupt never lands in the driver's own work."""
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    reply = {"value": None, "value_truncated": False, "exception": None}
    try:
        tree = ast.parse(code, filename, "exec")
        tail = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            tail = compile(ast.Expression(tree.body.pop().value), filename, "eval")
        body = compile(tree, filename, "exec")
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
        try:
            exec(body, namespace)
            if tail is not None:
                value = eval(tail, namespace)
                if value is not None:
                    namespace["_"] = value
                    reply["value"], reply["value_truncated"] = _text(repr(value), VALUE_CAP)
        finally:
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
    except SystemExit:
        _flush_stdio()
        raise
    except BaseException as error:
        reply["exception"] = _describe(error, filename)
    _flush_stdio()
    return reply


def _reseed():
    """Fresh kernel entropy for the language's generators, after a restore or fork."""
    reseeded = []
    module = sys.modules.get("random")
    if module is not None:
        module.seed()  # from os.urandom
        reseeded.append("random")
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        try:
            numpy.random.seed()  # the legacy global generator, from the OS
            reseeded.append("numpy.random")
        except Exception:
            pass
    return reseeded


_PROXY_VARS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "no_proxy", "NO_PROXY")


def _set_proxy_env(env):
    """The egress proxy's variables, for a session that started before egress was on
    (a template's warm session): urllib and subprocesses read os.environ."""
    for name in _PROXY_VARS:
        os.environ.pop(name, None)
    for name, value in env.items():
        if name in _PROXY_VARS and isinstance(value, str):
            os.environ[name] = value


def _serve():
    ctl, out, err = _setup()
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
    # Also when the agent's parent left SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    sys.argv = [""]
    if "" not in sys.path:
        sys.path.insert(0, "")
    _send(ctl, {"ready": True, "python": sys.version.split()[0]})
    cells = 0
    while True:
        message = _recv(ctl)
        if message is None:
            return
        op = message.get("op")
        if op == "eval":
            cells += 1
            _send(ctl, _run_cell(message["code"], "<cell %d>" % cells, main.__dict__))
        elif op == "flush":
            # Every SIGINT the agent sent for that cell is pending by now: drop it,
            # or it would interrupt the next cell.
            signal.sigtimedwait([signal.SIGINT], 0)
            marker = message["marker"].encode("ascii")
            _write_all(out, marker)
            _write_all(err, marker)
        elif op == "reseed":
            env = message.get("env")
            if isinstance(env, dict):
                _set_proxy_env(env)
            _send(ctl, {"reseeded": _reseed()})
        else:
            _send(ctl, {"error": "unknown op %r" % (op,)})


_serve()
