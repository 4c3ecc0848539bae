"""The workbook as a user sees it, in a real browser (headless Chromium driven by Playwright).

1. ``bash workbook.sh lab --no-browser --port P`` serves JupyterLab; notebook 03 is opened, Run All
   runs it on the small settings (``EAGLE3_WORKBOOK_SMALL=1``) and the tiny test pair, the served and best
   preset buttons are pressed, and the comparison table must hold both with different figures.
2. A papermill run of notebook 03 renders ``index.html`` and the report page; both are opened with
   every non-file request refused (no CDN, as a report mailed to someone offline) and must show
   every section, every image, and the comparison in the "by hand" section.

Screenshots land in the test's tmp dir (printed at the end; ``-s`` shows it). Playwright cannot
download its browsers here, so the test uses Debian's ``chromium`` (``.ci/run`` installs it); it
skips, saying so, only when no chromium executable exists at all.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from _pairs import tiny_default
from conftest import scaled

from helpers.notebook.lab import SMALL
from helpers.notebook.runner import REPO, run_workbook

NB = "03_compare_concat_orders"
CHROMIUM = os.environ.get("EAGLE3_WORKBOOK_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).is_file(),
                                reason=f"no chromium executable ({CHROMIUM}); apt-get install -y chromium")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5):
    timeout = scaled(timeout)
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


@pytest.fixture()
def lab(tmp_path):
    """`bash workbook.sh lab` on a free port, no token, Jupyter's per-user state in tmp_path; stopped
    through its own API (kernels first), then by signal if it lingers."""
    port = _free_port()
    env = {**os.environ, "EAGLE3_WORKBOOK_SMALL": "1",
           "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config"),
           "JUPYTER_DATA_DIR": str(tmp_path / "jupyter-data"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter-runtime"), "IPYTHONDIR": str(tmp_path / "ipython"),
           "EAGLE3_WORKBOOK_PARAMS": json.dumps({"TARGET": str(tiny_default() / "target"),
                                          "DRAFT": str(tiny_default() / "draft"),
                                          "REPORTS_DIR": str(tmp_path / "lab-reports")})}
    args = ["bash", str(REPO / "workbook.sh"), "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
            "--IdentityProvider.token=", "--LabApp.expose_app_in_browser=True",
            f"--LabApp.workspaces_dir={tmp_path / 'lab-workspaces'}",
            f"--LabApp.user_settings_dir={tmp_path / 'lab-settings'}"]
    if os.geteuid() == 0:   # containers and CI run as root; jupyter refuses that unless told
        args.append("--allow-root")
    # no "get Jupyter news?" toast over the screenshots (page config in this run's own config dir), and no
    # autosave: the notebook in the working tree is committed without outputs and must stay so
    (tmp_path / "jupyter-config" / "labconfig").mkdir(parents=True)
    (tmp_path / "jupyter-config" / "labconfig" / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    docmanager = tmp_path / "lab-settings" / "@jupyterlab" / "docmanager-extension"
    docmanager.mkdir(parents=True)
    (docmanager / "plugin.jupyterlab-settings").write_text(json.dumps({"autosave": False}))
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"workbook.sh lab exited with {proc.returncode}:\n"
                            f"{(tmp_path / 'lab.log').read_text()[-3000:]}")
            try:
                _get(f"{base}/api/status", 2)
                break
            except OSError:
                if time.monotonic() - t0 > scaled(180):
                    pytest.fail(f"JupyterLab did not answer in {scaled(180):.0f} s:\n"
                                f"{(tmp_path / 'lab.log').read_text()[-3000:]}")
                time.sleep(0.5)
        yield base
    finally:
        # SIGTERM: jupyter_server shuts its kernels down (they run in sessions of their own) and exits
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=scaled(30))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=scaled(10))
        log.close()


@pytest.fixture()
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            yield b
        finally:
            b.close()


def _column(page, layout) -> dict[str, str]:
    """metric -> text shown in the comparison table's column for ``layout``."""
    key = ",".join(map(str, layout))
    return page.eval_on_selector_all(
        f"table.layout-comparison td[data-layout='{key}']",
        "tds => Object.fromEntries(tds.map(td => [td.dataset.metric, td.textContent.trim()]))")


