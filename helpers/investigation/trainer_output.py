"""What a trainer itself recorded of the layers it captured, read from its training output.

Trainers write nothing an engine reads about the layout, but some keep it beside the checkpoints:

- SpecForge (0.2.0) stores ``capture_layers`` in every checkpoint's ``training_state.pt``, inside the
  ``specforge_model_provenance`` resume contract (training/provenance.py ``_compute_model_resume_provenance``,
  algorithms/common/providers.py ``bind_runtime``), in its own id numbering. Its exporter
  (export/to_sglang.py) writes the draft config it started from unchanged, so a run that overrode the ids
  exports a config whose ids are not the ones it trained on.
- speculators (0.9.0) writes ``run.yaml`` (the resolved config, ``target_layer_ids`` when set) and
  ``train_command.txt`` (the argv, ``--target-layer-ids``, and a ``# speculators: X`` version line) next to
  its checkpoints (train/config/artifacts.py, train/utils.py ``save_train_command``).

``training_state.pt`` is a pickle from outside: it is loaded with ``weights_only=True`` (torch imported
only then), and a refusal is said, never worked around. Nothing here guesses: a file without the field is
"no statement", and the caller goes down the evidence chain.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadConfig, pickle_refusal

SPECFORGE_STATE = "training_state.pt"
SPECFORGE_KEY = "specforge_model_provenance"
SPECULATORS_FILES = ("run.yaml", "train_command.txt")


@dataclass(frozen=True)
class TrainerOutput:
    """The ids a trainer recorded for its run (its own numbering), who recorded them and where."""

    trainer: str                # a trainer spec its rule is named by: "specforge-hf", "speculators==0.9.0"
    ids: tuple[int, ...]
    file: Path
    field: str                  # where in the file: "specforge_model_provenance.capture_layers", ...
    note: str = ""

    @property
    def source(self) -> str:
        return f"{self.file} ({self.field})"


def _state_file(path: Path) -> Path | None:
    """``training_state.pt`` itself, a checkpoint folder holding it, or an output folder whose newest
    ``*-stepN/`` holds it."""
    if path.is_file() and path.name.endswith(".pt"):
        return path
    if (path / SPECFORGE_STATE).is_file():
        return path / SPECFORGE_STATE
    steps = sorted(((int(m.group(1)), p) for p in path.glob(f"*-step*/{SPECFORGE_STATE}")
                    if (m := re.search(r"-step(\d+)$", p.parent.name))), key=lambda t: t[0])
    return steps[-1][1] if steps else None


def read_specforge(path: Path) -> TrainerOutput | None:
    state_file = _state_file(path)
    if state_file is None:
        return None
    import torch

    try:
        state = torch.load(state_file, map_location="cpu", weights_only=True)
    except Exception as exc:      # noqa: BLE001 - an unpickler refusal or a damaged file: said, not loaded
        raise BadConfig(f"{state_file}: not read ({pickle_refusal(exc)}); expected SpecForge's "
                        f"{SPECFORGE_STATE}") from None
    prov = state.get(SPECFORGE_KEY) if isinstance(state, dict) else None
    pairs = isinstance(prov, (tuple, list)) and all(isinstance(p, (tuple, list)) and len(p) == 2
                                                    for p in prov)
    fields = dict(prov) if pairs else (prov if isinstance(prov, dict) else {})
    layers = fields.get("capture_layers")
    if not layers:
        return None
    ids = tuple(int(i) for i in layers)
    return TrainerOutput("specforge-hf", ids, state_file, f"{SPECFORGE_KEY}.capture_layers",
                         note="SpecForge records no capture backend: its HF backend's numbering is applied "
                              "(layer outputs); name the SGLang backend with --trainer specforge-sglang==X "
                              "when it captured through SGLang")


def _find_key(obj, key: str):
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for v in obj.values():
            found = _find_key(v, key)
            if found is not None:
                return found
    return None


def read_speculators(path: Path) -> TrainerOutput | None:
    folder = path if path.is_dir() else path.parent
    command = folder / "train_command.txt"
    version = None
    ids = None
    where = None
    if command.is_file():
        text = command.read_text(encoding="utf-8", errors="replace")
        m = re.search(r"^# speculators: ([\w.]+)", text, re.M)
        version = m.group(1) if m and m.group(1) != "not" else None
        argv = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
        words = shlex.split(argv[-1]) if argv else []
        for i, w in enumerate(words):
            if w.startswith("--target-layer-ids"):
                values = [w.split("=", 1)[1]] if "=" in w else []
                for nxt in words[i + 1:] if not values else []:
                    if nxt.startswith("--"):
                        break
                    values.append(nxt)
                ids = [int(x) for v in values for x in re.split(r"[,\s]+", v) if x]
                where = (command, "--target-layer-ids")
    run = folder / "run.yaml"
    if ids is None and run.is_file():
        import yaml

        try:
            cfg = yaml.safe_load(run.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise BadConfig(f"{run}: not YAML ({str(exc).splitlines()[0]})") from None
        found = _find_key(cfg, "target_layer_ids")
        if isinstance(found, list) and found:
            ids, where = [int(i) for i in found], (run, "target_layer_ids")
    if ids is None or where is None:
        return None
    spec = f"speculators=={version}" if version else "speculators"
    return TrainerOutput(spec, tuple(ids), where[0], where[1])


def read_trainer_output(path: str | Path) -> TrainerOutput | None:
    """What the trainer recorded under ``path`` (a checkpoint, its folder, or the run's output folder), or
    None when it recorded nothing this module reads. Raises ``BadConfig`` for a file it cannot read."""
    p = Path(path).expanduser()
    if not p.exists():
        raise BadConfig(f"{p}: no such training output (expected SpecForge's {SPECFORGE_STATE} or its "
                        f"checkpoint folder, or speculators' output folder with run.yaml / "
                        f"train_command.txt)")
    return read_specforge(p) or read_speculators(p)
