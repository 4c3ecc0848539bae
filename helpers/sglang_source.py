"""SGLang's own source, read as text, for any released version.

The workbook never imports sglang (it needs CUDA); it reads the files a version ships and
walks them with ``ast``. A version comes either from a wheel fetched once into a cache, or
from an installed sglang located without importing it. Everything downstream (the capture
inspector, the id resolver, the patch) works on a :class:`SglangSource`, so a test can point
one at a private copy of the files and leave the shared cache alone.

Cache layout: ``$EAGLE3_WORKBOOK_CACHE/sglang/<version>/`` (default
``~/.cache/eagle3-workbook/sglang/<version>/``) holds the wheel's ``sglang/srt/**/*.py`` and
its ``*.dist-info`` (whose RECORD carries the sha256 of every pristine file).
"""
from __future__ import annotations

import ast
import base64
import csv
import difflib
import functools
import hashlib
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .errors import BadOption, CacheError

CACHE_ENV = "EAGLE3_WORKBOOK_CACHE"
_VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?$")
_EXTRACT_PREFIX = "sglang/srt/"
_COMPLETE_MARKER = ".complete"
_ENTRY_RE = re.compile(r"^EntryClass\s*=\s*(\[[^\]]*\]|\w+)", re.M)
# Wheels built for one interpreter only (0.5.23 ships cp311 manylinux wheels): when the
# running Python has no match, these tags are tried before calling the version unknown.
_FALLBACK_WHEEL_TAGS = (("3.11", "manylinux_2_34_x86_64"), ("3.12", "manylinux_2_34_x86_64"),
                        ("3.10", "manylinux_2_34_x86_64"))


class SglangSourceError(RuntimeError):
    """The source of an SGLang version could not be obtained or read."""


class UnknownVersionError(SglangSourceError):
    """The package index has no such sglang version."""


class IndexUnreachableError(SglangSourceError):
    """pip could not reach a package index (offline machine)."""


class UnknownArchitectureError(SglangSourceError, ValueError):
    """No model file of this version declares the architecture in its EntryClass."""


# --------------------------------------------------------------------------------------
# Where a version's files live.


@dataclass(frozen=True)
class SglangSource:
    """One version's files on disk: ``root`` is the folder that contains ``sglang/``."""

    version: str
    root: Path
    origin: str = "cache"  # "cache" | "installed" | "root"

    @property
    def package_dir(self) -> Path:
        return self.root / "sglang"

    @property
    def models_dir(self) -> Path:
        return self.package_dir / "srt" / "models"

    def path(self, rel: str) -> Path:
        return self.root / rel

    def rel(self, path: Path | str) -> str:
        """Path inside the distribution (``sglang/srt/models/llama.py``): stable across caches."""
        try:
            return Path(path).resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return str(path)

    def read_text(self, rel_or_path: str | Path) -> str:
        p = Path(rel_or_path)
        return (p if p.is_absolute() else self.root / p).read_text(encoding="utf-8")

    def record_hashes(self) -> dict[str, str]:
        """sha256 hex of each file as the wheel shipped it (from RECORD); {} when absent."""
        for info in sorted(self.root.glob("sglang-*.dist-info")):
            record = info / "RECORD"
            if record.is_file():
                return _parse_record(record.read_text(encoding="utf-8"))
        return {}


def _parse_record(text: str) -> dict[str, str]:
    out = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) >= 2 and row[1].startswith("sha256="):
            digest = row[1][len("sha256="):]
            raw = base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4))
            out[row[0]] = raw.hex()
    return out


