"""What this host's runs of the kernels chapter (``notebook.kernels``) measured, kept for its next choice.

Two files in ``<cache>/kernels/``, each a JSON object keyed so that a value is reused only where the same
measurement would be made again (the engine's build, the pair, the widening, the weight type and this
CPU's model; a verify curve also llama-server's threads and the prompts' tokens):

- ``VERIFY_COSTS``: each weight type's verify curve, which the choice measures on a server of its own;
- ``DRAFT_COSTS``: the draft step the chapter's rows measured, in decode steps, which the next choice
  counts in each round.

The sentences that use them name the run that measured them; delete a file to measure again. An unreadable
or unwritable cache remembers nothing.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from pathlib import Path

from ..engines.llamacpp.bench import host_threads
from ..engines.llamacpp.costs import VerifyCurve
from ..rules.wheels import cache_root

DRAFT_COSTS = "draft-step-costs.json"
VERIFY_COSTS = "verify-costs.json"


class CurveMemory:
    """The verify curves this host's earlier runs of the choice measured, per weight type, in
    ``<cache>/kernels/VERIFY_COSTS``: keyed by the engine (its build), the pair, the widening, the weight
    type, this CPU's model, llama-server's threads and the prompts' tokens, so a curve is reused only where
    the same measurement would be made again. Delete the file to measure them again; an unreadable or
    unwritable cache remembers nothing."""

    def __init__(self, engine: str, pair: str, widen_by: int):
        self.engine, self.pair, self.widen_by = engine, pair, widen_by
        self.path = cache_root("kernels") / VERIFY_COSTS

    def _key(self, outtype: str, ids) -> str:
        tokens = hashlib.sha256(json.dumps([[int(t) for t in p.tolist()] for p in ids]).encode()).hexdigest()
        return (f"{self.engine}|{self.pair}|x{self.widen_by}|{outtype}|{host()}|threads {host_threads()}|"
                f"{tokens[:16]}")

    def get(self, outtype: str, ids) -> tuple[VerifyCurve, str] | None:
        d = _read_json(self.path).get(self._key(outtype, ids))
        try:
            curve = VerifyCurve(str(d["engine"]), float(d["decode"]),
                                {int(n): float(ms) for n, ms in d["verify"].items()})
        except (TypeError, KeyError, ValueError, AttributeError):
            return None
        if curve.decode <= 0 or not curve.verify or min(curve.verify.values()) <= 0:
            return None
        return curve, str(d.get("measured", "?"))

    def put(self, outtype: str, ids, curve: VerifyCurve) -> None:
        _write_json(self.path, self._key(outtype, ids), {
            "engine": curve.engine, "decode": round(curve.decode, 4),
            "verify": {str(n): round(ms, 4) for n, ms in curve.verify.items()},
            "measured": time.strftime("%Y-%m-%d %H:%M")})


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_json(path: Path, key: str, value: dict) -> None:
    """``value`` under ``key`` in the JSON object at ``path``, written whole (a reader never sees half)."""
    data = _read_json(path)
    data[key] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass


def host() -> str:
    """This CPU's model name, which a remembered cost is keyed by (a cache shared between hosts)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _draft_cost_key(engine: str, pair: str, widen_by: int, outtype: str) -> str:
    return f"{engine}|{pair}|x{widen_by}|{outtype}|{host()}"


def remembered_draft_costs(engine: str, pair: str, widen_by: int) -> dict[str, dict]:
    """Per weight type, the draft step in decode steps that this host's last run of the chapter measured
    (``remember_draft_costs``): ``{"decodes", "measured"}``."""
    data = _read_json(cache_root("kernels") / DRAFT_COSTS)
    out = {}
    for key, d in data.items():
        engine_, pair_, widen_, outtype, host_ = (key.split("|") + [""] * 5)[:5]
        if (engine_, pair_, widen_, host_) != (engine, pair, f"x{widen_by}", host()):
            continue
        if isinstance(d, dict) and isinstance(d.get("decodes"), (int, float)) and d["decodes"] >= 0:
            out[outtype] = {"decodes": float(d["decodes"]), "measured": str(d.get("measured", "?"))}
    return out


def remember_draft_costs(engine: str, pair: str, settings: dict, rows) -> None:
    """Keep the median draft step of a run's ``rows`` (``LiveRow``), in decode steps, where it could be
    derived (a row whose round cost less than its verify measured alone gives none), for the next choice
    here; ``settings``: the run's (its widening and weight type)."""
    costs = [r.costs["draft_step"] / r.costs["decode"] for r in rows
             if r.costs and r.costs.get("decode") and r.costs.get("draft_step") is not None
             and r.costs["draft_step"] >= 0]
    if not costs or not engine or not settings.get("outtype") or not settings.get("widen"):
        return
    _write_json(cache_root("kernels") / DRAFT_COSTS,
                _draft_cost_key(engine, pair, int(settings["widen"]), str(settings["outtype"])),
                {"decodes": round(statistics.median(costs), 4), "measured": time.strftime("%Y-%m-%d %H:%M"),
                 "rows": len(costs)})
