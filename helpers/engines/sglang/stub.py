"""Running a version's own ``set_eagle3_layers_to_capture`` on a stub model, in a sandbox.

The release's own setter is the authority on its id-to-layer step, so it is run, never restated.
But the code comes from a tree the user points at (``--sglang-root``) or a wheel off the index, and
``check`` promises to be a static gate. So (docs/conventions.md, "How a release's code is run"):

- it runs in a child process started with ``python -I`` (no user site, no PYTHON* variables), an
  environment scrubbed to a locale, cwd ``/``, and, where the kernel allows, its own empty network
  namespace;
- before the first job the child installs an audit hook that refuses every write-mode open, every
  socket, subprocess, exec/spawn/fork, file-system change (remove, rename, mkdir, chmod, ...),
  ctypes and the import of network or process modules, and sets the file-size limit to 0;
- only the setter (and the methods of its class it calls) is compiled from the file, never the
  module's top-level code; a dunder name or attribute anywhere in it refuses the run; it sees
  restricted builtins (``SAFE_BUILTINS``: no open, import, exec, eval, compile, type, globals);
- one job has ``SETTER_TIMEOUT_S`` to answer; the child is killed after that.

Children are reused: one for every cached wheel (a matrix of 69 releases costs one start), one per
explicit tree. A child that broke a rule or timed out is discarded.
"""
from __future__ import annotations

import ast
import atexit
import builtins
import copy
import json
import os
import selectors
import subprocess
import sys
import textwrap
import types
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ...boundaries import WiringError
from . import classes
from .classes import ClassRef
from .sites import SETTER, CaptureSite, CaptureStyle, SourceLine, dedupe
from .source import SglangSource

# --------------------------------------------------------------------------------------
# Running the version's own setter on a stub.


class _Placeholder:
    """Anything the stub does not model: falsy, callable, absorbs attribute access."""

    def __init__(self, name: str, log: list[str]):
        self._name, self._log = name, log

    def __getattr__(self, name):
        return _Placeholder(f"{self._name}.{name}", self._log)

    def __call__(self, *args, **kwargs):
        self._log.append(f"{self._name}()")
        return _Placeholder(f"{self._name}()", self._log)

    def __bool__(self):
        return False

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0

    def __repr__(self):
        return f"<stub {self._name}>"


class SandboxRefusal(RuntimeError):
    """The release's code tried something the sandbox does not allow (a dunder, a write, a socket)."""


class SandboxPermissionError(PermissionError):
    """What the locked child's audit hook raises for a refused event (a write, a socket, an import):
    told apart by its type, so a child that broke a rule is known without reading its message."""


def _no_dunder(name) -> str:
    if not isinstance(name, str) or name.startswith("__"):
        raise SandboxRefusal(f"attribute {name!r} refused: the sandbox allows no dunder access")
    return name


def _getattr(obj, name, *default):
    return getattr(obj, _no_dunder(name), *default)


def _setattr(obj, name, value):
    return setattr(obj, _no_dunder(name), value)


def _hasattr(obj, name):
    return hasattr(obj, _no_dunder(name))


# What a setter may call: everything the setters of 0.4.4.post2 .. 0.5.23 use (int, list, setattr,
# hasattr, len, set, sorted, max, all, any, enumerate, tuple and a few exceptions), plus the plain
# value builtins. No open, __import__, exec, eval, compile, type, vars, globals, breakpoint, input.
SAFE_BUILTINS: dict[str, Any] = {
    **{k: getattr(builtins, k) for k in (
        "abs", "all", "any", "bool", "dict", "divmod", "enumerate", "filter", "float", "frozenset", "int",
        "isinstance", "issubclass", "iter", "len", "list", "map", "max", "min", "next", "range", "repr",
        "reversed", "round", "set", "slice", "sorted", "str", "sum", "tuple", "zip", "None", "True", "False",
        "Exception", "ValueError", "TypeError", "KeyError", "IndexError", "AttributeError", "RuntimeError",
        "NotImplementedError", "AssertionError", "StopIteration", "ZeroDivisionError")},
    "getattr": _getattr, "setattr": _setattr, "hasattr": _hasattr,
}