def sha256_file(path: Path | str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cache_root() -> Path:
    """Base folder of every SGLang version the workbook has fetched."""
    base = os.environ.get(CACHE_ENV)
    base_path = Path(base).expanduser() if base else Path.home() / ".cache" / "eagle3-workbook"
    return base_path / "sglang"


def check_version_string(version: str) -> str:
    """Refuse anything that is not a plain release number before it reaches pip or a path."""
    version = str(version).strip()
    if not _VERSION_RE.match(version):
        raise UnknownVersionError(f"'{version}' is not an sglang version number (expected e.g. 0.5.9)")
    return version


def parse_engine(engine: str) -> tuple[str, str | None]:
    """'sglang==0.5.9' -> ('sglang', '0.5.9'); 'vllm' -> ('vllm', None)."""
    text = str(engine).strip().lower()
    name, _, version = text.partition("==")
    name, version = name.strip(), version.strip()
    if name not in ("sglang", "vllm"):
        raise BadOption(f"unknown engine '{engine}'; expected 'sglang==VERSION', 'sglang' or 'vllm'")
    if "==" in text and not _VERSION_RE.match(version):
        raise BadOption(f"engine '{engine}': {version!r} is not a version number; expected e.g. {name}==0.5.9"
                        + (" or plain 'vllm'" if name == "vllm" else ""))
    return name, (version or None)


# --------------------------------------------------------------------------------------
# Fetching a wheel into the cache.


def cached_sglang(version: str, cache: Path | str | None = None) -> SglangSource | None:
    """The cached copy of a version, if a complete one is there; never downloads."""
    version = check_version_string(version)
    folder = (Path(cache) if cache else cache_root()) / version
    if (folder / _COMPLETE_MARKER).is_file() and (folder / "sglang" / "srt" / "models").is_dir():
        return SglangSource(version=version, root=folder, origin="cache")
    return None


def fetch_sglang(version: str, cache: Path | str | None = None) -> SglangSource:
    """A version's source, downloading its wheel once (``pip download --no-deps``).

    The wheel is unpacked into a temporary folder beside the cache entry and renamed into
    place only when complete, so an unknown version, a network failure or two processes
    fetching at once never leave a half-written entry.
    """
    version = check_version_string(version)
    found = cached_sglang(version, cache)
    if found is not None:
        return found
    base = Path(cache) if cache else cache_root()
    check_cache_writable(base)
    with tempfile.TemporaryDirectory(prefix="sglang-dl-") as tmp:
        wheel = _download_wheel(version, Path(tmp), base)
        base.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=base))
        try:
            _extract_wheel(wheel, staging)
            (staging / _COMPLETE_MARKER).write_text(wheel.name + "\n", encoding="utf-8")
            try:
                os.rename(staging, base / version)
            except OSError:
                if cached_sglang(version, base) is None:  # not a concurrent winner: a real failure
                    raise
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    found = cached_sglang(version, base)
    if found is None:
        raise SglangSourceError(f"sglang {version} was downloaded but its cache entry is incomplete")
    return found


def check_cache_writable(base: Path) -> Path:
    """The cache folder exists and takes a file, checked before a download that would otherwise
    fail after minutes with a bare FileNotFoundError/PermissionError naming a temp path."""
    try:
        base.mkdir(parents=True, exist_ok=True)
        probe = tempfile.mkdtemp(prefix=".write-probe-", dir=base)
        os.rmdir(probe)
    except OSError as exc:
        raise CacheError(f"cannot write the SGLang source cache {base} ({exc.strerror or type(exc).__name__}); "
                         f"set {CACHE_ENV} to a writable folder (it is {os.environ.get(CACHE_ENV)!r})"
                         if os.environ.get(CACHE_ENV) else
                         f"cannot write the SGLang source cache {base} ({exc.strerror or type(exc).__name__}); "
                         f"set {CACHE_ENV} to a writable folder") from None
    return base


def _pip_download(version: str, dest: Path, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "-d", str(dest), *extra, f"sglang=={version}"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900)


def _listed_versions(pip_output: str) -> list[str] | None:
    m = re.search(r"from versions: ([^)]*)\)", pip_output)
    if not m:
        return None
    return [v.strip() for v in m.group(1).split(",") if v.strip() and v.strip() != "none"]


