"""The pre-deployment gate behind ``python -m helpers check``: will this deployment feed the draft what
it was trained on?

``check`` loads no weights, so it can run in CI before a deploy. It reads the draft's config, the target's
(once, as a ``TargetSpec``), the safetensors headers, the training record, a named trainer's rule and
the engine release's own source through ``wiring``, and returns a ``CheckReport`` whose problems each
carry their fix (ids and the key to write them in, the patch, or retraining); ``CheckReport.exit_code``
is the command's.
"""
from __future__ import annotations

import textwrap
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Sequence

from ..boundaries import Problem, ProblemKind, WiringError, WiringResult, layout_label
from ..engines.llamacpp.gguf import TARGET_LAYERS_KEY, target_layers
from ..errors import BadConfig, BadOption, InputError, read_json_file
from ..judgement import Judgement, Verdict, compare
from ..rules import matrix as releases
from ..rules.conventions import (
    DEFAULT_ENGINE,
    IDS_KEY,
    Engine,
    IdsAt,
    TargetSpec,
    assumed_engine_line,
    expect_engine,
    ids_in_config,
    read_draft_config,
    read_target,
)
from ..rules.topology import check_sizes, topology
from ..rules.trainers import parse_trainer, writers_of
from ..rules.wiring import ids_for_layout, resolve
from . import draft_file
from .evidence import Basis, Evidence, deploy_line, training_evidence
from .verdict import candidate_table, ways_out, writer_candidates

ALGORITHMS = ("EAGLE3", "EAGLE")
# ``Problem`` (boundaries) is the one shape of a finding: the resolvers' problems carry a ProblemKind and
# a command as their fix (or None); check's own kinds (``ProblemKind.LAYOUT_MISMATCH``, ``FC_WIDTH``, ...)
# carry an instruction as the fix; the engine's blocking problems are reported as ENGINE_CANNOT_CAPTURE.


