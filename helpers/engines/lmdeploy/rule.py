"""LMDeploy's rule: what its PyTorch engine feeds an EAGLE-3 draft, read from each release's own config
builders (``engines.lmdeploy.source``); the recorded rule below only where those files cannot be read
(docs/conventions.md, "LMDeploy").

The target's builder decides, from the target's depth alone: the draft's ids are never read for the
capture (the Kimi draft reads them only to size its ``fc``), so no config changes what is served. The
capture hands out the input of each listed layer (``hidden_states + residual`` before the layer runs), so
an id is a boundary.
"""

from __future__ import annotations

from typing import Sequence

from ...boundaries import Problem, ProblemKind, WiringResult, error, warning
from ...errors import CacheError, one_line
from ...rules.conventions import IdsAt, config_ids
from ...rules.wheels import PackageSourceError
from . import source as src

K = ProblemKind

LMDEPLOY_NEWEST_READ = "0.18.0"
BACKENDS = ("pytorch", "turbomind")
# model type a target class implies when no target config says otherwise (the wiring command's --arch)
MODEL_TYPE_OF = {
    "LlamaForCausalLM": "llama",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "KimiK25ForConditionalGeneration": "kimi_k25",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}

# Recorded from lmdeploy 0.18.0 (a cache of what source.read_release found; tests/test_lmdeploy.py reads it
# again): target condition -> (the assignment's file:line, the layout as a function of the depth N).
RECORDED_FROM = LMDEPLOY_NEWEST_READ
RECORDED_CAPTURE = {
    "LlamaForCausalLM": "lmdeploy/pytorch/configurations/llama.py:28",
    "kimi_k2": "lmdeploy/pytorch/configurations/kimi_k2.py:82",
    "kimi_k25": "lmdeploy/pytorch/configurations/kimi_k2.py:82",  # kimi_k25.py:25 hands its text config on
}
RECORDED_KIMI_MIN_LAYERS = ("lmdeploy/pytorch/configurations/kimi_k2.py:78", 5)
RECORDED_REFUSES = {
    "deepseek_v3": "lmdeploy/pytorch/configurations/deepseek_v2.py:32",
    "deepseek_v2": "lmdeploy/pytorch/configurations/deepseek_v2.py:32",
}
RECORDED_IDS_ONLY_FOR = "lmdeploy/pytorch/config.py:735"
RECORDED_TURBOMIND = "lmdeploy/serve/core/async_engine.py:149"