def _download_wheel(version: str, dest: Path, cache: Path | None = None) -> Path:
    proc = _pip_download(version, dest)
    if proc.returncode != 0:
        output = proc.stdout + proc.stderr
        listed = _listed_versions(output)
        if listed == []:
            # pip prints "(from versions: none)" when no index answered at all (offline, a dead
            # PIP_INDEX_URL): sglang has hundreds of releases, so an empty list never means
            # that this version is missing, only that nothing could be asked.
            raise IndexUnreachableError(
                f"cannot fetch sglang {version}: pip listed no sglang versions at all, so the package "
                f"index is unreachable or does not carry sglang ({_network_reason(output)}); "
                f"{_cached_hint(cache)}")
        if listed is None and "No matching distribution" not in output:
            raise IndexUnreachableError(
                f"pip could not download sglang {version}: {_last_line(output)}; {_cached_hint(cache)}")
        # pip lists only the versions with a wheel for this interpreter, so a release built for
        # another Python (0.5.23 ships cp311 only) looks absent until the other tags are tried.
        for py, platform in _FALLBACK_WHEEL_TAGS:
            proc = _pip_download(version, dest, ("--only-binary=:all:", "--python-version", py,
                                                 "--platform", platform))
            if proc.returncode == 0:
                break
        else:
            if listed is not None and version not in listed:
                raise UnknownVersionError(
                    f"sglang {version} does not exist on the package index "
                    f"(latest listed: {', '.join(listed[-5:])})")
            raise UnknownVersionError(f"sglang {version}: no wheel could be downloaded "
                                      f"({_last_line(proc.stdout + proc.stderr)})")
    wheels = sorted(dest.glob("sglang-*.whl"))
    if not wheels:
        raise SglangSourceError(f"pip reported success but left no sglang {version} wheel in {dest}")
    return wheels[0]


_NETWORK_HINTS = ("NewConnectionError", "Connection refused", "Name or service not known",
                  "Temporary failure in name resolution", "Network is unreachable", "timed out",
                  "ProxyError", "SSLError")


def _network_reason(output: str) -> str:
    """The line of pip's output that says why no index answered, if pip gave one."""
    for line in output.splitlines():
        hint = next((h for h in _NETWORK_HINTS if h in line), None)
        if hint is not None:
            m = re.search(r"\[Errno [^\]]*\][^'\")]*", line)
            return f"pip: {m.group(0).strip() if m else hint}"
    return "no index answered pip"


def _cached_hint(cache: Path | None = None) -> str:
    """Which versions can still be read offline, so the user can pick one or pass a tree."""
    root = Path(cache) if cache else cache_root()
    have = sorted(p.name for p in root.iterdir() if (p / _COMPLETE_MARKER).is_file()) if root.is_dir() else []
    cached = f"cached here: {', '.join(have)}" if have else f"nothing is cached in {root}"
    return f"{cached}; go online once to fetch it, or point at an sglang tree (--sglang-root / root=)"


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def _extract_wheel(wheel: Path, dest: Path) -> None:
    """Only the Python sources under sglang/srt and the dist-info: what the workbook reads."""
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            wanted = (name.startswith(_EXTRACT_PREFIX) and name.endswith(".py")) or (
                ".dist-info/" in name and name.startswith("sglang-"))
            if wanted and not name.endswith("/") and ".." not in Path(name).parts:
                zf.extract(name, dest)


# --------------------------------------------------------------------------------------
# An installed sglang, found without importing it.


