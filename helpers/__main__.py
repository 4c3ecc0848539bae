"""``python -m helpers <command>``: one entry point, each command in the module that owns it."""
from __future__ import annotations

import importlib
import sys

from . import errors
from .errors import HeldStderr, InputError, fail, say

COMMANDS = {
    "build-default": ("helpers.commands.build", "build the embedded target/draft pair (data/tiny-kimi)"),
    "bench": ("helpers.commands.bench", "baseline vs speculative tok/s and accept length, one process"),
    "diagnose": ("helpers.commands.diagnose",
                 "which layout was the draft trained on, and what does the engine serve"),
    "dump": ("helpers.commands.dump",
             "write a hidden-state dump in a trainer's layout (speculators, SpecForge)"),
    "scale-check": ("helpers.commands.scale_check",
                    "dump diagnosis cost at a 7168-wide draft: peak memory, s per 1000 tokens"),
    "capture": ("helpers.commands.capture",
                "capture what an engine feeds the draft into a dump, measured (SGLang or vLLM started here, "
                "or a running SGLang)"),
    "check": ("helpers.commands.check",
              "pre-deployment gate: will the engine serve the trained layout? (no weights)"),
    "fixes": ("helpers.commands.fixes", "write a draft's training record, or a fixed copy (ids, fc order)"),
    "wiring": ("helpers.commands.wiring", "resolve the boundaries an engine version feeds a draft"),
    "releases": ("helpers.commands.releases",
                 "does the workbook know this engine release: its rule, what changed, its guard hook sites"),
    "patch-sglang": ("helpers.commands.patch_sglang", "apply / revert / check the boundary-0 capture patch"),
    "run-workbook": ("helpers.commands.workbook", "execute notebooks 01-06 and render reports/"),
    "llamacpp-build": ("helpers.commands.llamacpp",
                       "build llama.cpp's llama-server once on this machine (CPU, the pinned release)"),
}


def usage() -> str:
    lines = ["usage: python -m helpers <command> [options]", "", "commands:"]
    lines += [f"  {name:<14} {desc}" for name, (_, desc) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        try:
            print(usage())
        except BrokenPipeError:     # `--help | head`: the reader left
            sys.stdout = None
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"unknown command {cmd!r}\n\n{usage()}", file=sys.stderr)
        return 2

    errors.JSON_ERRORS = "--json" in rest
    held = None
    if not sys.stderr.isatty():        # a log or a pipe: bad input leaves the error line alone there
        held = sys.stderr = HeldStderr(sys.stderr)
    try:
        module = importlib.import_module(COMMANDS[cmd][0])
        return int(module.main(rest) or 0)
    except InputError as exc:  # the one place every command's bad input becomes one line and exit 2
        return fail(exc)
    except KeyboardInterrupt:  # Ctrl-C: stop quietly, no traceback
        say(f"interrupted: {cmd} stopped by Ctrl-C")
        return 130
    except BrokenPipeError:  # `... --json | head`: the reader left, nothing to report
        return 1
    finally:
        if held is not None:
            held.release()
            sys.stderr = held._stream


if __name__ == "__main__":
    sys.exit(main())
