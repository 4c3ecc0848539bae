"""Any released package's Python source, fetched once from the package index into the workbook's cache.

Trainers and engines change their conventions between releases, so a rule is checked against the
release's own files (``helpers.rules.trainers``, ``engines.vllm.source``, ``engines.sglang.source``) rather
than trusted from memory. This module is the one cache they share. Only the files the caller keeps are
unpacked (``keep``): a 370 MB vLLM wheel leaves a few MB.

Layout: ``$EAGLE3_WORKBOOK_CACHE/<package>/<version>/`` (default ``$XDG_CACHE_HOME/eagle3-workbook``, else
``~/.cache/eagle3-workbook``: ``cache_base``), each entry holding the kept files and a ``.complete`` marker.
An entry is unpacked into a hidden staging folder ``.<version>-*`` beside it and renamed into place when
complete, so an interrupted or concurrent fetch never leaves half a release behind.

Eviction, done after each download (a cache miss) of a package, inside ``<cache>/<package>/`` only:

- a staging folder ``.<version>-*`` older than an hour (``STAGING_STALE_S``) is an interrupted fetch's
  and is removed;
- a complete entry is removed when it is not among the ``KEEP_RECENT`` most recently used of its
  package and has not been used for a day (``IDLE_S``); "used" is the ``.complete`` marker's mtime,
  touched on every cache hit. The day spares a run that reads every release (``wiring --matrix``),
  which would otherwise evict the releases it is about to read again;
- the entry being returned is never removed.
"""
from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import zipfile
from pathlib import Path
from typing import Callable, Sequence

from .. import net
from ..errors import BadOption, CacheError, one_line
from .conventions import is_final_release, is_version_string, version_key

CACHE_ENV = "EAGLE3_WORKBOOK_CACHE"
COMPLETE_MARKER = ".complete"
KEEP_RECENT = 10                # complete entries per package that are never evicted, most recently used
IDLE_S = 24 * 3600              # beyond those, an entry unused this long is evicted
STAGING_STALE_S = 3600          # a staging folder this old belongs to a fetch that was interrupted
PIP_TIMEOUT_S = 900
# Releases built for one interpreter only (sglang 0.5.23 ships cp311 manylinux wheels): when the
# running Python has no wheel, these tags are tried before the version is called unknown. Only Python
# files are read, so any platform's wheel will do.
FALLBACK_WHEEL_TAGS = (("3.11", "manylinux_2_34_x86_64"), ("3.12", "manylinux_2_34_x86_64"),
                       ("3.10", "manylinux_2_34_x86_64"))

Keep = Sequence[str] | Callable[[str], bool]
Download = Callable[[str, Path, tuple[str, ...]], subprocess.CompletedProcess]


class PackageSourceError(RuntimeError):
    """A release's source could not be obtained."""


class UnknownPackageVersion(PackageSourceError, BadOption):
    """The index has no such release: the user's to fix, not the network's."""


class PackageIndexUnreachable(PackageSourceError):
    """pip reached no index (an offline machine)."""


def cache_base() -> Path:
    """The workbook's one cache folder: ``$EAGLE3_WORKBOOK_CACHE`` when set, else
    ``$XDG_CACHE_HOME/eagle3-workbook`` (the XDG base directory spec: an absolute path only), else
    ``~/.cache/eagle3-workbook``."""
    base = os.environ.get(CACHE_ENV)
    if base:
        return Path(base).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return root / "eagle3-workbook"


def cache_root(package: str) -> Path:
    """``<cache>/<package>``: the folder holding every cached version of ``package``."""
    return cache_base() / package


def cached(package: str, version: str, cache: Path | str | None = None) -> Path | None:
    """The complete entry of ``package==version``, or None; never downloads. ``cache``: the folder
    holding the versions, by default ``cache_root(package)``."""
    folder = (Path(cache) if cache is not None else cache_root(package)) / version
    return folder if (folder / COMPLETE_MARKER).is_file() else None


