"""``python -m helpers fixes``: write a draft's training record, or a fixed copy of a draft.

- ``record``: the training record (``training.json``, docs/metrics.md) beside a draft, from what the user
  knows (``--layout``, or ``--trainer`` with ``--train-ids``) or from what ``diagnose --json`` measured
  (``--from-diagnose``). The engine guard and every check read it; without one, each says how it settled
  the layout instead.
- ``ids``: a copy whose config gives an engine the ids it turns into the trained layout (fix A).
- ``reorder``: a copy whose ``fc`` slots are permuted to the order the engine concatenates (fix C).
- ``deploy``: one copy for every engine named (``--engine`` repeated): the format each loads, each engine's
  ids from its own rule, ``check`` run on the copy for each before it is written (one copy per engine where
  no single config serves them all). The fix ``check``, ``diagnose`` and the guard print is this command.

Each writes a new folder (``ids``, ``reorder``) or only ``training.json`` (``record``); bad input changes
nothing.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from ..cli import engine_value, glue_option_values, parse_int_list, parser
from ..errors import BadOption, read_json_file, say
from ..profile import from_record, write_profile
from ..record import read_record, write_record
from ..rules.conventions import IdsAt, read_target


def _args(argv):
    p = parser("fixes", __doc__)
    sub = p.add_subparsers(dest="action", required=True, parser_class=type(p))
    r = sub.add_parser("record", help="write training.json beside a draft")
    r.add_argument("--draft", type=Path, required=True, help="the draft folder")
    how = r.add_mutually_exclusive_group(required=True)
    how.add_argument("--layout", help="the boundaries the fc slots were trained on, in order, e.g. 0,3,7")
    how.add_argument("--trainer", help="the trainer and release, e.g. speculators==0.4.0 (with --train-ids, "
                                       "or its defaults)")
    how.add_argument("--from-diagnose", type=Path, help="a 'diagnose --json' output to take the layout from "
                                                        "(only when it was confident)")
    r.add_argument("--train-ids", help="the ids in the trainer's own config, e.g. 2,6,9 (with --trainer)")
    r.add_argument("--num-layers", type=int, help="the target's layer count (with --trainer; default: the "
                                                  "draft config's target_num_layers or --target's)")
    r.add_argument("--target", type=Path, help="target folder: its layer count and class (with --trainer)")
    r.add_argument("--arch", help="the target class, e.g. LlamaForCausalLM (with --trainer, no --target)")
    r.add_argument("--full-acc", help="per-step acceptance at training (full_acc), e.g. 0.70,0.52,0.40")
    i = sub.add_parser("ids", help="a copy whose config makes an engine serve the trained layout")
    i.add_argument("--draft", type=Path, required=True)
    i.add_argument("--out", type=Path, required=True, help="a new folder for the copy")
    i.add_argument("--engine", required=True, help="sglang or vllm: whose key and convention to write")
    i.add_argument("--ids", required=True, help="the ids that engine turns into the layout, e.g. -1,2,6")
    i.add_argument("--layout", help="the boundaries those ids mean (needed when the draft carries ids for "
                                    "both engines)")
    o = sub.add_parser("reorder", help="a copy whose fc slots follow the order the engine concatenates")
    o.add_argument("--draft", type=Path, required=True)
    o.add_argument("--out", type=Path, required=True)
    o.add_argument("--served", required=True, help="the boundaries the engine feeds, in order, e.g. 3,7,10")
    o.add_argument("--trained", help="the trained layout (default: the draft's training record)")
    d = sub.add_parser("deploy", help="one copy that every engine named serves at the trained layout, "
                                      "checked by their own rules before it is written")
    d.add_argument("--draft", type=Path, required=True)
    d.add_argument("--out", type=Path, required=True, help="a new folder for the copy (or one per engine)")
    d.add_argument("--engine", action="append", required=True,
                   help="an engine and release to serve it on, repeated: --engine sglang==0.5.23 --engine "
                        "vllm==0.34.0 --engine llamacpp==b11434")
    d.add_argument("--target", type=Path, required=True, help="the target folder (its class and layer count)")
    d.add_argument("--layout", help="the trained layout, e.g. 0,3,7 (default: the draft's training record)")
    d.add_argument("--json", action="store_true", help="print the outcome as one JSON document")
    return p.parse_args(glue_option_values(list(argv), "--ids", "--layout", "--served", "--trained",
                                           "--train-ids"))


def _target_shape(a) -> tuple[int, str | None]:
    """(layer count, architecture) for a trainer's rule: from --num-layers/--arch, else --target's config."""
    target = read_target(a.target) if a.target is not None else None
    n = a.num_layers or (target.num_layers if target else None)
    if not isinstance(n, int):
        raise BadOption("--trainer needs the target's layer count: give --num-layers N or --target DIR")
    return n, a.arch or (target.arch if target else None)


def _fractions(text: str, option: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise BadOption(f"cannot read {option} from {text!r}; expected fractions like 0.70,0.52") from None


def record(a) -> int:
    from ..investigation.fixes import check_record_layout

    fields: dict = {"source": "user"}
    if a.layout:
        fields["training_boundaries"] = parse_int_list(a.layout, "--layout", "0,3,7")
    elif a.trainer:
        from ..rules.trainers import trainer_layout

        ids = parse_int_list(a.train_ids, "--train-ids", "2,6,9") if a.train_ids else None
        n, arch = _target_shape(a)
        result = trainer_layout(a.trainer, n, ids, arch=arch)
        if result.training_layout is None:
            why = "; ".join(result.errors) or "no boundary fits"
            raise BadOption(f"{a.trainer} with ids {result.ids}: {why}")
        fields.update(training_boundaries=list(result.training_layout), trainer=a.trainer,
                      captured_boundaries=[c for c in result.captured if isinstance(c, int)] or None,
                      train_ids=result.ids)
    else:
        d = read_json_file(a.from_diagnose, "diagnose --json output")
        if not isinstance(d, dict) or "best_layout" not in d:
            raise BadOption(f"{a.from_diagnose}: not a 'diagnose --json' output (no best_layout)")
        settled = d.get("training_layout", d["best_layout"] if d.get("confident") else None)
        if not settled:
            held = d.get("candidate_layouts") or d.get("confident_set") or []
            raise BadOption(f"{a.from_diagnose}: diagnose could not separate {len(held)} layouts "
                            f"({', '.join(map(str, held[:4]))}); give --layout, or rerun diagnose on more "
                            f"text")
        fields.update(training_boundaries=list(settled), source="diagnose",
                      full_acc=d.get("best_full_acc") if list(settled) == list(d["best_layout"]) else None)
    if a.full_acc:
        fields["full_acc"] = _fractions(a.full_acc, "--full-acc")
    before = read_record(a.draft)
    unchecked = check_record_layout(a.draft, fields["training_boundaries"], before, a.target, a.num_layers)
    rec = write_record(a.draft, **fields)
    was = f" (was {before.layout})" if before and before.layout and before.layout != rec.layout else ""
    say(f"wrote {rec.path}: training_boundaries {list(rec.layout)}{was}, source {rec.source}")
    if unchecked:
        say(f"note: {unchecked}")
    prof = from_record(rec)
    if prof is not None:
        path = write_profile(a.draft, prof)
        say(f"wrote {path}: expected accept length {prof.accept_length:.3f} at temperature 0 "
            f"(marginal per position {[round(x, 3) for x in prof.marginal]}); diagnose --metrics and the "
            f"engine guard read it, --baseline gates on it")
    return 0


def ids(a) -> int:
    from ..investigation.fixes import with_engine_ids

    engine = engine_value(a.engine)
    layout = parse_int_list(a.layout, "--layout", "0,3,7") if a.layout else None
    out = with_engine_ids(a.draft, a.out, parse_int_list(a.ids, "--ids"), engine=engine, layout=layout)
    cfg = json.loads((out / "config.json").read_text(encoding="utf-8"))
    nested = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    top = cfg.get("eagle_aux_hidden_state_layer_ids")
    written = nested if engine.rules.ids_home == IdsAt.EAGLE_CONFIG else top
    say(f"wrote {out}: the ids {engine.name} reads are {written}")
    return 0


def reorder(a) -> int:
    from ..investigation.fixes import reorder_fc

    served = parse_int_list(a.served, "--served", "3,7,10")
    if a.trained:
        trained = parse_int_list(a.trained, "--trained", "7,3,10")
    else:
        rec = read_record(a.draft)
        if rec is None or rec.layout is None:
            raise BadOption(f"{a.draft} has no training record naming its layout; give --trained")
        trained = list(rec.layout)
    out = reorder_fc(a.draft, a.out, trained, served)
    say(f"wrote {out}: fc slots reordered from {tuple(trained)} to {tuple(served)}")
    return 0


def deploy(a) -> int:
    from ..investigation.fixes import deploy as write_deployment

    engines = [engine_value(e) for e in a.engine]
    layout = parse_int_list(a.layout, "--layout", "0,3,7") if a.layout else None
    d = write_deployment(a.draft, a.out, engines, target=a.target, layout=layout)
    if a.json:
        print(json.dumps(d.to_dict(), indent=2))
        return d.exit_code
    head = (f"wrote {d.out}: one copy every engine named serves" if d.ok and d.shared else
            f"wrote {d.out}: one copy per engine (no single config serves them all)" if d.ok else
            f"wrote nothing: not every engine named serves {d.trained} from a copy")
    say(head)
    say(f"  trained on {d.trained}; format {d.fmt}" + (" (converted)" if d.converted else "")
        + ("; fc slots permuted into ascending order" if d.reordered else ""))
    for f in d.fixes:
        where = f" [{f.folder}]" if f.folder is not None and not d.shared else ""
        ids = f"{f.key} ids {list(f.ids)}" if f.ids is not None and f.key else "no ids"
        say(f"  {f.engine:<18} {ids}: {f.verdict}{where}")
        if f.then and f.ok:
            say(f"  {'':<18} then {f.then}")
    for k in d.dropped:
        say(f"  left out {k}: no engine named reads it")
    return d.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    a = _args(argv or [])
    return {"record": record, "ids": ids, "reorder": reorder, "deploy": deploy}[a.action](a)
