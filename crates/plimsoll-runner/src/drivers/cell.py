# plimsoll cell driver (python). Passed to `python3 -I -c`; never a file the cell can edit.
# fd 3 is the runner's control socket: one JSON line {"nonce", "code"} per cell in, one
# JSON line {"nonce", "status"} out when the cell is over. stdout/stderr are the cell's.
import ast, asyncio, builtins, json, os, socket, sys, traceback

_ctl = socket.socket(fileno=3)
os.set_inheritable(3, False)
_lines = _ctl.makefile("rb")
_globals = {"__name__": "__main__", "__builtins__": builtins}
_loop = asyncio.new_event_loop()
asyncio.set_event_loop(_loop)
_FLAGS = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
_CO_COROUTINE = 0x80


def _eval(code_obj):
    value = eval(code_obj, _globals)
    if code_obj.co_flags & _CO_COROUTINE:
        value = _loop.run_until_complete(value)
    return value


def _cell(source):
    tree = ast.parse(source, "<cell>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    _eval(compile(tree, "<cell>", "exec", flags=_FLAGS))
    if last is not None:
        value = _eval(compile(last, "<cell>", "eval", flags=_FLAGS))
        if value is not None:
            print(repr(value))


def _flush():
    for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            s.flush()
        except BaseException:
            pass


for _raw in _lines:
    try:
        _msg = json.loads(_raw)
        _nonce, _source = _msg["nonce"], _msg["code"]
    except BaseException:
        break
    _status = "ok"
    try:
        _cell(_source)
    except BaseException as _e:
        _status = "error"
        _flush()
        _tb = _e.__traceback__
        # Drop the driver's own frames.
        while _tb is not None and _tb.tb_frame.f_code.co_filename != "<cell>":
            _tb = _tb.tb_next
        traceback.print_exception(type(_e), _e, _tb, file=sys.__stderr__)
        del _e, _tb
    _flush()
    _ctl.sendall((json.dumps({"nonce": _nonce, "status": _status}) + "\n").encode())
