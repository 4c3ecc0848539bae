"""The reports each notebook leaves in ``reports/``, as typed records.

Notebook 06 reads what 05 wrote, ``run-workbook``'s index page reads ``summary.json``, and other
tools read ``summary.json`` and the step files by key. While the format lived only inside
notebook cells, a renamed key broke a reader far away and silently; here each file has one record
class that says its keys and their types, one writer and one reader, so a report that is missing
or from another version fails where it is read, naming the file and the notebook to (re)run.

The JSON keys are the record's field names unless a field's metadata names another key (JSON keys
such as ``fixA`` or ``02_isolate`` are not Python names). Fields marked ``optional`` are left out
of the file when they are None, as the notebooks always did.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from ..errors import BadConfig, read_json_file, strict_json

# The notebooks in the order a run executes them: each step's report is read by later ones.
ORDER = ["01_baseline_throughput", "02_isolate_draft", "03_compare_concat_orders",
         "04_layer_boundary_forward", "05_apply_patch", "06_rebenchmark"]
# The notebooks that time a speed (the benchmarks); the others measure nothing a busy core would change.
TIMED = ("01_baseline_throughput", "06_rebenchmark")


class ReportError(BadConfig):
    """A step's report that cannot be used: not JSON, or not what its notebook writes."""


class MissingReport(ReportError):
    """A step's report that is not there: the notebook that writes it has not run."""


def _key(name: str | None = None, optional: bool = False) -> dict:
    return {"key": name, "optional": optional}


def _optional(name: str | None = None):
    return field(default=None, metadata=_key(name, optional=True))


@dataclass
class PlanRef:
    """A layout as a report quotes it: the boundaries, where they came from, and (for the served
    layout) why the engine cannot feed them, if it cannot."""

    layout: list[int]
    source: str
    problems: list[str] | None = _optional()


@dataclass
class FixA:
    """Fix A as notebook 05 leaves it: the draft copy with engine ids and what they now serve."""

    draft: str
    ids: list[int]
    layout: list[int]
    errors: list[str]


@dataclass
class BaselineStep:
    """Notebook 01: the deployed wiring and its benchmark (None when it cannot be served)."""

    FILE: ClassVar[str] = "01_baseline.json"
    NOTEBOOK: ClassVar[str] = ORDER[0]

    plan: dict
    problems: list[str]
    served: dict | None
    seed_break_even_tau: float
    live: dict | None = _optional()        # the deployed wiring on the real engine (BACKEND="vllm")
    bench: dict | None = _optional()       # what the measurement depended on (``measurement_key``):
                                           # notebook 06 reuses it when its own is the same
    kernels: dict | None = _optional()     # the deployed wiring on llama.cpp's kernels (``KernelsRun``)


@dataclass
class IsolateStep:
    """Notebook 02: the draft scored outside the engine, fed each wiring."""

    FILE: ClassVar[str] = "02_isolate.json"
    NOTEBOOK: ClassVar[str] = ORDER[1]

    trained: PlanRef
    served: PlanRef
    rows: list[dict]
    tokens: int
    source: str                      # "target capture" or "dump"
    dump: dict | None = _optional()  # the dump diagnosis, when the test ran from a trainer's dump
    wiring: dict | None = _optional()  # the verdict: mismatch (by rule), cost, significant, verdict line


@dataclass
class LayoutsStep:
    """Notebook 03: the layout search's ranking (``SearchResult.to_dict``) and where the served
    layout stands in it."""

    FILE: ClassVar[str] = "03_layouts.json"
    NOTEBOOK: ClassVar[str] = ORDER[2]

    best_layout: list[int]
    runner_up: list[int] | None
    margin: float | None             # None where there was no runner-up (JSON has no NaN)
    margin_acc: float | None
    z: float | None
    mode: str
    evaluations: int
    seconds: float
    tokens: int
    ranking: list[dict]
    notes: list[str]
    served_layout: list[int]
    served_rank: int | None
    heatmap: list[dict]
    permutations: list[dict]
    margin_ce: float | None = _optional()   # beside the ranking: ce margin of the runner-up (nats)
    confident: bool | None = _optional()
    ranked_by: str | None = _optional()      # the ranking's measure (accepted tokens per verify step)
    steps: int | None = _optional()
    blocks: int | None = _optional()         # paired-test blocks behind z
    wiring: dict | None = _optional()        # the verdict: mismatch, cost, significant, verdict line


