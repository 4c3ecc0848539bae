"""Command-line plumbing every ``python -m helpers`` command shares.

One parser class, so a bad flag reads the same everywhere (one ``error:`` line, exit 2, as any
other bad input), and one set of pair options, so ``--target``/``--draft``/``--engine``/
``--device``/``--json`` mean the same thing in every command: ``--engine NAME[==VERSION]`` is always
whose rules decide what "served" means, ``--backend`` (bench, run-workbook) which live runtime runs.
``--engine`` left out is None; each command resolves it (``stated_engine`` for a static question, the
installed release for a live one) and says what it chose.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import BadOption, InputError, one_line, print_json
from .rules.conventions import DEFAULT_ENGINE, Engine, assumed_engine_line, parse_engine


class OneLineParser(argparse.ArgumentParser):
    """argparse's default prints the whole usage block before the reason, which pushes the reason
    off a one-line log; this one prints ``error: <prog>: <what> (see --help)`` and exits 2."""

    def error(self, message):
        print(f"error: {self.prog}: {one_line(message)} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def parser(command: str, doc: str | None) -> OneLineParser:
    """The parser of ``python -m helpers <command>``, described by its module's first doc line."""
    first = (doc or "").strip().splitlines()[0] if (doc or "").strip() else ""
    return OneLineParser(prog=f"python -m helpers {command}",
                         description=first.removeprefix(f"``python -m helpers {command}``: "))


class EngineOption(argparse.Action):
    """``--engine``: parsed here, once, into a ``conventions.Engine`` every function below takes as is.
    Text that does not parse is kept as text, so the command's ``engine_value`` call (or the entry
    function it hands the value to), first thing in its error handling, turns it into its one
    ``error:`` line and exit 2 before any model loads."""

    def __call__(self, parser, namespace, value, option_string=None):
        try:
            value = parse_engine(value)
        except InputError:
            pass
        setattr(namespace, self.dest, value)


def engine_value(value: str | Engine) -> Engine:
    """``--engine``'s value as the Engine ``EngineOption`` parsed; text it kept raises its BadOption."""
    return parse_engine(value)


def stated_engine(value: str | Engine | None) -> tuple[Engine, str | None]:
    """A static question's engine: ``--engine`` as given (None beside it), or, when it was left out, the
    stated default (``conventions.DEFAULT_ENGINE``) with the line the output opens with."""
    if value is None:
        return DEFAULT_ENGINE, assumed_engine_line(DEFAULT_ENGINE)
    return parse_engine(value), None


def add_pair_args(p: argparse.ArgumentParser, *,
                  target: str | None = "target model folder (Hugging Face layout)",
                  draft: str | None = "EAGLE-3 draft folder (SGLang, speculators or EAGLE reference format)",
                  engine: str | None = ("whose rules decide what 'served' means: sglang==VERSION, "
                                        "vllm[==VERSION][:v1|:v2], trtllm, llamacpp[==BUILD] or "
                                        "lmdeploy[==VERSION][:turbomind]; default: "
                                        f"{DEFAULT_ENGINE}, said in the output's first line"),
                  device: bool = True, json: bool = True, required: bool = False, paths: bool = True) -> None:
    """The options naming the pair and where it runs; pass None to leave one out."""
    kind = Path if paths else str
    if target is not None:
        p.add_argument("--target", type=kind, default=None, required=required, help=target)
    if draft is not None:
        p.add_argument("--draft", type=kind, default=None, required=required, help=draft)
    if engine is not None:
        p.add_argument("--engine", action=EngineOption, default=None, metavar="NAME[==VERSION]", help=engine)
    if device:
        p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps")
    if json:
        p.add_argument("--json", action="store_true", help="print the result as one JSON document")


def emit(result, as_json: bool, text) -> None:
    """``--json``: the result's ``to_dict()`` as one strict JSON document; otherwise ``text(result)``."""
    if as_json:
        print_json(result.to_dict(), indent=2)
    else:
        print(text(result))


def glue_option_values(argv: list[str], *options: str) -> list[str]:
    """``--ids -1,2,6`` -> ``--ids=-1,2,6`` for the named options: argparse takes a value starting
    with '-' for an option and answers 'expected one argument' instead of letting the value's own
    check name the bad boundary."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in options and i + 1 < len(argv):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def parse_int_list(text: str, option: str, example: str = "-1,2,6", empty_hint: str = "") -> list[int]:
    """Every comma-separated field must be an integer: an empty field is a typo, never 'skip'."""
    if not text.strip():
        raise BadOption(f"{option} is empty; give integers like {example}{empty_hint}")
    parts = [p.strip() for p in text.split(",")]
    if any(not p for p in parts):
        raise BadOption(f"{option} {text!r} has an empty field; "
                        f"expected integers separated by single commas, like {example}")
    out = []
    for p in parts:
        try:
            out.append(int(p))
        except ValueError:
            raise BadOption(f"cannot read {option} from {text!r}: {p!r} is not an integer; expected integers "
                            f"like {example}") from None
    return out
