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

import base64
import csv
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
from importlib.metadata import version as distribution_version
from pathlib import Path

from ...errors import CacheError
from ..conventions import is_version_string

CACHE_ENV = "EAGLE3_WORKBOOK_CACHE"
_EXTRACT_PREFIX = "sglang/srt/"
_COMPLETE_MARKER = ".complete"
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
    if not is_version_string(version):
        raise UnknownVersionError(f"'{version}' is not an sglang version number (expected e.g. 0.5.9)")
    return version


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
        raise CacheError(f"cannot write the SGLang source cache {base} "
                         f"({exc.strerror or type(exc).__name__}); set {CACHE_ENV} to a writable folder (it "
                         f"is {os.environ.get(CACHE_ENV)!r})"
                         if os.environ.get(CACHE_ENV) else
                         f"cannot write the SGLang source cache {base} "
                         f"({exc.strerror or type(exc).__name__}); set {CACHE_ENV} to a writable "
                         f"folder") from None
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
        return distribution_version("sglang")
    except Exception:
        pass
    m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", safe_read(package_dir / "version.py"))
    return m.group(1) if m else None


def safe_read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError):
        return ""


def tree_version(root: Path) -> str | None:
    """The release a tree says it is: its ``sglang-*.dist-info`` (a wheel's copy or an install), else
    ``sglang/version.py`` (a git checkout); None when it says nothing."""
    infos = sorted(Path(root).glob("sglang-*.dist-info"))
    if infos:
        return infos[0].name[len("sglang-"):-len(".dist-info")]
    m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", safe_read(Path(root) / "sglang" / "version.py"))
    return m.group(1) if m else None


def source_at(root: Path | str, version: str | None = None) -> SglangSource:
    """A source rooted at an explicit folder (a test's private copy, a git checkout). A version named
    by the caller must be the tree's own: an answer labelled with one release but computed from
    another's code is wrong in a way nobody would notice."""
    root = Path(root)
    if not (root / "sglang").is_dir():
        raise SglangSourceError(f"{root} has no sglang/ folder; expected a folder holding an sglang/ tree "
                                f"(a site-packages, an unpacked wheel or a git checkout)")
    if not (root / "sglang" / "srt" / "models").is_dir():
        raise SglangSourceError(f"{root / 'sglang'} has no srt/models/ folder, so it is not an SGLang source "
                                f"tree the workbook can read")
    own = tree_version(root)
    if version is not None and own is not None and own != version:
        said = "dist-info" if any(root.glob("sglang-*.dist-info")) else "sglang/version.py"
        raise SglangSourceError(f"the tree {root} is sglang {own} (its {said}), not {version} as asked; "
                                f"name the tree's own version, or point at a {version} tree")
    return SglangSource(version=version or own or "unknown", root=root, origin="root")


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