@dataclass
class BoundaryStep:
    """Notebook 04: the engine source's capture machinery, the ids-to-boundaries table, what each
    boundary is on the target, and the same draft across engines."""

    FILE: ClassVar[str] = "04_boundary.json"
    NOTEBOOK: ClassVar[str] = ORDER[3]

    wiring: dict
    plus_one: list[dict]
    identities: list[dict]
    conventions: list[dict]


@dataclass
class PatchStep:
    """Notebook 05: the patched engine source and the two fixes notebook 06 measures."""

    FILE: ClassVar[str] = "05_patch.json"
    NOTEBOOK: ClassVar[str] = ORDER[4]

    engine: str
    root: str | None                 # the patched SGLang tree; None for an engine that needs no patch
    trained: list[int]
    fix_a: FixA | None = field(metadata=_key("fixA"))
    before: dict                     # the resolver on the pristine source (WiringResult.to_dict)
    fix_b: str | None = field(metadata=_key("fixB"))    # the retrained draft, if there is one
    fc_reordered: str | None         # the draft with fc slots reordered, when training's were not ascending


@dataclass
class Summary:
    """Notebook 06's before/after, the file other tools read: ``rows`` and ``costs`` hold one
    entry per configuration (see ``bench_tables``), and notebooks 02 and 03's findings are quoted
    when they ran."""

    FILE: ClassVar[str] = "summary.json"
    NOTEBOOK: ClassVar[str] = ORDER[5]

    headline: str
    engine: str
    draft_steps: int
    max_new_tokens: int
    prompts: int
    repeats: int
    target: str
    draft: str
    rows: list[dict]
    costs: list[dict]
    details: dict
    isolate: dict | None = _optional("02_isolate")
    layouts: dict | None = _optional("03_layouts")
    live: list[dict] | None = _optional()  # each wiring on the real engine, its reference figures beside it
    # what the table cannot say (which rows are faster beyond their interval, why a timing is noisy, the
    # break-even, which runs disagree): printed after the table in summary.md and the index page
    notes: str | None = _optional()
    kernels: dict | None = _optional()  # every wiring on llama.cpp's kernels at a real target's cost

    def after_table(self) -> str:
        """The prose under the table: the notes, or the headline for a summary written before they were."""
        return self.notes or self.headline

    def table(self) -> list[dict]:
        """The table a person reads first: a row per wiring and engine (llama.cpp's kernels at a real
        target's cost first where they ran, then the real engine's row and the reference engine's), the
        engine named in each, from the fields this record holds."""
        live = {r.get("wiring"): r for r in self.live or []}
        out = kernel_rows(self.kernels)
        for row in self.rows:
            w = row["wiring"]
            lr = live.get(w)
            if lr is not None:
                engine = str(lr.get("backend", ""))
                if lr.get("rules"):
                    engine += f" ({lr['rules']})"
                out.append({"wiring": w, "engine": engine, "pair": self.pair(),
                            "layout": lr.get("served_layout"),
                            "accept_length": lr.get("accept_length"),
                            "per_position": lr.get("accepted_per_position"),
                            "speedup": lr.get("speedup"), "speedup_interval": lr.get("speedup_interval"),
                            "timing": lr.get("timing"), "baseline_tok_s": lr.get("baseline_tok_s"),
                            "spec_tok_s": lr.get("spec_tok_s"), "lossless": lr.get("lossless")})
            detail = self.details.get(w, {}) if isinstance(self.details, dict) else {}
            out.append({"wiring": w, "engine": row.get("engine", "reference"), "pair": self.pair(),
                        "layout": row.get("layout"),
                        "accept_length": row.get("tau"), "per_position": detail.get("position_acceptance"),
                        "speedup": row.get("speedup"), "speedup_interval": row.get("speedup_interval"),
                        "timing": row.get("timing"), "baseline_tok_s": row.get("baseline_tok_s"),
                        "spec_tok_s": row.get("spec_tok_s"), "lossless": row.get("lossless")})
        return out

    def finding(self) -> str:
        """The run in one sentence: what each wiring accepts and what that does to speed, on the engine
        that measured it (the real engine where one ran, else the reference engine)."""
        return finding_of(self.table())

    def pair(self) -> str:
        """The pair notebooks 01-06 ran, by its folder (``tiny-kimi``), else its target's path."""
        return pair_label(self.target)

    def by_pair(self) -> list[tuple[str, list[dict]]]:
        """``table``'s rows grouped by the pair they measured, in table order: llama.cpp's kernels chapter
        runs its own pair (a Llama target widened to a real model's cost), the other rows the run's."""
        groups: dict[str, list[dict]] = {}
        for r in self.table():
            groups.setdefault(r["pair"], []).append(r)
        return list(groups.items())


