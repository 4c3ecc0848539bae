"""The notebook runner: execute notebooks 01-06 in order with papermill, check their parameters before
any kernel starts, and render ``reports/`` (a report view with code hidden, a full view, and an index page
that opens with the table notebook 06 wrote to ``summary.json``). ``python -m helpers run-workbook``
(``commands.workbook``) parses its options and calls ``run_workbook``."""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from ..boundaries import parse_layout
from ..errors import BadOption, InputError
from ..investigation.pair import BACKENDS, DEFAULT_DIR, MAX_STEPS, check_device
from ..model.checkpoint import config_from_json
from ..rules.conventions import CASE_ENGINE, DEFAULT_ENGINE, parse_engine, read_draft_config
from . import durations, kernels
from .lab import SMALL  # noqa: F401  (the small settings, re-exported beside the runner)
from .parameters import NAMES
from .reports import ORDER, TABLE_HEAD, TIMED, Summary, finding_of, read_summary, table_cells

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
OUT_IS_A_FILE = "--out {out} is a file; expected a folder for the reports (it is created if missing)"


@dataclass
class RunRecord:
    name: str
    seconds: float
    ok: bool
    error: str = ""
    outputs: list[str] = field(default_factory=list)
    cell: int | None = None          # the failing cell's index in the notebook (0-based), when one failed


_PROGRESS_LINE = re.compile(r"\d+%\|.*\||\[\d+:\d+(?:<[\d:?]+)?|: \d+:\d+(?::\d+)?\s*$")


def progress_as_text(nb) -> int:
    """Progress bars go to stderr (tqdm's default), which a rendered report paints as a red error block.
    A stderr stream whose every line is a progress bar is shown as plain output instead; anything else on
    stderr (a warning) keeps its colour. Returns how many streams were changed."""
    changed = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                lines = [ln for ln in str(out.get("text", "")).splitlines() if ln.strip()]
                if lines and all(_PROGRESS_LINE.search(ln) for ln in lines):
                    out["name"] = "stdout"
                    changed += 1
    return changed


FINDING, LOG = "finding", "log"     # cell tags: the notebook's finding; a cell whose printed lines are a log
FOLD_LINES = 12                     # printed output longer than this is folded in the report view too


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _folded(text: str) -> dict:
    """A printed stream as a collapsed ``<details>``, its first line as the summary."""
    import nbformat

    lines = text.strip("\n").splitlines()
    summary = html.escape(lines[0][:100] if lines else "output")
    body = html.escape("\n".join(lines))
    return nbformat.v4.new_output("display_data", data={
        "text/html": f"<details class='log'><summary>{summary} <small>({len(lines)} lines)</small></summary>"
                     f"<pre>{body}</pre></details>",
        "text/plain": text})


def report_order(nb):
    """The report view of an executed notebook: its heading, then the cells tagged ``finding`` (one sentence
    and one figure), then the heading's intro and the rest in order; the printed lines of cells tagged
    ``log`` (stdout and stderr), and any printed output longer than ``FOLD_LINES`` lines, folded under their
    first line."""
    import copy

    import nbformat

    nb = copy.deepcopy(nb)
    cells = nb.cells
    title = cells[:1] if cells and cells[0].cell_type == "markdown" else []
    found = [c for c in cells[len(title):] if FINDING in _tags(c)]
    rest = [c for c in cells[len(title):] if FINDING not in _tags(c)]
    for cell in rest:
        if cell.cell_type != "code":
            continue
        outs, log, at = [], [], None
        for out in cell.get("outputs", []):
            text = str(out.get("text", "")) if out.get("output_type") == "stream" else ""
            if text and LOG in _tags(cell):   # a log cell's printed lines, stderr's (progress, the guard) too
                at = len(outs) if at is None else at
                log.append(text)
            elif text and out.get("name") == "stdout" and text.count("\n") > FOLD_LINES:
                outs.append(_folded(text))
            else:
                outs.append(out)
        if log:
            outs.insert(at, _folded("".join(t if t.endswith("\n") else t + "\n" for t in log)))
        cell["outputs"] = outs
    intro = []
    if title and found:     # the heading, then the finding, then the intro: a phone's first screen finds it
        src = "".join(title[0].source)
        head, sep, body = src.partition("\n\n")
        if head.startswith("#") and body.strip():
            title[0].source = head
            intro = [nbformat.v4.new_markdown_cell(body)]
    nb.cells = title + found + intro + rest
    return nb


