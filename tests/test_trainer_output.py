"""What trainers record of their runs (helpers/investigation/trainer_output.py): SpecForge's capture_layers
in training_state.pt (loaded weights-only), speculators' run.yaml and train_command.txt. Read where the user
points (check --training-output, EAGLE3_WORKBOOK_TRAINING_OUTPUT) or in the draft folder, ranked above a
trainer's name and the config's format, and a config that disagrees with what was captured is said."""
from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import torch

from helpers.__main__ import main as cli
from helpers.investigation.evidence import Basis, training_evidence
from helpers.investigation.trainer_output import read_trainer_output
from helpers.rules.conventions import parse_engine, read_draft_config

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data" / "tiny-kimi"


def _published(tmp_path: Path) -> Path:
    """The deployed draft as SpecForge exports it: its config's eagle_config ids [2, 6, 9], no record."""
    draft = tmp_path / "draft"
    shutil.copytree(DATA / "draft", draft)
    (draft / "training.json").unlink()
    return draft


def _specforge_run(tmp_path: Path, capture_layers) -> Path:
    """SpecForge 0.2.0's output folder: {run_id}-step{N}/training_state.pt with its resume contract."""
    run = tmp_path / "run"
    for step in (100, 200):
        ck = run / f"r1-step{step}"
        ck.mkdir(parents=True)
        prov = (("capture_layers", tuple(capture_layers) if step == 200 else (0, 0, 0)),
                ("embedding_key", "model.embed_tokens.weight"), ("torch_dtype", "bfloat16"))
        torch.save({"step": step, "specforge_model_provenance": prov, "optimizer": {"m": torch.zeros(2)}},
                   ck / "training_state.pt")
    return run


def test_specforge_capture_layers_settle_the_layout_and_the_unchanged_config_is_named(tmp_path, capsys):
    draft = _published(tmp_path)
    run = _specforge_run(tmp_path, (1, 5, 8))     # layer outputs 1, 5, 8: the fc trained on (2, 6, 9)
    out = read_trainer_output(run)
    assert out is not None and out.ids == (1, 5, 8) and out.file.parent.name == "r1-step200"
    ev = training_evidence(draft, read_draft_config(draft), engine=parse_engine("sglang==0.5.23"),
                           arch="DeepseekV3ForCausalLM", num_layers=12, training_output=run)
    assert ev.basis is Basis.TRAINER_OUTPUT and ev.proven and ev.layout == (2, 6, 9), ev
    assert "recorded by the trainer in" in ev.source and "capture_layers" in ev.source
    assert "the exported config's ids [2, 6, 9] mean (3, 7, 10)" in ev.note
    target = str(DATA / "target")
    code = cli(["check", "--draft", str(draft), "--target", target, "--engine", "sglang==0.5.23",
                "--training-output", str(run), "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert rep["training_layout"] == [2, 6, 9] and rep["evidence"] == "trainer-output", rep
    assert code == 0          # SGLang 0.5.23's DeepSeek rule serves the ids as given: (2, 6, 9), as captured
    assert any(p["kind"] == "config-vs-trainer" for p in rep["problems"])
    # SGLang 0.5.9 adds one to every id: (3, 7, 10), what the exported config means, not what was trained
    code = cli(["check", "--draft", str(draft), "--target", target, "--engine", "sglang==0.5.9",
                "--training-output", str(run), "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 1 and rep["served_layout"] == [3, 7, 10] and rep["training_layout"] == [2, 6, 9]


def test_speculators_run_files_and_the_draft_folder_itself(tmp_path):
    draft = _published(tmp_path)
    (draft / "train_command.txt").write_text(
        "# Timestamp: 2026-11-30\n# speculators: 0.9.0\n# vllm: 0.33.0\n"
        "python -m speculators.train --verifier /m/target --target-layer-ids 0 3 7 --epochs 3\n")
    out = read_trainer_output(draft)
    assert out.trainer == "speculators==0.9.0" and out.ids == (0, 3, 7) and out.field == "--target-layer-ids"
    ev = training_evidence(draft, read_draft_config(draft), engine=parse_engine("vllm==0.34.0"),
                           arch="DeepseekV3ForCausalLM", num_layers=12)    # found in the draft folder
    assert ev.basis is Basis.TRAINER_OUTPUT and ev.layout == (0, 3, 7)
    (draft / "train_command.txt").unlink()
    (draft / "run.yaml").write_text("model:\n  target_layer_ids: [3, 7, 10]\ntraining:\n  epochs: 3\n")
    assert read_trainer_output(draft).ids == (3, 7, 10)


def test_a_pickle_that_asks_for_more_than_tensors_is_refused_and_nothing_changes(tmp_path, capsys):
    draft = _published(tmp_path)
    bad = tmp_path / "training_state.pt"

    class Shell:
        def __reduce__(self):
            return (os.system, ("echo pwned > " + str(tmp_path / "pwned"),))

    target = str(DATA / "target")
    for how, write in (("torch.save", lambda: torch.save({"specforge_model_provenance": Shell()}, bad)),
                       ("a raw pickle", lambda: bad.write_bytes(pickle.dumps({"x": Shell()}, protocol=4)))):
        write()
        code = cli(["check", "--draft", str(draft), "--target", target, "--engine", "sglang==0.5.23",
                    "--training-output", str(bad)])
        err = capsys.readouterr().err
        assert code == 2 and "not read" in err and err.count("\n") == 1, (how, err)
        assert ("posix.system" in err) if how == "torch.save" else ("weights-only load refuses" in err)
        assert not (tmp_path / "pwned").exists()