@dataclass
class CheckReport:
    draft: str
    target: str
    engine: str
    arch: str
    num_layers: int
    training_layout: tuple[int, ...] | None
    training_source: str
    served_layout: tuple[int, ...]
    served_source: str
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    # every release of the engine, in runs that serve this draft alike ({first, last, served_layout, note})
    served_across_releases: list[dict] = field(default_factory=list)
    release_drift: str | None = None     # one line when another release serves it otherwise
    releases_from: str = ""              # how the runs were found (committed data or resolved now)
    # trainer conventions that write this config format, when the trainer is not recorded
    candidates: list[dict] = field(default_factory=list)
    topology: dict | None = None
    # what the engine itself captured (``capture --backend vllm|sglang`` wrote it into capture.json)
    measured_layout: tuple[int | None, ...] | None = None
    measured_source: str = ""
    # the release assumed when no engine was named (``conventions.DEFAULT_ENGINE``); said first
    assumed_engine: str | None = None
    # what the training layout rests on (``evidence.Basis``: record, trainer, config; none when unsettled)
    evidence: str = "none"
    fix_command: str | None = None       # fixes deploy, where ids alone serve the trained layout
    answer: Evidence | None = None       # the chain's whole answer (``evidence.training_evidence``)
    rule_basis: str = ""                 # its rule read from the release now, or recorded (WiringResult's)

    @property
    def agree(self) -> bool | None:
        return (None if self.training_layout is None or self.cannot_serve
                else tuple(self.served_layout) == tuple(self.training_layout))

    @property
    def cannot_serve(self) -> bool:
        """The engine feeds this draft nothing at all (no capture for the target's architecture): a blocked
        launch, which no ids and no retraining change."""
        return not self.served_layout and any(p.kind == ProblemKind.ENGINE_CANNOT_CAPTURE
                                              for p in self.problems)

    @property
    def ok(self) -> bool:
        return bool(self.agree) and not any(p.blocking for p in self.problems)

    @property
    def verdict(self) -> str:
        if self.ok:
            return f"OK: {self.engine} serves the trained layout {self._label(self.served_layout)}"
        if self.cannot_serve:
            why = next(p.message for p in self.problems if p.kind == ProblemKind.ENGINE_CANNOT_CAPTURE)
            return f"BLOCKED: {self.engine} cannot serve this draft at all: {why}"
        if self.training_layout is None:
            return "UNKNOWN: the training layout is not recorded; see the fixes below for how to settle it"
        if not self.agree:
            # two questions: whether they differ is settled here by rule; what it costs needs the weights
            return (f"MISMATCH: {self.engine} serves {self._label(self.served_layout)} ≠ trained "
                    f"{self._label(self.training_layout)}; the cost is not measured statically (`python -m "
                    f"helpers diagnose` measures it in accepted tokens per verify step)")
        return (f"BLOCKED: the layouts agree, but {len([p for p in self.problems if p.blocking])} "
                f"problem(s) remain")

    @property
    def judgement(self) -> Judgement:
        """The verdict's kind: MATCH (OK), MISWIRED or ORDER (MISMATCH), BLOCKED (the layouts agree, or none
        is known, and a problem blocks it), UNKNOWN (no training layout and nothing else wrong)."""
        if self.ok:
            return Judgement.MATCH
        if self.cannot_serve:
            return Judgement.BLOCKED
        if self.training_layout is None:
            other = [p for p in self.problems if p.blocking and p.kind != ProblemKind.TRAINING_UNKNOWN]
            return Judgement.BLOCKED if other else Judgement.UNKNOWN
        return Judgement.BLOCKED if self.agree else compare(self.served_layout, self.training_layout)

    @property
    def judged(self) -> Verdict:
        """This report as every judge says a verdict (``judgement.Verdict``)."""
        fix = next((p.fix for p in self.problems if p.blocking and p.fix), None)
        return Verdict(self.judgement, "check", self.engine, tuple(self.served_layout),
                       None if self.training_layout is None else tuple(self.training_layout),
                       self.training_source, self.verdict, fix, self.fix_command)

    @property
    def exit_code(self) -> int:
        """``boundaries.ExitCode``, by the judgement: 0 OK; 1 a mismatch or a blocking problem; 3 no
        training layout to judge by and nothing else wrong."""
        return self.judgement.exit_code

    def _label(self, layout) -> str:
        return f"{tuple(layout)} {layout_label(layout, self.num_layers)}" if layout else "nothing"

    def to_dict(self) -> dict:
        d = {"assumed_engine": self.assumed_engine} | asdict(self)     # first, as the text's first line
        d.update(training_layout=list(self.training_layout) if self.training_layout else None,
                 served_layout=list(self.served_layout), agree=self.agree, ok=self.ok, verdict=self.verdict,
                 exit_code=self.exit_code, judgement=str(self.judgement),
                 mismatch=None if self.agree is None else not self.agree,
                 cost=None, significant=None)
        return d


# --------------------------------------------------------------------------------------
# The check.


@dataclass(frozen=True)
class CheckRequest:
    """What ``check`` judges, as the command line (or a caller) stated it. ``engine``: whose rules; None
    assumes ``conventions.DEFAULT_ENGINE`` and the report says so first (``assumed_engine``).
    ``across_releases``: also every release of the engine (committed data, or resolved now); ``tp``/``pp``:
    the serving topology, whose pipeline stages may drop captures. ``gguf``: llama.cpp's converted draft
    file, whose ``eagle3.target_layers`` are what the engine serves (the config beside it then only says what
    this build's converter would have written)."""

    draft: str | Path
    engine: Engine | None
    target: str | Path | None = None
    target_config: str | Path | None = None
    trainer: str | None = None
    train_ids: Sequence[int] | None = None
    algorithm: str = "EAGLE3"
    root: str | Path | None = None
    read_vllm_source: bool = False
    tp: int = 1
    pp: int = 1
    across_releases: bool = True
    measured: str | Path | None = None
    gguf: str | Path | None = None
    training_output: str | Path | None = None
    trtllm_options: str | Path | None = None   # TensorRT-LLM's launch options (``--extra_llm_api_options``)

    def validate(self) -> None:
        check_sizes(self.tp, self.pp)
        if (self.target is None) == (self.target_config is None):
            raise BadOption("give the target as --target DIR or --target-config FILE (one of them)")
        if self.algorithm.upper() not in ALGORITHMS:
            raise BadOption(f"--algorithm {self.algorithm!r}: expected EAGLE3 or EAGLE "
                            f"(the engine's speculative algorithm)")
        if self.trainer is not None:
            parse_trainer(self.trainer)


