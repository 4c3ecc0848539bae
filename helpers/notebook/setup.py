"""The first cell every notebook runs after its parameters: load what it studies, say what it is.

All six notebooks open the same way (the reports folder, the pair, two lines describing target
and draft), and six copies of that cell drift apart. ``setup_notebook`` is that cell. Notebook 02
fed from a trainer's dump (``DATA``) never runs the target, so there it loads the draft with only
the target's config, embedding, final norm and head (``heads_only``) and describes the same two
lines from those.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..cores import size_torch_threads
from ..investigation.dump_diagnose import load_for_dump
from ..investigation.pair import DEFAULT_DIR, Pair, load_pair
from ..model.checkpoint import read_training_record
from ..model.draft import Eagle3Draft
from ..rules.conventions import CASE_ENGINE, Engine, parse_engine


@dataclass
class NotebookSetup:
    """What the notebook's later cells work on. ``pair`` is None with ``heads_only``: then
    ``heads`` (and ``small_target``, a target small enough to run for matching a dump's slots)
    stand in for it. ``rules``: the notebook's ``ENGINE_VERSION``, parsed here once (the notebooks'
    edge) into the Engine every later cell hands down."""

    reports: Path
    target_dir: Path
    draft_dir: Path
    draft: Eagle3Draft
    draft_config: dict
    arch: str
    num_layers: int
    hidden_size: int
    record: dict | None = None
    pair: Pair | None = None
    heads: object | None = None
    small_target: object | None = None
    notes: list[str] = field(default_factory=list)
    rules: Engine = CASE_ENGINE

    @property
    def recorded_layout(self) -> tuple[int, ...] | None:
        if self.record and self.record.get("training_boundaries") is not None:
            return tuple(self.record["training_boundaries"])
        return None

    def describe(self) -> list[str]:
        """The two lines every notebook opens with: which target and which draft, as loaded."""
        c = self.draft.cfg
        return [f"target {self.target_dir} ({self.arch}, {self.num_layers} layers, "
                f"hidden {self.hidden_size})",
                f"draft  {self.draft_dir} ({c.format} format, fc {c.fc_in} -> {c.hidden_size}, draft vocab "
                f"{c.draft_vocab_size}, config ids {c.eagle_ids} in {c.ids_location})"]


def setup_notebook(target=None, draft=None, device: str = "cpu", reports_dir="../reports", *,
                   heads_only: bool = False, engine: str | None = None) -> NotebookSetup:
    """Create ``reports_dir``, load the pair (None: the embedded tiny-kimi), print its notes and
    description. ``heads_only``: the draft and the target's heads, never the target's layers.
    ``engine``: the notebook's ``ENGINE_VERSION`` text (None: the notebooks' default, the case replay),
    parsed before anything loads so a misspelled engine stops the notebook first. Torch gets as many
    threads as there are free cores now (``helpers.cores``), said in one line when that is fewer than all."""
    rules = parse_engine(engine) if engine is not None else CASE_ENGINE
    cores = size_torch_threads()        # a core another job holds gets no torch thread (helpers/cores.py)
    if cores.free < cores.allowed:
        print(cores.line())
    reports = Path(reports_dir)
    reports.mkdir(parents=True, exist_ok=True)
    if heads_only:
        setup = _heads_only(target, draft, device, reports)
    else:
        pair = load_pair(target, draft, device)
        setup = NotebookSetup(reports, pair.target_dir, pair.draft_dir, pair.draft, pair.draft_config,
                              arch=pair.arch, num_layers=pair.num_layers,
                              hidden_size=pair.target.config.hidden_size, record=pair.record, pair=pair,
                              notes=list(pair.notes))
    setup.rules = rules
    for n in setup.notes:
        print("note:", n)
    for line in setup.describe():
        print(line)
    return setup


def _heads_only(target, draft, device: str, reports: Path) -> NotebookSetup:
    target_dir = Path(target) if target else DEFAULT_DIR / "target"
    draft_dir = Path(draft) if draft else DEFAULT_DIR / "draft"
    print("loading the draft and the target's embedding, final norm and head (not the target's layers)...")
    loaded, heads, small_target, tspec, notes, draft_config = load_for_dump(draft_dir, target_dir, "auto",
                                                                           device)
    return NotebookSetup(reports, target_dir, draft_dir, loaded, draft_config,
                         arch=tspec.arch or "?", num_layers=tspec.num_layers,
                         hidden_size=tspec.hidden_size, record=read_training_record(draft_dir), heads=heads,
                         small_target=small_target, notes=list(notes))
