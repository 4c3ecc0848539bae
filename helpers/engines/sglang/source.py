"""SGLang's own source, read as text, for any released version.

The workbook never imports sglang (it needs CUDA); it reads the files a version ships and
walks them with ``ast``. A version comes either from a wheel fetched once into a cache, or
from an installed sglang located without importing it. Everything downstream (the capture
inspector, the id resolver, the patch) works on a :class:`SglangSource`, so a test can point
one at a private copy of the files and leave the shared cache alone.

The wheel is fetched through the workbook's one cache (``rules.wheels``: its layout, its eviction):
``$EAGLE3_WORKBOOK_CACHE/sglang/<version>/`` (default ``<cache>/sglang/<version>/``, ``wheels.cache_base``)
holds the wheel's ``sglang/srt/**/*.py`` and its ``*.dist-info`` (whose RECORD carries the sha256 of
every pristine file).
"""
from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import re
import subprocess
from dataclasses import dataclass
from importlib.metadata import version as distribution_version
from pathlib import Path

from ...rules import wheels
from ...rules.conventions import is_version_string
from ...rules.wheels import CACHE_ENV  # noqa: F401  (the one cache's setting, named here for callers)


class SglangSourceError(wheels.PackageSourceError):
    """The source of an SGLang version could not be obtained or read."""


class UnknownVersionError(SglangSourceError, wheels.UnknownPackageVersion):
    """The package index has no such sglang version."""


class IndexUnreachableError(SglangSourceError, wheels.PackageIndexUnreachable):
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
    return wheels.cache_root("sglang")


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
    folder = wheels.cached("sglang", version, cache)
    if folder is not None and (folder / "sglang" / "srt" / "models").is_dir():
        return SglangSource(version=version, root=folder, origin="cache")
    return None


def fetch_sglang(version: str, cache: Path | str | None = None) -> SglangSource:
    """A version's source, its wheel downloaded once into the shared cache (``wheels.fetch``).

    ``cache``: the folder holding the versions (default ``cache_root()``). The wheel's
    ``sglang/srt/**/*.py`` and its dist-info are kept.
    """
    version = check_version_string(version)
    try:
        folder = wheels.fetch("sglang", version, _kept, cache=cache, download=_pip_download)
    except wheels.UnknownPackageVersion as exc:
        raise UnknownVersionError(str(exc)) from None
    except wheels.PackageIndexUnreachable as exc:
        raise IndexUnreachableError(f"{exc}, or point at an sglang tree (--sglang-root / root=)") from None
    except wheels.PackageSourceError as exc:
        raise SglangSourceError(str(exc)) from None
    if not (folder / "sglang" / "srt" / "models").is_dir():
        raise SglangSourceError(f"the cache entry {folder} holds no sglang/srt/models/; remove it and fetch "
                                f"sglang {version} again")
    return SglangSource(version=version, root=folder, origin="cache")


def _kept(name: str) -> bool:
    """The members of an sglang wheel the workbook reads: srt's Python sources and the dist-info."""
    return ((name.startswith("sglang/srt/") and name.endswith(".py"))
            or (name.startswith("sglang-") and ".dist-info/" in name))


def _pip_download(version: str, dest: Path, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``pip download`` of one sglang wheel; tests replace it to play the package index."""
    return wheels.pip_download("sglang", version, dest, extra)


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
