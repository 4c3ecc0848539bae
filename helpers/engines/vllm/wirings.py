"""The investigation's three wirings as vLLM serves them: deployed, fix A and fix B.

vLLM reads a draft's ids as boundaries (id k = HF ``hidden_states[k]``), sorted; on a CPU host it
runs the V1 model runner, which reads the top-level key and falls back to ``eagle_config``'s. So:
- deployed: the draft as shipped, served what the release's rules say (``wiring``);
- fix A: the training layout written where vLLM reads it (``fixes.with_engine_ids``); for a
  DeepSeek target whose layout holds boundary 0 the release cannot capture it (``residual`` is
  still None), and the workbook's vLLM plugin ``boundary0`` fix makes it, the seed's patch in vLLM;
- fix B: the retrained draft, its training layout written where vLLM reads it.
"""
from __future__ import annotations

from pathlib import Path

from ...boundaries import CapturePlan, ProblemKind
from ...investigation.fixes import with_engine_ids
from ...record import read_record
from ...rules.conventions import Engine, TargetSpec, read_draft_config, read_target
from .bench import fixes_for
from .install import VllmInstall

# vLLM's boundary-0 capture adds a residual that is still None (conventions.resolve_vllm)
BOUNDARY0_CRASH = ProblemKind.BOUNDARY0_RESIDUAL_NONE


def with_vllm_fixes(plan: CapturePlan, ids: list[int], target: TargetSpec, install: VllmInstall
                    ) -> CapturePlan:
    """A plan whose only error is the boundary-0 capture becomes servable when the plugin's fix
    applies: the layout is the ids, sorted (vLLM's order), and the source says which fix made it."""
    if not plan.errors or "boundary0" not in fixes_for(target, tuple(ids), install):
        return plan
    if plan.kinds() != {BOUNDARY0_CRASH}:
        return plan
    return CapturePlan(tuple(sorted(set(ids))), plan.num_layers,
                       plan.source + " + the workbook's vLLM boundary0 fix (plugin)", plan.notes,
                       tuple(p for p in plan.problems if not p.blocking))


def vllm_wirings(pair, rules: Engine, install: VllmInstall, training_layout: tuple[int, ...] | None,
                 retrained: Path | None, out_dir: Path) -> dict[str, tuple[Path, CapturePlan]]:
    """Each wiring's draft folder (copies under ``out_dir``, the originals untouched) and its plan."""
    out_dir = Path(out_dir)
    tspec = read_target(pair.target_dir)
    found = {"deployed": (pair.draft_dir, pair.served(rules))}
    if training_layout is not None:
        ids = [int(b) for b in training_layout]
        fix_a = with_engine_ids(pair.draft_dir, out_dir / "vllm-fix-a", ids, engine=rules)
        plan = pair.served(rules, config=read_draft_config(fix_a))
        found["fix A"] = (fix_a, with_vllm_fixes(plan, ids, tspec, install))
    if retrained is not None:
        rec = read_draft_config(retrained)
        record = read_record(retrained)
        layout = record.layout if record else None
        if layout is not None:
            fix_b = with_engine_ids(retrained, out_dir / "vllm-fix-b", [int(b) for b in layout], engine=rules)
            found["fix B"] = (fix_b, pair.served(rules, config=read_draft_config(fix_b)))
        else:
            found["fix B"] = (Path(retrained), pair.served(rules, config=rec))
    return found
