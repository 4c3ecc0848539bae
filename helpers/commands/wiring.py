"""Resolve a draft's layer ids to the boundaries an engine serves (and the trainer's side, and every release).

``python -m helpers wiring --engine sglang==0.5.9 --target T --draft D`` answers for one engine
release; ``--trainer speculators==0.4.0 --layers 61`` for the trainer's side; ``--matrix`` for every
SGLang release since EAGLE-3. Exit 0: capturable; 1: resolved, but the engine cannot feed the draft
(or the trainer captured no boundary); 2: bad input.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from .. import cli
from ..boundaries import WiringError, WiringResult
from ..engines.sglang import source as ss
from ..errors import BadOption, InputError, fail, print_json
from ..rules.conventions import IdsAt, TargetSpec, read_target
from ..rules.matrix import format_runs, matrix, runs, write_doc
from ..rules.trainers import TRAINERS, trainer_layout
from ..rules.wheels import PackageSourceError
from ..rules.wiring import resolve


def _parser():
    p = cli.parser("wiring", __doc__)
    p.add_argument("--arch", help="target architecture, e.g. DeepseekV3ForCausalLM")
    p.add_argument("--layers", type=int, help="number of decoder layers L of the target")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--ids", help="explicit ids, e.g. -1,2,6")
    g.add_argument("--train-ids", help="with --trainer: the ids the trainer captured, in its own numbering")
    cli.add_pair_args(g, target=None, engine=None, device=False, json=False, paths=False,
                      draft="draft checkpoint folder (or its config.json)")
    cli.add_pair_args(p, draft=None, device=False, paths=False,
                      target="target folder: arch and num_hidden_layers from its config.json")
    p.add_argument("--sglang-root", help="folder holding an sglang/ tree to read instead of the cache; its "
                   "setter runs sandboxed (child process, no network, no writes, restricted builtins: "
                   "docs/conventions.md)")
    p.add_argument("--trtllm-options", type=Path, default=None, metavar="FILE",
                   help="TensorRT-LLM: the options file it is launched with (trtllm-serve "
                        "--extra_llm_api_options FILE.yaml, or JSON): its eagle3_layers_to_capture are "
                        "served")
    p.add_argument("--read-source", action="store_true",
                   help="vLLM: also check the capture facts against the release's own files (read by ranges "
                        "from the index, once; the whole wheel where ranges cannot be read)")
    modes = p.add_argument_group("other questions")
    modes.add_argument("--trainer", help="the trainer's side instead: NAME[==VERSION], one of "
                       + ", ".join(sorted({r.name for r in TRAINERS})))
    modes.add_argument("--matrix", action="store_true",
                       help="every SGLang release since EAGLE-3, grouped into runs that serve alike")
    modes.add_argument("--versions", help="with --matrix: only these releases, e.g. 0.5.9,0.5.23")
    modes.add_argument("--matrix-doc", metavar="FILE",
                       help="regenerate the committed table for the common families (docs/sglang-matrix.md)")
    return p


def _target_arch_and_layers(args, target: TargetSpec | None) -> tuple[str, int]:
    """--arch/--layers, or the target's config.json; when both are given they must agree,
    since a report about a different depth or class than the target's is silently wrong."""
    cfg_arch, cfg_layers = (target.arch, target.num_layers) if target is not None else (None, None)
    if target is not None:
        where = Path(args.target) if Path(args.target).is_file() else Path(args.target) / "config.json"
        if args.layers is not None and cfg_layers is not None and args.layers != cfg_layers:
            raise WiringError(f"--layers {args.layers} contradicts {where}, which has num_hidden_layers = "
                              f"{cfg_layers}; drop --layers or pass the matching value")
        if args.arch is not None and cfg_arch is not None and args.arch != cfg_arch:
            raise WiringError(f"--arch {args.arch} contradicts {where}, whose architectures are "
                              f"{list(target.architectures)}; drop --arch or pass the matching name")
    arch = args.arch or cfg_arch
    layers = args.layers if args.layers is not None else cfg_layers
    if not arch or layers is None:
        missing = " and ".join(n for n, v in (("--arch", arch), ("--layers", layers)) if v is None or v == "")
        raise WiringError(f"need --arch and --layers (or --target DIR with a config.json); missing {missing}")
    return arch, layers


def format_report(r: WiringResult) -> str:
    lines = [f"{r.engine}  {r.arch}  L={r.num_layers}  (its rule {r.rule_basis})",
             f"  ids used          : {r.ids_used} ({r.ids_source})",
             f"  layers_to_capture : {r.layers_to_capture}",
             f"  served layout     : {r.served_layout}  {r.label}",
             f"  capturable        : {'yes' if r.capturable else 'NO'}"]
    lines += [f"  error: {e}" for e in r.errors]
    lines += [f"  warning: {w}" for w in r.warnings]
    if r.source_lines:
        lines.append("  source:")
        lines += [f"    {s['file']}{'' if s.get('line') is None else ':' + str(s['line'])}"
                  f"{' @ ' + s['commit'][:10] if s.get('commit') else ''}: {s['text']}"
                  for s in r.source_lines]
    return "\n".join(lines)


