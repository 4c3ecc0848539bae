"""The trainer's side of the contract: which boundaries a trainer's "layer ids" captured, and what
the draft's ``fc`` was trained on.

A wiring bug is the trainer's convention disagreeing with the engine's. The engine's side is read
from each engine release (``wiring``); this module is the trainer's. Each rule names the file and
release it was read from (docs/conventions.md has the table). Where the trainer is a public package
(speculators, SpecForge), the release's own wheel is fetched and its default ids are evaluated from
its source, and for speculators the capture position and the dropped verifier state are read too,
so a release that changed them is not described by an older one's rule. SpecForge's SGLang backend
captures through SGLang's own setter, so its ids go through the engine resolver for that release.
"""
from __future__ import annotations

import ast
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ..boundaries import Layout, WiringError, layout_label
from ..errors import BadOption, CacheError, one_line, warn_once
from .conventions import (
    Engine,
    IdsAt,
    check_num_layers,
    ids_in_config,
    is_eagle_reference_config,
    is_speculators_format,
    is_version_string,
    layer_outputs_to_boundaries,
    version_key,
)
from .wheels import PackageSourceError, UnknownPackageVersion, fetch
from .wiring import resolve

POST_NORM = "post-norm"   # the final state after the norm: a verifier state, never a boundary
# The SpecForge release whose wheel is read when a run does not name one (0.1.0 ships an sdist that
# does not build; 0.2.0 is the newest on the index as of this writing).
SPECFORGE_READ = "0.2.0"


@dataclass(frozen=True)
class TrainerRule:
    """One trainer release range: how its ids name states, its defaults, what it keeps aside."""

    name: str
    first: str | None                   # first release the rule holds for (None: all earlier)
    next: str | None                    # first release it no longer holds for
    meaning: str                        # "output" (boundary = id + 1) | "boundary" | "engine" | "fixed"
    default: Callable[[int], list[int]]
    drops_last: bool                    # the last captured state is the verifier's, not an fc slot
    writes_ids: IdsAt                   # where the draft config it writes carries the ids
    read_from: str                      # file and release the rule was read from
    package: str | None = None          # PyPI package whose wheel is read to confirm the rule
    default_file: str | None = None     # where its default ids are written, inside the wheel
    capture_file: str | None = None     # where its capture loop is, inside the wheel
    note: str = ""
    appends_final: bool = False         # boundary N is captured after the given ids, as the verifier state
    folder: str | None = None           # the wheel's top folder, when it is not the package name
    default_fn: str | None = None       # the function in default_file that returns the default ids
    ascending: bool = False             # hooks fire in layer order, whatever order the ids are listed in
    export_offset: int = 0              # the exporter writes training id + offset into the draft config
    export_model_type: str | None = None   # ... only for draft configs of this model_type
    read_version: str | None = None     # the release whose wheel is read when none is named
    minus_one: str | None = None        # what output id -1 names: "embedding" (a patched pipeline's
    #                                     name, boundary 0) | "post-norm" (the final state after the norm)

    def exports_with_offset(self, model_type: str | None) -> bool:
        return bool(self.export_offset) and (self.export_model_type is None
                                             or model_type == self.export_model_type)

    def holds_for(self, version: str | None) -> bool:
        if not version:
            return self.next is None
        v = version_key(version)
        return (self.first is None or v >= version_key(self.first)) and (
            self.next is None or v < version_key(self.next))

    @property
    def versions(self) -> str:
        lo = f">={self.first}" if self.first else ""
        hi = f"<{self.next}" if self.next else ""
        return ",".join(p for p in (lo, hi) if p) or "all"


