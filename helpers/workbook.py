"""The main job: execute notebooks 01-06 in order with papermill and render ``reports/``.

Each notebook runs on the same parameters (the embedded default unless told otherwise),
lands in ``reports/`` executed, and is rendered to HTML twice: a report view (code hidden,
for sharing) and a full view. An index page links them and shows the before/after table
that notebook 06 wrote to ``summary.json``.
"""
from __future__ import annotations

import argparse
import html
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
ORDER = ["01_baseline_throughput", "02_isolate_draft", "03_compare_concat_orders",
         "04_layer_boundary_forward", "05_apply_patch", "06_rebenchmark"]

SMALL = {"NUM_PROMPTS": 2, "MAX_NEW_TOKENS": 24, "REPEATS": 1, "EVAL_WINDOWS": 3, "DRAFT_STEPS": 3,
         "SEARCH_WINDOWS": 2}


@dataclass
class RunRecord:
    name: str
    seconds: float
    ok: bool
    error: str = ""
    outputs: list[str] = field(default_factory=list)


def notebook_parameters(path: Path) -> dict:
    """The parameters cell's names, so overrides that a notebook does not take are dropped."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            names = {}
            for line in cell.source.splitlines():
                if "=" in line and not line.startswith((" ", "#")):
                    names[line.split("=")[0].strip()] = True
            return names
    return {}


def render_html(executed: Path, out_dir: Path) -> list[str]:
    from nbconvert import HTMLExporter
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    written = []
    for suffix, hide in (("", True), ("_code", False)):
        exp = HTMLExporter(template_name="lab")
        exp.exclude_input = hide
        exp.exclude_input_prompt = hide
        exp.exclude_output_prompt = True
        body, _ = exp.from_notebook_node(nb)
        target = out_dir / f"{executed.stem}{suffix}.html"
        target.write_text(body)
        written.append(target.name)
    return written


def index_page(out_dir: Path, runs: list[RunRecord], params: dict) -> Path:
    summary = out_dir / "summary.json"
    table = ""
    if summary.is_file():
        s = json.loads(summary.read_text())
        rows = "".join(
            f"<tr><td>{html.escape(r['wiring'])}</td><td>{html.escape(str(r['layout']))}</td>"
            f"<td>{r['baseline_tok_s']:.1f}</td><td>{r['spec_tok_s']:.1f}</td><td>{r['speedup']:.2f}x</td>"
            f"<td>{r['tau']:.2f}</td><td>{'yes' if r['lossless'] else 'NO'}</td></tr>" for r in s.get("rows", []))
        table = ("<h2>Before and after</h2><table><tr><th>wiring</th><th>layout</th><th>baseline tok/s</th>"
                 "<th>EAGLE-3 tok/s</th><th>speedup</th><th>accept length</th><th>lossless</th></tr>"
                 f"{rows}</table><p>{html.escape(s.get('headline', ''))}</p>")
    items = "".join(
        f"<li><b>{html.escape(r.name)}</b> &mdash; "
        + (" ".join(f"<a href='{o}'>{'report' if not o.endswith('_code.html') else 'with code'}</a>"
                    for o in r.outputs if o.endswith('.html'))
           if r.ok else f"<span style='color:#b00'>failed: {html.escape(r.error)}</span>")
        + f" <small>({r.seconds:.0f}s)</small></li>" for r in runs)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>EAGLE-3 wiring workbook</title>
<style>body{{font-family:system-ui,sans-serif;max-width:900px;margin:2em auto;line-height:1.45}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}
th{{background:#f3f5f8}}td:first-child{{text-align:left}}</style></head><body>
<h1>EAGLE-3 wiring workbook &mdash; reports</h1>
<p>Target: <code>{html.escape(str(params.get('TARGET') or 'data/tiny-kimi/target'))}</code>,
draft: <code>{html.escape(str(params.get('DRAFT') or 'data/tiny-kimi/draft'))}</code>,
engine wiring: <code>{html.escape(str(params.get('ENGINE_VERSION', 'sglang==0.5.9')))}</code>.</p>
{table}<h2>The investigation, step by step</h2><ol>{items}</ol>
<p><a href="summary.md">summary.md</a> &middot; <a href="summary.json">summary.json</a></p></body></html>"""
    path = out_dir / "index.html"
    path.write_text(page)
    return path


