"""vLLM's rules, read from every release's wheel: which key a release reads a draft's ids from (by
model runner), which boundaries each target class captures, which draft class it builds.

The evidence lines are in docs/conventions.md; ``engines.vllm.source`` re-reads them from a release's own
files. Ids are boundaries in every release (no +1), captured in ascending order.
"""
from __future__ import annotations

from typing import Sequence

from ...boundaries import Layout, Problem, ProblemKind, WiringError, WiringResult, error, warning
from ...rules.conventions import (
    MLA_DRAFT_ARCH,
    SGLANG_DRAFT_ARCH,
    DraftIds,
    Engine,
    IdsAt,
    architectures,
    check_ids,
    config_ids,
    default_ids,
    is_speculators_format,
    rules_of,
    version_key,
)
from .own import RunRule

K = ProblemKind


def ids_vllm_reads(cfg: dict, version: str | None, arch: str, runner: str | None) -> DraftIds:
    """The ids this vLLM release reads (``vllm_reads``: which key, by release and model runner)."""
    nested, inner, top = config_ids(cfg)
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


def vllm_ids_to_boundaries(ids: Sequence[int]) -> Layout:
    """vLLM: an id is the boundary itself (0 = embedding output), captured in ascending order."""
    return tuple(sorted(int(i) for i in ids))


# vLLM, read from every release's wheel (0.8.0 .. 0.34.0; docs/conventions.md has the evidence
# lines). Ids are boundaries in every release (no +1), captured in ascending order.
VLLM_FIRST_EAGLE3 = "0.8.5"


VLLM_NEWEST_READ = "0.34.0"      # 0.34.0: V2 only (the V1 runner deleted); llama_eagle3 flags as 0.33


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
    return first is not None and version_key(_vllm_version(version)) >= version_key(first)


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


def ids_run(run: RunRule, cfg: dict) -> DraftIds:
    """The ids the release's own function returned, and the key they sit under in the config (compared, not
    assumed: V2 also reads DFlash/DSpark keys, shifted)."""
    nested, inner, top = config_ids(cfg)
    said: list[Problem] = []
    reader = next((str(s) for s in run.sites if "layers_from_config" in s.name), "code")
    if not run.ids:
        skipped = [f"{where} {got}" for where, got in (("top-level", top), ("eagle_config", inner)) if got]
        if skipped:
            said.append(warning(K.IDS_IGNORED,
                                f"vLLM {run.version}'s {run.runner.upper()} runner ignores the draft's "
                                f"{' and '.join(skipped)} ids (its own {reader} returned none) and "
                                f"serves the target's default {list(run.default or ())}, without a warning"))
        return DraftIds(None, IdsAt.NONE, said)
    got = list(run.ids)
    if top and got == list(top):
        return DraftIds(got, IdsAt.TOP_LEVEL, said)
    if inner and got == list(inner):
        return DraftIds(got, IdsAt.EAGLE_CONFIG, said + [warning(
            K.IDS_READ, f"vLLM {run.version}'s {run.runner.upper()} runner reads eagle_config's ids here")])
    return DraftIds(got, IdsAt.EAGLE_CONFIG if nested else IdsAt.TOP_LEVEL, said + [warning(
        K.IDS_READ, f"vLLM {run.version}'s {run.runner.upper()} runner reads ids {got} from another key of "
                    f"the draft config (its own get_eagle3_aux_layers_from_config's chain)")])


def resolve_vllm(version: str | None, arch: str, num_layers: int, ids: Sequence[int] | None,
                 cfg: dict | None, runner: str | None = None, run: RunRule | None = None) -> WiringResult:
    """What a vLLM release serves: ``run``, the release's own functions run on this config
    (``engines.vllm.own``), where they could be run; else its rules as recorded from its wheels (VLLM_*
    above), and a warning says so."""
    v = _vllm_version(version)
    warnings: list[Problem] = []
    errors: list[Problem] = []
    assumed = rules_of("vllm").assumed(version)
    if assumed:
        warnings.append(warning(K.RULE_ASSUMED, assumed))
    if not at_least(v, VLLM_FIRST_EAGLE3):
        raise WiringError(f"vLLM {v} has no EAGLE-3 (it first appears in {VLLM_FIRST_EAGLE3})")
    if run is None and version_key(v) > version_key(VLLM_NEWEST_READ):
        warnings.append(warning(K.NEWER_THAN_READ, f"vLLM {v} is newer than the releases read "
                                f"({VLLM_NEWEST_READ}); their rule is assumed"))
    if run is not None:       # the label stays the engine as named; the run's runner is in its cited sites
        warnings += [warning(K.IDS_READ, n) for n in run.notes]
    if ids is not None:
        chosen = DraftIds(check_ids(ids, num_layers), IdsAt.EXPLICIT)
    elif cfg is not None and run is not None:
        chosen = ids_run(run, cfg)
        chosen.ids = check_ids(chosen.ids, num_layers)
    elif cfg is not None:
        chosen = ids_vllm_reads(cfg, v, arch, runner)
        chosen.ids = check_ids(chosen.ids, num_layers)
    else:
        chosen = DraftIds(None, IdsAt.NONE)
    warnings += chosen.problems
    if run is not None and not run.uses_aux:
        site = next((s for s in run.sites if "aux" in s.name and "layers" not in s.name), None)
        errors.append(error(K.AUX_OFF,
                            f"vLLM {v} captures no aux hidden states for this draft (eagle_config."
                            f"use_aux_hidden_state is false; {site or 'its own switch'}): the draft is fed "
                            f"the target's last hidden state alone, never the layout its fc was trained on",
                            fix="remove eagle_config.use_aux_hidden_state (or set it true) when the draft "
                                "was trained on aux hidden states"))
        return WiringResult(engine=str(Engine("vllm", version, runner)), version=version, arch=arch,
                            num_layers=num_layers, served_layout=(), layers_to_capture=[],
                            ids_used=chosen.ids, ids_source=chosen.source, problems=errors + warnings,
                            source_lines=run.cited())
    fallback = list(run.default) if run is not None and run.default else default_ids(num_layers)
    used = chosen.ids if chosen.ids is not None else fallback
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
    if run is None and ids is None and cfg is not None:     # the recorded rule chose the ids
        warnings.append(warning(K.RULE_NOT_RUN, f"vLLM {v}'s own code was not run here: the recorded rule "
                                f"(a cache of what its code did when read) is applied"))
    return WiringResult(engine=str(Engine("vllm", version, runner)), version=version, arch=arch,
                        num_layers=num_layers, served_layout=tuple(sorted(captured)),
                        layers_to_capture=sorted(used), ids_used=chosen.ids, ids_source=chosen.source,
                        problems=errors + warnings, source_lines=run.cited() if run is not None else [])


# vLLM maps a speculators-format config onto its own (speculators/algos.py); a flag it does not copy
# is lost whatever the model file reads.
VLLM_SPECULATORS_PASSES = {"norm_before_residual": "0.10.1", "norm_before_fc": "0.19.0",
                           "fc_norm": "0.25.0", "norm_output": "0.25.0"}


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


def vllm_draft_class(version: str | None, cfg: dict) -> tuple[bool | None, str]:
    """Whether this vLLM release builds a draft class for the config at all (None: not recorded)."""
    v = _vllm_version(version)
    arch = next(iter(architectures(cfg)), "")
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