def test_notebook_03_in_jupyterlab_and_reports_offline(lab, browser, tmp_path):
    notebook_before = (REPO / "notebooks" / f"{NB}.ipynb").read_bytes()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    timings = {}
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(scaled(60_000))
    page.goto(f"{lab}/lab/tree/notebooks/{NB}.ipynb")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell")
    # the notebook's kernelspec must be the one setup registered in .venv: no kernel picker appears
    page.wait_for_function("""() => {
        const k = window.jupyterapp && window.jupyterapp.serviceManager.sessions;
        return k && [...k.running()].some(s => s.kernel && s.kernel.name === 'eagle3-workbook'); }""")
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=scaled(60_000))
    t0 = time.monotonic()
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_selector(".jupyter-widgets button:has-text('add to comparison')", timeout=scaled(300_000))
    page.wait_for_selector("table.layout-comparison", timeout=scaled(60_000))
    timings["run_all_to_widget_s"] = round(time.monotonic() - t0, 1)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=scaled(120_000))
    errors = page.eval_on_selector_all(
        ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']",
        "els => els.map(e => e.textContent).filter(t => t.includes('Traceback') || t.includes('Error'))")
    assert not errors, errors
    # the last cell ran
    assert page.locator(".jp-OutputArea-output", has_text="The search ranks").count() == 1
    # text progress bars are for papermill; here tqdm draws widgets
    assert page.locator(".jupyter-widgets .widget-progress, .jupyter-widgets progress, "
                        ".jupyter-widgets .progress").count() >= 1

    widget = page.locator(".jupyter-widgets.widget-vbox", has=page.locator("table.layout-comparison")).last
    buttons = widget.locator("button")
    served_btn = buttons.filter(has_text="served").first
    best_btn = buttons.filter(has_text="best").first
    served_layout = tuple(int(b) for b in page.get_attribute(
        "table.layout-comparison th[data-names*='served']", "data-layout").split(","))
    best_layout = tuple(int(b) for b in page.get_attribute(
        "table.layout-comparison th[data-names*='best']", "data-layout").split(","))
    assert served_layout != best_layout
    for btn, lay in ((served_btn, served_layout), (best_btn, best_layout)):
        btn.click()
        key = ",".join(map(str, lay))
        page.wait_for_function(f"""() => {{
            const th = document.querySelector("table.layout-comparison th[data-layout='{key}']");
            return th && th.textContent.includes('in the dropdowns'); }}""")
    served, best = _column(page, served_layout), _column(page, best_layout)
    assert (served.keys() == best.keys()
            and {"full_acc_0", "cond_acc_0", "sim_accept_length", "ce"} <= served.keys())
    assert all(v not in ("", "–") for v in list(served.values()) + list(best.values()))
    assert served != best
    assert float(best["ce"]) < float(served["ce"])             # best is ranked by cross-entropy
    assert page.eval_on_selector("img.layout-acceptance", "i => i.complete && i.naturalWidth > 0")
    widget.scroll_into_view_if_needed()
    widget.screenshot(path=str(shots / "lab-comparison-after-presets.png"))
    page.screenshot(path=str(shots / "lab-page.png"))
    page.close()
    assert (REPO / "notebooks" / f"{NB}.ipynb").read_bytes() == notebook_before, (
        "JupyterLab wrote to the notebook")

    # 2. the shared report, offline
    d = tiny_default()
    out = tmp_path / "reports"
    runs = run_workbook(out, {**SMALL, "TARGET": str(d / "target"), "DRAFT": str(d / "draft")}, only=[NB],
                        progress=False)
    assert all(r.ok for r in runs), [(r.name, r.error) for r in runs]
    ctx = browser.new_context(viewport={"width": 1200, "height": 900})
    refused = []

    def offline(route):
        if route.request.url.startswith("file:") or route.request.url.startswith("data:"):
            return route.continue_()
        refused.append(route.request.url)
        return route.abort()

    ctx.route("**/*", offline)
    page = ctx.new_page()
    page.goto((out / "index.html").as_uri())
    links = page.eval_on_selector_all("a", "as => as.map(a => a.getAttribute('href'))")
    assert f"{NB}.html" in links and "failed" not in page.inner_text("body")
    assert all((out / href).is_file() for href in links), [h for h in links if not (out / h).is_file()]
    page.screenshot(path=str(shots / "report-index.png"), full_page=True)
    page.click(f"a[href='{NB}.html']")
    page.wait_for_load_state("load")
    assert page.url.endswith(f"{NB}.html")
    broken = page.eval_on_selector_all("img", "is => is.filter(i => !(i.complete && i.naturalWidth > 0))"
                                              ".map(i => i.alt || i.src.slice(0, 60))")
    assert not broken, broken
    # every markdown heading is followed by something visible before the next one
    empty = page.evaluate("""() => {
        const hs = [...document.querySelectorAll('.jp-MarkdownOutput h1, .jp-MarkdownOutput h2')];
        const all = [...document.querySelectorAll('.jp-Cell')];
        return hs.filter(h => {
            const cell = h.closest('.jp-Cell'); let i = all.indexOf(cell), seen = false;
            const own = [...cell.querySelectorAll('.jp-MarkdownOutput > *')]
                .some(e => e !== h && e.innerText.trim() && h.compareDocumentPosition(e) & 4);
            if (own) return false;
            for (i = i + 1; i < all.length; i++) {
                const c = all[i];
                if (c.querySelector('.jp-MarkdownOutput h1, .jp-MarkdownOutput h2')) break;
                if (c.innerText.trim() || c.querySelector('img')) { seen = true; break; }
            }
            return !seen;
        }).map(h => h.textContent);
    }""")
    assert not empty, f"empty sections: {empty}"
    heading = page.locator("h2", has_text="Try layouts by hand")
    assert heading.count() == 1
    snap = page.locator(".layout-comparison-snapshot")
    assert snap.count() == 1 and snap.is_visible()
    # under the heading
    assert heading.evaluate("(h, s) => !!(h.compareDocumentPosition(s) & 4)", snap.element_handle())
    served_r, best_r = _column(page, served_layout), _column(page, best_layout)
    assert served_r and best_r and served_r != best_r
    assert snap.locator("img.layout-acceptance").evaluate("i => i.complete && i.naturalWidth > 0")
    snap.scroll_into_view_if_needed()
    page.locator(".jp-Cell", has=heading).screenshot(path=str(shots / "report-by-hand-heading.png"))
    snap.screenshot(path=str(shots / "report-by-hand-offline.png"))
    page.screenshot(path=str(shots / "report-page.png"), full_page=True)
    assert refused, "the report asked for nothing off the machine; the offline check proved nothing"
    timings["refused_requests"] = len(refused)
    (shots / "timings.json").write_text(json.dumps(timings, indent=2))
    print(f"\nscreenshots in {shots}: {sorted(p.name for p in shots.iterdir())}; {timings}")
