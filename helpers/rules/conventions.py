"""What every engine shares: the engine as one value (``Engine``, ``parse_engine``), reading a draft's and a
target's config, where a config keeps its ids, and the id <-> boundary arithmetic.

A wiring bug is two conventions disagreeing, so each convention is written down exactly once. The rules
that differ by engine live in one room per engine on the same plan: ``engines.sglang`` (run from each
release's own source, never restated; ``engines.sglang.rule`` holds what surrounds that step),
``engines.vllm.rule``, ``engines.trtllm.rule`` and ``engines.llamacpp.rule`` (recorded per release, each with
a ``source`` reader where its files can be fetched); forward flags in ``rules.flags``; trainers in
``rules.trainers``. ``engine.rules`` (``rules.families``) says which applies. ``docs/conventions.md`` says
where and at which release each rule was read.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Sequence

from packaging.version import InvalidVersion, Version

from ..boundaries import Layout, Problem, ProblemKind, WiringError
from ..errors import BadConfig, BadOption, check_architectures, read_json_file

K = ProblemKind

IDS_KEY = "eagle_aux_hidden_state_layer_ids"
ENGINES = ("sglang", "vllm", "trtllm", "llamacpp", "lmdeploy")
SGLANG_DRAFT_ARCH = "LlamaForCausalLMEagle3"
SPECULATORS_ARCH = "Eagle3Speculator"
# MLA drafts (Kimi-K2.x): SGLang kimi_k25_eagle3.py, vLLM deepseek_eagle3.py (V3 is vLLM's alias).
MLA_DRAFT_ARCH = "Eagle3DeepseekV2ForCausalLM"
MLA_DRAFT_ARCHS = (MLA_DRAFT_ARCH, "Eagle3DeepseekV3ForCausalLM")

_VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?$")


class IdsAt(StrEnum):
    """Where a draft's layer ids came from; one spelling for configs, engines and reports."""

    EAGLE_CONFIG = "eagle_config"   # nested: {"eagle_config": {IDS_KEY: [...]}} (SGLang/SpecForge)
    TOP_LEVEL = "top-level"         # {IDS_KEY: [...]} (speculators, vLLM)
    NONE = "none"                   # the config holds none: the engine uses its defaults
    EXPLICIT = "explicit"           # given on the command line or by a notebook


class DraftConfigError(BadConfig):
    """A draft config.json that is missing, unreadable or not an EAGLE-3 draft's."""


class TargetConfigError(BadConfig):
    """A target config.json that is missing, unreadable, an EAGLE-3 draft's, or without its depth."""


# Keys a multimodal wrapper keeps under text_config / language_config and the workbook needs on top.
TEXT_KEYS = ("num_hidden_layers", "hidden_size", "vocab_size", "rms_norm_eps", "architectures", "model_type",
             "tie_word_embeddings")


# --------------------------------------------------------------------------------------
# Engines and versions.


def is_version_string(version: str) -> bool:
    """A plain release number (PEP 440 without epoch or local part), safe to hand to pip or use as a
    folder name."""
    if not isinstance(version, str) or not _VERSION_RE.match(version):
        return False
    try:
        Version(version)
    except InvalidVersion:
        return False
    return True


def is_final_release(version: str) -> bool:
    """A release number that is neither a pre-release (a, b, rc) nor a dev build: what an index's list
    of releases is filtered to. ``0.5.13.post1`` is final (a post-release of a final one)."""
    if not is_version_string(version):
        return False
    v = Version(version)
    return not (v.is_prerelease or v.is_devrelease)