def run_workbook(out_dir: Path, params: dict, only: list[str] | None = None, render: bool = True,
                 progress: bool = True) -> list[RunRecord]:
    import papermill as pm
    from tqdm.auto import tqdm

    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    params = {**params, "REPORTS_DIR": str(out_dir)}
    names = [n for n in ORDER if not only or n in only]
    runs: list[RunRecord] = []
    bar = tqdm(names, desc="workbook", disable=not progress)
    for name in bar:
        bar.set_postfix_str(name)
        src = NOTEBOOKS / f"{name}.ipynb"
        dst = out_dir / f"{name}.ipynb"
        accepted = notebook_parameters(src)
        t0 = time.perf_counter()
        try:
            pm.execute_notebook(str(src), str(dst), parameters={k: v for k, v in params.items() if k in accepted},
                                cwd=str(NOTEBOOKS), progress_bar=False, kernel_name="python3")
            outputs = [dst.name] + (render_html(dst, out_dir) if render else [])
            runs.append(RunRecord(name, round(time.perf_counter() - t0, 1), True, outputs=outputs))
        except Exception as exc:  # a failed notebook still gets a rendered page showing where
            if render and dst.is_file():
                render_html(dst, out_dir)
            why = f"{getattr(exc, 'ename', type(exc).__name__)}: {getattr(exc, 'evalue', str(exc))}".strip()
            runs.append(RunRecord(name, round(time.perf_counter() - t0, 1), False, why.splitlines()[0][:300]))
            break
    index_page(out_dir, runs, params)
    (out_dir / "runs.json").write_text(json.dumps([r.__dict__ for r in runs], indent=2))
    return runs


def normalise_notebook_name(name: str) -> str:
    """'01', '01_baseline_throughput' and '01_baseline_throughput.ipynb' all name notebook 01."""
    stem = Path(name).name.removesuffix(".ipynb")
    hits = [n for n in ORDER if n == stem or n.split("_", 1)[0] == stem]
    return hits[0] if len(hits) == 1 else stem


def _draft_width(draft) -> int | None:
    """The draft's fc slot count from its config alone (no weights loaded), None if unreadable."""
    from .draft import config_from_json, read_draft_config

    try:
        return config_from_json(read_draft_config(Path(draft) if draft else REPO / "data" / "tiny-kimi" / "draft")).num_aux
    except Exception:  # the notebooks will report a bad draft in full
        return None