class _Globals(dict):
    """Module globals for an extracted function: restricted builtins, typing, else placeholders."""

    def __init__(self, log: list[str]):
        super().__init__()
        self._log = log
        self["__builtins__"] = SAFE_BUILTINS
        self.update({k: getattr(typing, k) for k in ("Optional", "List", "Dict", "Tuple", "Union", "Any")})

    def __missing__(self, key):
        if key.startswith("__"):
            raise KeyError(key)
        if key in SAFE_BUILTINS:
            return SAFE_BUILTINS[key]
        self._log.append(f"global {key}")
        return _Placeholder(key, self._log)


def _refuse_dunders(node: ast.AST, path: str) -> None:
    """The escape routes out of restricted builtins all go through dunders (``().__class__``,
    ``f.__globals__``, ``__import__``); no setter of any release uses one."""
    for n in ast.walk(node):
        name = (n.attr if isinstance(n, ast.Attribute) else n.id if isinstance(n, ast.Name)
                else n.name if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n is not node
                else None)
        if isinstance(name, str) and name.startswith("__"):
            raise SandboxRefusal(f"{path}:{getattr(n, 'lineno', '?')} uses {name!r}: the sandbox runs no "
                                 f"code that touches dunder names")
        if isinstance(n, (ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal)):
            raise SandboxRefusal(f"{path}:{n.lineno} `{ast.unparse(n)}`: the sandbox runs no imports or "
                                 f"global statements")


@dataclass
class _StubContext:
    src: SglangSource
    num_layers: int
    config: types.SimpleNamespace
    pp_group: types.SimpleNamespace
    log: list[str] = field(default_factory=list)
    assigned: list[tuple[Any, list]] = field(default_factory=list)
    traced: list[tuple[str, int]] = field(default_factory=list)
    layer_lists: list[list] = field(default_factory=list)  # every stub's self.layers, to read flags


class _StubModule:
    """A model object as the setter sees it: methods come from the version's source."""

    def __init__(self, ctx: _StubContext, cls: ClassRef | None):
        object.__setattr__(self, "_ctx", ctx)
        object.__setattr__(self, "_cls", cls)
        L = ctx.num_layers
        layers = [types.SimpleNamespace(layer_id=i) for i in range(L)]  # setattr-able, like modules
        ctx.layer_lists.append(layers)
        for k, v in dict(config=ctx.config, pp_group=ctx.pp_group, start_layer=0, end_layer=L,
                         layers=layers, layers_to_capture=[], capture_aux_hidden_states=False,
                         num_layers=L).items():
            object.__setattr__(self, k, v)

    def __getattr__(self, name):
        ctx, cls = self._ctx, self._cls
        if cls is not None and not name.startswith("__"):
            found = classes.find_method(ctx.src, cls, name)
            if found is not None:
                return types.MethodType(_compile_method(ctx, found[0], found[1]), self)
            inner = classes.child_class(ctx.src, cls, name)
            if inner is not None:
                child = _StubModule(ctx, inner)
                object.__setattr__(self, name, child)
                return child
        if name.startswith("__") or name.endswith("_layers_to_capture"):
            # a capture setter the class does not define must look absent, as it would to
            # `hasattr(self.model, "set_eagle3_layers_to_capture")` in the real model
            raise AttributeError(name)
        ctx.log.append(f"self.{name}")
        return _Placeholder(f"self.{name}", ctx.log)

    def __setattr__(self, name, value):
        if name == "layers_to_capture":
            self._ctx.assigned.append((self, value))
        object.__setattr__(self, name, value)


def _compile_method(ctx: _StubContext, owner: ClassRef, fn: ast.FunctionDef):
    """Compile one method from source with its real file name and line numbers."""
    node = copy.deepcopy(fn)
    node.decorator_list = []
    node.returns = None
    a = node.args
    for arg in a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]:
        arg.annotation = None
    _refuse_dunders(node, str(owner.path))
    module = ast.Module(body=[node], type_ignores=[])
    code = compile(module, str(owner.path), "exec")
    namespace = _Globals(ctx.log)
    # the module-level accessors some setters use instead of self.pp_group
    namespace["get_pp_group"] = lambda: ctx.pp_group
    namespace["get_parallel"] = lambda: types.SimpleNamespace(pp_group=ctx.pp_group)
    exec(code, namespace)
    return namespace[fn.name]


