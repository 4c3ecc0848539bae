"""Every engine the workbook starts is stopped on every exit path: ``close()``, a ``with`` block's end,
interpreter exit, and SIGTERM. The handlers are installed when the first engine starts (never at
import: importing a helper must not change how the importing process dies)."""
from __future__ import annotations

import atexit
import os
import signal
import weakref
from pathlib import Path

_LIVE: "weakref.WeakSet" = weakref.WeakSet()
_installed = {"done": False}


class Stoppable:
    """A started engine: ``with Engine(...) as e:`` stops it on leaving the block, whatever happens there."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def track(engine) -> None:
    """Register a started engine (anything with ``close()``); installs the handlers on first use."""
    _install()
    _LIVE.add(engine)


def untrack(engine) -> None:
    _LIVE.discard(engine)


def live() -> list:
    return list(_LIVE)


def stop_all(*_args) -> None:
    for engine in list(_LIVE):
        engine.close()


SHM = Path("/dev/shm")


def shm_names() -> frozenset[str]:
    """What /dev/shm holds now (empty where there is none): taken before an engine starts, so that what it
    leaves there can be told from what was there already."""
    try:
        return frozenset(p.name for p in SHM.iterdir())
    except OSError:
        return frozenset()


def _held_in_shm() -> set[str]:
    """The /dev/shm names some live process of this user still maps or holds open."""
    held, uid = set(), os.getuid()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if proc.stat().st_uid != uid:
                continue
            for line in (proc / "maps").read_text(encoding="utf-8", errors="replace").splitlines():
                if "/dev/shm/" in line:
                    held.add(line.rsplit("/dev/shm/", 1)[1].split()[0])
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("/dev/shm/"):
                    held.add(target[len("/dev/shm/"):].split()[0])
        except OSError:          # the process ended while it was read
            continue
    return held


def reclaim_shm(before: frozenset[str], prefixes: tuple[str, ...]) -> list[str]:
    """Unlink what a stopped engine left in /dev/shm: names that were not there before it started, that
    start with one of the engine's ``prefixes``, belong to this user, and that no live process maps or holds
    open. An engine's group killed after its grace period runs none of its own unlinks (SGLang 0.5.23
    leaves a load-snapshot slot file and a multiprocessing semaphore per launch). Returns what it removed."""
    new = [n for n in shm_names() - before if n.startswith(prefixes)]
    if not new:
        return []
    held, removed = _held_in_shm(), []
    for name in new:
        path = SHM / name
        try:
            if name in held or path.stat().st_uid != os.getuid():
                continue
            path.unlink()
            removed.append(name)
        except OSError:
            continue
    return removed


def _install() -> None:
    if _installed["done"]:
        return
    _installed["done"] = True
    atexit.register(stop_all)
    if hasattr(signal, "SIGTERM") and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        def _on_sigterm(signum, frame):
            # stop the engines, then die of the signal as the process would have: raising SystemExit
            # here could be caught by the caller (a test runner) and let it start the next engine
            stop_all()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        try:
            signal.signal(signal.SIGTERM, _on_sigterm)
        except ValueError:       # not the main thread (a notebook's helper thread): atexit still stops them
            pass
