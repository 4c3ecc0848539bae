"""``python -m helpers check``: will this deployment feed the draft what it was trained on?

A static gate for CI before a deploy (``investigation.gate``): no weights are loaded, every problem comes
with its fix. Exit 0: the engine serves the trained layout; 1: it does not (or that cannot be known
statically); 2: bad input.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from .. import cli
from ..engines.sglang import source as ss
from ..errors import BadOption, InputError, fail
from ..investigation.gate import CheckRequest, check_deployment, format_report
from ..rules.wheels import PackageSourceError


def main(argv: Sequence[str] | None = None) -> int:
    p = cli.parser("check", __doc__)
    cli.add_pair_args(p, device=False, paths=False,
                      draft="the EAGLE-3 draft folder (config.json, safetensors), or its config.json "
                            "(the folder's training.json and safetensors are read either way)",
                      target="the target folder (only config.json is read)")
    p.add_argument("--target-config", help="the target's config.json alone, instead of --target")
    p.add_argument("--trainer", help="NAME[==VERSION] of the trainer that captured the features")
    p.add_argument("--train-ids", help="the ids the trainer was run with, in its own numbering")
    p.add_argument("--training-output", type=Path, default=None,
                   help="what the trainer wrote of its run: SpecForge's training_state.pt (or its checkpoint "
                        "folder), speculators' output folder (run.yaml, train_command.txt); its recorded ids "
                        "rank above a trainer's name and the config's format (read by default when the draft "
                        "folder holds them)")
    p.add_argument("--algorithm", default="EAGLE3",
                   help="the engine's speculative algorithm flag (EAGLE3 or EAGLE)")
    p.add_argument("--sglang-root",
                   help="an sglang/ tree to read instead of the cached release (a patched copy); its "
                        "setter runs sandboxed (child process, no network, no writes, restricted builtins: "
                        "docs/conventions.md)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size the target is served with")
    p.add_argument("--pp", type=int, default=1,
                   help="pipeline-parallel size: captures on a non-last stage may never reach the draft")
    p.add_argument("--measured", type=Path, default=None,
                   help="a dump written by `capture --backend vllm`: its measured_boundaries are the served "
                        "layout as the engine itself captured it")
    p.add_argument("--gguf", type=Path, default=None, metavar="FILE",
                   help="llama.cpp: the draft as converted to GGUF, whose eagle3.target_layers are what the "
                        "engine serves (run before llama-server; --engine llamacpp[==BUILD])")
    p.add_argument("--trtllm-options", type=Path, default=None, metavar="FILE",
                   help="TensorRT-LLM: the options file it is launched with (trtllm-serve "
                        "--extra_llm_api_options FILE.yaml, or JSON); its speculative_config's "
                        "eagle3_layers_to_capture are the ids served (without it: the release's default)")
    p.add_argument("--read-source", action="store_true",
                   help="vLLM: also check the capture facts against the release's own files (read by "
                        "ranges from the index, once)")
    args = p.parse_args(cli.glue_option_values(list(sys.argv[1:] if argv is None else argv), "--train-ids"))
    try:
        if args.draft is None:
            raise BadOption("--draft DIR is required")
        ids = cli.parse_int_list(args.train_ids, "--train-ids") if args.train_ids is not None else None
        if ids is not None and args.trainer is None:
            raise BadOption("--train-ids goes with --trainer NAME[==VERSION]")
        engine = cli.engine_value(args.engine) if args.engine is not None else None   # None: stated default
        request = CheckRequest(args.draft, engine, target=args.target, target_config=args.target_config,
                               trainer=args.trainer, train_ids=ids, algorithm=args.algorithm,
                               root=args.sglang_root, read_vllm_source=args.read_source, tp=args.tp,
                               pp=args.pp, measured=args.measured, gguf=args.gguf,
                               training_output=args.training_output, trtllm_options=args.trtllm_options)
        report = check_deployment(request)
    except (InputError, ss.SglangSourceError, PackageSourceError) as exc:
        return fail(exc)
    cli.emit(report, args.json, format_report)
    return report.exit_code