def _other_modes(args) -> int | None:
    """--trainer, --matrix and --matrix-doc: None when the plain engine question was asked."""
    if args.matrix_doc:
        doc = Path(args.matrix_doc)
        if doc.is_dir():
            raise BadOption(f"--matrix-doc {doc} is a folder; expected the markdown file to write, e.g. "
                            f"{doc / 'sglang-matrix.md'}")
        blocked = next((d for d in doc.parents if d.exists() and not d.is_dir()), None)
        if blocked is not None:
            raise BadOption(f"--matrix-doc {doc}: {blocked} is a file, so nothing can be written under it")
        path = write_doc(doc, _versions(args), progress=True)
        print(f"wrote {path}")
        return 0
    if not (args.trainer or args.matrix):
        if args.train_ids is not None:
            raise BadOption("--train-ids goes with --trainer NAME[==VERSION]")
        return None
    target = read_target(args.target) if args.target is not None else None     # read once
    if args.trainer:
        layers = args.layers if args.layers is not None else (target.num_layers if target else None)
        if layers is None:
            raise BadOption("--trainer needs --layers N (or --target DIR)")
        arch = args.arch or (target.arch if target else None)
        ids = cli.parse_int_list(args.train_ids, "--train-ids") if args.train_ids is not None else None
        res = trainer_layout(args.trainer, layers, ids, arch=arch)
        cli.emit(res, args.json, format_trainer)
        return 1 if res.errors else 0
    arch, layers = _target_arch_and_layers(args, target)
    ids = cli.parse_int_list(args.ids, "--ids") if args.ids is not None else None
    versions = _versions(args)
    found = runs(matrix(arch, layers, ids, draft=args.draft, versions=versions, progress=not args.json))
    if found and all(r.status == "no such model class" for r in found):
        first, last = found[0].first, found[-1].last
        span = first if first == last else f"{first} .. {last}"
        raise WiringError(f"--arch {arch}: no SGLang release read ({span}) registers a model class of that "
                          f"name; expected an architecture from the target's config.json, e.g. "
                          f"LlamaForCausalLM")
    if not found:
        raise WiringError("no SGLang release to read for --matrix (none listed or cached); go online once, "
                          "or pass --versions")
    if args.json:
        print_json({"arch": arch, "num_layers": layers, "ids": ids, "runs": [r.to_dict() for r in found]},
                   indent=2)
    else:
        print(format_runs(arch, layers, ids, found))
    return 0


def _versions(args) -> list[str] | None:
    """--versions as a list; None (every release) only when the flag is absent: an empty value is a
    typo, and 'every release' would fetch every wheel online, or quietly cover only the cached ones."""
    if args.versions is None:
        return None
    found = [v.strip() for v in args.versions.split(",") if v.strip()]
    if not found or len(found) != len(args.versions.split(",")):
        raise BadOption(f"--versions {args.versions!r} has an empty entry; expected releases like "
                        f"0.5.9,0.5.23, or leave --versions out for every release")
    for v in found:
        ss.check_version_string(v)
    return found


def format_trainer(r) -> str:
    lines = [f"{r.trainer}{'==' + r.version if r.version else ''}  L={r.num_layers}  ({r.rule})",
             f"  ids             : {r.ids} ({'given' if r.ids_source == IdsAt.EXPLICIT else 'its default'})",
             f"  captured        : {r.captured}",
             f"  trained fc on   : {r.training_layout}  {r.label}",
             f"  writes ids to   : {r.writes_ids}",
             f"  read from       : {r.read_from}"]
    lines += [f"  error: {e}" for e in r.errors] + [f"  note: {w}" for w in r.warnings]
    lines += [f"    {s['file']}:{s['line']}: {s['text']}" for s in r.source_lines]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: 0 = capturable, 1 = resolved but not capturable, 2 = bad input."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(cli.glue_option_values(argv, "--ids", "--train-ids"))
        other = _other_modes(args)
        if other is not None:
            return other
        target = read_target(args.target) if args.target is not None else None
        arch, layers = _target_arch_and_layers(args, target)
        ids = (cli.parse_int_list(args.ids, "--ids",
                                  empty_hint=", or omit --ids to use the engine's default ids")
               if args.ids is not None else None)
        engine, assumed = cli.stated_engine(args.engine)      # no --engine: the stated default, said first
        options = None
        if args.trtllm_options is not None:
            from ..engines.trtllm.options import read_options

            options = read_options(args.trtllm_options)
        result = resolve(engine, arch, layers, ids=ids, draft=args.draft, root=args.sglang_root,
                         target_config=target.config if target else None, read_vllm_source=args.read_source,
                         options=options)
    except SystemExit as exc:  # --help, or a flag argparse refused (already said in one line)
        return int(exc.code or 0)
    except (InputError, ss.SglangSourceError, PackageSourceError) as exc:
        return fail(exc)
    if args.json:
        print_json({"assumed_engine": str(engine) if assumed else None} | result.to_dict(), indent=2)
    else:
        print("\n".join(([assumed] if assumed else []) + [format_report(result)]))
    return 0 if result.capturable else 1
