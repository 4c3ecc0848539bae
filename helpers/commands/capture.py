"""``python -m helpers capture``: the hidden states an engine feeds the draft, written as a dump and measured.

Three ways in, one speculators-layout dump (``hs_{i}.safetensors`` and ``capture.json``) that
``diagnose --data`` and ``check --measured`` read:

- ``--backend sglang --target T --draft D [--engine sglang==0.5.9]``: the workbook starts SGLang from
  ``.venv-sglang`` with the draft and keeps what the draft's fc receives for each window
  (``engines.sglang.capture``); ``--engine`` names whose capture rule the live runtime runs (default: its
  own).
- ``--backend vllm --target T --draft D``: vLLM from ``.venv-vllm`` with its own extraction
  (``engines.vllm.capture``).
- ``--engine-url URL --tokenizer T``: a SGLang server the user already runs with
  ``--enable-return-aux-hidden-states``; ``--reference DUMP`` (known boundaries, same text) measures it.

The live backends match each slot against the target's own forward at every boundary: the served layout
measured (``measured_boundaries``), beside the layout the rules predict.
"""
from __future__ import annotations

import math
import sys
from dataclasses import asdict
from pathlib import Path

from .. import cli
from ..boundaries import parse_layout
from ..engines.sglang.capture import DEFAULT_TIMEOUT_S, CaptureError, capture_dump, capture_sglang
from ..engines.vllm.capture import capture_vllm
from ..errors import BadConfig, BadOption, BadText, InputError, fail, print_json, read_text_file
from ..investigation.dumps import check_new_dir, open_dump
from ..investigation.measured import match_slots
from ..investigation.pair import text_windows
from ..live.backends import choose
from ..model.target import load_target
from ..rules.conventions import read_draft_config, read_target, read_target_config
from ..rules.wiring import resolve

__all__ = ["DEFAULT_TIMEOUT_S", "CaptureError", "main"]

BACKENDS = ("sglang", "vllm")
# (window, records) when not given: a running server answers long windows quickly;
# an engine started here on a CPU less so
DEFAULTS = {None: (512, 8), "sglang": (256, 4), "vllm": (256, 4)}


def _parser():
    ap = cli.parser("capture", __doc__)
    ap.add_argument("--backend", choices=BACKENDS, default=None,
                    help="start this engine from its venv and capture through it: sglang (.venv-sglang) or "
                         "vllm (.venv-vllm); without it, --engine-url names a running SGLang server")
    ap.add_argument("--engine", action=cli.EngineOption, default=None,
                    help="whose capture rule the live engine runs: for --backend sglang, sglang==0.5.9 runs "
                         "that release's own setter inside the installed runtime (default: the runtime's "
                         "own); for --backend vllm only the installed release")
    ap.add_argument("--target", type=Path, default=None, help="--backend: the target's Hugging Face folder")
    ap.add_argument("--draft", type=Path, default=None,
                    help="--backend: the draft whose ids the engine reads (as its release reads them)")
    ap.add_argument("--layer-ids", default=None,
                    help="--backend vllm: ids to extract instead of the draft's, e.g. 0,3,7; --engine-url: "
                         "the ids the server was launched with (recorded in capture.json)")
    ap.add_argument("--engine-url", default=None, help="a running SGLang server, e.g. http://127.0.0.1:30000")
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="--engine-url: the target's directory (tokenizer and config)")
    ap.add_argument("--text", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--window", type=int, default=None, help="tokens per record (default 256; 512 with "
                                                             "--engine-url)")
    ap.add_argument("--records", type=int, default=None, help="records (default 4; 8 with --engine-url)")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                    help=f"seconds to wait for each request's answer (default {DEFAULT_TIMEOUT_S:g})")
    ap.add_argument("--slot-boundaries", default=None,
                    help="--engine-url: the slots' boundaries, when known (recorded)")
    ap.add_argument("--reference", type=Path, default=None,
                    help="--engine-url: a dump of known boundaries on the same text: measure which "
                         "boundaries the engine captured")
    ap.add_argument("--json", action="store_true", help="--backend: print the result as one JSON document")
    return ap


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = _parser()
    a = ap.parse_args(cli.glue_option_values(argv, "--layer-ids", "--slot-boundaries"))
    if a.engine_url is not None:
        if a.backend == "vllm":
            ap.error("--engine-url names a running SGLang server; --backend vllm starts vLLM itself "
                     "(give one)")
        unused = [o for o, v in (("--target", a.target), ("--draft", a.draft), ("--engine", a.engine),
                                 ("--json", a.json or None)) if v is not None]
        if unused:
            ap.error(f"{', '.join(unused)} start an engine (--backend); a running server (--engine-url) "
                     f"serves its own launch")
        if a.tokenizer is None:
            ap.error("--engine-url needs --tokenizer (the target's directory)")
        a.backend = None
    elif a.backend is None:
        ap.error("give --backend sglang|vllm --target DIR --draft DIR (the workbook starts the engine) or "
                 "--engine-url URL --tokenizer DIR (a running SGLang server)")
    else:
        unused = [o for o, v in (("--tokenizer", a.tokenizer), ("--reference", a.reference),
                                 ("--slot-boundaries", a.slot_boundaries)) if v is not None]
        if unused:
            ap.error(f"{', '.join(unused)} belong to --engine-url; --backend measures against the target "
                     f"itself (--target)")
        if a.target is None:
            ap.error(f"--backend {a.backend} needs --target DIR")
    window, records = DEFAULTS[a.backend]
    a.window = window if a.window is None else a.window
    a.records = records if a.records is None else a.records
    if a.window < 8 or a.records < 1:
        ap.error(f"--window must be at least 8 and --records at least 1, got {a.window}, {a.records}")
    if not math.isfinite(a.timeout) or a.timeout <= 0:
        ap.error(f"--timeout must be a positive number of seconds, got {a.timeout:g}")
    if a.backend == "sglang":
        return _main_sglang(a)
    if a.backend == "vllm":
        return _main_vllm(a)
    return _main_url(a)


