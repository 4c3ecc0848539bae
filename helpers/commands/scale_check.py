"""``python -m helpers scale-check``: the dump diagnosis at the original case's width, measured.

A randomly initialised draft of Kimi-K2.5's draft's shape and a synthetic dump of the same width, every
layout scored in a fresh process: peak memory and seconds per 1000 tokens per layout
(``helpers.investigation.scale`` does the work; this module parses the options, calls it and prints).
"""
from __future__ import annotations

from pathlib import Path

from .. import cli
from ..errors import BadOption, fail, print_json
from ..investigation.scale import VARIANTS, check_workdir, scale_check


def main(argv=None) -> int:
    ap = cli.parser("scale-check", __doc__)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--vocab", type=int, default=32000, help="draft (and its own embedding's) vocabulary")
    ap.add_argument("--intermediate", type=int, default=18432)
    ap.add_argument("--tokens", type=int, default=512, help="tokens per record")
    ap.add_argument("--records", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--variant", default="plain", choices=sorted(VARIANTS),
                    help="draft variant: MLA attention (Kimi-K2.5's numbers), a forward flag, or both")
    ap.add_argument("--num-aux", type=int, default=3, help="target states the draft's fc takes")
    cli.add_pair_args(ap, target=None, draft=None, engine=None, json=False)
    ap.add_argument("--workdir", default=None,
                    help="where the temporary draft and dump go (needs ~3 GB at 7168)")
    a = ap.parse_args(argv)
    try:
        for opt, v in (("--hidden", a.hidden), ("--vocab", a.vocab), ("--intermediate", a.intermediate),
                       ("--tokens", a.tokens), ("--records", a.records), ("--steps", a.steps),
                       ("--num-aux", a.num_aux)):
            if v < 1:
                raise BadOption(f"{opt} must be a positive integer, got {v}")
        if a.hidden % 128:
            raise BadOption(f"--hidden must be a multiple of the 128-wide attention heads, got {a.hidden}")
        if a.tokens < a.steps + 3:    # what scoring a record needs (dump_diagnose.score_layouts)
            raise BadOption(f"--tokens {a.tokens} is too few for --steps {a.steps}: a record needs at least "
                            f"--steps + 3 = {a.steps + 3} tokens")
        if a.workdir is not None:
            check_workdir(Path(a.workdir))
        out = scale_check(a.hidden, a.vocab, a.intermediate, a.tokens, a.records, 4, a.steps, a.device,
                          a.workdir, a.variant, a.num_aux)
    except (ValueError, RuntimeError) as exc:
        return fail(exc)
    print_json(out, indent=2)
    return 0
