"""Notebook 06's three wirings, whichever engine serves them: the deployed draft, fix A (the engine's capture
patched, the config's ids for the training layout) and fix B (a draft retrained on the served layout).

vLLM reads its ids elsewhere and fixes boundary 0 through the workbook's plugin, so its wirings are written
for it (``engines.vllm.wirings``); the reference engine and SGLang take the drafts notebook 05 wrote, under
the rules in force (SGLang: its capture rule). A wiring the engine cannot feed at all is dropped here, with
the reason, so the notebook measures only what can run. Outcomes are data (``Wirings``); the notebook prints
``lines``."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..boundaries import CapturePlan
from ..investigation.pair import plan_problems
from ..model.checkpoint import load_draft
from ..rules.conventions import read_draft_config


@dataclass
class Wirings:
    configs: dict[str, tuple[object, CapturePlan]] = field(default_factory=dict)   # name -> (draft, plan)
    draft_dirs: dict[str, Path] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)        # what was chosen, and why any was left out


def rebenchmark_wirings(pair, rules, engine, patch, reports: Path, device: str = "cpu") -> Wirings:
    """The wirings notebook 06 measures on ``engine`` (a ``live.backends`` choice) under ``rules``, from
    notebook 05's ``patch`` (``PatchStep``)."""
    w = Wirings()
    own = engine.own_wirings(pair, rules, tuple(patch.trained), patch.fix_b, Path(reports) / "vllm")
    if own is not None:
        for name, (d, plan) in own.items():
            w.configs[name] = (pair.draft if name == "deployed" else load_draft(d, target=pair.target,
                                                                                device=device), plan)
            w.draft_dirs[name] = Path(d)
    else:
        w.configs["deployed"] = (pair.draft, pair.served(rules))
        w.draft_dirs["deployed"] = Path(pair.draft_dir)
        if patch.fix_a:
            w.configs["fix A"] = (load_draft(patch.fix_a.draft, target=pair.target, device=device),
                                  pair.served(rules, config=read_draft_config(patch.fix_a.draft),
                                              root=patch.root))
            w.draft_dirs["fix A"] = Path(patch.fix_a.draft)
        else:
            w.lines.append("fix A is not available for this training layout (see notebook 05)")
        if patch.fix_b:
            w.configs["fix B"] = (load_draft(patch.fix_b, target=pair.target, device=device),
                                  pair.served(rules, config=read_draft_config(patch.fix_b)))
            w.draft_dirs["fix B"] = Path(patch.fix_b)
        else:
            w.lines.append("fix B: no retrained draft, so only the deployed wiring and fix A are measured; "
                           "build one with `.venv/bin/python -m helpers build-default` (or set "
                           "RETRAINED_DRAFT) and rerun notebooks 05 and 06")
    for name, (d, plan) in list(w.configs.items()):
        w.lines.append(f"{name:9s} {plan.label:22s} {plan.source}")
        w.lines += [f"          warning: {x}" for x in plan.warnings]
        problems = plan_problems(pair, plan) if d is pair.draft else list(plan.errors)
        if problems:
            w.lines.append(f"          cannot be served, not benchmarked: {'; '.join(problems)}")
            w.configs.pop(name)
            w.draft_dirs.pop(name, None)
    return w
