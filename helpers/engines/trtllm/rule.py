"""TensorRT-LLM's rule: it takes the ids from its speculative config, never from the draft's config, and
its capture hands out layer outputs (docs/conventions.md, "TensorRT-LLM")."""
from __future__ import annotations

from typing import Sequence

from ...boundaries import Problem, ProblemKind, WiringResult, error, warning
from ...rules.conventions import DraftIds, IdsAt, check_ids, config_ids, layer_outputs_to_boundaries

K = ProblemKind


def ids_trtllm_reads(cfg: dict) -> DraftIds:
    """TensorRT-LLM reads no ids from the draft's config: a key there is ignored, and said."""
    _, inner, top = config_ids(cfg)
    warnings: list[Problem] = []
    if top is not None or inner is not None:
        warnings.append(warning(K.IDS_IGNORED, "TensorRT-LLM takes eagle3_layers_to_capture from its "
                                "speculative config, not from the draft's config.json: pass them as "
                                "explicit ids"))
    return DraftIds(None, IdsAt.NONE, warnings)


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
