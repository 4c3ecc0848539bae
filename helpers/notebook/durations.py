"""How long a workbook run takes on this machine, said before it starts.

Every run that finishes is kept in the cache (``<cache>/runs/workbook-runs.json``, the last few of each
kind): its seconds per notebook and in all, and what kind of run it was (the notebooks and every parameter
but the paths). A run of a kind that finished here before is announced from the newest such run; a first
one from the project's measurements of the default run on its 2-core hosts (``REFERENCES``, with the date
and the commit; docs/timing.md), said to be another machine's. A llama-server build started beside the run
(``bash workbook.sh run`` on a fresh machine) is said too: the timed notebooks wait for it.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

HISTORY = "workbook-runs.json"
KEEP = 64           # kinds of run kept, the most recently run (the suite's own small runs are ~30 kinds)
PER_KIND = 3        # runs kept of each kind, the last
BUILD_LOG_ENV = "EAGLE3_WORKBOOK_LLAMACPP_BUILD_LOG"   # set by `bash workbook.sh run` when it started a build


@dataclass(frozen=True)
class Reference:
    """A measured default run (``bash workbook.sh run``) on one of the project's 2-core hosts, quoted where
    this machine has none of its own."""

    host: str
    first_s: float          # a new clone, empty caches: venvs, llama-server's build, the notebooks
    later_s: float          # the same run again, everything in place
    measured: str           # when, which commit


# docs/timing.md, "The first run and later runs"
REFERENCES = (Reference("Intel Xeon with AMX", 946.0, 485.0, "2026-12-07, 077f2bf and 81c9ebd"),
              Reference("AMD EPYC", 782.0, 411.0, "2026-12-07, e3aa4a4"),
              Reference("Intel Xeon without AMX", 957.0, 498.0, "2026-12-07, e3aa4a4"))


def _span(attr: str) -> str:
    """The fastest and the slowest of the project's hosts' times for ``attr`` (``first_s`` or ``later_s``),
    each named."""
    refs = sorted(REFERENCES, key=lambda r: getattr(r, attr))
    return " to ".join(f"{_minutes(getattr(r, attr))} ({r.host})" for r in dict.fromkeys((refs[0], refs[-1])))


def kind_of(names: list[str], params: dict, path_params: tuple[str, ...] = ()) -> str:
    """What makes two runs comparable: the notebooks and every parameter but the paths."""
    kept = {k: v for k, v in params.items() if k not in path_params and k != "REPORTS_DIR"}
    return json.dumps({"notebooks": list(names), "params": kept}, sort_keys=True, default=str)


def _path():
    # imported here: `first_run_line` runs on the system Python before .venv exists, with the standard library
    from ..rules.wheels import cache_root
    return cache_root("runs") / HISTORY


def history() -> list[dict]:
    try:
        data = json.loads(_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [r for r in data if isinstance(r, dict) and isinstance(r.get("seconds"), (int, float))] \
        if isinstance(data, list) else []


def _minutes(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"


def start_line(kind: str, cores: int | None = None) -> str:
    """The line a run starts with: how long it should take here, and on what that rests."""
    cores = cores or os.cpu_count() or 1
    building = bool(os.environ.get(BUILD_LOG_ENV))
    build = (" llama-server is being built beside it (its first build on this machine); the notebooks "
             "that time a speed wait for it." if building else "")
    same = [r for r in history() if r.get("kind") == kind]
    # a run that waited on llama-server's build is like this one only if this one builds too
    alike = [r for r in same if bool(r.get("built_llama_server")) == building]
    if alike:
        last = alike[-1]
        return (f"[run] about {_minutes(last['seconds'])} here: the last run like this one on this machine "
                f"took that ({last.get('date', '?')}).{build}")
    if same and building:
        last = same[-1]
        return (f"[run] the last run like this one on this machine took {_minutes(last['seconds'])} "
                f"({last.get('date', '?')}) with llama-server already built; expect longer.{build}")
    if same:
        last = same[-1]
        return (f"[run] the last run like this one on this machine took {_minutes(last['seconds'])} "
                f"({last.get('date', '?')}) while llama-server was built beside it; this one has no build to "
                f"wait on and should take less (the project's 2-core hosts: {_span('later_s')}).")
    return (f"[run] no run like this one has finished on this machine ({cores} cores) yet; the default run "
            f"on the project's 2-core hosts took {_span('first_s')} the first time and {_span('later_s')} "
            f"later.{build}")


def first_run_line(cores: int | None = None) -> str:
    """What ``bash workbook.sh run`` says before it installs anything on a machine without ``.venv``: the
    first run's whole length (setup, builds, notebooks), measured on the project's host, said to be that."""
    cores = cores or os.cpu_count() or 1
    fewer = " (this machine has fewer cores: expect longer)" if cores < 2 else ""
    return (f"[run] first run on this machine ({cores} cores): it installs .venv and SGLang's venv, builds "
            f"llama-server, then runs notebooks 01-06; from a new clone that took {_span('first_s')} on the "
            f"project's 2-core hosts, and {_span('later_s')} each time after{fewer}.")


def record(kind: str, seconds: float, notebooks: dict[str, float]) -> None:
    """Keep a finished run's times: the last ``PER_KIND`` of each kind, for the ``KEEP`` kinds run most
    recently (so many small runs of other kinds never push out the default run's); a cache that cannot be
    written is passed over."""
    runs = history() + [{"kind": kind, "seconds": round(seconds, 1), "notebooks": notebooks,
                         "date": time.strftime("%Y-%m-%d %H:%M"),
                         "built_llama_server": bool(os.environ.get(BUILD_LOG_ENV))}]
    recent = list(dict.fromkeys(r.get("kind") for r in reversed(runs)))[:KEEP]
    kept, per = [], {}
    for r in reversed(runs):
        k = r.get("kind")
        if k in recent and per.get(k, 0) < PER_KIND:
            per[k] = per.get(k, 0) + 1
            kept.append(r)
    path = _path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(kept[::-1], indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass
