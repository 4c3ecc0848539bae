"""The GPU rehearsal's table: one row per run of .ci/device-check.sh, from the JSON each bench wrote.

    python .ci/device_summary.py RUNS_DIR [--json OUT.json]

Per run (NAME.json, NAME.log, NAME.rc in RUNS_DIR): the engine that ran and whose rules it was held to, the
layout it served, accept length, acceptance per draft position, speculative tok/s with the range over its
timed runs, speedup with its interval, the served slots the engine measured (when the run recorded them) and
the guard's verdict; then each run's guard lines from its log, as the engine printed them. A run that
failed or was skipped says so in its row. Standard library only: it runs with whatever python3 is there.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

GUARD_PREFIX = "eagle3-workbook guard"


def _num(x, fmt="{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def _measured(d: dict):
    """Served slots the engine itself measured, wherever the run put them (row, guard or fixes)."""
    for where in (d, d.get("guard") or {}):
        for key, value in where.items():
            if key.startswith("measured") and value:
                return value
    return None


def row(name: str, d: dict | None, rc: str, last: str = "") -> dict:
    if not d:
        why = f": {last[:120]}" if last else ""
        return {"run": name, "engine": "-", "status": f"no result (rc {rc}){why}"}
    if "skipped" in d:
        return {"run": name, "engine": "-", "status": f"skipped: {d['skipped']}"}
    timing = d.get("timing_detail") or {}
    spec_range = timing.get("spec_range")
    guard = d.get("guard") or {}
    return {
        "run": name,
        "engine": d.get("backend") or "reference",      # a live row names its engine; else the workbook's
        "rules": d.get("rules") or d.get("engine") or d.get("assumed_engine") or "-",
        "layout": d.get("served_layout") or d.get("layout"),
        "accept_length": d.get("accept_length", d.get("tau")),
        "per_position": d.get("accepted_per_position") or d.get("position_acceptance"),
        "spec_tok_s": d.get("spec_tok_s"),
        "spec_tok_s_range": spec_range,
        "baseline_tok_s": d.get("baseline_tok_s"),
        "speedup": d.get("speedup"),
        "speedup_interval": d.get("speedup_interval"),
        "timing": d.get("timing"),
        "measured_slots": _measured(d),
        "guard": guard.get("kind"),
        "lossless": d.get("lossless"),
        "status": f"ok (rc {rc})" if rc in ("0", "1") else f"rc {rc}",
    }


def table(rows: list[dict]) -> str:
    head = ["run", "engine", "rules", "layout", "accept", "per position", "spec tok/s [range]",
            "speedup [interval]", "measured slots", "guard", "status"]
    lines = []
    for r in rows:
        rng = r.get("spec_tok_s_range")
        ivl = r.get("speedup_interval")
        lines.append([
            r["run"], r["engine"], r.get("rules", "-"),
            str(tuple(r["layout"])) if r.get("layout") else "-",
            _num(r.get("accept_length")),
            " ".join(f"{x:.2f}" for x in r["per_position"]) if r.get("per_position") else "-",
            _num(r.get("spec_tok_s"), "{:.1f}") + (f" [{rng[0]:.1f}, {rng[1]:.1f}]" if rng else ""),
            _num(r.get("speedup"), "{:.3f}") + (f" [{ivl[0]:.3f}, {ivl[1]:.3f}]" if ivl else ""),
            str(r["measured_slots"]) if r.get("measured_slots") else "-",
            r.get("guard") or "-", r["status"]])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    rule = fmt.format(*("-" * w for w in widths))
    return "\n".join(ln.rstrip() for ln in [fmt.format(*head), rule] + [fmt.format(*ln) for ln in lines])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="device_summary.py")
    ap.add_argument("runs", type=Path)
    ap.add_argument("--json", type=Path, default=None, help="also write the rows and guard lines here")
    a = ap.parse_args(argv)
    rows, guards = [], {}
    for path in sorted(a.runs.glob("*.json"), key=lambda p: p.stat().st_mtime):
        name = path.stem
        rc_file = path.with_suffix(".rc")
        rc = rc_file.read_text().strip() if rc_file.is_file() else "?"
        try:
            data = json.loads(path.read_text() or "null")
        except json.JSONDecodeError:
            data = None
        log = path.with_suffix(".log")
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()] \
            if log.is_file() else []
        rows.append(row(name, data if isinstance(data, dict) else None, rc, lines[-1] if lines else ""))
        guards[name] = [ln for ln in lines if GUARD_PREFIX in ln]
    print(table(rows))
    for name, lines in guards.items():   # runs without a guard line print none
        for ln in dict.fromkeys(lines):           # one of each: every engine process prints its own
            print(f"  {name}: {ln}")
    if a.json is not None:
        a.json.write_text(json.dumps({"rows": rows, "guard_lines": guards}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
