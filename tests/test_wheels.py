"""The one cache of released packages (``rules.wheels``), with pip played by a stand-in: no network."""
from __future__ import annotations

import os
import re
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from helpers.errors import BadOption, CacheError
from helpers.rules import wheels

PKG = "demo"
FILES = {"demo/core.py": "X = 1\n", "demo/sub/deep.py": "Y = 2\n", "demo/data.json": "{}\n",
         "other/skip.py": "Z = 3\n", "demo-0.1.0.dist-info/RECORD": "demo/core.py,,\n"}
DAY = 24 * 3600


def _wheel(dest: Path, version: str, files: dict[str, str] = FILES) -> Path:
    path = dest / f"{PKG}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


class FakePip:
    """``download(version, dest, extra)`` for ``wheels.fetch``: a wheel when ``ok(extra)``, else ``fail``."""

    def __init__(self, fail: str = "", ok=lambda extra: True, files: dict[str, str] = FILES):
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.fail, self.ok, self.files = fail, ok, files

    def __call__(self, version, dest, extra=()):
        self.calls.append((version, tuple(extra)))
        if not self.ok(extra):
            return subprocess.CompletedProcess(["pip"], 1, "", self.fail)
        _wheel(Path(dest), version, self.files)
        return subprocess.CompletedProcess(["pip"], 0, "", "")


def _never(*args, **kwargs):
    raise AssertionError("pip must not run")


def _entry(base: Path, version: str, used: float) -> Path:
    """A complete entry last used at ``used`` (the marker's mtime)."""
    folder = base / version
    (folder / PKG).mkdir(parents=True)
    (folder / wheels.COMPLETE_MARKER).write_text("x.whl\n")
    os.utime(folder / wheels.COMPLETE_MARKER, (used, used))
    return folder


def _listing(base: Path) -> list[str]:
    return sorted(p.name for p in base.iterdir())


# --------------------------------------------------------------------------------------
# Fetching and reading back.


def test_fetch_keeps_the_named_folders_and_a_second_fetch_hits_the_cache(tmp_path):
    base, pip = tmp_path / "cache", FakePip()
    found = wheels.fetch(PKG, "0.1.0", ["demo/"], cache=base, download=pip)
    assert found == base / "0.1.0" and len(pip.calls) == 1
    kept = sorted(p.relative_to(found).as_posix() for p in found.rglob("*") if p.is_file())
    assert kept == [wheels.COMPLETE_MARKER, "demo/core.py", "demo/sub/deep.py"]
    assert _listing(base) == ["0.1.0"]               # no staging folder or probe left behind

    marker = found / wheels.COMPLETE_MARKER
    os.utime(marker, (1, 1))
    assert wheels.fetch(PKG, "0.1.0", ["demo/"], cache=base, download=_never) == found
    assert marker.stat().st_mtime > time.time() - 60  # the hit counts as a use


def test_default_cache_follows_the_env_and_default_pip_is_replaceable(tmp_path, monkeypatch):
    monkeypatch.setenv(wheels.CACHE_ENV, str(tmp_path))
    seen = []

    def pip(package, version, dest, extra=()):
        seen.append(package)
        return FakePip()(version, dest, extra)

    monkeypatch.setattr(wheels, "pip_download", pip)
    assert wheels.cache_root(PKG) == tmp_path / PKG
    assert wheels.fetch(PKG, "0.2.0", "demo/sub/") == tmp_path / PKG / "0.2.0"   # one prefix as a str
    assert seen == [PKG] and wheels.cached(PKG, "0.2.0") == tmp_path / PKG / "0.2.0"
    assert (tmp_path / PKG / "0.2.0" / "demo" / "sub" / "deep.py").is_file()
    assert not (tmp_path / PKG / "0.2.0" / "demo" / "core.py").exists()
    assert wheels.cached_versions(PKG) == ["0.2.0"]


def test_a_predicate_keeps_any_member_and_paths_never_leave_the_entry(tmp_path):
    files = dict(FILES) | {"../escape.py": "bad\n"}
    found = wheels.fetch(PKG, "0.1.0", lambda name: name.startswith(("demo", "..")),
                         cache=tmp_path / "c", download=FakePip(files=files))
    assert (found / "demo" / "data.json").is_file() and (found / "demo-0.1.0.dist-info" / "RECORD").is_file()
    assert not (tmp_path / "escape.py").exists() and not (tmp_path / "c" / "escape.py").exists()


@pytest.mark.parametrize("bad", ["latest", "0.1; rm -rf /", "../0.1.0", ""])
def test_malformed_version_never_reaches_pip(bad, tmp_path):
    with pytest.raises(wheels.UnknownPackageVersion, match="not a version number"):
        wheels.fetch(PKG, bad, ["demo/"], cache=tmp_path, download=_never)


