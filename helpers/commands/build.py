"""``python -m helpers build-default``: the embedded target/draft pair, from nothing.

Builds, with fixed seeds, a target trained from scratch, a draft trained on a stated layout and saved
with the deployed ids, and (full builds) a draft retrained on the served layout:
``helpers.factory.embedded_pair`` does the work; this module parses the options, calls it and
prints.
"""
from __future__ import annotations

import sys
from pathlib import Path

from .. import cli
from ..boundaries import check_layout, parse_layout
from ..factory.embedded_pair import FAMILIES, build_default


def main(argv=None) -> int:
    ap = cli.parser("build-default", __doc__)
    ap.add_argument("--family", choices=sorted(FAMILIES), default=None,
                    help="kimi: the DeepSeek-V3 pair SGLang serves (data/tiny-kimi, the default); llama: "
                         "the Llama pair llama.cpp serves (data/tiny-llama), a tokenizer its converter takes")
    ap.add_argument("--out", type=Path, default=None, help="default: the family's folder under data/")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--training-boundaries", default=None,
                    help="default: the family's (0,3,7 for both)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="a small pair in a few minutes (tests)")
    ap.add_argument("--arch", default=None, choices=["deepseek_v3", "llama"],
                    help="the target family alone, with the byte-level tokenizer (tests); --family sets it")
    ap.add_argument("--draft-format", default="sglang", choices=["sglang", "speculators"])
    ap.add_argument("--retrained", dest="retrained", action="store_true", default=None,
                    help="also train a draft on the served layout (fix B); default on for full builds")
    ap.add_argument("--no-retrained", dest="retrained", action="store_false")
    ap.add_argument("--reuse-target", action="store_true",
                    help="keep DIR/target (same family and layers) and rebuild only the drafts")
    a = ap.parse_args(argv)
    if a.family and a.arch:
        ap.error(f"--family {a.family} sets the target family; --arch is for a pair without one")
    family = FAMILIES[a.family] if a.family else None
    story = family or FAMILIES["kimi"]
    arch = a.arch or story.arch
    out = a.out if a.out is not None else story.out
    boundaries = (a.training_boundaries if a.training_boundaries is not None
                  else ",".join(map(str, story.training_boundaries)))
    if a.layers < 4:
        ap.error(f"--layers must be at least 4 (the deployed ids [2, L//2, L-3] need it); got {a.layers}")
    try:
        layout = check_layout(parse_layout(boundaries), a.layers)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        build_default(out, a.layers, layout, a.seed, a.tiny, arch, a.draft_format, a.retrained,
                      reuse_target=a.reuse_target, family=family)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