@dataclass(frozen=True)
class Engine:
    """An engine named once, at the edge (a CLI flag, a notebook parameter), and passed down typed.

    ``name`` and ``version`` say whose rules decide what "served" means; ``runner`` is vLLM's model
    runner when the user pins it ('v1' or 'v2'; None: the release's default for the architecture);
    ``live`` marks an engine that actually runs (``bench``/``capture --backend``), not only its rules,
    and ``runtime`` the release that runs then (None: only the rules are consulted). ``rules`` is the
    family's rule object (``helpers.rules.families``): code below the edge asks it, never the name.
    """

    name: str
    version: str | None = None
    runner: str | None = None
    live: bool = False
    runtime: str | None = field(default=None, compare=False)

    def __str__(self) -> str:
        text = f"{self.name}=={self.version}" if self.version else self.name
        return f"{text}:{self.runner}" if self.runner else text

    def at(self, version: str | None) -> "Engine":
        """The same engine at another release (a live backend reports the one it runs)."""
        return Engine(self.name, version, self.runner, self.live, self.runtime)

    @property
    def rules(self):
        """The family's rule object (``helpers.rules.families.EngineRules``): what it reads and serves."""
        return rules_of(self.name)

    @property
    def effective_version(self) -> str | None:
        """The release whose rules apply: the one named, else the newest read (``rules.assumed`` says so)."""
        return self.rules.effective_version(self.version)


# The original case's release. Only the embedded pair (data/tiny-kimi) replays it: the notebooks'
# ENGINE_VERSION default and the main job on that pair (0.5.9's capture rule inside the installed
# runtime: helpers/live/backends.py), each naming it as the case replay. Never a user's default.
# Typed like every engine below the edge; ``str()`` gives the text a parameter carries.
CASE_ENGINE = Engine("sglang", "0.5.9")
# What a static question (check, diagnose, wiring, bench on the reference engine) assumes when no --engine
# is given, said in the first line of its output (``assumed_engine_line``): the newest release the workbook
# has read of SGLang, the original case's engine family (tests/test_engine_defaults.py keeps it the newest
# read). A live run defaults to the installed engine's own release instead (live.backends.choose).
DEFAULT_ENGINE = Engine("sglang", "0.5.23")
# Before and after SGLang changed its DeepSeek rule, and the other engine: the comparison table.
DEFAULT_ENGINES = (CASE_ENGINE, DEFAULT_ENGINE, Engine("vllm"))


_FAMILIES: dict[str, Any] = {}    # family name -> its rule object, registered by helpers.rules.families
FAMILIES_MODULE = "helpers.rules.families"   # where the rule objects live: loaded by name on first use


def register_rules(families: dict[str, Any]) -> None:
    """``helpers.rules.families`` hands each family's rule object here when it loads, so this module, below
    every engine room, never imports the rooms: the rule objects reach ``Engine.rules`` by registration."""
    _FAMILIES.update(families)


def rules_of(name: str):
    """The rule object of the family ``name`` (one of ENGINES). The first call loads ``FAMILIES_MODULE`` by
    name, as an engine loads a plugin from its entry point, which registers every family."""
    if not _FAMILIES:
        importlib.import_module(FAMILIES_MODULE)
    return _FAMILIES[name]


RUNNERS = ("v1", "v2")


def parse_engine(engine: "str | Engine") -> Engine:
    """'sglang==0.5.9' -> Engine('sglang', '0.5.9'); 'vllm' -> Engine('vllm'); 'vllm==0.32.0:v1' pins
    vLLM's model runner. An Engine passes through unchanged, so a value parsed at the edge is never
    parsed again."""
    if isinstance(engine, Engine):
        return engine
    text = str(engine).strip().lower()
    text, _, runner = text.partition(":")
    name, _, version = text.partition("==")
    name, version, runner = name.strip(), version.strip(), runner.strip()
    if name not in ENGINES:
        raise BadOption(f"unknown engine '{engine}'; expected 'sglang==VERSION', 'sglang', "
                        f"'vllm[==VERSION]', 'trtllm', 'llamacpp[==BUILD]' or "
                        f"'lmdeploy[==VERSION][:turbomind]'")
    rules = rules_of(name)
    if "==" in text:
        rules.check_version(str(engine), version)
    if runner and not rules.runners:
        raise BadOption(f"engine '{engine}': ':{runner}' names a model runner; only vLLM has them "
                        f"(expected vllm[==VERSION]:v1 or :v2; LMDeploy names a backend, "
                        f"lmdeploy[==VERSION]:turbomind)")
    if runner and runner not in rules.runners:
        raise BadOption(f"engine '{engine}': {rules.title} has no model runner ':{runner}' (expected "
                        f"{name}[==VERSION]:" + " or :".join(rules.runners) + ")")
    return Engine(name, version or None, runner or None)