def check_run_inputs(params: dict, only: list[str] | None) -> list[str]:
    """Everything that can be checked before a kernel starts, so a typo fails in a second
    instead of inside notebook 02 after the old reports were overwritten."""
    from .boundaries import parse_layout
    from .sglang_source import parse_engine

    problems = []
    for name in only or []:
        if normalise_notebook_name(name) not in ORDER:
            problems.append(f"--only {name!r} is not a notebook; expected one of {', '.join(ORDER)} (or 01..06)")
    for key in ("TARGET", "DRAFT", "RETRAINED_DRAFT", "PROMPTS"):
        if params.get(key) and not Path(params[key]).exists():
            problems.append(f"{key.lower()} {params[key]} does not exist")
    if params.get("TARGET") and not params.get("DRAFT") and not (Path(params["TARGET"]).parent / "draft").is_dir():
        problems.append(f"a target was given ({params['TARGET']}) without a draft, and no draft/ beside it: pass --draft")
    known = {}
    for nb in ORDER:
        known.update(notebook_parameters(NOTEBOOKS / f"{nb}.ipynb"))
    for key in params:
        if key not in known:
            problems.append(f"no notebook takes a parameter {key!r}; known: {', '.join(sorted(known))}")
    try:
        name, version = parse_engine(params.get("ENGINE_VERSION", "sglang==0.5.9"))
        if name == "sglang" and not version:
            problems.append(f"--engine-version {params.get('ENGINE_VERSION')!r} names no version; expected e.g. sglang==0.5.9")
    except ValueError as exc:
        problems.append(str(exc))
    if params.get("TRAINING_LAYOUT") not in (None, ""):
        try:
            layout = parse_layout(str(params["TRAINING_LAYOUT"]))
            if not layout or len(set(layout)) != len(layout) or min(layout) < 0:
                raise ValueError(f"expected distinct boundaries >= 0 like '0,3,7', got {params['TRAINING_LAYOUT']!r}")
            width = _draft_width(params.get("DRAFT"))
            if width is not None and len(layout) != width:
                raise ValueError(f"layout {layout} has {len(layout)} slots; the draft's fc takes {width}")
        except ValueError as exc:
            problems.append(f"--training-layout: {exc}")
    for key in ("NUM_PROMPTS", "MAX_NEW_TOKENS", "REPEATS", "EVAL_WINDOWS", "SEARCH_WINDOWS", "DRAFT_STEPS"):
        v = params.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            problems.append(f"{key} must be a positive integer, got {v!r}")
    for key in ("EVAL_WINDOWS", "SEARCH_WINDOWS"):
        if isinstance(params.get(key), int) and params[key] < 2:
            problems.append(f"{key} must be at least 2 (confidence needs more than one window), got {params[key]}")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m helpers run-workbook", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "reports")
    ap.add_argument("--target", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--retrained-draft", default=None)
    ap.add_argument("--training-layout", default=None, help="a,b,c; default: the draft's record, else inferred")
    ap.add_argument("--engine", default="reference", choices=["reference", "sglang"])
    ap.add_argument("--engine-version", default="sglang==0.5.9")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--small", action="store_true", help="tiny parameters: a smoke run in a couple of minutes")
    ap.add_argument("--only", nargs="*", default=None, help="run only these notebooks (names without .ipynb)")
    ap.add_argument("--no-render", action="store_true")
    ap.add_argument("-p", "--param", action="append", default=[], metavar="NAME=JSON",
                    help="any notebook parameter, e.g. -p NUM_PROMPTS=4")
    a = ap.parse_args(argv)
    params: dict = dict(SMALL) if a.small else {}
    for key, val in [("TARGET", a.target), ("DRAFT", a.draft), ("RETRAINED_DRAFT", a.retrained_draft),
                     ("TRAINING_LAYOUT", a.training_layout), ("PROMPTS", a.prompts), ("DRAFT_STEPS", a.steps)]:
        if val is not None:
            params[key] = val
    params.update(ENGINE=a.engine, ENGINE_VERSION=a.engine_version, DEVICE=a.device)
    for p in a.param:
        if "=" not in p:
            ap.error(f"--param expects NAME=VALUE, got {p!r}")
        k, v = p.split("=", 1)
        try:
            params[k] = json.loads(v)
        except json.JSONDecodeError:
            params[k] = v
    problems = check_run_inputs(params, a.only)
    if problems:
        for msg in problems:
            print(f"error: {msg}", file=sys.stderr)
        print("nothing was run and nothing under --out was touched", file=sys.stderr)
        return 2
    a.only = [normalise_notebook_name(n) for n in a.only] if a.only else a.only
    for key in ("TARGET", "DRAFT", "RETRAINED_DRAFT", "PROMPTS"):
        if params.get(key):
            params[key] = str(Path(params[key]).resolve())
    t0 = time.perf_counter()
    runs = run_workbook(a.out, params, a.only, render=not a.no_render)
    for r in runs:
        print(f"{'ok ' if r.ok else 'FAIL'} {r.name:<28} {r.seconds:6.1f}s {r.error}")
    print(f"reports in {a.out} ({time.perf_counter() - t0:.0f}s); open {a.out / 'index.html'}")
    return 0 if all(r.ok for r in runs) and len(runs) == len([n for n in ORDER if not a.only or n in a.only]) else 1