def _recorded_layout(n: int) -> tuple[int, ...]:
    return (2, n // 2, n - 3)  # the expression at both RECORDED_CAPTURE lines


def model_type_of(arch: str, target_config: dict | None) -> str | None:
    """The target's model type: its config's (a multimodal wrapper's outer one), else the class's usual
    one; an ``arch`` written in lower case is taken to be a model type itself (``--arch kimi_k2``)."""
    if target_config and target_config.get("model_type"):
        return str(target_config["model_type"])
    if arch and arch == arch.lower():
        return arch
    return MODEL_TYPE_OF.get(arch)


def _config_ids(cfg: dict | None) -> tuple[list[int] | None, IdsAt]:
    """The ids the draft's config writes (eagle_config's first, as the Kimi draft reads them), and where."""
    if not cfg:
        return None, IdsAt.NONE
    _, inner, top = config_ids(cfg)
    if inner is not None:
        return inner, IdsAt.EAGLE_CONFIG
    return (top, IdsAt.TOP_LEVEL) if top is not None else (None, IdsAt.NONE)


def ids_warning(ids: Sequence[int] | None, cfg: dict | None) -> list[Problem]:
    ids_in_cfg = _config_ids(cfg)[0]
    named = ids if ids is not None else ids_in_cfg
    if named is None:
        return []
    return [
        warning(
            K.IDS_IGNORED,
            f"LMDeploy ignores the ids {list(named)}: the target's config builder "
            f"sets the capture from the target's depth alone (the Kimi draft reads "
            f"them only to size its fc)",
        )
    ]


def _result(version, arch, n, served, ids, cfg, problems, lines) -> WiringResult:
    return WiringResult(
        engine="lmdeploy" + (f"=={version}" if version else ""),
        version=version,
        arch=arch,
        num_layers=n,
        served_layout=tuple(served),
        layers_to_capture=list(served),
        ids_used=None,
        ids_source=str(IdsAt.NONE),  # no ids reach the capture
        problems=problems + ids_warning(ids, cfg),
        source_lines=lines,
    )


def _shallow(version, arch, n, ids, cfg, where: str, notes: list, lines: list) -> WiringResult:
    """A Kimi target below the depth LMDeploy's builder accepts: loading fails, whether read or recorded."""
    refused = error(K.SETTER_RAISES, f"LMDeploy refuses a target this shallow ({where}): loading fails")
    return _result(version, arch, n, (), ids, cfg, [refused, *notes], lines)


def _turbomind(version, arch, n, ids, cfg, where: str) -> WiringResult:
    return _result(
        version,
        arch,
        n,
        (),
        ids,
        cfg,
        [
            error(
                K.NO_CAPTURE,
                f"LMDeploy's TurboMind backend ignores the speculative config (it only logs a warning, "
                f"{where}): it feeds the draft nothing; serve with --backend pytorch",
            )
        ],
        [],
    )


def resolve_lmdeploy(
    version: str | None,
    arch: str,
    num_layers: int,
    ids: Sequence[int] | None,
    cfg: dict | None,
    *,
    target_config: dict | None = None,
    backend: str = "pytorch",
    release: src.LmdeployRelease | None = None,
) -> WiringResult:
    """What ``lmdeploy==version`` feeds a draft on a target of class ``arch`` (model type from
    ``target_config``), read from the release's own files; recorded (and said so) where they cannot be
    read."""
    version = version or LMDEPLOY_NEWEST_READ
    model_type = model_type_of(arch, target_config)
    if release is None:
        try:
            release = src.read_release(version)
        except (src.LmdeploySourceError, PackageSourceError, CacheError, OSError) as exc:
            return recorded_lmdeploy(version, arch, num_layers, ids, cfg, model_type, backend, one_line(exc))
    if backend == "turbomind":
        return _turbomind(
            version,
            arch,
            num_layers,
            ids,
            cfg,
            release.turbomind.cite() if release.turbomind else "not found in its source",
        )
    chain = _chain(release, arch, model_type)
    lines = [ln.as_dict() for b in chain for ln in (b.condition, b.sets_aux, b.rejects) if ln is not None]
    read = warning(
        K.SOURCE_CHECKED,
        f"read from lmdeploy {version}'s own files: " + " -> ".join(f"{b.name} ({b.file})" for b in chain),
    )
    refuses = next((b.rejects for b in chain if b.rejects is not None), None)
    setter = next((b for b in chain if b.sets_aux is not None), None)
    if refuses is not None and (setter is None or chain.index(setter) > 0):
        return _result(
            version, arch, num_layers, (), ids, cfg, [_cannot(refuses.cite(), model_type), read], lines
        )
    if setter is None:
        return _result(
            version,
            arch,
            num_layers,
            (),
            ids,
            cfg,
            [
                _nothing(
                    arch, model_type, chain, release.ids_only_for.cite() if release.ids_only_for else None
                ),
                read,
            ],
            lines,
        )
    for guard, test in setter.guards:
        if src.evaluate(test, cfg=_Depth(num_layers), num_layers=num_layers):
            return _shallow(version, arch, num_layers, ids, cfg, f"{guard.cite()}: {guard.text}", [],
                            lines + [guard.as_dict()])
    served = tuple(src.evaluate(setter.aux_expr, cfg=_Depth(num_layers), num_layers=num_layers))
    return _result(version, arch, num_layers, served, ids, cfg, [read], lines)


class _Depth:
    """What the release's expressions read of the engine's model config: its depth."""

    def __init__(self, n: int):
        self.num_layers = n


def _chain(release: src.LmdeployRelease, arch: str, model_type: str | None) -> list[src.Builder]:
    """The builder whose condition accepts the target first (as the release asks them), then the builders
    it hands the build to."""
    first = next((b for b in release.builders if src.matches(b, arch, model_type)), None)
    by_name = {b.name: b for b in release.builders}
    chain = [first] if first is not None else []
    while chain and chain[-1].delegates in by_name and by_name[chain[-1].delegates] not in chain:
        chain.append(by_name[chain[-1].delegates])
    return chain


def _cannot(where: str, model_type: str | None) -> Problem:
    return error(
        K.SETTER_RAISES,
        f"LMDeploy's config builder for model type {model_type!r} asserts a speculative "
        f"method other than eagle3 ({where}), so loading an EAGLE-3 draft fails: LMDeploy "
        f"cannot serve this draft at all (only Llama and Kimi-K2/K2.5 targets get capture)",
    )


def _nothing(arch: str, model_type: str | None, chain: list, ids_only: str | None) -> Problem:
    builder = chain[0].name if chain else "the default config builder"
    return error(
        K.NO_CAPTURE,
        f"LMDeploy feeds the draft nothing: {builder} sets no capture for {arch} "
        f"(model type {model_type!r}) on the eagle3 path, and the engine config takes "
        f"target layer ids for another method only ({ids_only or 'not found'})",
    )


def recorded_lmdeploy(
    version: str, arch: str, num_layers: int, ids, cfg, model_type: str | None, backend: str, why: str
) -> WiringResult:
    """The rule recorded from lmdeploy RECORDED_FROM, for when the release's files cannot be read."""
    note = warning(
        K.RULE_NOT_RUN,
        f"LMDeploy rule recorded, not read now, from lmdeploy {RECORDED_FROM}'s files (the file:line "
        f"cited): {why[:200]}",
    )
    if backend == "turbomind":
        r = _turbomind(version, arch, num_layers, ids, cfg, RECORDED_TURBOMIND)
        r.problems.append(note)
        return r
    key = arch if arch in RECORDED_CAPTURE else model_type
    if model_type in RECORDED_REFUSES and key not in RECORDED_CAPTURE:
        return _result(
            version,
            arch,
            num_layers,
            (),
            ids,
            cfg,
            [_cannot(RECORDED_REFUSES[model_type], model_type), note],
            [],
        )
    if key not in RECORDED_CAPTURE:
        return _result(
            version,
            arch,
            num_layers,
            (),
            ids,
            cfg,
            [_nothing(arch, model_type, [], RECORDED_IDS_ONLY_FOR), note],
            [],
        )
    where, least = RECORDED_KIMI_MIN_LAYERS
    if key != "LlamaForCausalLM" and num_layers < least:
        return _shallow(version, arch, num_layers, ids, cfg, f"{where}: under {least} layers", [note], [])
    file, line = RECORDED_CAPTURE[key].rsplit(":", 1)
    return _result(
        version,
        arch,
        num_layers,
        _recorded_layout(num_layers),
        ids,
        cfg,
        [note],
        [{"file": file, "line": int(line), "text": "aux_hidden_state_layers = (2, N // 2, N - 3)"}],
    )