def expect_engine(engine: Engine) -> Engine:
    """``engine`` as given, when it is an Engine: below the edge nothing parses text again, so text that
    reached a library function is the caller's slip (parse it where it entered: ``parse_engine``)."""
    if not isinstance(engine, Engine):
        raise TypeError(f"expected an Engine (parsed once at the edge with parse_engine), got "
                        f"{type(engine).__name__} {engine!r}")
    return engine


def assumed_engine_line(engine: "str | Engine") -> str:
    """The first line of a result whose engine was not named: the release assumed, and how to name yours."""
    return f"assumed engine {engine} (no --engine given; pass --engine NAME==VERSION for yours)"


def version_key(version: str) -> Version:
    """A release number in PEP 440 order (``packaging.version.Version``), to compare with ``<``/``>=`` or
    sort by: ``0.34.0rc1 < 0.34.0``, ``0.33.1.dev12 < 0.33.1``, ``0.5.13 < 0.5.13.post1``. A string that
    is not a version raises ``packaging.version.InvalidVersion`` (a ValueError): versions are checked at
    the edge (``is_version_string``), so none should reach here. A llama.cpp build (``b11434``) compares
    as its number, as the builds are numbered."""
    m = re.fullmatch(r"b(\d+)", version)
    return Version(m.group(1) if m else version)


# --------------------------------------------------------------------------------------
# Reading a draft config, and where its ids sit.


def read_draft_config(draft: str | Path | dict) -> dict:
    """A draft's config.json as a dict, from a dict, a checkpoint folder or the file itself."""
    if isinstance(draft, dict):
        return draft
    path = Path(draft).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise DraftConfigError(f"no draft at {draft}: the folder has no config.json (expected beside "
                                   f"model.safetensors, model.safetensors.index.json or pytorch_model.bin)")
    elif not path.is_file():
        raise DraftConfigError(f"draft {draft} not found (expected a checkpoint folder or its config.json)")
    try:
        cfg = read_json_file(path, "draft config")
    except BadConfig as exc:
        raise DraftConfigError(str(exc)) from None
    if not isinstance(cfg, dict):
        raise DraftConfigError(f"{path} holds a JSON {type(cfg).__name__}; "
                               f"expected an object (a draft config)")
    try:
        check_architectures(cfg, path)
    except BadConfig as exc:
        raise DraftConfigError(str(exc)) from None
    nested = cfg.get("eagle_config")
    if nested is not None and not isinstance(nested, dict):
        raise DraftConfigError(f"{path}: eagle_config is a JSON {type(nested).__name__} ({str(nested)[:60]});"
                               f" "
                               f"expected an object like {{\"{IDS_KEY}\": [2, 6, 9]}} (SGLang reads its keys "
                               f"and would fail to load this draft)")
    archs = list(architectures(cfg))
    if archs and not is_draft_config(cfg) and "eagle_config" not in cfg:
        layers = cfg.get("num_hidden_layers")
        head = (isinstance(layers, int) and layers <= 2) or any(k in a for a in archs for k in OTHER_DRAFTERS)
        hint = ("another kind of draft head? The workbook checks EAGLE-3 heads: LlamaForCausalLMEagle3, "
                "Eagle3DeepseekV2ForCausalLM, speculators eagle3, or the EAGLE reference code's "
                "LlamaForCausalLM with a draft_vocab_size" if head else "are --target and --draft swapped?")
        raise DraftConfigError(f"draft config {path} is a {', '.join(archs)} model, not an EAGLE-3 draft: "
                               f"{hint}")
    try:
        ids_in_config(cfg)     # ids that are not distinct integers: refused here, with the file named
        if nested is not None and cfg.get(IDS_KEY) is not None:
            _ids(cfg[IDS_KEY], "top-level ")
    except DraftConfigError as exc:
        raise DraftConfigError(f"{path}: {exc}") from None
    return cfg