def cached_versions(package: str, cache: Path | str | None = None) -> list[str]:
    """The versions with a complete entry, oldest release first."""
    base = Path(cache) if cache is not None else cache_root(package)
    found = [p.name for p in base.iterdir() if is_version_string(p.name) and (p / COMPLETE_MARKER).is_file()
             ] if base.is_dir() else []
    return sorted(found, key=version_key)


def fetch(package: str, version: str, keep: Keep, *, cache: Path | str | None = None,
          download: Download | None = None, whole: bool = True) -> Path:
    """The folder holding ``package==version``'s kept files, its wheel downloaded once.

    ``keep``: folder prefixes whose ``.py`` files are kept (e.g. ``["speculators/"]``), or a predicate
    on the wheel's member names. ``cache``: the folder holding the versions (default
    ``cache_root(package)``). ``download(version, dest, extra_pip_args)`` stands in for
    ``pip download`` (tests). One package has one selection: an entry holds what its first fetch kept.
    The kept members are read by ranges from the index's copy where it serves them (``RangedFile``); else the
    whole wheel is downloaded, unless ``whole`` is False (a caller with a recorded fallback), which then
    raises ``PackageSourceError``.
    """
    if not is_version_string(version):
        raise UnknownPackageVersion(f"{package} {version!r} is not a version number (expected e.g. 0.4.0)")
    wanted = _keep_predicate(keep)
    base = Path(cache) if cache is not None else cache_root(package)
    found = cached(package, version, base)
    if found is not None:
        _touch(found)
        return found
    made = [p for p in (base, *base.parents) if not p.exists()]     # the folders this fetch creates
    check_cache_writable(base, package)
    try:
        if download is None and _install_ranged(package, version, wanted, base):
            evict(base, spare=version)
            return base / version
        if not whole and download is None:
            raise PackageSourceError(f"{package} {version}'s files could not be read by ranges from "
                                     f"{index_url()} (offline, or an index without a JSON listing)")
        earlier = _UNREACHABLE.get((index_url(), download))
        if earlier is not None:     # one air-gapped answer is enough: pip is not asked again in this process
            asked, said, why = earlier     # the same release is told the same sentence (it is said once)
            again = (f"cannot fetch {package} {version}: the package index did not answer earlier in this "
                     f"run ({why}); {_cached_hint(package, base)}")
            raise PackageIndexUnreachable(said if asked == (package, version) else again)
        run = download or (lambda v, dest, extra: pip_download(package, v, dest, extra))
        with tempfile.TemporaryDirectory(prefix=f"{package}-dl-") as tmp:
            try:
                wheel = _download_wheel(package, version, Path(tmp), base, run)
            except PackageIndexUnreachable as exc:
                _UNREACHABLE[(index_url(), download)] = ((package, version), str(exc), one_line(exc)[:200])
                raise
            _install(package, version, wheel, wanted, base)
    except BaseException:
        _remove_empty(made)       # a refused release (one the index does not have) leaves no folder behind
        raise
    evict(base, spare=version)
    return base / version


# the indexes that did not answer pip in this process: an air-gapped host is told once, not once per release
# (the release asked, what was said, why in short)
_UNREACHABLE: dict[tuple[str, Download | None], tuple[tuple[str, str], str, str]] = {}