def _main_url(a) -> int:
    """``--engine-url``: a SGLang server the user already runs."""
    try:
        from transformers import AutoTokenizer

        if not a.engine_url.startswith(("http://", "https://")):
            raise BadOption(f"--engine-url {a.engine_url!r}: expected http://HOST:PORT")
        cfg = read_target_config(a.tokenizer)
        hidden = cfg.get("hidden_size")
        if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden < 1:
            raise BadConfig(f"{Path(a.tokenizer) / 'config.json'} has no integer hidden_size (got "
                            f"{hidden!r}); expected the target's config beside its tokenizer")
        meta = {}
        if a.layer_ids:
            meta["layer_ids"] = cli.parse_int_list(a.layer_ids, "--layer-ids")
        if a.slot_boundaries:
            meta["slot_boundaries"] = list(parse_layout(a.slot_boundaries))
        if a.reference is not None:      # checked before the capture, not after minutes of it
            ref = open_dump(a.reference)
            if ref.hidden != hidden:
                raise BadText(f"--reference {ref.root} is {ref.hidden} wide; the target at {a.tokenizer} has "
                              f"hidden_size {hidden}")
        check_new_dir(a.out)
        text = read_text_file(a.text, "text file")
        tok = AutoTokenizer.from_pretrained(a.tokenizer)
        windows = text_windows(tok, text, a.window, a.records, min_windows=1)
        out = capture_dump(a.engine_url, windows, hidden, a.out, meta=meta, progress=True, timeout=a.timeout)
        print(f"wrote {out}")
        if a.reference is not None:
            print_json({"served_slots_measured": match_slots(out, a.reference)}, indent=2)
    except RuntimeError as exc:      # the engine refused the request (HTTP error body)
        return fail(exc)
    except (FileNotFoundError, ValueError, OSError) as exc:
        return fail(exc)
    return 0


def _live_backend(family: str, engine):
    """The runtime ``--backend`` names, under the rules ``--engine`` names (None: its own release's); one
    line when this host has no such engine or it cannot run those rules."""
    named = cli.engine_value(engine) if engine is not None else None
    backend = choose(family, named)
    if not backend.live:
        raise BadOption(backend.unavailable)
    why = backend.refuses(named)
    if why:
        raise BadOption(why)
    return backend