def test_unwritable_cache_names_the_folder_and_the_setting(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(wheels.CACHE_ENV, str(blocker))
    with pytest.raises(CacheError, match=rf"{re.escape(str(blocker / PKG))}.*{wheels.CACHE_ENV}") as exc:
        wheels.fetch(PKG, "0.1.0", ["demo/"], download=_never)
    assert "\n" not in str(exc.value)


def test_a_concurrent_winner_is_used(tmp_path):
    base = tmp_path / "cache"

    def racing(version, dest, extra=()):
        _entry(base, version, time.time())          # another process finished first
        return FakePip()(version, dest, extra)

    assert wheels.fetch(PKG, "0.1.0", ["demo/"], cache=base, download=racing) == base / "0.1.0"
    assert _listing(base) == ["0.1.0"] and not (base / "0.1.0" / "demo" / "core.py").exists()


def test_a_foreign_folder_in_the_entrys_place_is_named(tmp_path):
    base = tmp_path / "cache"
    (base / "0.1.0" / "junk").mkdir(parents=True)
    with pytest.raises(wheels.PackageSourceError, match=r"0\.1\.0 exists but is not a complete cache entry"):
        wheels.fetch(PKG, "0.1.0", ["demo/"], cache=base, download=FakePip())
    assert _listing(base) == ["0.1.0"]


# --------------------------------------------------------------------------------------
# Eviction.


def test_stale_staging_folders_are_removed_at_the_next_download(tmp_path):
    base, old = tmp_path / "cache", time.time() - 2 * wheels.STAGING_STALE_S
    for name in (".0.1.0-abc123", ".0.5.13.post1-evicted-x1", ".0.2.0-fresh1", ".git", ".notes-x"):
        (base / name / "demo").mkdir(parents=True)
    for name in (".0.1.0-abc123", ".0.5.13.post1-evicted-x1", ".git", ".notes-x"):
        os.utime(base / name, (old, old))
    wheels.fetch(PKG, "0.3.0", ["demo/"], cache=base, download=FakePip())
    # an interrupted fetch's leftovers go; a fresh one (a fetch under way) and anything not ours stay
    assert _listing(base) == [".0.2.0-fresh1", ".git", ".notes-x", "0.3.0"]


def test_eviction_keeps_the_most_recently_used(tmp_path, monkeypatch):
    monkeypatch.setattr(wheels, "KEEP_RECENT", 3)
    base, now = tmp_path / "cache", time.time()
    for i, version in enumerate(["0.1.0", "0.1.1", "0.1.2", "0.1.3", "0.1.4"]):
        _entry(base, version, now - 10 * DAY + i * DAY)      # 0.1.4 used most recently, all idle
    wheels.fetch(PKG, "0.2.0", ["demo/"], cache=base, download=FakePip())
    assert wheels.cached_versions(PKG, base) == ["0.1.3", "0.1.4", "0.2.0"]


def test_recently_used_entries_are_spared_beyond_the_count(tmp_path, monkeypatch):
    """A run that reads every release (the matrix) must not evict what it read an hour ago."""
    monkeypatch.setattr(wheels, "KEEP_RECENT", 2)
    base, now = tmp_path / "cache", time.time()
    _entry(base, "0.1.0", now - 2 * DAY)
    for i, version in enumerate(["0.1.1", "0.1.2", "0.1.3"]):
        _entry(base, version, now - 3600 + i)
    wheels.fetch(PKG, "0.2.0", ["demo/"], cache=base, download=FakePip())
    assert wheels.cached_versions(PKG, base) == ["0.1.1", "0.1.2", "0.1.3", "0.2.0"]


def test_the_entry_returned_is_never_evicted(tmp_path, monkeypatch):
    monkeypatch.setattr(wheels, "KEEP_RECENT", 0)
    monkeypatch.setattr(wheels, "IDLE_S", -1.0)              # everything counts as idle
    base = tmp_path / "cache"
    _entry(base, "0.1.0", time.time())
    found = wheels.fetch(PKG, "0.2.0", ["demo/"], cache=base, download=FakePip())
    assert found.is_dir() and wheels.cached_versions(PKG, base) == ["0.2.0"]
    _entry(base, "0.3.0", 1.0)
    assert wheels.evict(base, spare="0.3.0", now=time.time()) == ["0.2.0"]
    assert wheels.cached_versions(PKG, base) == ["0.3.0"]


def test_eviction_never_follows_a_link_out_of_the_package_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(wheels, "KEEP_RECENT", 0)
    outside = _entry(tmp_path / "elsewhere", "0.1.0", 1.0)
    stale = tmp_path / "elsewhere" / ".0.1.0-old"
    stale.mkdir()
    os.utime(stale, (1.0, 1.0))
    base = tmp_path / "cache"
    base.mkdir()
    (base / "0.1.0").symlink_to(outside)
    (base / ".0.1.0-link").symlink_to(stale)
    assert wheels.evict(base, now=time.time()) == []
    assert outside.is_dir() and stale.is_dir()


# --------------------------------------------------------------------------------------
# Fallback wheel tags, and what pip's failures mean.


def _no_match(version: str, listed: str) -> str:
    return (f"ERROR: Could not find a version that satisfies the requirement {PKG}=={version} "
            f"(from versions: {listed})\nERROR: No matching distribution found for {PKG}=={version}\n")


def test_a_release_built_for_another_python_is_found_through_the_fallback_tags(tmp_path):
    first = wheels.FALLBACK_WHEEL_TAGS[1]
    pip = FakePip(fail=_no_match("0.5.0", "0.4.0"), ok=lambda extra: first[0] in extra)
    found = wheels.fetch(PKG, "0.5.0", ["demo/"], cache=tmp_path, download=pip)
    assert (found / "demo" / "core.py").is_file()
    tags = [("--python-version", py, "--platform", plat) for py, plat in wheels.FALLBACK_WHEEL_TAGS[:2]]
    assert [extra for _, extra in pip.calls] == [(), *tags]     # this interpreter first, then the list


def test_an_empty_listing_means_the_index_is_unreachable(tmp_path):
    _entry(tmp_path, "0.1.0", time.time())
    _entry(tmp_path, "0.10.0", time.time())
    _entry(tmp_path, "0.9.0", time.time())
    output = _no_match("0.5.0", "none") + "WARNING: NewConnectionError([Errno 111] Connection refused)"
    pip = FakePip(fail=output, ok=lambda extra: False)
    with pytest.raises(wheels.PackageIndexUnreachable,
                       match=r"index is unreachable .*Errno 111.*cached here: 0\.1\.0, 0\.9\.0, 0\.10\.0; "
                             r"go online once") as exc:
        wheels.fetch(PKG, "0.5.0", ["demo/"], cache=tmp_path, download=pip)
    assert not isinstance(exc.value, wheels.UnknownPackageVersion)
    assert len(pip.calls) == 1                   # no tag retries against an index that did not answer
    assert not (tmp_path / "0.5.0").exists()


def test_pip_failing_without_a_listing_is_unreachable(tmp_path):
    pip = FakePip(fail="ERROR: HTTP error 503 while getting https://pypi.org/simple/demo/",
                  ok=lambda extra: False)
    with pytest.raises(wheels.PackageIndexUnreachable,
                       match=rf"HTTP error 503.*nothing is cached in {re.escape(str(tmp_path))}"):
        wheels.fetch(PKG, "0.5.0", ["demo/"], cache=tmp_path, download=pip)


def test_a_version_absent_from_the_listing_is_unknown_after_every_tag(tmp_path):
    pip = FakePip(fail=_no_match("0.5.99", "0.5.8, 0.5.9, 0.5.10"), ok=lambda extra: False)
    with pytest.raises(wheels.UnknownPackageVersion,
                       match=r"demo 0\.5\.99 does not exist on the package index "
                             r"\(latest listed: 0\.5\.8, 0\.5\.9, 0\.5\.10\)") as exc:
        wheels.fetch(PKG, "0.5.99", ["demo/"], cache=tmp_path / "c", download=pip)
    assert isinstance(exc.value, BadOption)
    assert len(pip.calls) == 1 + len(wheels.FALLBACK_WHEEL_TAGS)
    assert not (tmp_path / "c").exists() or _listing(tmp_path / "c") == []


def test_a_listed_version_that_will_not_download_is_neither_unknown_nor_offline(tmp_path):
    pip = FakePip(fail=_no_match("0.5.9", "0.5.8, 0.5.9") + "ERROR: hash mismatch", ok=lambda extra: False)
    with pytest.raises(wheels.PackageSourceError, match="could not download a demo 0.5.9 wheel") as exc:
        wheels.fetch(PKG, "0.5.9", ["demo/"], cache=tmp_path, download=pip)
    assert type(exc.value) is wheels.PackageSourceError


def test_pip_success_without_a_wheel_is_an_error(tmp_path):
    def empty(version, dest, extra=()):
        return subprocess.CompletedProcess(["pip"], 0, "", "")

    with pytest.raises(wheels.PackageSourceError, match="left no demo 0.1.0 wheel"):
        wheels.fetch(PKG, "0.1.0", ["demo/"], cache=tmp_path, download=empty)


def test_the_cache_follows_xdg_unless_the_workbook_names_one(monkeypatch, tmp_path):
    monkeypatch.delenv(wheels.CACHE_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert wheels.cache_root("sglang") == tmp_path / "home" / ".cache" / "eagle3-workbook" / "sglang"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")      # the spec: a relative path is ignored
    assert wheels.cache_base() == tmp_path / "home" / ".cache" / "eagle3-workbook"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert wheels.cache_root("vllm-code") == tmp_path / "xdg" / "eagle3-workbook" / "vllm-code"
    monkeypatch.setenv(wheels.CACHE_ENV, str(tmp_path / "mine"))  # the workbook's own setting wins
    assert wheels.cache_root("sglang") == tmp_path / "mine" / "sglang"