def is_eagle_reference_config(cfg: dict) -> bool:
    """The EAGLE reference code's own head (eagle/traineagle3/config.json, the yuhuili/EAGLE3-* heads):
    a plain ``LlamaForCausalLM`` config with a ``draft_vocab_size`` (no model's own config has one) and
    no eagle_config; its ``num_hidden_layers`` is 1 as written, but tools copy the target's there.
    Only vLLM turns that class into its EAGLE-3 head (docs/conventions.md, "Draft formats")."""
    archs = list(architectures(cfg))
    return (bool(archs) and "eagle_config" not in cfg and not cfg.get("speculators_model_type")
            and not _names_a_draft(archs)
            and all(a.endswith("ForCausalLM") and not any(k in a for k in OTHER_DRAFTERS) for a in archs)
            and type(cfg.get("draft_vocab_size")) is int)


# Class-name parts of other drafters' heads, which are not EAGLE-3 drafts whatever keys they carry.
OTHER_DRAFTERS = ("Draft", "MTP", "Medusa", "DFlash", "NextN")


def is_draft_config(cfg: dict) -> bool:
    archs = list(architectures(cfg))
    return bool(cfg.get("speculators_model_type")) or is_eagle_reference_config(cfg) or _names_a_draft(archs)


def _names_a_draft(archs: Sequence[str]) -> bool:
    return any("eagle" in a.lower() or "speculator" in a.lower() for a in archs)


def architectures(cfg: dict) -> tuple[str, ...]:
    """The class names a config declares: the one read of ``architectures`` (``check_architectures``
    already refused anything but a list of names when the file was read). Empty when it names none."""
    return tuple(str(a) for a in cfg.get("architectures") or ())


# The keys of a multi-head latent attention target (DeepSeek-V2/V3, Kimi-K2.x).
MLA_KEYS = ("kv_lora_rank", "qk_rope_head_dim")


@dataclass(frozen=True)
class TargetSpec:
    """A target's config.json, read once at the edge into what every reader below it asks for.

    ``arch`` is the first declared class, or None when the config names none: the one fallback, so a
    reader that needs a class says so instead of inventing "" or "?". ``config`` keeps the whole file
    (text_config numbers lifted to the top) for the rules that read a key of their own (SGLang's setter
    runs on it, vLLM's fixes read the MLA keys)."""

    where: Path
    config: dict
    arch: str | None
    num_layers: int
    hidden_size: int | None
    vocab_size: int | None
    mla: bool

    @classmethod
    def of(cls, cfg: dict, where: str | Path) -> "TargetSpec":
        """From a config already read by ``read_target_config`` (its checks done)."""
        def number(key):
            v = cfg.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) else None
        return cls(Path(where), cfg, next(iter(architectures(cfg)), None), cfg["num_hidden_layers"],
                   number("hidden_size"), number("vocab_size"), all(cfg.get(k) is not None for k in MLA_KEYS))

    @property
    def architectures(self) -> tuple[str, ...]:
        return architectures(self.config)


def read_target(path: str | Path, require: Sequence[str] = ("num_hidden_layers",)) -> TargetSpec:
    """A target folder (or its config.json) -> its ``TargetSpec``; every bad file is a one-line
    ``TargetConfigError`` (``read_target_config``)."""
    need = tuple(dict.fromkeys(("num_hidden_layers", *require)))
    return TargetSpec.of(read_target_config(path, need), path)


