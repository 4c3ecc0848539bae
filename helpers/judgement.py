"""One verdict on a wiring, whoever judged it, and the statistics it rests on; no torch.

``check`` judges a deployment from its files, the guard inside the engine at load, ``diagnose`` from a
target's forward or a trainer's dump, ``wiring`` from a release's own rule. Each keeps the figures that are
its own (a release table, the ids it was given, a measured cost), and each says what it found as one
``Verdict``: a ``Judgement``, the layouts on each side, what the training layout rests on, its sentence, the
fix as a command, and the exit code every command that judges a wiring returns (``boundaries.ExitCode``).

``PairedTest`` is the paired test two layouts' accept lengths are compared by (``investigation.evaluate``
computes it from blocks of tokens); a verdict carries it as its cost.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .boundaries import ExitCode

Z_NOISE = 3.0      # two layouts closer than this many standard errors are within noise of each other
BLOCK = 64         # tokens per block of the paired test: neighbouring tokens are not independent
MIN_BLOCKS = 8     # fewer blocks than this: no claim of confidence, whatever z says


@dataclass
class PairedTest:
    """``a`` minus ``b`` in the ranking's measure, block by block."""

    difference: float     # mean of a - b (accepted tokens per verify step)
    se: float             # its standard error over blocks (floored: see ``evaluate.paired_test``)
    z: float              # difference / se: bounded, always a number
    blocks: int

    @property
    def enough(self) -> bool:
        return self.blocks >= MIN_BLOCKS

    @property
    def significant(self) -> bool:
        """The test separates them: enough blocks, and ``|z|`` at least ``Z_NOISE``."""
        return self.enough and abs(self.z) >= Z_NOISE

    @property
    def half_width(self) -> float:
        """The interval's half width, ``Z_NOISE`` standard errors: significant exactly when the
        interval excludes zero, so the interval and the verdict never disagree."""
        return Z_NOISE * self.se

    def to_dict(self) -> dict:
        return {"difference": round(self.difference, 4), "half_width": round(self.half_width, 4),
                "interval": [round(self.difference - self.half_width, 4),
                             round(self.difference + self.half_width, 4)],
                "se": round(self.se, 4), "z": round(self.z, 2), "blocks": self.blocks,
                "units": "accepted tokens per verify step", "significant": self.significant}


def deploy_command(draft, target, engine) -> str:
    """The one command that writes a copy ``engine`` serves at the trained layout, checked first."""
    return (f"python -m helpers fixes deploy --draft {draft} --target {target} --engine {engine} "
            f"--out {str(draft).rstrip('/')}-deploy")


class Judgement(StrEnum):
    """What a verdict says of a wiring; values are the spellings JSON and logs carry."""

    MATCH = "match"                # serves the trained layout, every flag honoured
    MISWIRED = "miswired"          # other boundaries than training used
    ORDER = "order"                # the same boundaries in another fc slot order
    IGNORED_FLAG = "ignored-flag"  # right layout, a forward flag the draft was trained with is not run
    BLOCKED = "blocked"            # the engine cannot feed the draft as configured, or a problem blocks it
    UNKNOWN = "unknown"            # nothing settles the training layout: no comparison, no guess made
    OTHER_RANK = "other-rank"      # this rank does not feed the draft (a pipeline stage before the last)

    @property
    def exit_code(self) -> int:
        """``boundaries.ExitCode``: 0 served = trained (or nothing for this rank to judge); 3 cannot
        decide; 1 anything else."""
        if self in (Judgement.MATCH, Judgement.OTHER_RANK):
            return ExitCode.OK
        return ExitCode.UNDECIDED if self is Judgement.UNKNOWN else ExitCode.PROBLEM


BLOCKING = (Judgement.MISWIRED, Judgement.ORDER, Judgement.IGNORED_FLAG, Judgement.BLOCKED)


def compare(served, trained) -> Judgement:
    """Served against trained by rule: the same tuple, the same boundaries in another order, or others;
    UNKNOWN when either side is not known."""
    if served is None or trained is None:
        return Judgement.UNKNOWN
    if tuple(served) == tuple(trained):
        return Judgement.MATCH
    return Judgement.ORDER if sorted(served) == sorted(trained) else Judgement.MISWIRED


@dataclass(frozen=True)
class Verdict:
    """One judge's verdict, as every command, log and report says it."""

    judgement: Judgement
    judge: str                           # check, guard, diagnose, wiring
    engine: str
    served: tuple[int, ...] | None
    trained: tuple[int, ...] | None
    evidence: str                        # what the training layout rests on, as a sentence
    line: str                            # the judge's own sentence
    fix: str | None = None               # what to do, in words
    fix_command: str | None = None       # ... as the command that does it (``fixes deploy``)
    costless: bool = False               # a difference measured on enough text to cost nothing measurable

    @property
    def blocking(self) -> bool:
        return self.judgement in BLOCKING and not self.costless

    @property
    def exit_code(self) -> int:
        return ExitCode.OK if self.costless else self.judgement.exit_code

    def to_dict(self) -> dict:
        return {"judgement": str(self.judgement), "judge": self.judge, "engine": self.engine,
                "served": None if self.served is None else list(self.served),
                "trained": None if self.trained is None else list(self.trained), "evidence": self.evidence,
                "line": self.line, "fix": self.fix, "fix_command": self.fix_command,
                "costless": self.costless, "exit_code": self.exit_code}