def installed_sglang() -> SglangSource | None:
    """The sglang this interpreter would import, or None; sglang itself is never imported."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    package_dir = Path(list(spec.submodule_search_locations)[0])
    version = _installed_version(package_dir)
    return SglangSource(version=version or "unknown", root=package_dir.parent, origin="installed")


def _installed_version(package_dir: Path) -> str | None:
    try:
        from importlib.metadata import version as dist_version
        return dist_version("sglang")
    except Exception:
        pass
    m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", _safe_read(package_dir / "version.py"))
    return m.group(1) if m else None


def _safe_read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError):
        return ""


def source_at(root: Path | str, version: str | None = None) -> SglangSource:
    """A source rooted at an explicit folder (a test's private copy, a git checkout)."""
    root = Path(root)
    if not (root / "sglang").is_dir():
        raise SglangSourceError(f"{root} has no sglang/ folder")
    if version is None:
        infos = sorted(root.glob("sglang-*.dist-info"))
        version = infos[0].name[len("sglang-"):-len(".dist-info")] if infos else "unknown"
    return SglangSource(version=version, root=root, origin="root")


def get_source(version: str | None = None, *, root: Path | str | None = None,
               target: str = "cache") -> SglangSource:
    """The one entry point: explicit root, else the installed sglang, else the cache."""
    if root is not None:
        return source_at(root, version)
    if target == "installed":
        src = installed_sglang()
        if src is None:
            raise SglangSourceError("no sglang is installed in this environment")
        if version is not None and src.version != version:
            raise SglangSourceError(f"installed sglang is {src.version}, not {version}")
        return src
    if target != "cache":
        raise ValueError(f"target must be 'cache' or 'installed', got {target!r}")
    if version is None:
        raise ValueError("a version is needed to fetch sglang into the cache")
    return fetch_sglang(version)


# --------------------------------------------------------------------------------------
# Parsing files and classes.


@dataclass(frozen=True)
class ParsedFile:
    path: Path
    text: str
    tree: ast.Module

    @functools.cached_property
    def _raw_lines(self) -> list[str]:
        # the split `ast` itself uses for offsets (\r\n, \r, \n only), kept once per file:
        # ast.get_source_segment re-splits the whole file on every call, which dominated
        # the inspector's time on 3000-line model files
        return re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", self.text)

    @functools.cached_property
    def _lines(self) -> list[str]:
        return self.text.splitlines()

    def segment(self, node: ast.AST) -> str:
        """``ast.get_source_segment(text, node, padded=True)``, without re-splitting the file."""
        pos = [getattr(node, a, None) for a in ("lineno", "end_lineno", "col_offset", "end_col_offset")]
        if None in pos:
            return ""
        first, last, col, end_col = pos[0] - 1, pos[1] - 1, pos[2], pos[3]
        lines = self._raw_lines
        if first == last:
            return lines[first].encode()[col:end_col].decode()
        head = lines[first].encode()
        padding = "".join(c if c in " \t\f" else " " for c in head[:col].decode())
        body = [padding + head[col:].decode(), *lines[first + 1:last], lines[last].encode()[:end_col].decode()]
        return "".join(body)

    def line(self, lineno: int) -> str:
        lines = self._lines
        return lines[lineno - 1] if 0 < lineno <= len(lines) else ""


@functools.lru_cache(maxsize=64)
def _parse_cached(path: str, mtime_ns: int, size: int) -> ParsedFile:
    text = Path(path).read_text(encoding="utf-8-sig")  # a few sglang files start with a BOM
    return ParsedFile(Path(path), text, ast.parse(text, filename=path))


def parse_file(path: Path | str) -> ParsedFile:
    """Parsed once per content version: a patched file is re-read, not served stale."""
    st = Path(path).stat()
    return _parse_cached(str(path), st.st_mtime_ns, st.st_size)


def entry_class_names(parsed: ParsedFile) -> list[str]:
    """Names in a module's ``EntryClass = X`` or ``EntryClass = [X, Y]`` (last one wins)."""
    names: list[str] = []
    for node in parsed.tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else [])
        if any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in targets):
            value = node.value
            elts = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
            names = [e.id for e in elts if isinstance(e, ast.Name)]
    return names


def entry_class_index(source: SglangSource) -> dict[str, Path]:
    """Every architecture name of the version -> the model file that registers it.

    Only the ``EntryClass = ...`` statement of each file is parsed, not the whole file: a
    version has hundreds of model files and the index is consulted for every suggestion.
    """
    index: dict[str, Path] = {}
    for path in sorted(source.models_dir.glob("*.py")):
        for name in _entry_names_in_text(_safe_read(path)):
            index.setdefault(name, path)
    return index


def _entry_names_in_text(text: str) -> list[str]:
    names: list[str] = []
    for m in _ENTRY_RE.finditer(text):  # the last assignment wins, as in the module itself
        try:
            node = ast.parse(m.group(0)).body[0]
        except SyntaxError:
            continue
        value = node.value
        elts = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
        names = [e.id for e in elts if isinstance(e, ast.Name)]
    return names


def find_model_file(source: SglangSource, arch: str) -> Path:
    """The models/*.py whose EntryClass declares ``arch``; only files naming it are parsed."""
    for path in sorted(source.models_dir.glob("*.py")):
        text = _safe_read(path)
        if not any(re.search(rf"\b{re.escape(arch)}\b", m.group(1)) for m in _ENTRY_RE.finditer(text)):
            continue  # cheap text test first: parse only files whose EntryClass names the arch
        if arch in entry_class_names(parse_file(path)):
            return path
    close = suggest_architectures(source, arch)
    hint = (f"; did you mean {', '.join(close)}?" if close else
            "; the name must be an HF `architectures` entry such as LlamaForCausalLM")
    raise UnknownArchitectureError(
        f"sglang {source.version} has no model class registered for architecture '{arch}'{hint}")