def _remove_empty(folders: list[Path]) -> None:
    """Remove each folder, deepest first, while it is empty (another process may have filled it)."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def _keep_predicate(keep: Keep) -> Callable[[str], bool]:
    if callable(keep):
        return keep
    prefixes = (keep,) if isinstance(keep, str) else tuple(keep)
    if not prefixes:
        raise ValueError("keep names no folder; expected folder prefixes such as 'vllm/v1/worker/'")
    return lambda name: name.endswith(".py") and name.startswith(prefixes)


def _touch(entry: Path) -> None:
    """Mark an entry used now (what eviction reads); a read-only cache simply stays as it is."""
    try:
        os.utime(entry / COMPLETE_MARKER)
    except OSError:
        pass


def check_cache_writable(base: Path, package: str) -> Path:
    """The cache folder exists and takes a file, checked before a download that would otherwise
    fail after minutes with a bare FileNotFoundError/PermissionError naming a temp path."""
    try:
        base.mkdir(parents=True, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=".write-probe-", dir=base))
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        setting = os.environ.get(CACHE_ENV)
        raise CacheError(f"cannot write the {package} source cache {base} ({why}); set {CACHE_ENV} to a "
                         f"writable folder" + (f" (it is {setting!r})" if setting else "")) from None
    return base


def _install(package: str, version: str, wheel: Path | RangedFile, wanted: Callable[[str], bool],
             base: Path) -> None:
    """Unpack the kept members into a staging folder and rename it into place. ``wheel``: the downloaded
    file, or the index's copy read by ranges (``RangedFile``)."""
    staging = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=base))
    try:
        try:
            with zipfile.ZipFile(wheel) as zf:
                for name in zf.namelist():
                    inside = not name.startswith("/") and ".." not in Path(name).parts
                    if inside and not name.endswith("/") and wanted(name):
                        zf.extract(name, staging)
        except zipfile.BadZipFile:
            raise PackageSourceError(f"pip's {package} {version} download {wheel.name} is not a wheel "
                                     f"(a zip archive)") from None
        (staging / COMPLETE_MARKER).write_text(wheel.name + "\n", encoding="utf-8")
        try:
            os.rename(staging, base / version)
        except OSError:
            winner = cached(package, version, base)
            if winner is not None:          # a concurrent fetch won: its entry is as good
                _touch(winner)
                return
            if (base / version).exists():
                raise PackageSourceError(f"{base / version} exists but is not a complete cache entry (no "
                                         f"{COMPLETE_MARKER}); remove it and fetch again") from None
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def evict(base: Path, spare: str | None = None, now: float | None = None) -> list[str]:
    """Apply the eviction rule (module docstring) to one package's folder; the names removed."""
    now = time.time() if now is None else now
    removed, entries = [], []
    for p in base.iterdir() if base.is_dir() else []:
        if p.is_symlink() or not p.is_dir():
            continue
        if _is_staging(p.name):
            made = _mtime(p)
            if made is not None and now - made > STAGING_STALE_S:
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p.name)
        elif is_version_string(p.name):
            used = _mtime(p / COMPLETE_MARKER)
            if used is not None:
                entries.append((used, p))
    entries.sort(key=lambda e: e[0], reverse=True)
    for used, p in entries[KEEP_RECENT:]:
        if p.name != spare and now - used > IDLE_S and _remove_entry(p):
            removed.append(p.name)
    return removed


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:          # gone meanwhile (another process), or never there
        return None


def _is_staging(name: str) -> bool:
    m = re.fullmatch(r"\.(.+?)-[^/]+", name)
    return bool(m) and is_version_string(m.group(1))


def _remove_entry(entry: Path) -> bool:
    """Moved under a staging name first, so a reader sees the entry whole or not at all."""
    try:
        gone = Path(tempfile.mkdtemp(prefix=f".{entry.name}-evicted-", dir=entry.parent))
    except OSError:
        return False
    try:
        os.rename(entry, gone / entry.name)
    except OSError:
        return False
    finally:
        shutil.rmtree(gone, ignore_errors=True)
    return True


# --------------------------------------------------------------------------------------
# A wheel read by ranges: only its central directory and the kept members cross the network.

INDEX_ENV = "EAGLE3_WORKBOOK_INDEX_URL"      # else PIP_INDEX_URL, else PyPI's simple index
RANGED_ENV = "EAGLE3_WORKBOOK_RANGED"        # "0" turns ranged reads off (pip downloads the whole wheel)
RANGE_BLOCK = 1 << 18                        # bytes per request beyond what zipfile asks for
RANGED_TIMEOUT_S = 60
MAX_LISTING_BYTES = 64 << 20                # an index's JSON listing of one package (torch's is a few MB)


