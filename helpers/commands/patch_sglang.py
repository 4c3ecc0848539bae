"""``python -m helpers patch-sglang``: apply, revert, inspect or show the boundary-0 capture patch for an
SGLang release (``engines.sglang.patch`` holds the patch and why it is safe). Exit 0: done, or nothing to do;
2: bad input, or the patch could not be applied (nothing was changed).
"""
from __future__ import annotations

import sys
from typing import Sequence

from .. import cli
from ..engines.sglang import source as ss
from ..engines.sglang.patch import PatchError, apply_patch, patch_status, revert_patch, show_diff
from ..errors import fail, print_json


def _parser():
    p = cli.parser("patch-sglang", "Apply, revert or inspect the boundary-0 capture patch for SGLang.")
    p.add_argument("action", choices=("apply", "revert", "status", "diff"))
    p.add_argument("--version", required=True, help="sglang version, e.g. 0.5.9")
    p.add_argument("--target", choices=("cache", "installed"), default="cache",
                   help="patch the workbook's cached copy (default) or the installed sglang")
    p.add_argument("--root", help="folder holding an sglang/ tree (overrides --target)")
    p.add_argument("--arch", help="apply only if this architecture's capture file is patchable, "
                                  "e.g. LlamaForCausalLM")
    p.add_argument("--json", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: 0 = done (or nothing to do), 2 = bad input or the patch could not be applied."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(argv)
        if args.action == "diff":
            print(show_diff(args.version, root=args.root, target=args.target), end="")
            return 0
        if args.arch is not None and args.action != "apply":
            raise PatchError(f"--arch only applies to `apply`, not `{args.action}`")
        if args.action == "apply":
            status = apply_patch(args.version, root=args.root, target=args.target, arch=args.arch)
        else:
            action = {"revert": revert_patch, "status": patch_status}[args.action]
            status = action(args.version, root=args.root, target=args.target)
    except SystemExit as exc:  # --help, or a flag argparse refused (already said in one line)
        return int(exc.code or 0)
    except (PatchError, ValueError, ss.SglangSourceError) as exc:
        return fail(exc)
    if args.json:
        print_json(status.to_dict(), indent=2)
    else:
        print(f"sglang {status.version} [{status.origin}] {status.root}: {status.state}"
              + (" (changed)" if status.changed else ""))
        print(f"  {status.message}")
        for rel, sha in status.files.items():
            print(f"  {rel}  [{status.file_states.get(rel, '?')}]  sha256 {sha}")
    return 0