def check(draft: str | Path, engine: Engine | None, **options) -> CheckReport:
    """``check_deployment`` on ``CheckRequest(draft, engine, **options)``."""
    return check_deployment(CheckRequest(draft, engine, **options))


def check_deployment(req: CheckRequest) -> CheckReport:
    """The deployment judged from its files, without loading weights: the served layout under ``req``'s
    engine, against what the draft was trained on, and every problem found on the way, each with its fix."""
    started = time.perf_counter()
    req.validate()
    eng = expect_engine(req.engine or DEFAULT_ENGINE)
    draft_dir = Path(req.draft).expanduser()
    cfg = read_draft_config(draft_dir)
    if draft_dir.is_file():  # DIR/config.json: the folder's training.json and weights count all the same
        draft_dir = draft_dir.parent
    target = req.target if req.target is not None else req.target_config
    spec = read_target(target)   # the target, read once
    if spec.arch is None:
        raise BadConfig(f"the target config {target} names no architectures")
    shapes = draft_file.safetensors_shapes(draft_dir) if draft_dir.is_dir() else None
    served, converted = _served(req, eng, cfg, spec)
    ids, where = ids_in_config(cfg)
    report = _report(req, eng, draft_dir, spec, served)
    _training(report, draft_dir, cfg, req, shapes, spec, eng)
    if req.across_releases:
        _releases(report, eng, spec, cfg)
    if report.training_layout is None and req.trainer is None:
        _candidates(report, cfg, eng, spec.arch, spec.num_layers, served.errors)
    _served_problems(report, served)
    _layout_fixes(report, served, eng, req.root)
    _ids_key(report, cfg, ids, where, eng)
    draft_file.fc_width(report, cfg, shapes, spec, eng, served)
    draft_file.forward_flags(report, cfg, eng)
    draft_file.sglang_draft_class(report, cfg, eng, req.root)
    draft_file.vocab(report, cfg, shapes, spec)
    _algorithm(report, req.algorithm)
    _topology(report, eng, spec.arch, spec.num_layers, req.tp, req.pp, req.root)
    report.notes += [str(p) for p in served.problems
                     if not p.blocking and p.kind != ProblemKind.STUB_PLACEHOLDERS]
    if req.measured is not None:
        _measured(report, Path(req.measured))
    if converted is not None:
        _converted(report, served, converted, eng)
    _one_command(report, req.target, eng, req.root)
    report.seconds = round(time.perf_counter() - started, 3)
    return report


def _served(req: CheckRequest, eng: Engine, cfg: dict, spec: TargetSpec):
    """(what the engine serves, and the config's own resolution where a converted GGUF overrides it)."""
    options = None
    if req.trtllm_options is not None:
        from ..engines.trtllm.options import read_options

        options = read_options(req.trtllm_options)
    served = resolve(eng, spec.arch, spec.num_layers, draft=cfg, root=req.root, target_config=spec.config,
                     read_vllm_source=req.read_vllm_source, options=options)
    if options is not None:
        served.problems.append(Problem(ProblemKind.IDS_READ, f"launch options {options.describe()}",
                                       blocking=False))
    if req.gguf is None:
        return served, None
    # the file the engine loads decides, not the config it was converted from
    return _gguf_served(Path(req.gguf).expanduser(), eng, spec.arch, spec.num_layers, spec), served