def pair_label(target: str | Path) -> str:
    t = Path(str(target))
    return t.parent.name if t.name == "target" and t.parent.name else str(t)


def finding_of(rows: list[dict]) -> str:
    """One sentence for rows of one pair: each wiring's accept length and speed on the first row's engine."""
    if not rows:
        return "No wiring could be measured in this run."
    engine = rows[0]["engine"]
    parts = [f"{r['wiring']} {_accepts(r)}" for r in rows if r["engine"] == engine]
    name = "the reference engine" if engine == "reference" else engine
    return f"On {name}, against no speculation: " + "; ".join(parts) + "."


def kernel_rows(kernels: dict | None) -> list[dict]:
    """A ``kernels.KernelsRun`` record's rows in ``Summary.table``'s shape, the engine named with the
    target it ran (``llama.cpp b11434 (llama-server, cpu), tiny-llama x96 f16``)."""
    if not kernels:
        return []
    st = kernels.get("settings", {})
    engine = (f"{kernels.get('engine', '')}, {Path(str(st.get('pair', ''))).name} x{st.get('widen')} "
              f"{st.get('outtype')}")
    pair = (f"{Path(str(st.get('pair', ''))).name} (its target widened x{st.get('widen')}, "
            f"{st.get('outtype')}), the kernels chapter's pair")
    return [{"wiring": r["wiring"], "engine": engine, "pair": pair, "layout": r.get("served_layout"),
             "accept_length": r.get("accept_length"), "per_position": r.get("accepted_per_position"),
             "speedup": r.get("speedup"), "speedup_interval": r.get("speedup_interval"),
             "timing": r.get("timing"), "baseline_tok_s": r.get("baseline_tok_s"),
             "spec_tok_s": r.get("spec_tok_s"), "lossless": r.get("lossless")}
            for r in kernels.get("rows", [])]


def _direction(r: dict) -> str:
    """A row's speedup as the words its interval supports (as printed, two decimals)."""
    iv, sp = r.get("speedup_interval"), r.get("speedup")
    if not isinstance(sp, (int, float)):
        return "speed not measured"
    if r.get("timing") == "unusable" or not iv:
        return f"{sp:.2f}x, no usable interval"
    lo, hi = (float(f"{x:.2f}") for x in iv)
    word = "faster" if lo > 1 else "slower" if hi < 1 else "no measurable difference"
    return f"{sp:.2f}x [{lo:.2f}, {hi:.2f}] ({word})"


def _accepts(r: dict) -> str:
    tau = r.get("accept_length")
    tau = f"{tau:.2f} tokens per step" if isinstance(tau, (int, float)) else "no accept length"
    return f"{tau} at {_direction(r)}"


TABLE_HEAD = ("wiring", "engine", "layout", "accept length", "per position", "speedup [95%]", "timing",
              "baseline tok/s", "EAGLE-3 tok/s", "lossless")


def table_cells(r: dict) -> list[str]:
    """One row of ``Summary.table`` as the text its cells show (the index page and summary.md alike)."""
    def num(x, fmt):
        return format(x, fmt) if isinstance(x, (int, float)) and not isinstance(x, bool) else "-"

    iv = r.get("speedup_interval")
    speed = num(r.get("speedup"), ".2f") + "x" + (f" [{iv[0]:.2f}, {iv[1]:.2f}]" if iv else "")
    pos = r.get("per_position")
    per = ", ".join(f"{x:.0%}" for x in pos) if pos else "-"
    lossless = {True: "yes", False: "NO"}.get(r.get("lossless"), "-")
    return [str(r["wiring"]), str(r.get("engine", "")), str(r.get("layout")),
            num(r.get("accept_length"), ".2f"), per, speed, str(r.get("timing") or "-"),
            num(r.get("baseline_tok_s"), ".1f"), num(r.get("spec_tok_s"), ".1f"), lossless]


