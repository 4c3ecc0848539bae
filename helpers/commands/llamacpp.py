"""``python -m helpers llamacpp-build``: llama.cpp's ``llama-server`` built once on this machine, CPU only,
from the pinned release's source (``engines.llamacpp.build``), into the workbook's cache. Exit 0: built, or
already there; 1: this host cannot build it (one line says why, and the other engines carry on); 2: bad
input.
"""
from __future__ import annotations

import sys

from .. import cli
from ..engines.llamacpp.build import BUILD, LlamacppUnavailable, build_server, find_server
from ..errors import CacheError, fail, print_json


def main(argv=None) -> int:
    ap = cli.parser("llamacpp-build", __doc__)
    ap.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: every core)")
    ap.add_argument("--where", action="store_true", help="only say where the built server is, if it is")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    if a.jobs is not None and a.jobs < 1:
        ap.error(f"--jobs must be at least 1, got {a.jobs}")
    if a.where:
        found = find_server()
        if found is None:
            print(f"[llamacpp] no llama-server {BUILD} built here (bash workbook.sh llamacpp builds it)")
            return 1
        if a.json:
            print_json(found.to_dict())
        else:
            print(found.server)
        return 0
    try:
        # flushed line by line: `bash workbook.sh run` sends it to a log a person may follow while it runs
        said = (lambda s: None) if a.json else (lambda s: print(s, flush=True))
        built = build_server(jobs=a.jobs, log=said)
    except LlamacppUnavailable as exc:
        print(f"[llamacpp] {exc}", file=sys.stderr)
        return 1
    except CacheError as exc:
        return fail(exc)
    if a.json:
        print_json(built.to_dict())
    else:
        print(f"[llamacpp] {built.server} (llama.cpp {built.build}, {built.size_bytes / 1e6:.1f} MB, "
              f"built in {built.seconds:.0f} s with {built.jobs} jobs)")
    return 0