def _report(req: CheckRequest, eng: Engine, draft_dir: Path, spec: TargetSpec, served) -> CheckReport:
    """The report's head: what is served. A release that cannot turn capture on serves nothing, whatever
    its inner text model would capture (SGLang 0.5.9's Kimi-K2.5 wrapper): the line says so, as the
    release table does."""
    captures = not (eng.rules.reports_inner_capture and releases.status_of(served) == "no EAGLE-3 capture")
    return CheckReport(str(draft_dir), str(req.target or req.target_config), served.engine, spec.arch,
                       spec.num_layers, None, "", tuple(served.served_layout) if captures else (),
                       f"ids {served.ids_used} from {served.ids_source} -> layers_to_capture "
                       f"{served.layers_to_capture}" + ("" if captures else
                                                        ", but the release never turns capture on"),
                       assumed_engine=str(DEFAULT_ENGINE) if req.engine is None else None,
                       rule_basis=served.rule_basis)


def _served_problems(report: CheckReport, served) -> None:
    """What the engine cannot capture blocks the launch; its own fix when the release has one."""
    for p in served.problems:
        if p.blocking:
            fix = (f"`{p.fix}`" if p.fix else _elsewhere(report) if not report.served_layout
                   else "see `python -m helpers wiring` for the source")
            report.problems.append(Problem(ProblemKind.ENGINE_CANNOT_CAPTURE, p.message if p.fix else str(p),
                                           fix))


def _elsewhere(report: CheckReport) -> str:
    """Where a release feeds the draft nothing: another engine, as the command that checks it there."""
    other = DEFAULT_ENGINE if not report.engine.startswith(DEFAULT_ENGINE.name) else "vllm"
    return (f"no ids and no retraining make {report.engine} feed this draft: serve it on an engine that "
            f"captures {report.arch} (`python -m helpers check --draft {report.draft} --target "
            f"{report.target} --engine {other}`)")


def _algorithm(report: CheckReport, algorithm: str) -> None:
    if algorithm.upper() == "EAGLE":
        report.problems.append(Problem(
            ProblemKind.ALGORITHM, "the engine is told EAGLE, not EAGLE3: it captures no aux hidden states "
            "for this EAGLE-3 draft, whose fc then sees the wrong input; "
            "it serves at accept length 1.00 with no warning "
            "(SGLang PR #21272, Kimi-K2.5)",
            "--speculative-algorithm EAGLE3 (SGLang) / speculative_config method 'eagle3' (vLLM)"))


# The problems ``fixes deploy`` settles: the ids, their key, the format. Its command heads their fix.
DEPLOY_SETTLES = (ProblemKind.LAYOUT_MISMATCH, ProblemKind.IDS_KEY, ProblemKind.IDS_MISSING,
                  ProblemKind.SPECULATORS_FORMAT)


def _one_command(report: CheckReport, target, eng: Engine, root) -> None:
    """The first problem the deploy command settles names it, the others point to it, so a fix is a
    command to run, never a hand edit (with the trained layout known; without one there is nothing to
    deploy to)."""
    if report.training_layout is None or target is None:
        return
    try:        # only where ids alone serve it: a release that needs a patch first is not a copy away
        ids = ids_for_layout(sorted(report.training_layout), report.arch, report.num_layers, eng, root=root)
    except (WiringError, ValueError):
        ids = None
    if ids is None:
        return
    cmd = deploy_line(report.answer, report.draft, str(target), report.engine)
    first = True
    for i, p in enumerate(report.problems):
        if p.kind not in DEPLOY_SETTLES or (p.kind == ProblemKind.LAYOUT_MISMATCH
                                            and len(report.training_layout) != len(report.served_layout)):
            continue
        head = (f"`{cmd}` writes a copy {report.engine} serves at the trained layout, checked before it is "
                f"written (add an --engine for each engine you serve it on)" if first
                else "the deploy command above settles this too")
        report.problems[i] = replace(p, fix=f"{head}; by hand: {p.fix}")
        first = False
    report.fix_command = None if first else cmd


