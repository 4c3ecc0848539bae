"""The engine guard's judgement (helpers/live/guard.py), the training record (helpers/record.py) and the
``fixes`` command that writes both kinds of fix and the record; no engine here (the live guard is tested
inside vLLM in test_vllm.py and inside SGLang in test_sglang_live.py)."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.commands.fixes import main as fixes
from helpers.errors import BadConfig, BadOption
from helpers.investigation.evidence import Basis, Evidence
from helpers.judgement import Judgement
from helpers.live import guard
from helpers.record import read_record, write_record
from helpers.rules.conventions import parse_engine

REPO = Path(__file__).resolve().parents[1]
DRAFT = REPO / "data" / "tiny-kimi" / "draft"


@pytest.fixture
def draft(tmp_path):
    out = tmp_path / "draft"
    shutil.copytree(DRAFT, out)
    return out


def _record(layout):
    return guard.record_evidence(layout)


def _judge(indices, trained, highest=11, engine="sglang 0.5.23", **kw):
    return guard.judge(engine=engine, draft="d", indices=indices, highest=highest, evidence=_record(trained),
                       **kw)


# -- the judgement ------------------------------------------------------------------------------------


def test_mode_is_parsed_once_and_a_typo_is_refused(monkeypatch):
    assert guard.mode_from(None) is guard.Mode.OFF and guard.mode_from(" Refuse ") is guard.Mode.REFUSE
    assert guard.mode_from("strict") is guard.Mode.STRICT and guard.Mode.STRICT.refusing
    with pytest.raises(ValueError, match="expected off, warn, refuse or strict"):
        guard.mode_from("strikt")
    monkeypatch.setenv(guard.GUARD_ENV, "warn")
    assert guard.mode() is guard.Mode.WARN


@pytest.mark.parametrize("indices, trained, kind", [
    ([3, 7, 10], (3, 7, 10), Judgement.MATCH),
    ([2, 6, 9], (0, 3, 7), Judgement.MISWIRED),
    ([0, 3, 7], (7, 0, 3), Judgement.ORDER),
])
def test_kinds(indices, trained, kind):
    v = guard.judge(engine="sglang 0.5.23", draft="d", indices=indices, highest=11, evidence=_record(trained))
    assert v.kind is kind and v.served == tuple(sorted(indices)) and v.trained == trained
    assert v.blocking == (kind is not Judgement.MATCH)


def test_no_record_says_so_and_does_not_guess():
    """Nothing settles the training layout: the guard does not guess; ``warn`` starts, ``refuse`` (fail
    closed: it cannot judge) and ``strict`` stop, each in one line."""
    v = guard.judge(engine="vllm 0.32.0", draft="d", indices=[2, 6, 9], highest=12, evidence=None)
    assert v.kind is Judgement.UNKNOWN and not v.blocking and v.trained is None
    assert not v.refused_by(guard.Mode.WARN)
    assert v.refused_by(guard.Mode.REFUSE) and v.refused_by(guard.Mode.STRICT)
    assert "does not guess" in guard.render(v, guard.Mode.WARN)
    assert "cannot judge" in guard.render(v, guard.Mode.REFUSE)


def test_a_prior_from_the_format_is_never_a_match():
    """Every writer of the config's format reading its ids alike is a prior: the guard names it and does
    not judge by it, even where the served layout equals it."""
    prior = Evidence(None, Basis.FORMAT, "", note="every writer reads its ids as (2, 6, 9): a prior",
                     prior=(2, 6, 9))
    v = guard.judge(engine="sglang 0.5.23", draft="d", indices=[2, 6, 9], highest=11, evidence=prior)
    assert v.kind is Judgement.UNKNOWN and v.prior == (2, 6, 9) and not v.proven
    assert v.refused_by(guard.Mode.REFUSE) and "a prior" in guard.render(v, guard.Mode.REFUSE)
    config = Evidence((2, 6, 9), Basis.CONFIG, "speculators==0.5.0 named by the config")
    v = guard.judge(engine="sglang 0.5.23", draft="d", indices=[2, 6, 9], highest=11, evidence=config)
    assert v.kind is Judgement.MATCH and v.proven and not v.stated
    assert not v.refused_by(guard.Mode.REFUSE) and v.refused_by(guard.Mode.STRICT)


def test_indices_past_the_loop_are_dropped_not_served():
    v = _judge([3, 7, 12], (3, 7, 12))
    assert v.served == (3, 7) and v.dropped == (12,) and v.kind is Judgement.MISWIRED
    v = _judge([3, 7, 12], (3, 7, 12), highest=12, engine="vllm 0.32.0")
    assert v.kind is Judgement.MATCH      # a loop that also captures after the last layer serves L


def _setter(rule):
    """A live model stand-in whose setter follows ``rule`` (ids -> capture indices)."""
    holder = SimpleNamespace(layers_to_capture=[2, 6, 9])

    def set_ids(ids):
        holder.layers_to_capture = rule(list(ids))
    return holder, set_ids


@pytest.mark.parametrize("rule, want", [
    (lambda ids: [i + 1 for i in ids], [-1, 2, 6]),                                  # sglang 0.5.9
    (lambda ids: [i + 1 for i in ids] if ids and ids[0] == 1 else ids, [0, 3, 7]),   # sglang 0.5.23
])
def test_the_fix_is_found_by_running_the_engines_own_setter_and_the_model_is_restored(rule, want):
    holder, set_ids = _setter(rule)
    original = holder.layers_to_capture

    def restore():
        holder.layers_to_capture = original
    ids_for = guard.probe_ids(set_ids, lambda: holder.layers_to_capture, 11, restore)
    v = guard.judge(engine="sglang 0.5.23", draft="d", indices=original, highest=11,
                    evidence=_record((0, 3, 7)), ids_for=ids_for)
    assert v.kind is Judgement.MISWIRED and f"to {want}" in v.fix
    assert holder.layers_to_capture is original


def test_non_ascending_training_has_no_ids_fix():
    v = _judge([2, 6, 9], (7, 0, 3), ids_for=lambda layout: [0, 0, 0])
    assert v.kind is Judgement.MISWIRED and "no ids serve" in v.fix and "ascending" in v.fix


def test_a_flag_the_engine_does_not_run_blocks_even_on_the_right_layout():
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "norm_before_residual": True}
    ignored = guard.ignored_flags(cfg, parse_engine("sglang==0.5.23"))
    assert [f for f, _, _ in ignored] == ["norm_before_residual"]
    assert guard.ignored_flags(cfg, parse_engine("vllm==0.32.0")) == []
    v = _judge([0, 3, 7], (0, 3, 7), ignored=ignored)
    assert v.kind is Judgement.IGNORED_FLAG and v.blocking and "vllm>=" in v.fix


def test_warn_logs_once_refuse_raises_only_when_blocking(capsys):
    rows = []
    bad = guard.judge(engine="sglang 0.5.23", draft="d-warn", indices=[2, 6, 9], highest=11,
                      evidence=_record((0, 3, 7)))
    guard.enforce(bad, guard.Mode.WARN, rows.append)
    guard.enforce(bad, guard.Mode.WARN, rows.append)
    assert capsys.readouterr().err.count("eagle3-workbook guard") == 1 and len(rows) == 2
    with pytest.raises(guard.GuardRefused, match="trained on"):
        guard.enforce(bad, guard.Mode.REFUSE)
    ok = _judge([0, 3, 7], (0, 3, 7))
    guard.enforce(ok, guard.Mode.REFUSE)           # starts
    guard.enforce(bad, guard.Mode.OFF)             # off: nothing at all
    assert "d-warn" not in capsys.readouterr().err


def test_at_load_reads_the_record_and_restores_the_live_model(monkeypatch, draft):
    monkeypatch.setenv(guard.GUARD_ENV, "refuse")
    holder, set_ids = _setter(lambda ids: [i + 1 for i in ids])
    original = holder.layers_to_capture
    with pytest.raises(guard.GuardRefused) as info:
        guard.at_load(family="sglang", version="0.5.9", draft=draft, holder=holder, attr="layers_to_capture",
                      highest=11, ids=[1, 5, 8], set_ids=set_ids)
    assert "trained on (0, 3, 7)" in str(info.value) and "[-1, 2, 6]" in str(info.value)
    assert holder.layers_to_capture is original
    monkeypatch.setenv(guard.GUARD_ENV, "off")
    assert guard.at_load(family="sglang", version="0.5.9", draft=draft, holder=holder,
                         attr="layers_to_capture", highest=11, ids=None, set_ids=set_ids) is None


def test_an_unreadable_record_warns_and_starts_or_refuses_with_the_reason(monkeypatch, draft, capsys):
    (draft / "training.json").write_text("[0, 3, 7]")
    holder, set_ids = _setter(lambda ids: ids)
    rows = []
    kw = dict(family="vllm", version="0.32.0", draft=draft, holder=holder, attr="layers_to_capture",
              highest=12, ids=None, set_ids=set_ids, report=rows.append)
    monkeypatch.setenv(guard.GUARD_ENV, "warn")
    assert guard.at_load(**kw) is None and rows[-1]["kind"] == "unjudged"
    assert "cannot judge" in capsys.readouterr().err
    monkeypatch.setenv(guard.GUARD_ENV, "refuse")
    with pytest.raises(guard.GuardRefused, match="expected an object"):
        guard.at_load(**kw)


def test_the_sglang_guard_hooks_are_apart_from_the_cpu_accommodations(monkeypatch):
    """A user's deployment: the registry hooks (guard, record) need only the registry and the setter every
    EAGLE-3 release has; the accommodations are pinned to one release and refuse any other."""
    from helpers.engines.sglang import hooks
    from helpers.engines.sglang.cpu import hooks as cpu_hooks

    monkeypatch.setattr(hooks, "_after", {})
    monkeypatch.delitem(sys.modules, hooks.REGISTRY, raising=False)
    before = list(sys.meta_path)
    try:
        hooks.install_watch()
        hooks.install_watch()
        assert list(hooks._after) == [hooks.REGISTRY] and len(hooks._after[hooks.REGISTRY]) == 2
        assert sum(isinstance(f, hooks._Watcher) for f in sys.meta_path) == 1
    finally:
        sys.meta_path[:] = before
    monkeypatch.setattr(cpu_hooks, "installed_release", lambda: "0.5.30")
    with pytest.raises(SystemExit):
        cpu_hooks.install()


def test_the_registry_is_wrapped_once_however_many_installers_ran():
    from helpers.engines.sglang import hooks

    class Registry:
        def resolve_model_cls(self, architectures):
            return Model, architectures[0]

    class Model:
        pass

    module = SimpleNamespace(ModelRegistry=Registry())
    hooks.wrap_registry(module)
    first = Registry.resolve_model_cls
    hooks.wrap_registry(module)
    assert Registry.resolve_model_cls is first and hooks.is_wrapped(Registry)
    assert module.ModelRegistry.resolve_model_cls(["Model"]) == (Model, "Model") and Model in hooks._handled


def test_a_forward_that_adds_an_unset_residual_at_the_capture_is_found():
    unsafe = """