@dataclass
class SetterRun:
    layers_to_capture: list[int] | None
    owner: str | None
    executed: list[SourceLine]
    touched: list[str]
    error: str | None = None
    flagged: dict[str, list[int]] = field(default_factory=dict)  # attribute -> layers it was set on
    takes_ids: bool = True  # False: the version's setter has no ids parameter, so draft ids never reach it
    error_type: str | None = None   # the exception's class name when the setter raised ('IndexError')
    refused: bool = False           # the audit hook refused an event: the child broke a rule


def run_setter(src: SglangSource, arch: str, num_layers: int, ids: Sequence[int] | None,
                target_config: dict | None = None) -> SetterRun:
    """Call the version's own ``set_eagle3_layers_to_capture(ids)`` on a stub of ``arch``, in the
    sandbox child (module docstring). Same answer as running it here, without the risk."""
    job = {"version": src.version, "root": str(src.root), "origin": src.origin, "arch": arch,
           "num_layers": int(num_layers), "ids": None if ids is None else [int(i) for i in ids],
           "target_config": json.loads(json.dumps(target_config or {}, default=str))}
    key = "cache" if src.origin == "cache" else f"tree:{Path(src.root).resolve()}"
    reply = _call_worker(key, job)
    if "run" not in reply:
        return SetterRun(None, None, [], [], reply.get("error") or "the sandbox gave no answer")
    d = reply["run"]
    d["executed"] = [SourceLine(**x) for x in d["executed"]]
    return SetterRun(**d)


def _run_setter_here(src: SglangSource, arch: str, num_layers: int, ids: Sequence[int] | None,
                     target_config: dict | None = None) -> SetterRun:
    """Call the version's own ``set_eagle3_layers_to_capture(ids)`` on a stub of ``arch``, in this
    process: what the sandbox child does for each job.

    A single-stage pipeline is modelled (first and last rank); the config carries
    ``num_hidden_layers`` plus whatever the target's config.json provides.
    """
    extra = {k: v for k, v in (target_config or {}).items() if isinstance(k, str)}
    extra["num_hidden_layers"] = num_layers
    # multimodal wrappers read the decoder's depth from config.text_config (gemma4_mm)
    text = extra.get("text_config") if isinstance(extra.get("text_config"), dict) else {}
    extra["text_config"] = types.SimpleNamespace(**{**text, "num_hidden_layers": num_layers})
    ctx = _StubContext(src, num_layers, types.SimpleNamespace(**extra),
                       types.SimpleNamespace(is_first_rank=True, is_last_rank=True, rank_in_group=0,
                                             world_size=1))
    top = classes.class_for_arch(src, arch)
    stub = _StubModule(ctx, top)
    if classes.find_method(src, top, SETTER) is None:
        attr = classes.wrapped_attr(src, top)
        if attr is None:
            return SetterRun(None, None, [], [], f"{arch} has no {SETTER}")
        stub = getattr(stub, attr)
    owner_cls = stub._cls if isinstance(stub, _StubModule) else None
    found = classes.find_method(src, owner_cls, SETTER) if owner_cls is not None else None
    params = found[1].args if found is not None else None
    takes_ids = params is None or len(params.posonlyargs + params.args) > 1 or params.vararg is not None
    files = {}

    def tracer(frame, event, arg):
        fname = frame.f_code.co_filename
        if fname in files or fname.startswith(str(src.root)):
            files.setdefault(fname, None)
            if event == "line":
                ctx.traced.append((fname, frame.f_lineno))
            return tracer
        return None

    error, error_type, refused = None, None, False
    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        setter = getattr(stub, SETTER)
        if takes_ids:
            setter(list(ids) if ids is not None else None)
        else:
            setter()
    except SandboxRefusal as exc:
        error, error_type = f"SandboxRefusal: {exc}", "SandboxRefusal"
    except Exception as exc:  # the version's code rejected the stub or the ids
        error, error_type = f"{type(exc).__name__}: {exc}", type(exc).__name__
        if isinstance(exc, SandboxPermissionError):
            error, error_type = f"SandboxRefusal: {exc}", "SandboxRefusal"
        refused = _denied(exc)
    finally:
        sys.settrace(old)
    executed = _executed_lines(src, ctx.traced)
    if error is None and not ctx.assigned:
        error = f"{SETTER} of sglang {src.version} returned without setting layers_to_capture"
    ltc, owner = None, None
    if ctx.assigned:
        holder, value = ctx.assigned[-1]
        ltc = [int(v) for v in value]
        owner = holder._cls.name if holder._cls else None
    flagged: dict[str, set[int]] = {}
    for layers in ctx.layer_lists:
        for layer in layers:
            for k, v in vars(layer).items():
                if k != "layer_id" and v is True:
                    flagged.setdefault(k, set()).add(layer.layer_id)
    return SetterRun(ltc, owner, executed, sorted(set(ctx.log)), error,
                     {k: sorted(v) for k, v in flagged.items()}, takes_ids, error_type, refused)