def read_target_config(path: str | Path, require: Sequence[str] = ("num_hidden_layers",)) -> dict:
    """A target's config.json (a folder or the file), with a multimodal wrapper's language-model
    numbers lifted to the top, so every reader sees ``num_hidden_layers`` in one place."""
    path = Path(path).expanduser()
    f = path / "config.json" if path.is_dir() else path
    if not f.is_file():
        raise TargetConfigError(f"no target config at {f}: "
                                f"expected a Hugging Face directory with config.json")
    try:
        cfg = read_json_file(f, "target config")
    except BadConfig as exc:
        raise TargetConfigError(str(exc)) from None
    if not isinstance(cfg, dict):
        raise TargetConfigError(f"{f} holds a JSON {type(cfg).__name__}; expected a model config object")
    try:
        check_architectures(cfg, f)
    except BadConfig as exc:
        raise TargetConfigError(str(exc)) from None
    if is_draft_config(cfg):
        what = ", ".join(architectures(cfg)) or cfg.get("speculators_model_type")
        raise TargetConfigError(f"target {path} is an EAGLE-3 draft ({what}), not a target model: "
                                f"are --target and --draft swapped?")
    text = cfg.get("text_config") or cfg.get("language_config") or {}
    out = dict(cfg)
    for k in TEXT_KEYS:
        if k not in out and k in text:
            out[k] = text[k]
    for k in require:
        if not isinstance(out.get(k), int) or isinstance(out.get(k), bool):
            raise TargetConfigError(f"{f} has no integer {k} (also looked in text_config); "
                                    f"got {out.get(k)!r}")
    return out


def _ids(value: Any, where: str) -> list[int]:
    """Integers as written (their range is the target's to judge, in ``check_ids``): no engine turns
    "2" into 2, so a config that needs that coercion would not serve what it seems to say."""
    if (not isinstance(value, (list, tuple))
            or any(isinstance(i, bool) or not isinstance(i, int) for i in value)):
        raise DraftConfigError(f"{where}{IDS_KEY} is {value!r}; expected a list of integer layer ids")
    repeated = sorted({i for i in value if list(value).count(i) > 1})
    if repeated:
        # an engine would capture one layer twice (or refuse at start): no layout to judge
        raise DraftConfigError(f"{where}{IDS_KEY} {list(value)} repeats {repeated}; expected distinct layer "
                               f"ids, one per fc slot")
    return list(value)


def ids_in_config(cfg: dict) -> tuple[list[int] | None, IdsAt]:
    """The ids a config file carries and where, nested first: what the file says, before any engine."""
    nested = cfg.get("eagle_config")
    if isinstance(nested, dict) and nested.get(IDS_KEY) is not None:
        return _ids(nested[IDS_KEY], "eagle_config."), IdsAt.EAGLE_CONFIG
    if cfg.get(IDS_KEY) is not None:
        return _ids(cfg[IDS_KEY], "top-level "), IdsAt.TOP_LEVEL
    return None, IdsAt.NONE


@dataclass
class DraftIds:
    """The ids an engine will pass on, where it found them, and what it silently ignored."""

    ids: list[int] | None
    source: IdsAt
    problems: list[Problem] = field(default_factory=list)   # advisory: IDS_IGNORED, IDS_READ, DRAFT_FORMAT
    lines: list = field(default_factory=list)   # cited engine source lines, when read from source
    use_aux: bool = True

    @property
    def warnings(self) -> list[str]:
        return [str(p) for p in self.problems]


def engine_ids(cfg: dict, engine: Engine, *, sglang_reads_top_level: bool = False,
               arch: str = "") -> DraftIds:
    """The ids ``engine`` reads from a draft config (its family's ``reads_ids``).

    SGLang reads only ``eagle_config``'s key (unless the version's own code, read by the
    caller, also falls back to the top level). vLLM's reading depends on the release and on
    which model runner serves ``arch`` (``vllm_reads``). A key the engine skips is a warning,
    since nothing else reports it.
    """
    return engine.rules.reads_ids(cfg, engine, arch=arch, also_top_level=sglang_reads_top_level)