Record = TypeVar("Record")

# summary.json's two tables, built from ``BenchResult.row``; the costs table calls the speedup
# "measured" to set it beside the predicted one.
ROW_COLUMNS = ("wiring", "engine", "layout", "baseline_tok_s", "spec_tok_s", "speedup", "speedup_interval",
               "timing", "tau", "accept_rate", "speedup_per_tau", "lossless")
COST_COLUMNS = ("wiring", "decode_ms", "verify_ms", "draft_step_ms", "draft_cost_ratio", "predicted_speedup",
                "measured_speedup", "break_even_tau", "slower_prompts")
_ROW_KEY = {"measured_speedup": "speedup"}
# what the summary quotes of notebooks 02 and 03 (whichever keys each has)
QUOTED = ("trained", "served", "rows", "best_layout", "margin", "z", "served_rank")


# --------------------------------------------------------------------------------------
# Records to JSON and back.


def _json_key(f: dataclasses.Field) -> str:
    return f.metadata.get("key") or f.name


def to_json(record) -> dict:
    """Nested records become objects and unset optional fields disappear, so the file holds exactly
    the keys the notebooks wrote before there were records."""
    out = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if value is None and f.metadata.get("optional"):
            continue
        out[_json_key(f)] = to_json(value) if dataclasses.is_dataclass(value) else value
    return out


def _type_name(hint) -> str:
    return getattr(hint, "__name__", None) if not typing.get_args(hint) else str(hint).replace("typing.", "")