def _half(n: int) -> list[int]:
    return [2, n // 2, n - 3]


TRAINERS: tuple[TrainerRule, ...] = (
    TrainerRule("speculators", None, "0.3.0", "none", _half, False, IdsAt.NONE,
                "speculators 0.1.0-0.2.0: no hidden-state generation in the package",
                note="these releases only convert drafts; name the trainer that produced the features"),
    TrainerRule("speculators", "0.3.0", "0.5.0", "output",
                lambda n: [2, n // 2, n - 3, n - 1], True, IdsAt.NONE,
                "speculators 0.3.0/0.4.0.1 data_generation/custom_worker.py (append after the layer runs), "
                "vllm_hidden_states_generator.py (default ids), train/data.py (`hidden_states[:-1]`)",
                package="speculators",
                default_file="speculators/data_generation/vllm_hidden_states_generator.py",
                capture_file="speculators/data_generation/custom_worker.py",
                note="the trained draft's config carries no ids, so every engine serves its own defaults",
                minus_one="embedding"),
    TrainerRule("speculators", "0.5.0", None, "boundary",
                _half, True, IdsAt.TOP_LEVEL,
                "speculators 0.5.0-0.9.0 captures through vLLM's extract_hidden_states (vLLM numbering: id = "
                "boundary); scripts/launch_vllm.py appends N (--include-last-layer); models/utils.py "
                "resolve_target_layer_ids defaults the fc ids to [2, N//2, N-3]; train/data.py keeps [:, -1] "
                "as the verifier state", package="speculators", default_file="speculators/models/utils.py",
                appends_final=True),
    TrainerRule("specforge-hf", None, None, "output", lambda n: [1, n // 2 - 1, n - 4], False,
                IdsAt.EAGLE_CONFIG,
                "SpecForge Eagle3TargetModel, HF backend (modeling/target/eagle3_target_model.py): "
                "output_hidden_states[id + 1] / forward hooks on layers[id], i.e. layer outputs; the final "
                "state is captured separately",
                package="specforge", default_file="specforge/algorithms/model_providers.py",
                note="SpecForge PR #239 (2025-09) shows a period when this path's middle id was N//2, i.e. "
                     "boundary N//2 + 1; state the ids your run used with --train-ids"),
    TrainerRule("specforge-sglang", None, None, "engine", lambda n: [1, n // 2 - 1, n - 4], False,
                IdsAt.EAGLE_CONFIG,
                "SpecForge SGLang backend (offline_capture/sglang_backend/capture.py, 0.2.0) "
                "calls the target's "
                "set_eagle3_layers_to_capture: the boundaries are whatever that SGLang release captures",
                package="specforge", default_file="specforge/algorithms/model_providers.py",
                note="the version given is the SGLang release the capture ran on"),
    TrainerRule("eagle", None, None, "fixed", _half, False, IdsAt.NONE,
                "EAGLE reference eagle/model/modeling_llama_kv.py and traineagle3/modeling_llama_kv.py: "
                "`if idx == len(self.layers) - 3 or idx == len(self.layers) // 2 or idx == 2` "
                "before the layer",
                note="the three boundaries are hard-coded; ids cannot be chosen"),
    TrainerRule("modelopt", None, None, "output",
                lambda n: sorted({1, max(0, n // 2 - 1), max(0, n - 4)}), False, IdsAt.EAGLE_CONFIG,
                "NVIDIA Model Optimizer (nvidia-modelopt 0.47.0) "
                "modelopt/torch/speculative/plugins/hf_eagle.py: "
                "forward hooks on base_model.layers[idx] for idx in eagle_aux_hidden_state_layer_ids "
                "(the output of layer idx), registered in layer order; default_eagle_aux_layer_ids; "
                "export/plugins/hf_spec_configs.py writes the ids unchanged under eagle_config",
                package="nvidia-modelopt", folder="modelopt/",
                default_file="modelopt/torch/speculative/plugins/hf_eagle.py",
                default_fn="default_eagle_aux_layer_ids", ascending=True, read_version="0.47.0",
                note="ModelOpt's hooks append in layer order, so the fc slots are ascending whatever "
                     "order the ids are written in; an id outside 0..N-1 gets no hook and the fc sees "
                     "fewer states"),
    TrainerRule("torchspec", None, None, "output", lambda n: [1, n // 2 - 1, n - 4], False,
                IdsAt.EAGLE_CONFIG,
                "TorchSpec (lightseekorg/TorchSpec @ 6f21829c, version.txt 0.1.0): "
                "torchspec/models/target/eagle3_target_model.py hooks layers[idx] (layer outputs), "
                "concatenated in id order; inference/engine/vllm_engine.py shifts each id +1 for vLLM's "
                "capture ('post-layer semantics'); utils/misc.py get_default_eagle3_aux_layer_ids; "
                "tools/convert_to_hf.py writes the training ids under eagle_config"),
    TrainerRule("torchspec-vllm", None, None, "output", lambda n: [1, n // 2 - 1, n - 4], False,
                IdsAt.EAGLE_CONFIG,
                "TorchSpec (lightseekorg/TorchSpec @ 6f21829c) tools/convert_to_hf.py --export-for-vllm: "
                "_fixup_export_config adds 1 to every id (top-level and eagle_config) when the draft's "
                "model_type is kimi_k2, so the exported ids are vLLM boundaries; training is as `torchspec`",
                export_offset=1, export_model_type="kimi_k2",
                note="for kimi_k2 drafts the config's ids are the training ids + 1 (boundaries); "
                     "for other model types the export leaves them as trained"),
    TrainerRule("trtllm", None, None, "output", lambda n: [1, n // 2 - 1, n - 4], False, IdsAt.NONE,
                "TensorRT-LLM _torch/speculative/eagle3.py (_get_eagle3_default_capture_layers), "
                "save_hidden_state.py (SaveHiddenStates adds -1, 'always the last post norm state'); "
                "layers call maybe_capture_hidden_states after their MLP",
                note="-1 is the final state after the norm: a verifier state, not a boundary",
                minus_one="post-norm"),
)


@dataclass
class TrainerResult:
    """What a trainer captured, and the layout the draft's fc was trained on."""

    trainer: str
    version: str | None
    num_layers: int
    rule: str
    ids: list[int] | None               # in the trainer's own numbering
    ids_source: IdsAt                   # EXPLICIT or NONE (the trainer's default)
    captured: list                      # boundaries (ints) in capture order, or POST_NORM
    training_layout: Layout | None      # what the fc slots saw, in order; None when no boundary fits
    writes_ids: IdsAt
    read_from: str
    written_ids: list[int] | None = None   # what it writes into the draft config (at writes_ids), if anything
    source_lines: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return layout_label(self.training_layout, self.num_layers) if self.training_layout else "(none)"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["training_layout"] = list(self.training_layout) if self.training_layout else None
        d["ids_source"], d["writes_ids"] = str(self.ids_source), str(self.writes_ids)
        d["label"] = self.label
        return d


def parse_trainer(spec: str) -> tuple[str, str | None]:
    """'speculators==0.4.0' -> ('speculators', '0.4.0'); names as in TRAINERS."""
    name, _, version = str(spec).strip().lower().partition("==")
    name, version = name.strip(), version.strip() or None
    known = sorted({r.name for r in TRAINERS})
    if name not in known:
        raise BadOption(f"unknown trainer {spec!r}; expected one of {', '.join(known)} "
                        f"(optionally ==VERSION)")
    if name.startswith("speculators") and version is None:
        raise BadOption("speculators changed its numbering at 0.5.0 "
                        "(layer outputs before, vLLM boundaries after): "
                        "name the release, e.g. speculators==0.4.0")
    if name == "specforge-sglang" and version is None:
        raise BadOption("specforge-sglang captures through SGLang's setter: "
                        "give the SGLang release it ran on, "
                        "e.g. specforge-sglang==0.5.9")
    return name, version


# Which trainers export which draft config format, keyed by where the config keeps its ids: the
# candidates ``check`` lists when no trainer is named (docs/conventions.md, "Trainers").
SPECULATORS_WRITERS = {IdsAt.NONE: ("speculators==0.4.0",), IdsAt.TOP_LEVEL: ("speculators==0.9.0",),
                       IdsAt.EAGLE_CONFIG: ()}
SGLANG_FORMAT_WRITERS = {IdsAt.EAGLE_CONFIG: ("specforge-hf", "specforge-sglang", "torchspec",
                                              "torchspec-vllm", "modelopt"),
                         IdsAt.TOP_LEVEL: ("speculators==0.9.0",),
                         # SpecForge and TorchSpec ship draft configs with no ids (SpecForge configs/*.json,
                         # TorchSpec configs/draft_models/) and then train on their defaults
                         IdsAt.NONE: ("specforge-hf", "specforge-sglang", "torchspec", "eagle", "trtllm")}


def writers_of(cfg: dict, sglang_version: str | None = None) -> list[str]:
    """Trainer specs that write a draft config of this format with its ids where this one has them.
    SpecForge's SGLang backend is listed at ``sglang_version`` (the release it would have captured
    on, taken to be the one named) and only then; TorchSpec's vLLM export only for kimi_k2 drafts,
    the one model type it rewrites."""
    _, where = ids_in_config(cfg)
    if is_eagle_reference_config(cfg):
        return ["eagle"]                 # its own one-layer LlamaForCausalLM config: nobody else writes it
    table = SPECULATORS_WRITERS if is_speculators_format(cfg) else SGLANG_FORMAT_WRITERS
    specs = list(table[where])
    made_by = cfg.get("speculators_version") if is_speculators_format(cfg) else None
    if isinstance(made_by, str) and is_version_string(made_by):
        # the release that wrote this file: one that only converts (0.1-0.2) took the weights from the
        # EAGLE reference code (its convert/eagle3 source), whose boundaries are fixed
        rule = rule_for("speculators", made_by)
        if rule.meaning == "none":
            specs = [f"speculators=={made_by}"] + (["eagle"] if where == IdsAt.NONE else [])
        elif rule.writes_ids == where:
            specs = [f"speculators=={made_by}"]
    out = []
    for spec in specs:
        if spec == "specforge-sglang":
            if sglang_version:
                out.append(f"specforge-sglang=={sglang_version}")
            continue
        rule = rule_for(*parse_trainer(spec)) if "==" in spec else next(r for r in TRAINERS if r.name == spec)
        if rule.export_offset and not rule.exports_with_offset(cfg.get("model_type")):
            continue
        out.append(spec)
    return out


def training_ids_from_config(spec: str, ids: Sequence[int], model_type: str | None) -> list[int]:
    """The ids the trainer ran with, from those its exporter wrote (TorchSpec's vLLM export adds 1)."""
    rule = rule_for(*parse_trainer(spec))
    shift = rule.export_offset if rule.exports_with_offset(model_type) else 0
    return [i - shift for i in ids]


def rule_for(name: str, version: str | None) -> TrainerRule:
    for rule in TRAINERS:
        if rule.name == name and rule.holds_for(version):
            return rule
    raise BadOption(f"no {name} rule covers release {version}")


def trainer_layout(spec: str, num_layers: int, train_ids: Sequence[int] | None = None, *,
                   arch: str | None = None, read_source: bool = True,
                   model_type: str | None = None) -> TrainerResult:
    """The boundaries ``spec``'s data generation captured for ``train_ids`` (or its defaults).
    ``model_type`` is the draft config's, for exporters whose rewrite depends on it (TorchSpec)."""
    name, version = parse_trainer(spec)
    n = check_num_layers(num_layers)
    rule = rule_for(name, version)
    if rule.meaning == "none":
        raise BadOption(f"{name} {version}: {rule.read_from}; {rule.note}")
    if rule.meaning == "fixed" and train_ids is not None:
        raise BadOption(f"{name} captures fixed boundaries {tuple(_half(n))} ({rule.note}); drop --train-ids")
    out = TrainerResult(name, version, n, f"{rule.name} {rule.versions}: {rule.meaning}", None,
                        IdsAt.NONE, [], None, rule.writes_ids, rule.read_from)
    default = rule.default(n)
    if read_source and rule.package:
        own = (version if version is not None and name != "specforge-sglang"
               else rule.read_version or SPECFORGE_READ)
        default = _confirm_from_source(rule, own, n, default, out)
    ids = list(train_ids) if train_ids is not None else default
    if rule.writes_ids != IdsAt.NONE:
        shift = rule.export_offset if rule.exports_with_offset(model_type) else 0
        out.written_ids = [i + shift for i in ids]
    if rule.appends_final and (not ids or ids[-1] != n):
        ids = ids + [n]
    out.ids, out.ids_source = ids, (IdsAt.EXPLICIT if train_ids is not None else IdsAt.NONE)
    out.captured = _captured(rule, ids, n, arch, version, out)
    slots = out.captured[:-1] if rule.drops_last else list(out.captured)
    if rule.drops_last and out.captured:
        out.warnings.append(f"the last captured state ({_name(out.captured[-1], n)}) "
                            f"is the verifier's target, not an fc slot")
    if POST_NORM in slots:
        out.errors.append("a slot was trained on the final state after the norm (TRT-LLM's -1): "
                          "no engine serves "
                          "that state as a feature, so the draft must be retrained on boundaries")
    if slots and POST_NORM not in slots:
        out.training_layout = tuple(slots)
    if rule.note:
        out.warnings.append(rule.note)
    return out


def _name(state, n: int) -> str:
    return "the post-norm final state" if state == POST_NORM else f"boundary {state}"


def _captured(rule: TrainerRule, ids: list[int], n: int, arch: str | None, version: str | None,
              out: TrainerResult) -> list:
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            raise WiringError(f"trainer ids must be integers, got {i!r}")
    if rule.meaning == "fixed":
        return _half(n)
    if rule.meaning == "boundary":
        bad = [i for i in ids if not 0 <= i <= n]
        if bad:
            raise WiringError(f"{rule.name} ids are boundaries 0..{n} (vLLM numbering); {bad} is outside")
        return list(ids)
    if rule.meaning == "output":
        low = -1 if rule.minus_one else 0
        bad = [i for i in ids if not low <= i <= n - 1]
        if bad:
            raise WiringError(f"{rule.name} ids name layer outputs {low}..{n - 1} for {n} layers; "
                              f"{bad} is outside")
        if rule.minus_one == "post-norm":
            return [POST_NORM if i == -1 else b for i, b in zip(ids, layer_outputs_to_boundaries(ids))]
        # speculators' -1 (a patched pipeline's name for the embedding) lands on boundary 0
        found = list(layer_outputs_to_boundaries(ids))
        return sorted(set(found)) if rule.ascending else found
    # "engine": SpecForge's SGLang backend hands the ids to that SGLang release's own setter
    if not arch:
        raise BadOption("specforge-sglang captures through SGLang's setter, which depends on the target "
                        "architecture: give --arch (or --target DIR)")
    r = resolve(Engine("sglang", version), arch, n, ids=ids)
    out.source_lines += r.source_lines
    out.errors += [f"SGLang {version} during capture: {e}" for e in r.errors]
    return list(r.served_layout)


_PRE_RELEASE = re.compile(r"^(\d+(?:\.\d+)*)(?:[.-]?(?:dev|a|b|rc|alpha|beta|pre)\d*)+$")


def _fetch_release(rule: TrainerRule, version: str | None, out: TrainerResult) -> Path:
    """The trainer's source at ``version``; a development or pre-release build that the index does not
    carry (``0.8.0.dev0``, written by a trainer run from a git checkout) is read at the release it led to,
    said as a warning, since that is the nearest code anyone can fetch."""
    folders = [rule.folder or rule.package + "/"]
    try:
        return fetch(rule.package, version, folders)
    except UnknownPackageVersion:
        m = _PRE_RELEASE.match(version or "")
        if not m:
            raise
        root = fetch(rule.package, m.group(1), folders)
        out.warnings.append(f"{rule.package} {version} is a development build the package index does not "
                            f"carry; its rule is read from {m.group(1)}, the release it led to")
        return root


def _confirm_from_source(rule: TrainerRule, version: str | None, n: int, documented: list[int],
                         out: TrainerResult) -> list[int]:
    """The release's own default ids (and, where the rule says where, its capture position), or the
    documented ones with a warning when the wheel cannot be fetched."""
    try:
        root = _fetch_release(rule, version, out)
    except UnknownPackageVersion:
        raise
    except (PackageSourceError, CacheError, OSError) as exc:
        out.warnings.append(warn_once(f"{rule.package} {version}: source could not be read "
                                      f"({one_line(exc)[:200]}); "
                                      f"the documented rule is used"))
        return documented
    if rule.default_fn:
        found = default_ids_from_function(root / rule.default_file, rule.default_fn, n)
    else:
        found = default_ids_in(root / rule.default_file, n) if rule.default_file else None
    if found is None:
        out.warnings.append(f"{rule.package} {version}: no default id list found in {rule.default_file}; the "
                            f"documented default {documented} is used")
        return documented
    ids, line, text = found
    out.source_lines.append({"file": rule.default_file, "line": line, "text": text})
    out.read_from = f"{rule.package} {version} wheel: {rule.read_from}"
    if rule.capture_file:
        after = capture_after_layer(root / rule.capture_file)
        if after is not None:
            where, line, text = after
            out.source_lines.append({"file": rule.capture_file, "line": line, "text": text})
            if where != "after":
                out.errors.append(f"{rule.package} {version} captures {where} the layer runs "
                                  f"({rule.capture_file}:{line}), not after as this rule says: "
                                  f"the ids would name "
                                  f"boundaries, not layer outputs")
    return ids


def default_ids_in(path: Path, n: int) -> tuple[list[int], int, str] | None:
    """The list literal in ``path`` that builds default ids from the layer count, evaluated for ``n``."""
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.List) or not node.elts:
            continue
        names = {x.id for e in node.elts for x in ast.walk(e) if isinstance(x, ast.Name)}
        halves = any(isinstance(x, ast.BinOp) and isinstance(x.op, ast.FloorDiv) for x in ast.walk(node))
        if len(names) != 1 or not halves:
            continue
        try:
            value = eval(compile(ast.Expression(node), str(path), "eval"), {"__builtins__": {}},
                         {names.pop(): n})
        except Exception:
            continue
        if isinstance(value, list) and all(isinstance(v, int) for v in value):
            return value, node.lineno, lines[node.lineno - 1].strip()
    return None


_SAFE_BUILTINS = {"sorted": sorted, "max": max, "min": min, "list": list, "set": set, "range": range,
                  "len": len, "int": int}


def default_ids_from_function(path: Path, name: str, n: int) -> tuple[list[int], int, str] | None:
    """``name(n)`` as the release defines it: the function alone, compiled with a few pure builtins
    (ModelOpt's default is ``sorted({1, max(0, n // 2 - 1), max(0, n - 4)})``, which no list literal
    shows)."""
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    fn = next((f for f in ast.walk(ast.parse(text))
               if isinstance(f, ast.FunctionDef) and f.name == name), None)
    if fn is None:
        return None
    fn.decorator_list, fn.returns = [], None
    for a in fn.args.args:
        a.annotation = None
    scope: dict = {}
    try:
        exec(compile(ast.Module([fn], []), str(path), "exec"), {"__builtins__": _SAFE_BUILTINS}, scope)
        value = scope[name](n)
    except Exception:
        return None
    if not (isinstance(value, list) and all(isinstance(v, int) for v in value)):
        return None
    ret = next((r for r in ast.walk(fn) if isinstance(r, ast.Return)), fn)
    return value, ret.lineno, lines[ret.lineno - 1].strip()


def capture_after_layer(path: Path) -> tuple[str, int, str] | None:
    """Whether the decoder loop in ``path`` appends the aux state after or before calling the layer."""
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    for loop in ast.walk(ast.parse(text)):
        if not isinstance(loop, ast.For):
            continue
        calls = [c.lineno for c in ast.walk(loop) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                 and c.func.id == "layer"]
        appends = [c.lineno for c in ast.walk(loop) if isinstance(c, ast.Call)
                   and isinstance(c.func, ast.Attribute) and c.func.attr == "append"
                   and "aux" in ast.unparse(c.func.value)]
        if calls and appends:
            where = "after" if appends[0] > calls[0] else "before"
            return where, appends[0], lines[appends[0] - 1].strip()
    return None
