"""``diagnose --data`` and ``dump``: the command-line side of dump diagnosis.

``diagnose --data DUMP`` answers the wiring question from the trainer's own saved states, so it
runs where the target cannot: only the draft is loaded, plus -- with ``--target`` -- the
target's config, embedding, final norm and head. ``dump`` writes each trainer's layout from a
pair the workbook can run, to check a trainer's output against or to test with.
"""
from __future__ import annotations

import sys
from pathlib import Path

from .. import cli
from ..boundaries import layout_label, parse_layout
from ..errors import BadOption, BadText, fail, print_json
from ..factory.dump_writer import write_from_text
from ..investigation.dump_diagnose import RANKED_BY, diagnose_dump, load_for_dump, stated_layout
from ..investigation.dumps import FORMATS, check_new_dir, open_dump
from ..investigation.pair import check_device
from ..rules.conventions import assumed_engine_line


def parse_slot_boundaries(text: str | None):
    if text is None:
        return None
    out = []
    for p in text.replace(",", " ").split():
        if p in ("?", "none", "None"):
            out.append(None)
            continue
        try:
            out.append(int(p))
        except ValueError:
            raise BadOption(f"--slot-boundaries {text!r}: expected integers or '?', like 0,3,7,12") from None
    return out


def run_dump_diagnosis(a, assumed_engine: str | None = None) -> int:
    """``diagnose --data``; ``assumed_engine``: the release assumed without --engine (said first)."""
    try:
        for name in ("max_records", "max_tokens"):
            v = getattr(a, name)
            if v is not None and v < 1:
                raise BadOption(f"--{name.replace('_', '-')} must be at least 1, got {v}")
        if a.max_tokens is not None and a.max_tokens < a.steps + 3:   # what scoring one record needs
            raise BadOption(f"--max-tokens {a.max_tokens} is too few for {a.steps} draft step(s): scoring "
                            f"needs at least --steps + 3 = {a.steps + 3} tokens")
        stated = parse_slot_boundaries(a.slot_boundaries)
        dump = open_dump(a.data)                           # before any weights load: a bad dump fails fast
        draft, heads, target, tspec, notes, dcfg = load_for_dump(a.draft, a.target, a.run_target, a.device)
        arch, L = (tspec.arch, tspec.num_layers) if tspec is not None else (None, None)
        if stated is not None and L is not None:
            for b in stated:
                if b is not None and not 0 <= b <= L:
                    raise BadOption(f"--slot-boundaries {a.slot_boundaries}: boundary {b} is outside 0..{L}")
        if dump.recorded_boundaries is not None and L is not None:
            beyond = [b for b in dump.recorded_boundaries if not 0 <= b <= L]
            if beyond:
                raise BadText(f"{dump.record_source} names boundaries {list(dump.recorded_boundaries)}, but "
                              f"the target has {L} layers (boundaries 0..{L}): {beyond} cannot be states of "
                              f"this target; is it the target the dump was written from?")
        recorded, source = stated_layout(a.draft, dcfg, a.engine, arch, L)
        d = diagnose_dump(draft, dump, heads=heads, target=target, stated=stated, engine=a.engine,
                          draft_config=dcfg, arch=arch, num_layers=L, steps=a.steps,
                          max_records=a.max_records, max_tokens=a.max_tokens, progress=not a.json,
                          recorded=recorded, recorded_source=source or "training record")
        d.notes = notes + d.notes
    except (FileNotFoundError, ValueError) as exc:   # InputError is a ValueError
        return fail(exc)
    if a.json:
        print_json({"assumed_engine": assumed_engine} | d.to_dict())
        return d.exit_code
    if assumed_engine:
        print(assumed_engine_line(assumed_engine))
    print(format_dump_diagnosis(d, a.engine))
    return d.exit_code


def _row_text(r: dict | None) -> str:
    if not r:
        return "not measurable from this dump"
    return (f"accept length {r['sim_accept_length']:.3f}   step-0 acc {r['acc0']:.3f}   ce {r['ce']:.3f}")


def format_dump_diagnosis(d, engine: str | None) -> str:
    L = d.num_layers
    out = list(d.wiring.head if d.wiring else [d.verdict])
    out.append(f"dump: {d.dump.root} ({d.dump.format}, {d.records} records, {d.tokens} scored tokens; "
               f"labels: {d.labels})")
    out.append("evidence:")
    for s in d.slots:
        name = "?" if s.boundary is None else (layout_label((s.boundary,), L)[1:-1] if L else str(s.boundary))
        out.append(f"   slot {s.slot}: boundary {'?' if s.boundary is None else s.boundary} ({name})   "
                   f"[{s.how}]")
    best = d.best
    out.append(f"ranked by {RANKED_BY}, {d.steps} draft steps")
    out.append(f"best: slots {tuple(best['slots'])} = {best['label']}   {_row_text(best)}")
    cs = d.confident_set
    r = d.ranking.loc[1] if len(d.ranking) > 1 else None
    z = "" if r is None else f"runner-up {tuple(r['slots'])} z = {r['z_vs_best']:.1f}"
    if len(cs) > 1:
        out.append(f"   NOT confident ({z}): {len(cs)} layouts within noise of the best: {cs[:6]}"
                   + (" ..." if len(cs) > 6 else ""))
    elif r is not None:
        out.append(f"   {z} (confident)")
    if d.trained_slots is not None:
        src = d.wiring.trained_source if d.wiring and d.wiring.trained_known else "the trainer's"
        out.append(f"trained ({src}): slots {d.trained_slots} = {d.trained_layout}   "
                   f"{_row_text(d.row(d.trained_slots))}")
    if engine:
        if d.served_errors:
            out.append(f"served by {engine}: {d.served_layout}   CANNOT FEED THIS DRAFT: "
                       f"{'; '.join(d.served_errors)}")
        elif d.served_layout is not None:
            out.append(f"served by {engine}: {d.served_layout} [{d.served_source}]   "
                       f"{_row_text(d.served_row)}")
    for n in d.notes:
        out.append(f"   note: {n}")
    return "\n".join(out)


# --------------------------------------------------------------------------------------
# python -m helpers dump


def main(argv=None) -> int:
    ap = cli.parser("dump", "write a hidden-state dump in a trainer's layout from a runnable target")
    cli.add_pair_args(ap, draft=None, engine=None, json=False, required=True)
    ap.add_argument("--boundaries", required=True, help="ascending boundaries to save, e.g. 0,3,7,12")
    ap.add_argument("--format", choices=FORMATS, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--text", type=Path, default=None,
                    help="text to dump (default: heldout.txt beside the target's folder, named on stderr; "
                         "without one, --text is required)")
    ap.add_argument("--window", type=int, default=256, help="tokens per record")
    ap.add_argument("--records", type=int, default=12, help="records to write at most")
    a = ap.parse_args(argv)
    try:
        if a.window < 8 or a.records < 1:
            raise BadOption(f"--window must be at least 8 and --records at least 1, got {a.window} and "
                            f"{a.records}")
        check_device(a.device)
        bounds = parse_layout(a.boundaries)
        if not bounds:
            raise BadOption(f"--boundaries {a.boundaries!r} names no boundary; expected ascending integers "
                            f"like 0,3,7,12")
        check_new_dir(a.out)                 # before the target loads
        written = write_from_text(a.target, bounds, a.format, a.out, a.text, a.window, a.records, a.device,
                                  progress=True, say_text=True)
    except (FileNotFoundError, ValueError) as exc:
        return fail(exc)
    print(f"wrote {written}")
    return 0



if __name__ == "__main__":
    sys.exit(main())