def _conform(value, hint, where: str, problems: list[str]):
    """``value`` checked against ``hint`` (nested records built); a mismatch is added to
    ``problems`` as 'where: what came, what was expected'."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        real = [a for a in args if a is not type(None)]
        if len(real) == 1 and dataclasses.is_dataclass(real[0]):   # say what is wrong inside it
            return _conform(value, real[0], where, problems)
        for arg in real:
            trial: list[str] = []
            out = _conform(value, arg, where, trial)
            if not trial:
                return out
    elif dataclasses.is_dataclass(hint):
        if isinstance(value, dict):
            return _build(hint, value, where, problems)
    elif origin is list or hint is list:
        if isinstance(value, list) and not args:
            return value
        if isinstance(value, list):
            return [_conform(v, args[0], f"{where}[{i}]", problems) for i, v in enumerate(value)]
    elif origin is dict or hint is dict:
        if isinstance(value, dict):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(value, hint):
        return value
    shown = repr(value)
    shown = shown[:60] + "..." if len(shown) > 60 else shown
    problems.append(f"{where} is {shown}, expected {_type_name(hint)}")
    return value


def _build(cls, data: dict, where: str, problems: list[str]):
    hints = typing.get_type_hints(cls)
    kw, missing = {}, []
    for f in dataclasses.fields(cls):
        key = _json_key(f)
        if key not in data:
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            if not has_default:
                missing.append(f"{where}.{key}" if where else key)
            continue
        kw[f.name] = _conform(data[key], hints[f.name], f"{where}.{key}" if where else key, problems)
    if missing:
        problems.insert(0, f"no {', '.join(missing)}")
    return None if missing else cls(**kw)


def from_json(cls: type[Record], data, where: str = "") -> Record:
    """A record from its file's JSON object; ReportError lists every key that is missing or of
    the wrong type (``where`` names the file)."""
    expected = f"expected the JSON object notebook {cls.NOTEBOOK[:2]} ({cls.NOTEBOOK}) writes"
    if not isinstance(data, dict):
        raise ReportError(f"{where or cls.FILE} holds {type(data).__name__}, {expected}; "
                          f"rerun notebook {cls.NOTEBOOK[:2]}")
    problems: list[str] = []
    record = _build(cls, data, "", problems)
    if problems:
        raise ReportError(f"{where or cls.FILE}: {'; '.join(problems)}; {expected} (an older workbook's, or "
                          f"an edited file?); rerun notebook {cls.NOTEBOOK[:2]}")
    return record


# --------------------------------------------------------------------------------------
# Files.


def step_path(reports_dir, cls) -> Path:
    return Path(reports_dir) / cls.FILE


def write_step(reports_dir, record) -> Path:
    """Write ``record`` to its file under ``reports_dir`` whole or not at all: a kernel stopped
    halfway must not leave a truncated report for the next notebook to misread."""
    path = step_path(reports_dir, type(record))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # strict: JSON readers other than Python's reject NaN; default=str: paths and enums as text
    tmp.write_text(strict_json(to_json(record), indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_step(reports_dir, cls: type[Record]) -> Record:
    """The record notebook ``cls.NOTEBOOK`` wrote; MissingReport says which notebook to run."""
    path = step_path(reports_dir, cls)
    nn = cls.NOTEBOOK[:2]
    if not path.is_file():
        raise MissingReport(f"{path} is missing: notebook {nn} ({cls.NOTEBOOK}) writes it; "
                            f"run notebook {nn} first, with the same REPORTS_DIR")
    try:
        data = read_json_file(path, f"report of notebook {nn}")
    except BadConfig as exc:
        raise ReportError(f"{exc}; rerun notebook {nn} to write it again") from None
    return from_json(cls, data, str(path))


def read_step_if_any(reports_dir, cls: type[Record]) -> Record | None:
    """The record, or None when its notebook has not run; a malformed one still fails."""
    return read_step(reports_dir, cls) if step_path(reports_dir, cls).is_file() else None


def measurement_key(pair, rules, engine: str, layout, prompt_ids, *, steps: int, max_new_tokens: int,
                    repeats: int, device: str) -> dict:
    """Everything a benchmark of one wiring depends on: the pair, whose rules, which engine measured
    (its label names the runtime and release), the layout, the prompts (their token ids, hashed), the
    draft steps, the tokens, the repeats and the device. Notebook 01 records it beside its measurement of
    the deployed wiring; notebook 06 uses that measurement instead of repeating it only when its own key
    is the same, item for item."""
    ids = json.dumps([[int(t) for t in p] for p in prompt_ids], separators=(",", ":"))
    return {"target": str(Path(pair.target_dir).resolve()), "draft": str(Path(pair.draft_dir).resolve()),
            "rules": str(rules), "engine": engine, "layout": [int(b) for b in layout],
            "prompts": len(prompt_ids), "prompts_sha256": hashlib.sha256(ids.encode()).hexdigest(),
            "steps": int(steps), "max_new_tokens": int(max_new_tokens), "repeats": int(repeats),
            "device": str(device)}


# --------------------------------------------------------------------------------------
# The summary.


def bench_tables(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """``BenchResult.row`` dicts split into summary.json's ``rows`` and ``costs``."""
    return ([{k: r[k] for k in ROW_COLUMNS} for r in rows],
            [{k: r[_ROW_KEY.get(k, k)] for k in COST_COLUMNS} for r in rows])


def quoted_steps(reports_dir) -> dict:
    """``Summary`` keyword arguments quoting notebooks 02 and 03, where they ran."""
    out = {}
    for name, cls in (("isolate", IsolateStep), ("layouts", LayoutsStep)):
        step = read_step_if_any(reports_dir, cls)
        out[name] = None if step is None else {k: v for k, v in to_json(step).items() if k in QUOTED}
    return out


def write_summary(reports_dir, summary: Summary) -> Path:
    """summary.json, and summary.md for people: the table first (a row per wiring and engine, the engine
    named in each), then the headline, which says only what the table cannot."""
    path = write_step(reports_dir, summary)
    head = "| " + " | ".join(TABLE_HEAD) + " |"
    rule = "|" + "|".join("---" for _ in TABLE_HEAD) + "|"
    body = ["| " + " | ".join(table_cells(r)) + " |" for r in summary.table()]
    md = ["# EAGLE-3 wiring workbook: summary", "", head, rule, *body, "", summary.after_table()]
    (Path(reports_dir) / "summary.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    return path


def read_summary(reports_dir) -> Summary:
    return read_step(reports_dir, Summary)


def frame_records(frame) -> list[dict]:
    """A DataFrame's rows as JSON-ready dicts: pandas' own writer already turns numpy scalars,
    tuples and NaN into plain JSON, which ``json.dumps`` of ``to_dict`` would not."""
    return json.loads(frame.to_json(orient="records"))
