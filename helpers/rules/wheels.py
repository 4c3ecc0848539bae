"""Any released package's Python source, fetched once from the package index into the workbook's cache.

Trainers change their conventions between releases just as engines do, so a trainer's rule is
checked against the release's own files (``helpers.rules.trainers``) rather than trusted from memory.
Only the Python files under the requested folders are kept: a 370 MB vLLM wheel leaves a few MB.
The entry is unpacked beside the cache and renamed into place when complete, so an interrupted or
concurrent fetch never leaves half a release behind.

Layout: ``$EAGLE3_WORKBOOK_CACHE/<package>/<version>/`` (default ``~/.cache/eagle3-workbook``).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Sequence

from ..errors import BadOption, CacheError
from .conventions import is_version_string, version_tuple

CACHE_ENV = "EAGLE3_WORKBOOK_CACHE"
COMPLETE_MARKER = ".complete"


class PackageSourceError(RuntimeError):
    """A release's source could not be obtained."""


class UnknownPackageVersion(PackageSourceError, BadOption):
    """The index has no such release: the user's to fix, not the network's."""


class PackageIndexUnreachable(PackageSourceError):
    """pip reached no index (an offline machine)."""


def cache_root(package: str) -> Path:
    base = os.environ.get(CACHE_ENV)
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "eagle3-workbook") / package


def cached(package: str, version: str) -> Path | None:
    folder = cache_root(package) / version
    return folder if (folder / COMPLETE_MARKER).is_file() else None


def fetch(package: str, version: str, folders: Sequence[str]) -> Path:
    """The folder holding ``package==version``'s Python files under ``folders`` (e.g. "speculators/")."""
    if not is_version_string(version):
        raise UnknownPackageVersion(f"{package} {version!r} is not a version number (expected e.g. 0.4.0)")
    found = cached(package, version)
    if found is not None:
        return found
    base = cache_root(package)
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CacheError(f"cannot write the source cache {base} ({exc.strerror}); "
                         f"set {CACHE_ENV} to a writable folder") from None
    with tempfile.TemporaryDirectory(prefix=f"{package}-dl-") as tmp:
        wheel = _download(package, version, Path(tmp))
        staging = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=base))
        try:
            with zipfile.ZipFile(wheel) as zf:
                for name in zf.namelist():
                    keep = name.endswith(".py") and any(name.startswith(f) for f in folders)
                    if keep and ".." not in Path(name).parts:
                        zf.extract(name, staging)
            (staging / COMPLETE_MARKER).write_text(wheel.name + "\n", encoding="utf-8")
            try:
                os.rename(staging, base / version)
            except OSError:
                if cached(package, version) is None:
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return base / version


def _download(package: str, version: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--only-binary=:all:", "-d", str(dest), f"{package}=={version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        listed = re.search(r"from versions: ([^)]*)\)", out)
        names = [v.strip() for v in listed.group(1).split(",")] if listed else None
        if names in (None, ["none"]) and "No matching distribution" not in out:
            raise PackageIndexUnreachable(f"cannot fetch {package} {version}: no package index answered pip "
                                          f"(offline?); {_last(out)}")
        if names and names != ["none"] and version not in names:
            raise UnknownPackageVersion(f"{package} {version} does not exist on the package index (latest "
                                        f"listed: {', '.join(names[-5:])})")
        raise PackageSourceError(f"pip could not download a {package} {version} wheel: {_last(out)}")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise PackageSourceError(f"pip left no {package} {version} wheel in {dest}")
    return wheels[0]


def _last(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def released_versions(package: str) -> list[str]:
    """Every release the index lists, oldest first (pre-releases and dev builds left out)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "index", "versions", package,
                           "--disable-pip-version-check"], capture_output=True, text=True, timeout=300)
    m = re.search(r"Available versions: (.*)", proc.stdout)
    if proc.returncode != 0 or not m:
        raise PackageIndexUnreachable(f"cannot list {package} releases: {_last(proc.stdout + proc.stderr)}")
    versions = [v.strip() for v in m.group(1).split(",")]
    final = [v for v in versions if is_version_string(v) and not re.search(r"(a|b|rc|dev)\d", v)]
    return sorted(final, key=version_tuple)