def _releases(report: CheckReport, eng: Engine, spec: TargetSpec, cfg: dict) -> None:
    """Every release of the named engine, in runs: the same draft served otherwise after an upgrade
    is the failure people meet most (SGLang PR #25454 changed DeepSeek's rule in 0.5.13)."""
    drift = eng.rules.across_releases(eng, spec.arch, spec.num_layers, cfg, spec.config)
    if drift is None:
        return
    if not drift.runs:
        report.notes.append(f"across releases: {drift.how}")
        return
    report.served_across_releases = drift.entries()
    report.release_drift = drift.line(eng.version)
    report.releases_from = f"{drift.how}; {drift.seconds:.2f} s"


def _candidates(report: CheckReport, cfg: dict, eng: Engine, arch: str, n: int,
                cannot_capture: Sequence[str] = ()) -> None:
    """No record and no trainer: the config format's writers and what each reads its ids as
    (``verdict.writer_candidates``)."""
    report.candidates = writer_candidates(cfg, eng, arch, n, report.served_layout, cannot_capture)


def _topology(report: CheckReport, eng: Engine, arch: str, n: int, tp: int, pp: int, root) -> None:
    topo = topology(eng, arch, n, report.served_layout, tp, pp, root)
    report.topology = topo.to_dict()
    if topo.blocking:
        what = ("the engine refuses EAGLE-3 with pipeline parallelism for this target"
                if topo.carried is None else "their aux states never reach the draft")
        report.problems.append(Problem(
            ProblemKind.TOPOLOGY,
            f"--pp {pp} splits the layers {topo.stages}: boundaries {topo.off_last} are captured "
            f"before the last stage, and {what} ({topo.evidence})", topo.fix))
    elif pp > 1:
        report.notes.append(f"--pp {pp}: {topo.evidence}")


def _gguf_served(path: Path, eng: Engine, arch: str, n: int, spec: TargetSpec) -> WiringResult:
    """What llama.cpp serves from its converted draft: the file's ``eagle3.target_layers``, used as given."""
    if not eng.rules.serves_from_gguf:
        raise BadOption(f"--gguf {path}: a GGUF draft is llama.cpp's, but the rules named are {eng}'s; pass "
                        f"--engine llamacpp[==BUILD]")
    ids = target_layers(path)
    served = resolve(eng, arch, n, ids=ids, target_config=spec.config)
    return replace(served, ids_source=f"{TARGET_LAYERS_KEY} in {path.name}")


def _converted(report: CheckReport, served: WiringResult, converted: WiringResult, eng: Engine) -> None:
    """The GGUF against what this build's converter writes for the config beside it: a difference means
    the file was converted from another config or by another build, and the file is what runs."""
    would = (list(converted.ids_used) if converted.ids_used is not None else
             sorted(converted.layers_to_capture))          # the converter's default when none are read
    written = (f"{converted.ids_used} ({converted.ids_source})" if converted.ids_used is not None else
               f"its default {would} (no top-level ids in this config)")
    if sorted(would) == sorted(served.ids_used or []):     # the graph hands out layer inputs in layer order
        report.notes.append(f"gguf: {served.ids_source} = {served.ids_used}, what {eng}'s converter "
                            f"writes for this config: {written}")
        return
    report.notes.append(
        f"gguf: {served.ids_source} = {served.ids_used}, but {eng}'s converter would write {written}, "
        f"serving {tuple(converted.served_layout)}: the file was converted from another config or build, "
        f"and the file is what llama.cpp serves")