def _main_sglang(a) -> int:
    """``--backend sglang``: SGLang with the draft, from .venv-sglang; what its fc receives, measured."""
    try:
        if a.draft is None:
            raise BadOption("--backend sglang needs --draft DIR: what the live engine feeds that draft is "
                            "what is captured")
        if a.layer_ids is not None:
            raise BadOption("--backend sglang captures the ids the engine reads from --draft; --layer-ids is "
                            "for --backend vllm or --engine-url (write other ids into a copy of the draft: "
                            "python -m helpers fixes ids)")
        backend = _live_backend("sglang", a.engine)
        check_new_dir(a.out)
        tspec = read_target(a.target)
        if tspec.hidden_size is None:
            raise BadConfig(f"{tspec.where} has no integer hidden_size")
        cfg = read_draft_config(a.draft)
        text = read_text_file(a.text, "text file")
        plan = resolve(backend.engine, tspec.arch or "", tspec.num_layers, draft=cfg,
                       target_config=tspec.config)
        predicted = list(plan.served_layout)
        target, windows = _target_windows(a, tspec, text)
        run = capture_sglang(backend.install, a.target, a.draft, windows, a.out, target=target,
                             hidden=tspec.hidden_size, capture_rule=backend.capture_rule, timeout=a.timeout,
                             meta={"predicted_layout": predicted, "predicted_by": str(backend.engine),
                                   "draft": str(a.draft)})
    except (InputError, FileNotFoundError, OSError, ValueError) as exc:
        return fail(exc)
    measured = run.measured
    agree = measured == sorted(predicted)
    if a.json:
        print_json({"dump": str(run.out), "backend": f"sglang=={run.version}", "rules": run.rules,
                    "layer_ids": run.ids, "layers_to_capture": run.layers_to_capture,
                    "predicted_layout": predicted, "measured_boundaries": measured,
                    "slot_matches": [asdict(m) for m in run.matches], "start_seconds": run.start_seconds,
                    "seconds": run.seconds}, indent=2)
    else:
        print(f"wrote {run.out} ({run.records} records of {run.tokens} tokens, SGLang {run.rules}, "
              f"{run.seconds:.1f} s with a {run.start_seconds:.1f} s start)")
        for m in run.matches:
            print(f"  slot {m.slot}: id {m.layer_id} -> boundary {m.boundary} "
                  f"(max abs diff {m.max_abs_diff:.2e})")
        print(f"  predicted {tuple(predicted)} by {backend.engine}'s rules; measured {tuple(measured)}: "
              f"{'the prediction holds' if agree else 'THEY DIFFER'}")
    return 0 if agree else 1


def _main_vllm(a) -> int:
    """``--backend vllm``: the real engine's extraction with the draft's own ids, measured."""
    try:
        if (a.draft is None) == (a.layer_ids is None):
            raise BadOption("give --draft DIR (its ids, as vLLM reads them) or --layer-ids a,b,c "
                            "(one of them)")
        install = _live_backend("vllm", a.engine).install
        check_new_dir(a.out)
        tspec = read_target(a.target)
        text = read_text_file(a.text, "text file")
        arch, layers = tspec.arch or "", tspec.num_layers
        if a.draft is not None:
            plan = resolve(install.engine, arch, layers, draft=read_draft_config(a.draft))
            ids, predicted = list(plan.layers_to_capture), list(plan.served_layout)
        else:
            ids = cli.parse_int_list(a.layer_ids, "--layer-ids")
            plan = resolve(install.engine, arch, layers, ids=ids)
            predicted = list(plan.served_layout)
        target, windows = _target_windows(a, tspec, text)
        out, matches = capture_vllm(install, a.target, windows, ids, a.out, target=target,
                                    meta={"predicted_layout": predicted, "rules": str(install.engine),
                                          "draft": str(a.draft) if a.draft else None})
    except (InputError, FileNotFoundError, OSError, ValueError) as exc:
        return fail(exc)
    measured = [m.boundary for m in matches]
    if a.json:
        print_json({"dump": str(out), "layer_ids": sorted(set(ids)), "predicted_layout": predicted,
                    "measured_boundaries": measured, "slot_matches": [asdict(m) for m in matches]},
                   indent=2)
    else:
        print(f"wrote {out} ({windows.shape[0]} records of {windows.shape[1]} tokens, "
              f"vLLM {install.version})")
        for m in matches:
            print(f"  slot {m.slot}: id {m.layer_id} -> boundary {m.boundary} "
                  f"(max abs diff {m.max_abs_diff:.2e})")
        agree = measured == sorted(predicted)
        print(f"  predicted {tuple(predicted)} by {install.engine}'s rules; measured {tuple(measured)}: "
              f"{'the prediction holds' if agree else 'THEY DIFFER'}")
    return 0 if measured == sorted(predicted) else 1


def _target_windows(a, tspec, text: str):
    """The target (its own forward measures each slot) and the text's windows, fitting its positions."""
    target, tok = load_target(a.target)
    limit = int(tspec.config.get("max_position_embeddings") or a.window)
    if a.window > limit:
        raise BadOption(f"--window {a.window} exceeds the target's {limit} positions")
    return target, text_windows(tok, text, a.window, a.records, min_windows=1)


if __name__ == "__main__":
    sys.exit(main())
