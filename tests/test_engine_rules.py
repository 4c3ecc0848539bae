"""The engine is one typed value, parsed only at the edge (issue #29): one rule object per family, all
with the same methods, and no engine-name string tests below the edge."""
from __future__ import annotations

import ast
import inspect
import json
import re
from pathlib import Path

import pytest

from helpers.engines.llamacpp.rule import LLAMACPP_NEWEST_READ
from helpers.engines.vllm.rule import VLLM_NEWEST_READ
from helpers.errors import BadOption
from helpers.rules import families as engines
from helpers.rules.conventions import ENGINES, Engine, IdsAt, engine_fc_slots, engine_ids, parse_engine
from helpers.rules.topology import pp_stages

REPO = Path(__file__).resolve().parents[1]
HELPERS = REPO / "helpers"

# Where an engine named as text is parsed: the edges only. The CLI (the --engine action and the value it
# kept as text), the notebooks' setup (their ENGINE_VERSION), run-workbook's check of the notebooks'
# parameters before any notebook starts, and the guard inside a live engine, which names itself as text.
# Every library function below takes an Engine (docs/architecture.md, "The engine, parsed once").
PARSED_AT = {
    ("cli.py", "EngineOption.__call__"), ("cli.py", "engine_value"), ("cli.py", "stated_engine"),
    ("notebook/setup.py", "setup_notebook"),
    ("notebook/runner.py", "check_run_inputs"),
    ("live/guard.py", "at_load"),
}
PARSED_IN = {"cli.py", "notebook/setup.py", "notebook/runner.py", "live/guard.py"}   # at most four modules


def _parse_sites() -> set[tuple[str, str]]:
    sites = set()
    for path in HELPERS.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))

        def walk(node, scope):
            for child in ast.iter_child_nodes(node):
                inner = scope
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    inner = f"{scope}.{child.name}" if scope else child.name
                if isinstance(child, ast.Call):
                    f = child.func
                    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                    if name == "parse_engine":
                        sites.add((str(path.relative_to(HELPERS)), scope))
                walk(child, inner)

        walk(tree, "")
    return sites


def test_every_family_has_the_same_methods():
    assert tuple(engines.FAMILIES) == ENGINES
    public = {n for n, v in inspect.getmembers(engines.EngineRules) if not n.startswith("_")}
    for name, rules in engines.FAMILIES.items():
        assert isinstance(rules, engines.EngineRules) and rules.name == name and rules.title
        assert {n for n, _ in inspect.getmembers(rules) if not n.startswith("_")} == public
        for method in ("reads_ids", "resolve"):          # no family is left to the base's NotImplementedError
            assert getattr(type(rules), method) is not getattr(engines.EngineRules, method), (name, method)
        assert Engine(name).rules is rules


