"""At the edge of ``diagnose --metrics``: which engine's rules judge an export, the speculation profile a
window writes as a later baseline, and the lines a person reads of a ``metrics.MetricsVerdict``."""
from __future__ import annotations

from ..errors import BadOption
from ..profile import SpeculationProfile
from ..rules.conventions import Engine
from .exports import Level
from .metrics import MetricsVerdict


def export_engine(family: str, named: Engine | None) -> tuple[Engine, str | None]:
    """The engine whose rules judge an export: the one the export came from. ``--engine`` naming another
    family is bad input; left out, the family's newest read release is assumed and said in one line."""
    if named is not None:
        if named.name != family:
            raise BadOption(
                f"--engine {named} names {named.name}, but the export is {family}'s; pass --engine "
                f"{family}[==VERSION] (or leave --engine out to take it from the export)"
            )
        return named, None
    engine = Engine(family)
    return engine, (
        f"engine inferred from the export: {family} (the export names no release: the rules of "
        f"{family} {engine.effective_version or 'newest read'} assumed; pass --engine "
        f"{family}==VERSION for yours)"
    )


def served_profile_file(v: MetricsVerdict) -> SpeculationProfile:
    """A window's served profile, to record as a later ``--baseline``; per-position counts needed."""
    p = v.profile
    if p.level is not Level.COUNTS:
        raise BadOption(
            f"--write-profile needs per-position counts; {p.where} gives {p.level} ({p.missing()})"
        )
    iv = p.accept_interval()
    known = not v.temperature_basis.startswith("not in")
    return SpeculationProfile(
        tuple(p.rates),
        v.temperature if known else None,       # an assumed temperature is not recorded as a fact
        ("greedy" if v.temperature == 0 else "speculative-sampling") if known else "unknown",
        f"served by {p.engine} ({p.source}, {p.where})",
        p.drafts,
        tuple(p.accepted_per_position),
        None if iv is None else (iv[0], iv[1]),
        v.served_layout,
        p.engine,
        conditions={"temperature_basis": v.temperature_basis, "temperature_known": known,
                    "kind": "served"},
    )


def render_metrics(v: MetricsVerdict) -> list[str]:
    p = v.profile
    al = p.accept_length
    iv = p.accept_interval()
    head = f"{p.engine} ({p.source}, {p.where}): "
    head += f"{p.drafts} draft rounds, " if p.drafts is not None else ""
    head += (
        f"accept length {al:.3f}" + (f" [{iv[0]:.3f}, {iv[1]:.3f}]" if iv else "")
        if al is not None
        else "no accept length"
    )
    if p.level is Level.GAUGE:
        head += f" ({p.gauge_scope})"
    out = [head]
    exp = v.expected.rates if v.expected else []
    srv = v.served_predicted.rates if v.served_predicted else []
    for row in p.per_position():
        lo, hi = row["interval"]
        line = f"   position {row['position']}: {row['rate']:.3f} [{lo:.3f}, {hi:.3f}]"
        if row["position"] < len(exp):
            line += f"   expected {exp[row['position']]:.3f}"
        if row["position"] < len(srv):
            line += f"   served layout simulates {srv[row['position']]:.3f}"
        out.append(line)
    if v.expected:
        out.append(
            f"   expected: accept length {v.expected.accept_length(p.num_spec_tokens):.3f}, "
            f"{v.expected.source}"
        )
    out.append(f"   temperature {v.temperature:g}: {v.temperature_basis}")
    for n in p.notes:
        out.append(f"   note: {n}")
    out.append(f"explanation: {v.explanation}")
    for e in v.evidence:
        out.append(f"   - {e}")
    for n in v.next:
        out.append(f"   next: {n}")
    if v.gate is not None:
        out.append(f"baseline {v.gate.baseline}: {'PASSED' if v.gate.passed else 'FAILED'}")
        out += [f"   - {x}" for x in v.gate.failures + v.gate.checked]
    return out