def _measured(report: CheckReport, dump: Path) -> None:
    """The served layout as measured: each slot of an engine-written dump matched to a boundary of the
    workbook's own capture. A measurement that disagrees with the rules is a blocking problem: the
    prediction, not the engine, is then wrong for this deployment."""
    cap = dump / "capture.json"
    rec = read_json_file(cap, "capture record")
    got = rec.get("measured_boundaries") if isinstance(rec, dict) else None
    if not isinstance(got, list) or not all(b is None or isinstance(b, int) for b in got):
        raise BadConfig(f"{cap} has no measured_boundaries list; expected a dump written by "
                        f"`capture --backend vllm|sglang` (which measures its slots)")
    report.measured_layout = tuple(got)
    report.measured_source = f"{cap} ({rec.get('engine', 'an engine')}, ids {rec.get('layer_ids')})"
    if list(got) == sorted(report.served_layout):
        report.notes.append(f"measured: {rec.get('engine', 'the engine')} captured {tuple(got)}, the layout "
                            f"predicted ({report.served_source})")
    else:
        report.problems.append(Problem(
            ProblemKind.MEASURED_DIFFERS,
            f"measured {tuple(got)} by {report.measured_source}, but the rules predict "
            f"{tuple(report.served_layout)}", "trust the measurement: rerun check with --engine naming the "
            "release that wrote the dump, and report the rule that predicted otherwise"))


def _writer_example(cfg: dict) -> str:
    """A trainer that writes this config's format, so the suggested command fits the draft at hand."""
    try:
        writers = writers_of(cfg)
    except InputError:
        writers = []
    return writers[0] if writers else "NAME[==VERSION]"


def _training(report: CheckReport, draft_dir: Path, cfg: dict, req: CheckRequest, shapes, spec: TargetSpec,
              eng: Engine) -> None:
    """The training layout from the one chain of evidence (``evidence.training_evidence``: the record, what
    the trainer recorded, the trainer named, the trainer the config names); the format's writers are a
    prior listed by ``_candidates``, never a settled layout. What the chain noticed on the way becomes a
    problem here."""
    ev = training_evidence(draft_dir, cfg, engine=eng, arch=spec.arch, num_layers=report.num_layers,
                           trainer=req.trainer, train_ids=req.train_ids, served=report.served_layout,
                           training_output=req.training_output, read_source=True,
                           slots=draft_file.fc_slots(shapes, spec))
    report.answer = ev
    report.training_layout, report.evidence = ev.layout, str(ev.basis)
    report.training_source = ev.source if ev.settled else "unknown"
    report.notes += [f"trainer: {w}" for w in ev.warnings]
    if ev.basis is Basis.TRAINER_OUTPUT and ev.note:
        report.notes.append(f"trainer output: {ev.note}")
    if ev.conflict and ev.basis is Basis.RECORD:
        report.problems.append(Problem(
            ProblemKind.RECORD_VS_TRAINER, ev.conflict,
            "check which trainer release and ids produced the features, or measure with `diagnose`"))
    elif ev.conflict:
        report.problems.append(Problem(
            ProblemKind.CONFIG_VS_TRAINER, f"the draft config's ids are not the ones its trainer captured: "
            f"{ev.conflict}", f"record what was captured: python -m helpers fixes record --draft {draft_dir} "
            f"--layout {','.join(map(str, ev.layout or ()))}; then python -m helpers fixes deploy writes the "
            f"ids each engine reads", blocking=False))
    if req.trainer is not None and ev.basis in (Basis.TRAINER, Basis.NONE) and (ev.note or not ev.settled):
        report.problems.append(Problem(ProblemKind.TRAINER, ev.note or f"{req.trainer}: no layout",
                                       "retrain the draft on boundaries"))
    if ev.settled or req.trainer is not None:
        return
    prior = f"; {ev.note}" if ev.prior is not None else ""
    report.problems.append(Problem(
        ProblemKind.TRAINING_UNKNOWN, "no training record (training.json) and no trainer named, "
        f"so the layout the fc learned is unknown{prior}",
        f"name the trainer (--trainer {_writer_example(cfg)} [--train-ids ...]), "
        f"or measure it: `python -m helpers diagnose --draft {draft_dir} --data DUMP --target TARGET` "
        f"on the trainer's hidden-state dump (no target forward), or `diagnose --target T --draft "
        f"{draft_dir}` where the target runs"))