def test_parse_engine_is_called_only_at_the_edge():
    sites = _parse_sites()
    assert sites <= PARSED_AT, sorted(sites - PARSED_AT)
    assert {f for f, _ in sites} <= PARSED_IN and len(PARSED_IN) <= 4
    assert ("rules/conventions.py", "parse_engine") not in sites       # no rule function parses
    # below the edge a function takes an Engine, never text it would have to parse again
    loose = {str(p.relative_to(HELPERS)) for p in HELPERS.rglob("*.py") if "str | Engine" in p.read_text()}
    assert loose <= {"cli.py", "rules/conventions.py"}, sorted(loose)
    for nb in sorted((REPO / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        assert not any("parse_engine(" in "".join(c["source"]) for c in cells), nb.name


def test_no_engine_name_tests_below_the_edge():
    pattern = re.compile(r'(name|\.name|family) *(==|!=) *"(sglang|vllm|trtllm|llamacpp)"'
                         r'|in \("(sglang|vllm|trtllm|llamacpp)"')
    hits = {(str(p.relative_to(HELPERS)), n + 1) for p in HELPERS.rglob("*.py")
            for n, line in enumerate(p.read_text().splitlines()) if pattern.search(line)}
    # backends.choose reads the BACKEND/--backend word itself (the edge); the verdict: work in progress
    assert {f for f, _ in hits} <= {"live/backends.py", "investigation/verdict.py"}, sorted(hits)
    assert not [p for p in HELPERS.rglob("*.py") if "or VLLM_NEWEST_READ" in p.read_text()]
    assert "in why" not in (HELPERS / "rules" / "topology.py").read_text()   # decided by a call, not text


@pytest.mark.parametrize("text, version", [("llamacpp==b11434", "b11434"), ("llamacpp==11434", "11434"),
                                           ("llamacpp", None)])
def test_llamacpp_builds_parse(text, version):
    eng = parse_engine(text)
    assert eng == Engine("llamacpp", version) and eng.rules is engines.LLAMACPP
    assert eng.effective_version == (version or f"b{LLAMACPP_NEWEST_READ}")
    assert (eng.rules.assumed(eng.version) is None) == (version is not None)


def test_bad_names_are_refused_at_parse_time_as_before():
    with pytest.raises(BadOption, match="not a llama.cpp build"):
        parse_engine("llamacpp==0.5.9")
    with pytest.raises(BadOption, match="or plain 'vllm'"):
        parse_engine("vllm==abc")
    with pytest.raises(BadOption, match="only vLLM has them"):
        parse_engine("sglang==0.5.9:v1")
    with pytest.raises(BadOption, match="no model runner ':v3'"):
        parse_engine("vllm:v3")
    e = parse_engine("vllm==0.32.0:v1")
    assert parse_engine(e) is e and e.rules.runners == ("v1", "v2")


def test_effective_version_is_the_named_one_else_the_newest_read_and_says_so():
    assert parse_engine("vllm").effective_version == VLLM_NEWEST_READ
    assert VLLM_NEWEST_READ in engines.VLLM.assumed(None)
    assert parse_engine("vllm==0.22.0").effective_version == "0.22.0"
    assert engines.VLLM.assumed("0.22.0") is None
    assert parse_engine("trtllm").effective_version is None
    assert engines.VLLM.label(parse_engine("vllm")) == f"vLLM {VLLM_NEWEST_READ} (the newest read)"
    assert engines.SGLANG.label(parse_engine("sglang==0.5.9")) == "SGLang 0.5.9"


def test_families_answer_what_name_tests_did():
    key = "eagle_aux_hidden_state_layer_ids"
    nested = {"architectures": ["LlamaForCausalLMEagle3"], "eagle_config": {key: [2, 6, 9]}}
    top = {"architectures": ["LlamaForCausalLMEagle3"], key: [3, 7, 10]}
    assert engine_ids(nested, parse_engine("sglang==0.5.9")).source == IdsAt.EAGLE_CONFIG
    assert engine_ids(nested, parse_engine("trtllm")).source == IdsAt.NONE
    assert engine_ids(top, parse_engine("llamacpp==b11434")).ids == [3, 7, 10]     # its converter's key
    assert engine_ids(top, parse_engine("llamacpp==b10001")).ids is None           # reads no ids yet
    assert engine_fc_slots(nested, parse_engine("llamacpp"))[0] == 3
    assert engine_fc_slots(nested, parse_engine("trtllm"))[0] is None
    assert [r.ids_home for r in engines.FAMILIES.values()] == [IdsAt.EAGLE_CONFIG, IdsAt.TOP_LEVEL, None,
                                                               IdsAt.TOP_LEVEL, None]   # lmdeploy: none read
    assert engines.SGLANG.misplaced_ids(top, [3, 7, 10], IdsAt.TOP_LEVEL, parse_engine("sglang"), "X")
    assert engines.VLLM.misplaced_ids(top, [3, 7, 10], IdsAt.TOP_LEVEL, parse_engine("vllm"), "X") is None
    assert "under eagle_config" in engines.VLLM.misplaced_ids(nested, [2, 6, 9], IdsAt.EAGLE_CONFIG,
                                                              parse_engine("vllm"), "LlamaForCausalLM")[0]
    # the PP split: vLLM gives the remainder to the stages before the last, SGLang to the last ones
    assert pp_stages(parse_engine("vllm"), 10, 3) == [(0, 3), (3, 7), (7, 10)]
    assert pp_stages(parse_engine("sglang"), 10, 3) == [(0, 3), (3, 6), (6, 10)]