def suggest_architectures(source: SglangSource, name: str, n: int = 6) -> list[str]:
    """Registered names a person most likely meant by ``name``.

    People type the family (``llama``, ``deepseek_v3``) or get the case wrong, and difflib
    alone finds nothing for a short name against ``LlamaForCausalLM``; so a match ignoring case
    comes first, then names that contain the typed text (ignoring case and ``_``/``-``), then
    difflib's near misses.
    """
    names = list(entry_class_index(source))
    squash = lambda t: re.sub(r"[-_\s]", "", t).lower()  # noqa: E731
    key = squash(name)
    if not key:
        return []
    by_lower = {}
    for nm in names:
        by_lower.setdefault(nm.lower(), nm)
    contains = sorted((nm for nm in names if key in squash(nm)),
                      key=lambda nm: (not squash(nm).startswith(key), "ForCausalLM" not in nm, len(nm), nm))
    near = [by_lower[m] for m in difflib.get_close_matches(name.lower(), list(by_lower), n=n, cutoff=0.6)]
    exact = [nm for nm in names if squash(nm) == key]
    out: list[str] = []
    for nm in exact + contains + near:
        if nm not in out:
            out.append(nm)
    return out[:n]


@dataclass(frozen=True)
class ClassRef:
    """A class definition found in a version's source."""

    name: str
    path: Path
    node: ast.ClassDef

    @property
    def line(self) -> int:
        return self.node.lineno


def _module_file(source: SglangSource, module: str) -> Path | None:
    if not module.startswith("sglang"):
        return None
    base = source.root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _relative_module(path: Path, source: SglangSource, level: int, module: str | None) -> str:
    parts = source.rel(path)[:-3].split("/")[:-level]
    return ".".join(parts + ([module] if module else []))


def find_class(source: SglangSource, name: str, path: Path, _depth: int = 0) -> ClassRef | None:
    """Class ``name`` as visible from ``path``: defined there or imported from another file."""
    if _depth > 6 or not path.is_file():
        return None
    parsed = parse_file(path)
    for node in parsed.tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return ClassRef(name, path, node)
    for node in ast.walk(parsed.tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) != name:
                    continue
                module = (_relative_module(path, source, node.level, node.module)
                          if node.level else node.module or "")
                other = _module_file(source, module)
                if other is not None:
                    found = find_class(source, alias.name, other, _depth + 1)
                    if found is not None:
                        return found
    return None


def class_for_arch(source: SglangSource, arch: str) -> ClassRef:
    path = find_model_file(source, arch)
    ref = find_class(source, arch, path)
    if ref is None:
        raise UnknownArchitectureError(f"{source.rel(path)} lists {arch} in EntryClass but its "
                                       f"class definition could not be found")
    return ref


def base_classes(source: SglangSource, cls: ClassRef) -> list[ClassRef]:
    out = []
    for base in cls.node.bases:
        if isinstance(base, ast.Name):
            ref = find_class(source, base.id, cls.path)
            if ref is not None:
                out.append(ref)
    return out


def find_method(source: SglangSource, cls: ClassRef, method: str,
                _seen: frozenset = frozenset()) -> tuple[ClassRef, ast.FunctionDef] | None:
    """A method as Python would find it: the class itself, then its bases in order."""
    if (cls.path, cls.name) in _seen:
        return None
    for node in cls.node.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == method:
            return cls, node
    for base in base_classes(source, cls):
        found = find_method(source, base, method, _seen | {(cls.path, cls.name)})
        if found is not None:
            return found
    return None


def _self_attr_assignments(fn: ast.FunctionDef, attr: str) -> list[ast.expr]:
    values = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if (isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.value, ast.Name)
                        and t.value.id == "self"):
                    values.append(node.value)
    return values