def forward(self, x):
    residual = None
    for i in range(3):
        if i in self.layers_to_capture:
            aux.append(hidden_states + residual)
"""
    safe = unsafe.replace("hidden_states + residual",
                          "hidden_states + residual if residual is not None else hidden_states")
    assert guard.adds_unset_residual(unsafe, "layers_to_capture") == 1
    assert guard.adds_unset_residual(safe, "layers_to_capture") == 0
    set_first = unsafe.replace("residual = None", "residual = x")
    assert guard.adds_unset_residual(set_first, "layers_to_capture") == 0


# -- the training record ------------------------------------------------------------------------------


def test_record_round_trip_keeps_what_it_does_not_read(draft):
    rec = read_record(draft)
    assert rec.layout == (0, 3, 7) and rec.full_acc[0] == pytest.approx(0.7007) and rec.ttt_steps == 5
    new = write_record(draft, training_boundaries=[3, 7, 10], trainer="speculators==0.4.0")
    again = read_record(draft / "config.json")
    assert again.layout == new.layout == (3, 7, 10) and again.trainer == "speculators==0.4.0"
    assert again.raw["data_pipeline"] == rec.raw["data_pipeline"]


@pytest.mark.parametrize("raw, match", [
    ([0, 3, 7], "expected an object"),
    ({"training_boundaries": [0, -3, 7]}, "non-negative"),
    ({"training_boundaries": [3, 3]}, "distinct"),
    ({"training_boundaries": [0, 3], "final_val": {"full_acc": [0.5, 1.2]}}, "fractions"),
    ({"training_boundaries": [0, 3], "forward_flags": {"fc_norm": "yes"}}, "forward_flags"),
])
def test_one_validation_for_every_reader(draft, raw, match):
    (draft / "training.json").write_text(json.dumps(raw))
    with pytest.raises(BadConfig, match=match):
        read_record(draft)


def test_a_bad_value_writes_nothing(draft):
    before = (draft / "training.json").read_text()
    with pytest.raises(BadConfig):
        write_record(draft, training_boundaries=[1, 1])
    assert (draft / "training.json").read_text() == before
    with pytest.raises(BadOption, match="not a draft folder"):
        write_record(draft.parent / "nowhere", training_boundaries=[1])


# -- the fixes command ---------------------------------------------------------------------------------


def test_fixes_record_from_the_user_from_a_trainer_and_from_diagnose(draft, tmp_path, capsys):
    assert fixes(["record", "--draft", str(draft), "--layout", "3,7,10"]) == 0
    assert read_record(draft).layout == (3, 7, 10) and "was (0, 3, 7)" in capsys.readouterr().err
    assert fixes(["record", "--draft", str(draft), "--trainer", "specforge-sglang==0.5.9", "--train-ids",
                  "2,6,9", "--target", str(REPO / "data" / "tiny-kimi" / "target")]) == 0
    rec = read_record(draft)
    assert rec.layout == (3, 7, 10) and rec.train_ids == (2, 6, 9)
    assert rec.trainer == "specforge-sglang==0.5.9"
    out = tmp_path / "d.json"
    out.write_text(json.dumps({"best_layout": [0, 3, 7], "confident": True, "best_full_acc": [0.6, 0.4]}))
    assert fixes(["record", "--draft", str(draft), "--from-diagnose", str(out)]) == 0
    rec = read_record(draft)
    assert rec.layout == (0, 3, 7) and rec.source == "diagnose" and rec.full_acc == (0.6, 0.4)


def test_fixes_record_refuses_an_undecided_diagnosis(draft, tmp_path):
    out = tmp_path / "d.json"
    out.write_text(json.dumps({"best_layout": [0, 3, 7], "confident": False,
                               "confident_set": [[0, 3, 7], [1, 3, 7]]}))
    before = (draft / "training.json").read_text()
    with pytest.raises(BadOption, match="could not separate 2 layouts"):
        fixes(["record", "--draft", str(draft), "--from-diagnose", str(out)])
    assert (draft / "training.json").read_text() == before


def test_fixes_ids_and_reorder_write_new_folders(draft, tmp_path):
    assert fixes(["ids", "--draft", str(draft), "--out", str(tmp_path / "a"), "--engine", "sglang",
                  "--ids", "-1,2,6"]) == 0
    assert json.loads((tmp_path / "a" / "config.json").read_text())["eagle_config"][
        "eagle_aux_hidden_state_layer_ids"] == [-1, 2, 6]
    assert fixes(["reorder", "--draft", str(draft), "--out", str(tmp_path / "r"), "--served", "3,7,0"]) == 0
    assert read_record(tmp_path / "r").layout == (3, 7, 0)
    with pytest.raises(BadOption, match="is the draft itself"):
        fixes(["ids", "--draft", str(draft), "--out", str(draft), "--engine", "vllm", "--ids", "0,3,7"])


def test_a_refusal_is_read_from_the_launch_report_not_from_the_log():
    bad = _judge([2, 6, 9], (0, 3, 7))
    rows = []
    with pytest.raises(guard.GuardRefused):
        guard.enforce(bad, guard.Mode.REFUSE, rows.append)
    assert guard.refusal(rows[-1]) == guard.render(bad, guard.Mode.REFUSE)
    guard.enforce(bad, guard.Mode.WARN, rows.append)
    assert guard.refusal(rows[-1]) is None
    ok = _judge([0, 3, 7], (0, 3, 7))
    guard.enforce(ok, guard.Mode.REFUSE, rows.append)
    assert guard.refusal(rows[-1]) is None
    assert guard.refusal({"kind": "unjudged", "mode": "refuse", "line": "x", "refused": True}) == "x"
    assert guard.refusal(None) is None


def test_a_refusing_launch_that_was_never_judged_does_not_serve():
    """The workbook's own launches: under refuse/strict, a speculative engine that came up with no guard
    record (plugin not loaded, allowlisted out, shadowed) is stopped before a request."""
    line = guard.unjudged_launch(guard.Mode.REFUSE, None, engine="SGLang 0.5.23", log="x.log")
    assert line.startswith("eagle3-workbook guard (refuse): SGLang 0.5.23 came up without judging")
    assert "unguarded" in line and "x.log" in line
    assert guard.unjudged_launch(guard.Mode.STRICT, None, engine="vLLM", log="x") is not None
    assert guard.unjudged_launch(guard.Mode.WARN, None, engine="vLLM", log="x") is None
    assert guard.unjudged_launch(guard.Mode.REFUSE, {"kind": "match"}, engine="vLLM", log="x") is None


@pytest.mark.parametrize("release, unsafe", [("0.5.9", True), ("0.5.23", False)])
def test_the_boundary0_hazard_is_read_from_each_releases_own_forward(release, unsafe):
    """SGLang 0.5.9's DeepseekV2Model.forward adds a residual still None before layer 0 (the original case's
    crash; its fix A needs the patch first), 0.5.23's does not: the guard reads the live class's source."""
    import ast

    from helpers.engines.sglang.source import fetch_sglang

    path = fetch_sglang(release).root / "sglang" / "srt" / "models" / "deepseek_v2.py"
    text = path.read_text()
    cls = next(n for n in ast.walk(ast.parse(text))
               if isinstance(n, ast.ClassDef) and n.name == "DeepseekV2Model")
    forward = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "forward")
    found = guard.adds_unset_residual(ast.get_source_segment(text, forward), "layers_to_capture")
    assert bool(found) is unsafe