def _denied(exc: BaseException) -> bool:
    """Whether the audit hook refused something on the way to ``exc`` (the release's code may wrap it)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, SandboxPermissionError):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _executed_lines(src: SglangSource, traced: list[tuple[str, int]]) -> list[SourceLine]:
    out = []
    for fname, line in traced:
        parsed = classes.parse_file(fname)
        out.append(SourceLine(src.rel(fname), line, parsed.line(line).strip()))
    return dedupe(out)


def exec_capture_site(site: CaptureSite, i: int, hidden_states: Any, residual: Any,
                      layers_to_capture: Sequence[int], first_rank: bool = True) -> list:
    """Execute the version's own capture statement once, as the loop would at layer ``i``.

    Only for inline sites. This is how the workbook shows the TypeError at boundary 0
    without importing sglang: the statement text comes from the file, and the rest of
    the loop's world is a handful of plain values.
    """
    if site.style not in (CaptureStyle.INLINE_ADD, CaptureStyle.INLINE_GUARDED,
                          CaptureStyle.INLINE_HIDDEN_ONLY):
        raise WiringError(f"the capture at {site.file}:{site.line} is {site.style}; only inline sites "
                          f"execute")
    tree = ast.parse(textwrap.dedent(site.source))
    _refuse_dunders(tree, site.path)
    code = compile(tree, site.path, "exec")
    log: list[str] = []
    namespace = _Globals(log)
    aux: list = []
    self_stub = types.SimpleNamespace(
        layers_to_capture=list(layers_to_capture), enable_a2a_moe=False, first_k_dense_replace=0,
        pp_group=types.SimpleNamespace(is_first_rank=first_rank, is_last_rank=True))
    namespace.update(self=self_stub, i=i, hidden_states=hidden_states, residual=residual,
                     aux_hidden_states=aux)
    exec(code, namespace)
    return aux


# --------------------------------------------------------------------------------------
# The sandbox child: one process per cache or tree, spoken to in JSON lines.

SETTER_TIMEOUT_S = 60.0      # one setter run takes milliseconds; a minute means it hangs
_MEMORY_LIMIT = 4 * 2**30    # address space of the child: a setter cannot exhaust the machine
_REPO = Path(__file__).resolve().parents[3]
_CHILD = ("import sys; sys.path.insert(0, sys.argv[1]); "
          "from helpers.engines.sglang.stub import _child_main; _child_main()")

# Audit events the child refuses once locked (https://docs.python.org/3/library/audit_events.html).
_REFUSED_EVENTS = (
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg",
    "subprocess.Popen", "pty.spawn", "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
    "os.link", "os.symlink", "os.truncate", "os.utime", "os.chflags", "os.lchmod", "os.mkfifo", "os.mknod",
    "os.putenv", "os.unsetenv", "os.chdir", "os.chroot", "shutil.", "socket.", "ctypes.", "webbrowser.",
    "urllib.Request", "http.client.", "ftplib.", "smtplib.", "poplib.", "imaplib.", "telnetlib.",
    "mmap.__new__", "fcntl.", "resource.setrlimit", "sys.addaudithook")
_REFUSED_MODULES = {
    "ctypes", "_ctypes", "socket", "_socket", "ssl", "_ssl", "http", "urllib", "ftplib", "smtplib", "poplib",
    "imaplib", "telnetlib", "xmlrpc", "multiprocessing", "_multiprocessing", "_posixsubprocess", "pty",
    "mmap", "fcntl", "webbrowser", "asyncio", "concurrent", "select", "selectors", "signal", "_signal",
    "resource",
    "pickle", "_pickle", "marshal", "shelve"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _audit(event: str, args: tuple) -> None:
    if event == "open":
        mode, flags = (args[1] if len(args) > 1 else None), (args[2] if len(args) > 2 else 0)
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int)
                                                                           and flags & _WRITE_FLAGS):
            raise SandboxPermissionError(f"sandbox: refused to open {args[0]!r} for writing")
        return
    if event == "import":
        if str(args[0]).split(".")[0] in _REFUSED_MODULES:
            raise SandboxPermissionError(f"sandbox: refused to import {args[0]}")
        return
    if event.startswith(_REFUSED_EVENTS):
        raise SandboxPermissionError(f"sandbox: refused {event}")


def _lock_down() -> list[str]:
    """Everything the child gives up before it reads the first job; returns what it managed."""
    import resource
    import signal

    done = []
    try:  # an empty network namespace: no interface but a down loopback (Linux, unprivileged userns)
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(0x10000000 | 0x40000000) == 0:   # CLONE_NEWUSER | CLONE_NEWNET
            done.append("network namespace")
        del libc, ctypes
    except (OSError, AttributeError):
        pass
    for name in [m for m in sys.modules if m.split(".")[0] in ("ctypes", "_ctypes")]:
        del sys.modules[name]          # so a later import of it is an audited (refused) one
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit fails with EFBIG, not a kill
    for limit, value in ((resource.RLIMIT_FSIZE, 0), (resource.RLIMIT_CORE, 0),
                         (resource.RLIMIT_AS, _MEMORY_LIMIT)):
        try:
            resource.setrlimit(limit, (value, value))
            done.append(f"rlimit {limit}")
        except (ValueError, OSError):
            pass
    sys.addaudithook(_audit)
    done.append("audit hook")
    return done


def _child_main() -> None:
    """Read one job per line from stdin, answer one JSON line per job on stdout."""
    out = sys.stdout
    locks = _lock_down()
    for line in sys.stdin:
        try:
            job = json.loads(line)
            src = SglangSource(version=job["version"], root=Path(job["root"]), origin=job["origin"])
            run = _run_setter_here(src, job["arch"], job["num_layers"], job["ids"], job["target_config"])
            reply = {"run": asdict(run), "locks": locks}
        except BaseException as exc:  # noqa: BLE001 - whatever happens, the parent gets one line
            reply = {"error": f"the sandboxed setter run failed: {type(exc).__name__}: {exc}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def _scrubbed_env() -> dict[str, str]:
    """No proxies, tokens, credentials or PYTHON* variables: only a locale."""
    return {"LC_ALL": "C.UTF-8", "LANG": "C.UTF-8", "PATH": "/usr/bin:/bin"}


class _Worker:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-I", "-B", "-c", _CHILD, str(_REPO)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=_scrubbed_env(), cwd="/", start_new_session=True)
        self.buffer = b""

    def call(self, job: dict, timeout: float) -> dict:
        try:
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return {"error": f"the sandbox process exited (status {self.proc.poll()}) before the job"}
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self.buffer:
                if not sel.select(timeout):
                    self.close()
                    return {"error": f"the release's {SETTER} did not return within {timeout:g} s in the "
                                     f"sandbox; it was stopped"}
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return {"error": f"the sandbox process exited (status {self.proc.wait()}) during the job"}
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


_WORKERS: dict[str, _Worker] = {}


def _call_worker(key: str, job: dict) -> dict:
    worker = _WORKERS.get(key)
    if worker is None or worker.proc.poll() is not None:
        worker = _WORKERS[key] = _Worker()
    reply = worker.call(job, SETTER_TIMEOUT_S)
    if "run" not in reply or (reply.get("run") or {}).get("refused"):
        worker.close()            # a child that broke a rule, hung or died serves no further job
        _WORKERS.pop(key, None)
    return reply


@atexit.register
def close_sandboxes() -> None:
    """Stop every sandbox child (they also exit on their own when this process's pipe closes)."""
    while _WORKERS:
        _WORKERS.popitem()[1].close()
