"""Serving topology: do the aux states a pipeline stage captures reach the draft?

The draft runs on the last pipeline stage. A layer whose input is a captured boundary may sit on an
earlier stage, and then the engine must carry that state forward; none of the releases read does so
by default (docs/conventions.md, "Topology"). SGLang's setter returns early unless
``pp_group.is_last_rank`` (read from each release by ``sglang.inspect``: ``SetterSite.last_rank_only``;
SGLang PR #39644), and vLLM's V1 model runner hands only ``hidden_states`` and ``residual`` on in
``IntermediateTensors`` (vLLM PR #45985, unmerged); vLLM 0.32.0's V2 runner relays them for the decoders
that declare ``supports_aux_hidden_states_over_pp`` and refuses EAGLE-3 with PP for the rest. Tensor
parallelism splits no layer across ranks' depth, so it changes nothing here.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence

from ..boundaries import WiringError
from ..engines.sglang import source as ss
from ..engines.sglang.inspect import inspect_model
from ..engines.vllm.rule import VLLM_PP_AUX_RELAY, VLLM_READS_TOP_LEVEL, at_least, vllm_on_v2
from ..errors import BadOption
from .conventions import Engine


@dataclass
class Topology:
    tp: int
    pp: int
    stages: list[tuple[int, int]]            # [start, end) layers per stage
    off_last: list[int] = field(default_factory=list)   # served boundaries captured before the last stage
    carried: bool | None = True             # whether the engine carries them to the draft (None: refuses)
    evidence: str = ""
    fix: str = ""

    @property
    def blocking(self) -> bool:
        return self.pp > 1 and bool(self.off_last) and not self.carried

    def to_dict(self) -> dict:
        d = asdict(self)
        d["blocking"] = self.blocking
        return d


def check_sizes(tp: int, pp: int) -> None:
    for name, v in (("--tp", tp), ("--pp", pp)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise BadOption(f"{name} {v!r}: expected a positive number of GPUs (default 1)")


def pp_stages(engine: Engine, num_layers: int, pp: int) -> list[tuple[int, int]]:
    """The engine's default layer split when its PP partition variable is unset: SGLang gives the
    remainder to the last stages (srt/distributed/utils.py get_pp_indices, 0.5.23), vLLM to the
    stages just before the last (distributed/utils.py get_pp_indices, 0.32.0)."""
    if pp > num_layers:
        raise BadOption(f"--pp {pp} is more stages than the target's {num_layers} layers")
    base, extra = divmod(num_layers, pp)
    sizes = [base] * pp
    if engine.rules.pp_remainder_before_last:
        for i in range(2, extra + 2):
            sizes[-i] += 1
    else:
        for i in range(pp - extra, pp):
            sizes[i] += 1
    out, start = [], 0
    for s in sizes:
        out.append((start, start + s))
        start += s
    return out


def _capture_stage(boundary: int, stages: Sequence[tuple[int, int]]) -> int:
    """The stage that captures boundary b: the one running layer b (captured as it enters);
    boundary N, the final state, on the last stage."""
    for i, (lo, hi) in enumerate(stages):
        if lo <= boundary < hi:
            return i
    return len(stages) - 1


def topology(eng: Engine, arch: str, num_layers: int, served: Sequence[int], tp: int = 1, pp: int = 1,
             root=None) -> Topology:
    check_sizes(tp, pp)
    stages = pp_stages(eng, num_layers, pp)
    last = len(stages) - 1
    # conservative at the edge: a boundary equal to the last stage's first layer is also the previous
    # stage's output, which an after-layer capture (gpt-oss from SGLang 0.5.17) takes there
    off = [b for b in served if _capture_stage(b, stages) != last or (pp > 1 and b == stages[last][0])]
    topo = Topology(tp, pp, stages, off)
    if pp == 1:
        topo.evidence = "one pipeline stage: every capture is on the stage that runs the draft"
        return topo
    carried, topo.evidence = eng.rules.pp_carried(eng, arch, root)
    topo.carried = carried
    if off and not carried:
        topo.fix = _fix(eng, num_layers, pp, tp, served)
    return topo


def sglang_carried(eng: Engine, arch: str, root) -> tuple[bool | None, str]:
    """SGLang's family ``pp_carried``: read from the release's own source."""
    try:
        src = ss.source_at(root, eng.version) if root is not None else ss.fetch_sglang(eng.version)
        wiring = inspect_model(arch, source=src)
    except (ss.SglangSourceError, WiringError, OSError) as exc:
        return False, (f"SGLang {eng.version}'s source could not be read ({str(exc)[:120]}); no release "
                       f"read carries aux states across stages")
    guard = next((s for s in wiring.setters if s.last_rank_only), None)
    if guard is not None:
        return False, (f"sglang {eng.version} {guard.file}:{guard.line} {guard.cls}.set_eagle3_layers_to_"
                       f"capture returns early unless pp_group.is_last_rank (SGLang PR #39644), and no "
                       f"PPProxyTensors entry carries aux states")
    return False, (f"sglang {eng.version}: no PPProxyTensors entry carries aux hidden states between "
                   f"stages, so a non-last stage's captures are dropped")


def vllm_carried(eng: Engine, arch: str) -> tuple[bool | None, str]:
    """vLLM's family ``pp_carried``: the recorded rule (VLLM_PP_AUX_RELAY), by the model runner serving."""
    first, decoders = VLLM_PP_AUX_RELAY
    on_v2 = (at_least(eng.version, VLLM_READS_TOP_LEVEL)       # before it, no runner reads any ids
             and vllm_on_v2(eng.version, arch, eng.runner))
    if on_v2 and at_least(eng.version, first):
        if arch in decoders:
            return True, (f"vLLM {eng.version or 'newest'} V2 runner relays aux states over PP for "
                          f"{arch} "
                          f"(v1/worker/gpu/pp_utils.py, supports_aux_hidden_states_over_pp; read in "
                          f"{first})")
        return None, (f"vLLM {eng.version or 'newest'} V2 runner refuses EAGLE-3 with pipeline "
                      f"parallelism for {arch} (eagle3_utils.verify_supports_aux_hidden_states_over_pp "
                      f"raises at load; read in {first})")
    return False, (f"vLLM {eng.version or 'newest'} {'V1' if not on_v2 else 'V2'} runner: a non-last "
                   f"stage returns IntermediateTensors of hidden_states and residual only, so its aux "
                   f"states are dropped (vLLM PR #45985)")


def _fix(eng: Engine, num_layers: int, pp: int, tp: int, served: Sequence[int]) -> str:
    var = eng.rules.pp_partition_var
    low = min(served) if served else 0
    start = low - 1        # the last stage must run the layer before the first captured boundary
    tp_only = f"or serve with TP only (--tp {tp * pp} --pp 1)"
    if start < pp - 1:
        return (f"no split keeps boundary {low} on the last stage (the {pp - 1} earlier stages need a layer "
                f"each): {tp_only}")
    head, extra = divmod(start, pp - 1)
    sizes = [head + (1 if i < extra else 0) for i in range(pp - 1)] + [num_layers - start]
    return (f"{var}={','.join(str(s) for s in sizes)} keeps layers {start}..{num_layers - 1} (every captured "
            f"boundary) on the last stage, at the cost of balance; {tp_only}")