def render_html(executed: Path, out_dir: Path) -> list[str]:
    import nbformat
    from nbconvert import HTMLExporter
    from nbconvert.preprocessors import CoalesceStreamsPreprocessor

    nb = nbformat.read(executed, as_version=4)
    # A text progress bar is one line redrawn with carriage returns; a browser would show every
    # frame as its own line, so keep only what a terminal would finally show.
    nb, _ = CoalesceStreamsPreprocessor().preprocess(nb, {})
    progress_as_text(nb)
    written = []
    for suffix, hide in (("", True), ("_code", False)):
        exp = HTMLExporter(template_name="lab")
        exp.exclude_input = hide
        exp.exclude_input_prompt = hide
        exp.exclude_output_prompt = True
        # the report view reads as a finding first, evidence after, logs folded; the view with code keeps
        # the order the cells ran in
        body, _ = exp.from_notebook_node(report_order(nb) if hide else nb)
        target = out_dir / f"{executed.stem}{suffix}.html"
        target.write_text(body, encoding="utf-8")
        written.append(target.name)
    return written


def index_page(out_dir: Path, runs: list[RunRecord], params: dict) -> Path:
    table, summary = "", None
    if (out_dir / "summary.json").is_file():
        try:
            summary = read_summary(out_dir)
            table = _before_after(summary)
        except (InputError, KeyError, TypeError, ValueError) as exc:  # the page still links every notebook
            summary = None
            table = f"<h2>Before and after</h2><p style='color:#b00'>{html.escape(str(exc))}</p>"
    items = "".join(
        f"<li><b>{html.escape(r.name)}</b> &mdash; "
        + (" ".join(f"<a href='{o}'>{'report' if not o.endswith('_code.html') else 'with code'}</a>"
                    for o in r.outputs if o.endswith('.html'))
           if r.ok else f"<span style='color:#b00'>failed: {html.escape(r.error)}</span>")
        + f" <small>({r.seconds:.0f}s)</small></li>" for r in runs)
    # only what this run wrote: a run of some notebooks has no summary (notebook 06 writes it)
    links = " &middot; ".join(f'<a href="{n}">{n}</a>' for n in ("summary.md", "summary.json")
                              if (out_dir / n).is_file())
    links = f"<p>{links}</p>" if links else ""
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>EAGLE-3 wiring workbook</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;
line-height:1.45}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}}
th{{background:#f3f5f8}}.n{{text-align:right}}.finding{{font-size:1.15em;font-weight:600}}
img.finding-figure{{max-width:100%;height:auto}}.scroll{{overflow-x:auto}}th.pair{{background:#e6ebf2}}
details{{margin:.6em 0}}summary{{cursor:pointer;color:#334}}</style></head><body>
<h1>EAGLE-3 wiring workbook &mdash; reports</h1>
{_pairs_header(summary, params)}
{table}<h2>The investigation, step by step</h2><ol>{items}</ol>
{links}</body></html>"""
    path = out_dir / "index.html"
    path.write_text(page, encoding="utf-8")
    return path


def _pairs_header(s: Summary | None, params: dict) -> str:
    """The pairs this page's rows measured, each with its engines: the run's pair (its target, draft and
    the rules its served layouts follow) and, where llama.cpp's kernels chapter ran, that chapter's own."""
    data_note = (f", isolated test from the dump <code>{html.escape(str(params['DATA']))}</code> "
                 "(no target forward)" if params.get("DATA") else "")
    rules = html.escape(str(params.get("ENGINE_VERSION", str(CASE_ENGINE))))
    own = (f"target: <code>{html.escape(str(params.get('TARGET') or 'data/tiny-kimi/target'))}</code>, "
           f"draft: <code>{html.escape(str(params.get('DRAFT') or 'data/tiny-kimi/draft'))}</code>, served "
           f"layouts by the rules of <code>{rules}</code>{data_note}")
    groups = s.by_pair() if s is not None else []
    if len(groups) <= 1:
        return f"<p>{own[0].upper() + own[1:]}; each row names the engine that measured it.</p>"
    lines = []
    for label, rows in groups:
        engines = ", ".join(dict.fromkeys(str(r["engine"]) for r in rows))
        what = own if label == s.pair() else "llama.cpp's kernels at a real target's cost"
        lines.append(f"<li><b>{html.escape(label)}</b>: {what}; rows measured on {html.escape(engines)}</li>")
    return (f"<p>This run measured {len(groups)} pairs; each has its own section below, and each row names "
            f"the engine that measured it:</p><ul>{''.join(lines)}</ul>")


def _before_after(s: Summary) -> str:
    """What a person reads first: per pair, its finding in one sentence and one figure (per wiring and
    engine: accept length, per-position acceptance, the speedup with its interval against 1); then the
    table (the same rows as summary.md, grouped by pair), then what the table cannot say, folded."""
    from .plots import figure_png, summary_figure

    groups = s.by_pair()
    head = "".join(f"<th{_align(h)}>{html.escape(h)}</th>" for h in TABLE_HEAD)
    sections, body = [], []
    for label, rows in groups:
        if len(groups) > 1:
            sections.append(f"<h2>{html.escape(label)}</h2>")
            body.append(f"<tr><th class='pair' colspan='{len(TABLE_HEAD)}'>{html.escape(label)}</th></tr>")
        sections.append(f"<p class='finding'>{html.escape(finding_of(rows))}</p>")
        png = figure_png(summary_figure(rows))
        sections.append(f"<img class='finding-figure' alt='accept length and speedup per wiring and engine, "
                        f"{html.escape(label)}' src='data:image/png;base64,{png}'>")
        body += ["<tr>" + "".join(f"<td{_align(h)}>{html.escape(c)}</td>"
                                  for h, c in zip(TABLE_HEAD, table_cells(r))) + "</tr>" for r in rows]
    if not groups:
        sections.append(f"<p class='finding'>{html.escape(s.finding())}</p>")
    return ("".join(sections) + f"<h2>Before and after</h2><div class='scroll'><table><tr>{head}</tr>"
            f"{''.join(body)}</table></div><details><summary>What the table cannot say</summary>"
            f"<p>{html.escape(s.after_table())}</p></details>")


# figures read down a column, right-aligned; names and lists read as text
_FIGURES = {"accept length", "speedup [95%]", "baseline tok/s", "EAGLE-3 tok/s"}


def _align(column: str) -> str:
    return " class='n'" if column in _FIGURES else ""


class Runs(list):
    """The run records, plus where an unfinished run was left (``incomplete``) and whether the
    user stopped it (``interrupted``); ``--out`` itself is only ever replaced by a whole run."""

    incomplete: Path | None = None
    interrupted: bool = False


class _Stop:
    """Ctrl-C (or SIGTERM) during a run: the first one interrupts the running cell through the
    kernel, so the cell fails like any other error, papermill records which one, and the kernel
    is shut down by nbclient's own cleanup; a second one gives up waiting and kills the kernel."""

    def __init__(self):
        self.requested = 0
        self.kernel_pid: int | None = None
        self._saved = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._saved[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        return False

    def _handle(self, signum, frame):
        self.requested += 1
        if self.requested == 1 and self.kernel_pid:
            self.interrupt_kernel()
        elif self.requested > 1:
            self.kill_kernel()
            raise KeyboardInterrupt

    def interrupt_kernel(self):
        try:
            os.kill(self.kernel_pid, signal.SIGINT)
        except (OSError, TypeError):
            pass

    def kill_kernel(self):
        if self.kernel_pid:
            try:
                os.killpg(os.getpgid(self.kernel_pid), signal.SIGKILL)  # the kernel runs in its own session
            except OSError:
                pass


_STOP: _Stop | None = None


def _kernel_manager_class():
    """A kernel manager that tells the run which process to interrupt, and that does not
    interrupt a kernel it is shutting down after a finished notebook (jupyter_client does, and
    ipykernel then logs 'ERROR | KeyboardInterrupt caught in kernel' on every good run)."""
    from jupyter_client.manager import AsyncKernelManager

    class WorkbookKernelManager(AsyncKernelManager):
        async def _async_start_kernel(self, **kw):
            await AsyncKernelManager._async_start_kernel(self, **kw)
            prov = self.provisioner
            pid = getattr(prov, "pid", None) or getattr(getattr(prov, "process", None), "pid", None)
            if _STOP is not None:
                _STOP.kernel_pid = pid
                if _STOP.requested:  # Ctrl-C came while the kernel was starting
                    _STOP.interrupt_kernel()

        start_kernel = _async_start_kernel  # the base class binds start_kernel to its own coroutine

        async def _async_interrupt_kernel(self):
            if getattr(self, "shutting_down", False):
                return
            await super()._async_interrupt_kernel()

    return WorkbookKernelManager


def _parameterised(src: Path, params: dict):
    """The notebook with papermill's injected-parameters cell, built here rather than by
    ``execute_notebook(parameters=...)``: papermill's own check of the parameters cell cannot
    read a line such as ``ENGINE_VERSION = "sglang==0.5.9"`` (two '=') and warns that a
    parameter every notebook declares is unknown. The names were checked by
    the one parameters cell's ``NAMES`` already."""
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    nb = load_notebook_node(str(src))  # papermill's reader: it gives every cell the tags list it expects
    return parameterize_notebook(nb, params, kernel_name="python3", language="python") if params else nb


def _first_error(executed: Path) -> tuple[int | None, str]:
    """(cell index, 'Ename: value') of the first cell whose outputs hold an error, else (None, '').
    A notebook is judged by what it holds, not only by whether papermill raised."""
    import nbformat

    try:
        nb = nbformat.read(executed, as_version=4)
    except Exception as exc:  # an unreadable output is itself a failure
        return -1, f"executed notebook unreadable: {exc}"
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if out.get("output_type") == "error":
                return i, f"{out.get('ename', 'Error')}: {out.get('evalue', '')}".strip()
    return None, ""


def _write_marker(staging: Path, text: str) -> None:
    (staging / "INCOMPLETE").write_text(text.rstrip() + "\n", encoding="utf-8")


def _rewrite_paths(staging: Path, out_dir: Path, since: float) -> None:
    """Notebooks record where they wrote (05_patch.json names the fix-A draft, the executed
    notebooks their REPORTS_DIR): written in the staging folder, those paths must name --out
    once the run is swapped in, or notebook 06 of a later ``--only 06`` run reads a folder
    that no longer exists."""
    old, new = str(staging), str(out_dir)
    for f in staging.rglob("*"):
        if (f.suffix in (".json", ".md", ".html", ".ipynb", ".txt") and f.is_file()
                and f.stat().st_mtime >= since):
            try:
                text = f.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if old in text:
                f.write_text(text.replace(old, new), encoding="utf-8")


def _swap_in(staging: Path, out_dir: Path) -> None:
    """Replace --out by the finished staging folder. Entries that appeared in --out during the
    run (nothing of ours) are carried over first; the old folder is renamed aside, the new one
    renamed in, and only then is the old one deleted."""
    if out_dir.exists():
        for entry in out_dir.iterdir():
            if not (staging / entry.name).exists() and not (staging / entry.name).is_symlink():
                shutil.move(str(entry), str(staging / entry.name))
        previous = out_dir.parent / f".{out_dir.name}.previous-{os.getpid()}"
        os.rename(out_dir, previous)
        os.rename(staging, out_dir)
        shutil.rmtree(previous, ignore_errors=True)
    else:
        os.rename(staging, out_dir)


def run_workbook(out_dir: Path, params: dict, only: list[str] | None = None, render: bool = True,
                 progress: bool = True) -> Runs:
    """Execute the notebooks into a staging folder beside ``out_dir`` and swap it in only when
    every one finished without an error. A failure or Ctrl-C leaves ``out_dir`` as it was and
    keeps the staging folder, marked INCOMPLETE with the notebook and cell that stopped it, so
    a report never mixes two runs or calls an interrupted notebook ok."""
    import papermill as pm  # before any staging folder: without the notebooks' extra, nothing is written

    global _STOP
    out_dir = Path(out_dir).resolve()
    started = time.time()
    staging = _staging(out_dir)
    params = {**params, "REPORTS_DIR": str(staging)}
    names = [n for n in ORDER if not only or n in only]
    runs = Runs()
    bar = tqdm(names, desc="workbook", disable=not progress)
    km_class = _kernel_manager_class()
    with _Stop() as stop:
        _STOP = stop
        try:
            waited = False
            for name in bar:
                if stop.requested:
                    break
                bar.set_postfix_str(name)
                if name in TIMED and not waited:   # a build started beside the run ends before any timing
                    waited = True
                    bar.set_postfix_str(f"{name}: waiting for llama-server's build")
                    why = kernels.await_build(progress, stopped=lambda: bool(stop.requested))
                    if why and progress:   # the kernels chapter says it again in its report
                        print(f"[llamacpp] {why}; the other engines measure", flush=True)
                    bar.set_postfix_str(name)
                runs.append(_execute(pm, name, staging, params, km_class, stop, render))
                if not runs[-1].ok:
                    break
        except KeyboardInterrupt:  # a second Ctrl-C: the kernel was killed, the run ends here
            stop.requested = max(stop.requested, 1)
            if not runs or runs[-1].ok:
                runs.append(RunRecord(name, 0.0, False, "KeyboardInterrupt: stopped by Ctrl-C"))
        finally:
            _STOP = None
            bar.close()
        runs.interrupted = bool(stop.requested)
        _finish(staging, out_dir, runs, names, params, started)
    return runs


def _staging(out_dir: Path) -> Path:
    """A staging folder beside ``out_dir``, marked INCOMPLETE until the run finishes, holding the earlier
    run's artifacts (notebook 06 reads 05's)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise BadOption(OUT_IS_A_FILE.format(out=out_dir))
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{out_dir.name}.staging-", dir=out_dir.parent))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp's 0700 would become --out's mode after the swap
    except OSError as exc:
        raise BadOption(f"--out {out_dir}: cannot create a staging folder beside it "
                        f"({exc.strerror or exc})") from None
    _write_marker(staging, f"run started {time.strftime('%Y-%m-%d %H:%M:%S')} by pid {os.getpid()}; still "
                           f"running or killed before it finished. --out {out_dir} was not changed by it.")
    if out_dir.is_dir():  # earlier artifacts stay available (notebook 06 reads 05's) and are kept
        shutil.copytree(out_dir, staging, symlinks=True, dirs_exist_ok=True)
        _write_marker(staging, (staging / "INCOMPLETE").read_text(encoding="utf-8"))
    return staging


def _execute(pm, name: str, staging: Path, params: dict, km_class, stop: _Stop, render: bool) -> RunRecord:
    """One notebook executed into ``staging`` by papermill (``pm``) and rendered, or its first error and
    the cell it came from."""
    src = NOTEBOOKS / f"{name}.ipynb"
    dst = staging / f"{name}.ipynb"
    t0 = time.perf_counter()
    error, cell = "", None
    given = {k: v for k, v in params.items() if k in NAMES}   # the one parameters cell
    try:
        pm.execute_notebook(_parameterised(src, given), str(dst), cwd=str(NOTEBOOKS),
                            progress_bar=False, kernel_name="python3",
                            kernel_manager_class=km_class,
                            extra_arguments=["--IPKernelApp.log_level=ERROR"])
    except Exception as exc:
        cell = getattr(exc, "cell_index", None)
        ename = getattr(exc, "ename", type(exc).__name__)
        error = f"{ename}: {getattr(exc, 'evalue', str(exc))}".strip()
    finally:
        stop.kernel_pid = None
    if not error:
        cell, error = (_first_error(dst) if dst.is_file()
                       else (None, "no executed notebook was written"))
    if stop.requested and (not error or error.startswith("KeyboardInterrupt")):
        error = "KeyboardInterrupt: stopped by Ctrl-C"
    seconds = round(time.perf_counter() - t0, 1)
    if error:
        if render and dst.is_file():  # the failed notebook's page shows where it stopped
            try:
                render_html(dst, staging)
            except Exception:
                pass
        first_line = (error.splitlines() or [""])[0][:300]
        return RunRecord(name, seconds, False, first_line, cell=cell)
    outputs = [dst.name] + (render_html(dst, staging) if render else [])
    return RunRecord(name, seconds, True, outputs=outputs)


def _finish(staging: Path, out_dir: Path, runs: Runs, names: list[str], params: dict, started: float) -> None:
    """The index page and runs.json; a complete run swapped in for ``out_dir``, else the staging folder
    kept and marked with where it stopped (``runs.incomplete``)."""
    index_page(staging, runs, params)
    (staging / "runs.json").write_text(json.dumps([r.__dict__ for r in runs], indent=2), encoding="utf-8")
    if len(runs) == len(names) and all(r.ok for r in runs) and not runs.interrupted:
        _rewrite_paths(staging, out_dir, started)
        (staging / "INCOMPLETE").unlink()
        _swap_in(staging, out_dir)
        durations.record(run_kind(params, names), time.time() - started, {r.name: round(r.seconds, 1)
                                                                           for r in runs})
        return
    bad = next((r for r in runs if not r.ok), None)
    where = (f"{bad.name}.ipynb" + (f", cell {bad.cell}" if bad.cell is not None else "")
             + f": {bad.error}" if bad else "stopped before the first notebook")
    _write_marker(staging, f"INCOMPLETE: {'interrupted' if runs.interrupted else 'failed'} at {where}\n"
                           f"--out {out_dir} was left as it was; this folder holds the partial run.")
    runs.incomplete = staging


def run_kind(params: dict, only: list[str] | None = None) -> str:
    """What makes two runs comparable (``durations.kind_of``): the notebooks run and the parameters but the
    paths."""
    return durations.kind_of([n for n in ORDER if not only or n in only], params, PATH_PARAMS)


def normalise_notebook_name(name: str) -> str:
    """'01', '01_baseline_throughput' and '01_baseline_throughput.ipynb' all name notebook 01."""
    stem = Path(name).name.removesuffix(".ipynb")
    hits = [n for n in ORDER if n == stem or n.split("_", 1)[0] == stem]
    return hits[0] if len(hits) == 1 else stem


def _draft_width(draft) -> int | None:
    """The draft's fc slot count from its config alone (no weights loaded), None if unreadable."""
    try:
        return config_from_json(read_draft_config(Path(draft) if draft else DEFAULT_DIR / "draft")).num_aux
    except Exception:  # the notebooks will report a bad draft in full
        return None


PATH_PARAMS = ("TARGET", "DRAFT", "RETRAINED_DRAFT", "PROMPTS", "DATA", "REPORTS_DIR", "METRICS")


def check_run_inputs(params: dict, only: list[str] | None) -> list[str]:
    """Everything that can be checked before a kernel starts, so a typo fails in a second
    instead of inside notebook 02 after the old reports were overwritten."""
    problems = []
    for name in only or []:
        if normalise_notebook_name(name) not in ORDER:
            problems.append(f"--only {name!r} is not a notebook; expected one of {', '.join(ORDER)} "
                            "(or 01..06)")
    for key in PATH_PARAMS:
        if params.get(key) is not None and not isinstance(params[key], (str, Path)):
            problems.append(f"{key} must be a path, got {params[key]!r}")
    if params.get("BACKEND") not in (None, *BACKENDS):
        problems.append(f"BACKEND must be one of {', '.join(BACKENDS)}, got {params['BACKEND']!r}")
    for key in ("TARGET", "DRAFT", "RETRAINED_DRAFT", "PROMPTS", "DATA"):
        if isinstance(params.get(key), (str, Path)) and params[key] and not Path(params[key]).exists():
            problems.append(f"{key.lower()} {params[key]} does not exist")
    target = params.get("TARGET")
    if target and not params.get("DRAFT") and not (Path(target).parent / "draft").is_dir():
        problems.append(f"a target was given ({target}) without a draft, and no draft/ beside it: "
                        "pass --draft")
    for key in params:
        if key not in NAMES:
            problems.append(f"no notebook takes a parameter {key!r}; known: {', '.join(sorted(NAMES))}")
    try:
        eng = parse_engine(params.get("ENGINE_VERSION", str(CASE_ENGINE)))     # the notebooks' own default
        if eng.rules.runs_release_source and not eng.version:     # SGLang's rules are a release's source
            problems.append(f"--engine {params.get('ENGINE_VERSION')!r} names no version (and no "
                            f"{eng.rules.title} is installed here to take it from); expected e.g. "
                            f"{DEFAULT_ENGINE}")
    except ValueError as exc:
        problems.append(str(exc))
    if params.get("TRAINING_LAYOUT") not in (None, ""):
        try:
            layout = parse_layout(str(params["TRAINING_LAYOUT"]))
            if not layout or len(set(layout)) != len(layout) or min(layout) < 0:
                raise ValueError(f"expected distinct boundaries >= 0 like '0,3,7', "
                                 f"got {params['TRAINING_LAYOUT']!r}")
            width = _draft_width(params.get("DRAFT"))
            if width is not None and len(layout) != width:
                raise ValueError(f"layout {layout} has {len(layout)} slots; the draft's fc takes {width}")
        except ValueError as exc:
            problems.append(f"--training-layout: {exc}")
    for key in ("NUM_PROMPTS", "MAX_NEW_TOKENS", "REPEATS", "EVAL_WINDOWS", "SEARCH_WINDOWS", "DRAFT_STEPS"):
        v = params.get(key)
        if key in params and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            problems.append(f"{key} must be a positive integer, got {v!r}")
    if isinstance(params.get("DRAFT_STEPS"), int) and params["DRAFT_STEPS"] > MAX_STEPS:
        problems.append(f"DRAFT_STEPS must be at most {MAX_STEPS} (draft tokens per verify step), "
                        f"got {params['DRAFT_STEPS']}")
    try:
        kernels.parse(params.get("KERNELS"))
    except ValueError as exc:
        problems.append(str(exc))
    try:
        check_device(params.get("DEVICE", "cpu"))
    except ValueError as exc:
        problems.append(str(exc))
    for key in ("EVAL_WINDOWS", "SEARCH_WINDOWS"):
        if isinstance(params.get(key), int) and params[key] < 2:
            problems.append(f"{key} must be at least 2 (confidence needs more than one window), "
                            f"got {params[key]}")
    return problems