class RangedFile(io.RawIOBase):
    """A remote file read by HTTP ranges, seekable, for ``zipfile``: a 240 MB vLLM wheel whose rule and hook
    files are wanted costs its central directory (about 1 MB) and those members, not the download."""

    def __init__(self, url: str, size: int, name: str):
        super().__init__()
        self.url, self.size, self.name, self._pos = url, size, name, 0
        self._blocks: dict[int, bytes] = {}
        self.requests = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def _get(self, start: int, end: int) -> bytes:
        """Bytes [start, end) from the server, in one request."""
        self.requests += 1
        resp = net.get(self.url, deadline_s=RANGED_TIMEOUT_S, max_bytes=end - start,
                       headers={"Range": f"bytes={start}-{end - 1}"})
        if resp.status != 206 or len(resp.body) != end - start:
            raise PackageSourceError(f"{self.url} ignores byte ranges (HTTP {resp.status})")
        return resp.body

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self._pos + n)
        if end <= self._pos:
            return b""
        first, last = self._pos // RANGE_BLOCK, (end - 1) // RANGE_BLOCK
        missing = [b for b in range(first, last + 1) if b not in self._blocks]
        if missing:
            lo, hi = missing[0] * RANGE_BLOCK, min(self.size, (missing[-1] + 1) * RANGE_BLOCK)
            data = self._get(lo, hi)
            for b in range(missing[0], missing[-1] + 1):
                off = (b - missing[0]) * RANGE_BLOCK
                self._blocks[b] = data[off:off + RANGE_BLOCK]
        out = b"".join(self._blocks[b] for b in range(first, last + 1))
        skip = self._pos - first * RANGE_BLOCK
        out = out[skip:skip + (end - self._pos)]
        self._pos += len(out)
        return out

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def index_url() -> str:
    return (os.environ.get(INDEX_ENV) or os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple").rstrip("/")


def index_listing(package: str) -> dict | None:
    """The index's JSON listing of ``package`` (PEP 691), or None where it cannot be read as one."""
    url = f"{index_url()}/{re.sub(r'[-_.]+', '-', package).lower()}/"
    try:
        listing = net.get(url, deadline_s=RANGED_TIMEOUT_S, max_bytes=MAX_LISTING_BYTES,
                          headers={"Accept": "application/vnd.pypi.simple.v1+json"}).json()
    except (OSError, ValueError):
        return None
    return listing if isinstance(listing, dict) else None


def remote_wheel(package: str, version: str) -> RangedFile | None:
    """The release's wheel on the index, as a ranged file (any platform's: only Python files are read), or
    None where the index has no JSON listing, no such wheel, or does not serve ranges."""
    url = f"{index_url()}/{re.sub(r'[-_.]+', '-', package).lower()}/"
    listing = index_listing(package)
    if listing is None:
        return None
    stem = f"{re.sub(r'[-_.]+', '_', package)}-{version}-".lower()
    wheels = [f for f in listing.get("files", []) if isinstance(f, dict)
              and str(f.get("filename", "")).lower().startswith(stem) and f["filename"].endswith(".whl")
              and isinstance(f.get("size"), int) and not f.get("yanked")]
    if not wheels:
        return None
    wheels.sort(key=lambda f: ("x86_64" not in f["filename"], "any" not in f["filename"]))
    chosen = wheels[0]
    return RangedFile(urllib.parse.urljoin(url, chosen["url"]), chosen["size"], chosen["filename"])


def _install_ranged(package: str, version: str, wanted: Callable[[str], bool], base: Path) -> bool:
    """The kept members read by ranges into the cache; False (nothing written) where that cannot be done,
    and the whole wheel is then downloaded by pip."""
    if os.environ.get(RANGED_ENV, "1") == "0":
        return False
    try:
        remote = remote_wheel(package, version)
        if remote is None:
            return False
        _install(package, version, remote, wanted, base)
    except (OSError, PackageSourceError, zipfile.BadZipFile, EOFError):
        return False
    return cached(package, version, base) is not None


# --------------------------------------------------------------------------------------
# pip, and what its failures mean.


def pip_download(package: str, version: str, dest: Path,
                 extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``pip download`` of one wheel into ``dest``; ``extra`` names another interpreter's tags. One retry
    per connection, not pip's five: on an air-gapped host pip's backoff spent 7.5 s asleep before it said
    the index was unreachable, on every release a command reads."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--retries", "1", "--only-binary=:all:", "-d", str(dest), *extra, f"{package}=={version}"]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 1, "", f"pip download timed out after {PIP_TIMEOUT_S} s")


