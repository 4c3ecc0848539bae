"""``python -m helpers build-default``: the embedded target/draft pair, from nothing.

Builds, with fixed seeds, a target trained from scratch, a draft trained on a stated layout and saved
with the deployed ids, and (full builds) a draft retrained on the served layout:
``helpers.investigation.embedded_pair`` does the work; this module parses the options, calls it and
prints.
"""
from __future__ import annotations

import sys
from pathlib import Path

from .. import cli
from ..boundaries import check_layout, parse_layout
from ..investigation.embedded_pair import DEFAULT_OUT, build_default


def main(argv=None) -> int:
    ap = cli.parser("build-default", __doc__)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--training-boundaries", default="0,3,7")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="a small pair in a few minutes (tests)")
    ap.add_argument("--arch", default="deepseek_v3", choices=["deepseek_v3", "llama"])
    ap.add_argument("--draft-format", default="sglang", choices=["sglang", "speculators"])
    ap.add_argument("--retrained", dest="retrained", action="store_true", default=None,
                    help="also train a draft on the served layout (fix B); default on for full builds")
    ap.add_argument("--no-retrained", dest="retrained", action="store_false")
    ap.add_argument("--reuse-target", action="store_true",
                    help="keep DIR/target (same family and layers) and rebuild only the drafts")
    a = ap.parse_args(argv)
    if a.layers < 4:
        ap.error(f"--layers must be at least 4 (the deployed ids [2, L//2, L-3] need it); got {a.layers}")
    try:
        layout = check_layout(parse_layout(a.training_boundaries), a.layers)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        build_default(a.out, a.layers, layout, a.seed, a.tiny, a.arch, a.draft_format, a.retrained,
                      reuse_target=a.reuse_target)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