def _layout_fixes(report: CheckReport, served: WiringResult, engine: str, root) -> None:
    if report.training_layout is None or report.agree or report.cannot_serve:
        return
    trained = report.training_layout
    ways = ways_out(trained, served.served_layout, engine, report.arch, report.num_layers, root=root)
    report.problems.append(Problem(
        ProblemKind.LAYOUT_MISMATCH, f"served {tuple(served.served_layout)} "
        f"{layout_label(served.served_layout, report.num_layers)} != trained {trained} "
        f"{layout_label(trained, report.num_layers)} ({report.training_source})", ways.listed))


def _ids_key(report: CheckReport, cfg: dict, ids, where: IdsAt, eng: Engine) -> None:
    home = eng.rules.ids_home
    if home is None:
        return   # TensorRT-LLM reads its capture layers from the speculative config, never the draft's
    if ids is None:
        report.problems.append(Problem(
            ProblemKind.IDS_MISSING,
            f"the draft config carries no {IDS_KEY}: {eng.name} serves its default boundaries (vLLM "
            f"PR #50170: about 1% acceptance when those are not the trained ones)",
            f"write the trained ids into {'eagle_config' if home == IdsAt.EAGLE_CONFIG else 'the top level'}",
            blocking=False))
    elif (misplaced := eng.rules.misplaced_ids(cfg, ids, where, eng, report.arch)) is not None:
        report.problems.append(Problem(ProblemKind.IDS_KEY, *misplaced, blocking=False))


# --------------------------------------------------------------------------------------
# CLI.


def format_report(r: CheckReport) -> str:
    lines = [assumed_engine_line(r.assumed_engine)] if r.assumed_engine else []
    basis = f"; its rule {r.rule_basis}" if r.rule_basis else ""
    lines += [f"check  {r.draft}  on  {r.engine}  ({r.arch}, {r.num_layers} layers{basis})",
             f"  trained on : {r._label(r.training_layout)}   [{r.training_source}]",
             f"  served     : {r._label(r.served_layout)}   [{r.served_source}]"]
    if r.measured_layout is not None:
        lines.append(f"  measured   : {tuple(r.measured_layout)}   [{r.measured_source}]")
    lines.append(f"  verdict    : {r.verdict}")
    for i, p in enumerate(r.problems, 1):
        lines.append(f"  {i}. [{p.kind}{'' if p.blocking else ', advisory'}] {p.message}")
        lines.append(f"     fix: {p.fix}")
    lines += format_candidates(r)
    lines += format_releases(r)
    lines += [f"  note: {n}" for n in r.notes]
    lines.append(f"  ({r.seconds:.2f} s, no weights loaded)")
    return "\n".join(lines)


def format_candidates(r: CheckReport) -> list[str]:
    if not r.candidates:
        return []
    lines = candidate_table(r.candidates, r.engine, r.num_layers)
    lines.append(f"    settle it: name the trainer (--trainer NAME[==VERSION]), or measure the layout from "
                 f"the trainer's dump: `python -m helpers diagnose --draft {r.draft} --data DUMP "
                 f"--target TARGET`")
    return lines


def format_releases(r: CheckReport) -> list[str]:
    if not r.served_across_releases:
        return []
    lines = [f"  across releases ({r.releases_from}):"]
    rows = [(e["first"] if e["first"] == e["last"] else f"{e['first']} .. {e['last']}",
             r._label(e["served_layout"]) if e["served_layout"] else "nothing", e["note"])
            for e in r.served_across_releases]
    w_span, w_served = (max(len(row[i]) for row in rows) for i in (0, 1))
    indent = " " * (4 + w_span + 1 + w_served + 1)
    for span, served, note in rows:     # the note whole, wrapped at words under its own column
        wrapped = textwrap.wrap(note, width=max(40, 110 - len(indent))) or [""]
        lines.append(f"    {span:<{w_span}} {served:<{w_served}} {wrapped[0]}")
        lines += [indent + more for more in wrapped[1:]]
    if r.release_drift:
        lines.append(f"  release drift: {r.release_drift}")
    return lines


