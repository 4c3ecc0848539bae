"""Every engine the workbook starts is stopped on every exit path: ``close()``, a ``with`` block's end,
interpreter exit, and SIGTERM. The handlers are installed when the first engine starts (never at
import: importing a helper must not change how the importing process dies)."""
from __future__ import annotations

import atexit
import os
import signal
import weakref

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