def child_class(source: SglangSource, cls: ClassRef, attr: str) -> ClassRef | None:
    """The class of ``self.<attr>`` as built in ``__init__`` (``X(...)`` or ``self._init_x(...)``)."""
    for owner in linear_bases(source, cls):  # an __init__ may leave it to super().__init__
        init = next((n for n in owner.node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init is None:
            continue
        for value in _self_attr_assignments(init, attr):
            ref = _class_of_call(source, cls, owner, value)
            if ref is not None:
                return ref
    return None


def linear_bases(source: SglangSource, cls: ClassRef) -> list[ClassRef]:
    """The class and its resolvable bases, depth first (close enough to the MRO here)."""
    out, stack, seen = [], [cls], set()
    while stack:
        c = stack.pop(0)
        if (c.path, c.name) in seen:
            continue
        seen.add((c.path, c.name))
        out.append(c)
        stack[:0] = base_classes(source, c)
    return out


def _class_of_call(source: SglangSource, cls: ClassRef, owner: ClassRef, value: ast.expr) -> ClassRef | None:
    """Class names resolve in the file that wrote the call (``owner``); ``self.f()`` dispatches
    on the instance's class (``cls``), so a subclass's ``_init_model`` override wins.

    Newer model files also build the inner model from a name that is not a class: a
    constructor argument (``language_model_cls=Qwen3LLMModel``, passed up by subclasses),
    a class attribute (``self.body_cls(...)``) or a module attribute (``qwen3_5.X(...)``).
    Each is followed the way Python would bind it on an instance of ``cls``.
    """
    if not isinstance(value, ast.Call):
        return None
    func = value.func
    if isinstance(func, ast.Name):
        return find_class(source, func.id, owner.path) or _class_from_init_default(source, cls, func.id)
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        factory = find_method(source, cls, func.attr)  # e.g. LlamaForCausalLM._init_model
        if factory is not None:
            fowner, ffn = factory
            for node in ast.walk(ffn):
                if isinstance(node, ast.Return) and node.value is not None:
                    ref = _class_of_call(source, cls, fowner, node.value)
                    if ref is not None:
                        return ref
            return None
        return _class_from_class_attr(source, cls, func.attr)
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return _class_in_module(source, owner.path, func.value.id, func.attr)
    return None


def _class_named_by(source: SglangSource, path: Path, expr: ast.expr | None) -> ClassRef | None:
    """The class a bare name or ``module.Name`` expression refers to, as seen from ``path``."""
    if isinstance(expr, ast.Name):
        return find_class(source, expr.id, path)
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        return _class_in_module(source, path, expr.value.id, expr.attr)
    return None


def _class_from_init_default(source: SglangSource, cls: ClassRef, param: str) -> ClassRef | None:
    """``X(...)`` where X is an ``__init__`` parameter: the most derived class's default wins,
    because subclasses declare their own default and hand it to ``super().__init__``."""
    for c in linear_bases(source, cls):
        init = next((n for n in c.node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init is None:
            continue
        a = init.args
        positional = a.posonlyargs + a.args
        pairs = list(zip(positional[len(positional) - len(a.defaults):], a.defaults))
        pairs += [(k, d) for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
        for arg, default in pairs:
            if arg.arg == param:
                ref = _class_named_by(source, c.path, default)
                if ref is not None:
                    return ref
    return None


def _class_from_class_attr(source: SglangSource, cls: ClassRef, attr: str) -> ClassRef | None:
    """``self.body_cls(...)`` with ``body_cls = SomeModel`` in the class body (subclass first)."""
    for c in linear_bases(source, cls):
        for node in c.node.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr
                                                    for t in node.targets):
                ref = _class_named_by(source, c.path, node.value)
                if ref is not None:
                    return ref
    return None


def _class_in_module(source: SglangSource, path: Path, alias: str, name: str) -> ClassRef | None:
    """``alias.name`` where ``alias`` is a module imported into ``path``."""
    if not path.is_file():
        return None
    for node in ast.walk(parse_file(path).tree):
        module = None
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                if (a.asname or a.name) == alias:
                    base = (_relative_module(path, source, node.level, node.module) if node.level
                            else node.module or "")
                    module = f"{base}.{a.name}" if base else a.name
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.asname == alias or (a.asname is None and a.name == alias):
                    module = a.name
        if module:
            other = _module_file(source, module)
            if other is not None:
                found = find_class(source, name, other)
                if found is not None:
                    return found
    return None


def wrapped_attr(source: SglangSource, cls: ClassRef) -> str | None:
    """``language_model`` or ``model`` when ``cls`` hands its work to such an inner model."""
    for attr in ("language_model", "model"):
        for method in ("set_eagle3_layers_to_capture", "forward"):
            found = find_method(source, cls, method)
            if found is None:
                continue
            if any(_mentions_self_attr(n, attr) for n in ast.walk(found[1])):
                if child_class(source, cls, attr) is not None:
                    return attr
    return None


def _mentions_self_attr(node: ast.AST, attr: str) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name)
            and node.value.id == "self")
