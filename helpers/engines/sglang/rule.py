"""What surrounds SGLang's id -> boundary step, which itself is never restated (``engines.sglang.stub``
runs each release's setter): which key it reads ids from, the layout the 0.5.9 rule documented, and
the draft-side mismatches no SGLang error reveals."""
from __future__ import annotations

from typing import Sequence

from ...boundaries import Layout, Problem, ProblemKind, warning
from ...rules.conventions import (
    IDS_KEY,
    SGLANG_DRAFT_ARCH,
    DraftIds,
    IdsAt,
    architectures,
    config_ids,
    default_boundaries,
    is_speculators_format,
    version_key,
)
from ...rules.flags import sets_norm_before_residual

K = ProblemKind


def ids_sglang_reads(cfg: dict, reads_top_level: bool = False) -> DraftIds:
    """The ids SGLang reads: ``eagle_config``'s, or the top level's where the release's own code (read by
    the caller) falls back to them."""
    nested, inner, top = config_ids(cfg)
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


def sglang_plus_one(ids: Sequence[int]) -> Layout:
    """SGLang's Llama/Qwen rule: id ``i`` is captured entering layer ``i + 1``, in ascending order."""
    return tuple(sorted(i + 1 for i in ids))


def sglang_documented_layout(arch: str, version: str | None, ids: list[int] | None,
                             where: IdsAt, num_layers: int) -> tuple[Layout, str]:
    """SGLang's rule as documented, for when no release source can be read; says which rule it assumed.

    DeepSeek/Kimi classes changed rule (PR #25454): 0.5.9 adds one to every id, 0.5.23 uses the
    ids as given unless the first is 1. Releases in between are not pinned down here.
    """
    if where != IdsAt.EAGLE_CONFIG or ids is None:
        return default_boundaries(num_layers), "no ids under eagle_config, so SGLang's default boundaries"
    if "deepseek" in arch.lower() and version is not None and version_key(version) >= version_key("0.5.23"):
        layout = sglang_plus_one(ids) if ids[0] == 1 else tuple(sorted(ids))
        return layout, "DeepSeek rule of 0.5.23 assumed: ids used as given unless the first is 1"
    return sglang_plus_one(ids), "SGLang boundary = id + 1 (0.5.9 convention)"


NORM_BEFORE_RESIDUAL_ON_SGLANG = (
    "the draft sets norm_before_residual=true (the residual of its fused hidden input is taken "
    "after hidden_norm). SGLang's llama_eagle3.py ignores the flag and always takes the residual "
    "from the raw hidden state, so SGLang serves this draft with a different forward from the one "
    "it was trained with; vLLM's llama_eagle3.py honours it.")


def sglang_format_warnings(cfg: dict, knows_speculators: bool | None = None) -> list[str]:
    """Draft-side mismatches no SGLang error reveals: a speculators checkpoint it cannot name, and a
    forward flag its llama_eagle3 does not implement. ``knows_speculators``: whether the release
    registers the speculators architecture (None when its source was not read)."""
    out = []
    if is_speculators_format(cfg) and not knows_speculators:
        archs = list(architectures(cfg))
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
