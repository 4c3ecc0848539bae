"""Start from the dashboard, for real: serve the embedded pair on vLLM and SGLang, keep what each engine
exports (vLLM's Prometheus text, SGLang's responses), and run ``diagnose --metrics`` on it.

    .venv/bin/python benchmarks/dashboard.py [--out reports/dashboard] [--engines vllm,sglang]

Per engine and wiring it writes ``<engine>-<wiring>.metrics`` (what a dashboard would scrape),
``<engine>-<wiring>.json`` (``diagnose --metrics --json``) and ``<engine>-<wiring>.png`` (served against
expected, ``plots.acceptance_profile``), then prints one line each: per-position acceptance with its
drafts, the expected figure, the explanation. One engine runs at a time, each stopped on exit; the engines
run with the guard in ``warn`` (so the miswired draft still serves and its symptom is measurable).
Not a test: it starts real engines and takes minutes.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PAIR = REPO / "data" / "tiny-kimi"


def prompts(n: int = 4, length: int = 48) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(PAIR / "target")
    ids = tok((PAIR / "heldout.txt").read_text(), verbose=False)["input_ids"]
    return [ids[i * 400: i * 400 + length] for i in range(n)]


def wirings(engine: str, tmp: Path) -> list[tuple[str, Path, dict]]:
    """(name, draft, launch options): the deployed draft as the original case served it, and the draft
    retrained on the served layout with ids this engine turns into it."""
    from helpers.investigation.fixes import with_engine_ids

    retrained = PAIR / "draft-retrained"
    if engine == "vllm":
        fix_b = with_engine_ids(retrained, tmp / "vllm-fix-b", [3, 7, 10], engine="vllm")
        return [("deployed", PAIR / "draft", {}), ("retrained", fix_b, {})]
    return [("deployed", PAIR / "draft", {"capture_rule": "0.5.9"}),
            ("retrained", retrained, {"capture_rule": "0.5.9"})]


def serve(engine: str, draft: Path, options: dict, ids: list[list[int]], log_dir: Path) -> str:
    if engine == "vllm":
        from helpers.engines.vllm.bench import fixes_for
        from helpers.engines.vllm.engine import LaunchSpec, VllmEngine
        from helpers.engines.vllm.install import find_vllm

        install = find_vllm()
        tcfg = json.loads((PAIR / "target" / "config.json").read_text())
        fixes = fixes_for(tcfg, None, install)
        spec = LaunchSpec(PAIR / "target", draft, steps=3, max_model_len=512, fixes=fixes)
        with VllmEngine(install, spec, log_dir=log_dir) as e:
            e.generate(ids, 64)
            return e.metrics_text()
    from helpers.engines.sglang.engine import SGLangEngine, SglangLaunch
    from helpers.engines.sglang.install import find_sglang

    with SGLangEngine(find_sglang(), SglangLaunch(PAIR / "target", draft, steps=3, **options),
                      log_dir=log_dir) as e:
        e.generate(ids, 64)
        return e.metrics_text()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "reports" / "dashboard")
    ap.add_argument("--engines", default="vllm,sglang")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    ids = prompts()
    from helpers.notebook import plots

    with tempfile.TemporaryDirectory(prefix="eagle3-dashboard-") as tmp:
        for engine in a.engines.split(","):
            for name, draft, options in wirings(engine, Path(tmp)):
                stem = a.out / f"{engine}-{name}"
                scrape = serve(engine, draft, options, ids, Path(tmp) / "logs")
                stem.with_suffix(".metrics").write_text(scrape)
                rules = "vllm" if engine == "vllm" else "sglang==0.5.9"
                out = subprocess.run([sys.executable, "-m", "helpers", "diagnose", "--metrics",
                                      str(stem.with_suffix(".metrics")), "--draft", str(draft), "--target",
                                      str(PAIR / "target"), "--engine", rules, "--json"],
                                     cwd=REPO, capture_output=True, text=True)
                if out.returncode not in (0, 1):
                    print(f"{engine} {name}: diagnose failed: {out.stderr.strip()[-300:]}")
                    continue
                verdict = json.loads(out.stdout)
                stem.with_suffix(".json").write_text(json.dumps(verdict, indent=2))
                fig = plots.acceptance_profile(verdict, f"{engine} {name}")
                fig.savefig(stem.with_suffix(".png"), dpi=110)
                per = ", ".join(f"{p['rate']:.3f} [{p['interval'][0]:.3f}, {p['interval'][1]:.3f}] of "
                                f"{p['drafts']}" for p in verdict["per_position"])
                exp = verdict.get("expected_per_position")
                print(f"{engine} {name}: accept length {verdict['accept_length']:.3f}; per position {per}; "
                      f"expected {exp} ({verdict.get('expected_source')}); served layout "
                      f"{verdict.get('served_layout')}, trained {verdict.get('trained_layout')}: "
                      f"{verdict['explanation']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