def config_ids(cfg: dict) -> tuple[dict, list[int] | None, list[int] | None]:
    """(eagle_config, its ids, the top-level ids) as the config writes them."""
    nested = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), dict) else {}
    top = _ids(cfg[IDS_KEY], "top-level ") if cfg.get(IDS_KEY) is not None else None
    inner = _ids(nested[IDS_KEY], "eagle_config.") if nested.get(IDS_KEY) is not None else None
    return nested, inner, top


def check_ids(ids: Sequence[int] | None, num_layers: int, low: int = -1) -> list[int] | None:
    """Ids within ``low..L``: anything else is a typo, never a layer of this target."""
    if ids is None:
        return None
    out = []
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            raise WiringError(f"layer ids must be integers, got {i!r}")
        if not low <= i <= num_layers:
            raise WiringError(f"layer id {i} is outside {low}..{num_layers} "
                              f"for a target with {num_layers} layers")
        out.append(i)
    if not out:
        raise WiringError("the id list is empty")
    return out


def check_num_layers(num_layers: Any) -> int:
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 3:
        raise WiringError(f"num_layers must be an integer >= 3 (the default ids use L-3), got {num_layers!r}")
    return num_layers


# --------------------------------------------------------------------------------------
# Defaults and id-to-boundary rules.


def default_ids(num_layers: int) -> list[int]:
    """The ids every engine falls back to, and SpecForge writes: ``[2, L//2, L-3]``."""
    return [2, num_layers // 2, num_layers - 3]


def default_boundaries(num_layers: int) -> Layout:
    """Where vLLM (id = boundary) puts the default ids: inputs to layers 2, L//2 and L-3."""
    return tuple(default_ids(num_layers))


def layer_outputs_to_boundaries(ids: Sequence[int]) -> Layout:
    """Ids that name layer outputs (speculators <= 0.4, SpecForge, TRT-LLM): the output of layer i is
    the stream entering layer i + 1, so boundary i + 1; -1 (a pipeline's name for the embedding)
    lands on 0. The order is kept: it is the order the features were concatenated in."""
    return tuple(i + 1 for i in ids)


def engine_fc_slots(cfg: dict, engine: Engine) -> tuple[int | None, str]:
    """How many target states ``engine`` sizes the draft's ``fc`` for, and the rule it used.

    The engine builds ``fc`` from the config before loading weights, so a checkpoint whose fc is
    wider or narrower fails at load. SGLang's llama_eagle3 hard-coded 3 up to 0.5.11; from 0.5.12
    it reads ``num_aux_hidden_states``, then the nested ids' count. vLLM reads the same two keys
    (never the top-level ids: vLLM PR #54598 reports the 4-slot speculators draft that crashes).
    """
    return engine.rules.fc_slots(cfg, engine)


def fc_slots_from_config(cfg: dict) -> tuple[int, str]:
    """The fc width a release that sizes fc from the config builds (SGLang from 0.5.12, vLLM from
    VLLM_FC_FROM_CONFIG), and the key it came from."""
    nested = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), dict) else {}
    if isinstance(cfg.get("num_aux_hidden_states"), int):
        return cfg["num_aux_hidden_states"], "num_aux_hidden_states"
    if isinstance(nested.get(IDS_KEY), list):
        return len(nested[IDS_KEY]), f"the count of eagle_config.{IDS_KEY}"
    return 3, "no num_aux_hidden_states and no eagle_config ids, so 3"


# --------------------------------------------------------------------------------------
# The draft's forward as each engine runs it.


def is_speculators_format(cfg: dict) -> bool:
    archs = list(architectures(cfg))
    return bool(cfg.get("speculators_model_type")) or any("Speculator" in a for a in archs)


# --------------------------------------------------------------------------------------
# Forward flags: config booleans that change the draft's forward without changing a shape (or
# that add a small norm whose weights an engine skips when it does not build the module).