def _download_wheel(package: str, version: str, dest: Path, base: Path, run: Download) -> Path:
    """The wheel of ``package==version``: for this interpreter, else for a fallback tag."""
    proc = run(version, dest, ())
    if proc.returncode != 0:
        output = proc.stdout + proc.stderr
        listed = _listed_versions(output)
        if listed == []:
            # "(from versions: none)": no index answered (offline, a dead PIP_INDEX_URL). The packages
            # read here have many releases, so an empty list never means this version is missing.
            raise PackageIndexUnreachable(
                f"cannot fetch {package} {version}: pip listed no {package} versions at all, so the package "
                f"index is unreachable or does not carry {package} ({_network_reason(output)}); "
                f"{_cached_hint(package, base)}")
        if listed is None and "No matching distribution" not in output:
            raise PackageIndexUnreachable(f"pip could not download {package} {version}: "
                                          f"{_last_line(output)}; {_cached_hint(package, base)}")
        # pip lists only the versions with a wheel for this interpreter, so a release built for
        # another Python looks absent until the other tags are tried.
        for py, platform in FALLBACK_WHEEL_TAGS:
            proc = run(version, dest, ("--python-version", py, "--platform", platform))
            if proc.returncode == 0:
                break
        else:
            if listed and version not in listed:
                raise UnknownPackageVersion(f"{package} {version} does not exist on the package index "
                                            f"(latest listed: {', '.join(listed[-5:])})")
            raise PackageSourceError(f"pip could not download a {package} {version} wheel for this Python "
                                     f"or any fallback tag: {_last_line(proc.stdout + proc.stderr)}")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise PackageSourceError(f"pip reported success but left no {package} {version} wheel in {dest}")
    return wheels[0]


def _listed_versions(pip_output: str) -> list[str] | None:
    """The versions pip's "(from versions: ...)" names; [] for "none"; None when it names none."""
    m = re.search(r"from versions: ([^)]*)\)", pip_output)
    if not m:
        return None
    return [v.strip() for v in m.group(1).split(",") if v.strip() and v.strip() != "none"]


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


def _cached_hint(package: str, base: Path) -> str:
    """Which versions can still be read offline, so the user can pick one."""
    have = cached_versions(package, base)
    where = f"cached here: {', '.join(have)}" if have else f"nothing is cached in {base}"
    return f"{where}; go online once to fetch it"


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def released_versions(package: str) -> list[str]:
    """Every release the index lists, oldest first (pre-releases and dev builds left out)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "index", "versions", package,
                           "--disable-pip-version-check"], capture_output=True, text=True, timeout=300)
    m = re.search(r"Available versions: (.*)", proc.stdout)
    if proc.returncode != 0 or not m:
        raise PackageIndexUnreachable(f"cannot list {package} releases: "
                                      f"{_last_line(proc.stdout + proc.stderr)}")
    versions = [v.strip() for v in m.group(1).split(",")]
    return sorted(filter(is_final_release, versions), key=version_key)
