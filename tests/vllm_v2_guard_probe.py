"""Run inside .venv-vllm by tests/test_vllm_v2_guard.py: vLLM's own V2 model runner code sets the capture
layers on a weightless target, with the workbook's plugin loaded the way vLLM loads it, and the guard judges.

What runs is the wheel's: ``vllm.plugins.load_general_plugins`` (which calls the workbook's entry point),
the V2 ``GPUModelRunner.load_model`` (vllm/v1/worker/gpu/model_runner.py) on an object made with ``__new__``
and given the attributes it reads up to and just past its ``set_eagle3_aux_hidden_state_layers`` call (the
model is passed in, so nothing is loaded), that function as the runner binds it, the real
``get_eagle3_aux_layers_from_config`` on the draft's config read by vLLM's own reader and wrapped in
``EAGLEConfig`` as config/speculative.py does for an EAGLE-3 draft, and the target's real classes
(``DeepseekV3ForCausalLM``/``DeepseekV2Model``, ``LlamaForCausalLM``/``LlamaModel``: their own setters and the
forward sources the guard reads) built without weights: ``layers`` holds one identity module per layer.
A pipeline rank is vLLM's own ``GroupCoordinator`` class given a rank and its group's ranks.

Usage: python tests/vllm_v2_guard_probe.py OUT_DIR CASE ...; each CASE is
NAME:TARGET_DIR:DRAFT_DIR:ARCH:RANK/STAGES (ARCH deepseek, llama, plamo3 or transformers; 0/1 for one
stage). With vLLM 0.34's Python on ``PYTHONPATH`` (``engines.vllm.own.release_package``) the same probe
runs that release's V2 runner. Each case's plugin
report is OUT_DIR/NAME.jsonl; one JSON line per case on stdout says how load_model ended.
python tests/vllm_v2_guard_probe.py --hook-failure: the install on a release without V2's setter name.
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace


def pp_groups(rank: int, stages: int) -> None:
    """vLLM's parallel state as one rank of a ``stages``-stage pipeline (tensor parallel 1)."""
    from vllm.distributed import parallel_state as ps

    def group(r, ranks):
        g = ps.GroupCoordinator.__new__(ps.GroupCoordinator)
        g.rank, g.ranks, g.world_size, g.rank_in_group = r, list(ranks), len(ranks), list(ranks).index(r)
        return g

    ps._TP = group(rank, [rank])
    ps._PP = group(rank, range(stages)) if stages > 1 else group(0, [0])


def plamo3_model(cfg, n: int):
    """Plamo3: the setter writes ``Plamo3Decoder`` (``Plamo3Model.layers``), while ``Plamo3Model`` keeps the
    mixin's class default: the holder is what the setter wrote, not the first module with the attribute."""
    import torch.nn as nn
    from vllm.model_executor.models.plamo3 import Plamo3Decoder, Plamo3ForCausalLM, Plamo3Model

    dec = Plamo3Decoder.__new__(Plamo3Decoder)
    nn.Module.__init__(dec)
    dec.layers = nn.ModuleList(nn.Identity() for _ in range(n))
    dec.start_layer, dec.end_layer = 0, n
    inner = Plamo3Model.__new__(Plamo3Model)
    nn.Module.__init__(inner)
    inner.config, inner.layers = cfg, dec
    model = Plamo3ForCausalLM.__new__(Plamo3ForCausalLM)
    nn.Module.__init__(model)
    model.config, model.model = cfg, inner
    return model, dec


def transformers_model(cfg, n: int):
    """The Transformers modeling backend (``--model-impl transformers``): vLLM's own
    ``TransformersForCausalLM`` around a real (tiny, randomly initialised) Hugging Face Llama of ``n``
    layers; its setter records outputs in ``_output_aux_hidden_states_kwargs`` (no
    ``aux_hidden_state_layers`` anywhere)."""
    import torch.nn as nn
    from transformers import LlamaConfig, LlamaModel
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    from vllm.model_executor.models.transformers import TransformersForCausalLM

    small = LlamaConfig(num_hidden_layers=n, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                        num_key_value_heads=2, vocab_size=32)
    model = TransformersForCausalLM.__new__(TransformersForCausalLM)
    nn.Module.__init__(model)
    model.config = model.text_config = cfg
    model.model = LlamaModel(small)
    model._target_class, model._layer_names = LlamaDecoderLayer, {i: f"layers.{i}" for i in range(n)}
    model._output_aux_hidden_states_kwargs = {}
    return model, model


def target_model(target: Path, arch: str, rank: int, stages: int):
    import torch.nn as nn
    from transformers import AutoConfig
    from vllm.model_executor.models.utils import make_empty_intermediate_tensors_factory

    cfg = AutoConfig.from_pretrained(target)
    n = int(cfg.num_hidden_layers)
    if arch == "plamo3":
        return plamo3_model(cfg, n)
    if arch == "transformers":
        return transformers_model(cfg, n)
    if arch == "deepseek":
        from vllm.model_executor.models.deepseek_v2 import DeepseekV2Model
        from vllm.model_executor.models.deepseek_v2 import DeepseekV3ForCausalLM as Outer
        inner = DeepseekV2Model.__new__(DeepseekV2Model)
    else:
        from vllm.model_executor.models.llama import LlamaForCausalLM as Outer
        from vllm.model_executor.models.llama import LlamaModel
        inner = LlamaModel.__new__(LlamaModel)
    nn.Module.__init__(inner)
    per = n // stages
    inner.config = cfg
    inner.layers = nn.ModuleList(nn.Identity() for _ in range(n))
    inner.start_layer, inner.end_layer = rank * per, (n if rank == stages - 1 else (rank + 1) * per)
    if arch == "deepseek":
        inner.aux_hidden_state_layers = ()        # as DeepseekV2Model.__init__ sets it
    inner.make_empty_intermediate_tensors = make_empty_intermediate_tensors_factory(
        ["hidden_states", "residual"], cfg.hidden_size)        # as both decoders' __init__ set it
    model = Outer.__new__(Outer)
    nn.Module.__init__(model)
    model.config, model.model = cfg, inner
    model.make_empty_intermediate_tensors = inner.make_empty_intermediate_tensors
    return model, inner


def speculative_config(draft: Path):
    """The draft's config as vLLM reads it (transformers_utils.config.get_config), made an ``EAGLEConfig``
    as config/speculative.py does for method eagle3."""
    from vllm.config import ModelConfig, SpeculativeConfig
    from vllm.transformers_utils.config import get_config
    from vllm.transformers_utils.configs.eagle import EAGLEConfig

    draft_cfg = ModelConfig.__new__(ModelConfig)
    draft_cfg.model = str(draft)
    draft_cfg.hf_config = EAGLEConfig(get_config(str(draft), trust_remote_code=False), method="eagle3",
                                      model_type="eagle")
    spec = SpeculativeConfig.__new__(SpeculativeConfig)
    spec.method, spec.draft_model_config = "eagle3", draft_cfg
    return spec


def v2_runner(spec, stages: int):
    from vllm.config import LoadConfig
    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner
    from vllm.v1.worker.gpu.pp_utils import PPHandler

    runner = GPUModelRunner.__new__(GPUModelRunner)
    runner.load_config = LoadConfig()
    runner.vllm_config = SimpleNamespace(load_config=runner.load_config)
    runner.eplb = SimpleNamespace(prepare_load=lambda: None)
    runner.jit_warmup_registry = JitWarmupRegistry(runner.vllm_config)
    runner.lora_config = None
    runner.use_aux_hidden_state_outputs = True      # model_runner.py:300-307 for method eagle3, every rank
    runner.speculative_config = spec
    runner.use_pp = stages > 1
    runner.pp_handler = PPHandler.__new__(PPHandler) if stages > 1 else None
    runner.speculator = None                        # built on the last rank only (model_runner.py:295-298)
    return runner


def hook_failure() -> int:
    """A release without V2's setter name: ``refuse`` stops at register (vLLM calls it outside any try),
    ``warn`` says so in one line and keeps the V1 hook. Prints each outcome as one JSON line."""
    import vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils as utils

    from helpers.engines.vllm import plugin

    del utils.set_eagle3_aux_hidden_state_layers
    for mode in ("refuse", "warn"):
        os.environ["EAGLE3_WORKBOOK_GUARD"] = mode
        plugin._applied.pop("guard", None)
        try:
            plugin.register()
            raised = None
        except plugin.GuardNotInstalled as exc:
            raised = str(exc)
        row = {"mode": mode, "raised": raised, "install": plugin._applied.get("guard")}
        print(json.dumps(row), flush=True)
    return 0


def main() -> int:
    if sys.argv[1] == "--hook-failure":
        return hook_failure()
    out = Path(sys.argv[1])
    from vllm.plugins import load_general_plugins

    load_general_plugins()      # vLLM's own loader: calls the workbook's entry point (eagle3_workbook_plugin)
    import vllm.v1.worker.gpu.model_runner as runner_mod
    import vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils as utils

    from helpers.engines.vllm import plugin
    from helpers.live.guard import GuardRefused

    bound = runner_mod.set_eagle3_aux_hidden_state_layers
    print(json.dumps({"install": plugin._applied.get("guard"),
                      "runner_binds_wrapper": bound is utils.set_eagle3_aux_hidden_state_layers
                      and getattr(bound, "__wrapped__", None) is not None}), flush=True)
    for case in sys.argv[2:]:
        name, target, draft, arch, ranks = case.split(":")
        rank, stages = (int(x) for x in ranks.split("/"))
        os.environ[plugin.REPORT_ENV] = str(out / f"{name}.jsonl")
        pp_groups(rank, stages)
        model, holder = target_model(Path(target), arch, rank, stages)
        runner = v2_runner(speculative_config(Path(draft)), stages)
        result = {"case": name, "raised": None, "stopped_in": None}
        try:
            runner.load_model(model=model)
        except GuardRefused as exc:
            result["raised"] = "GuardRefused"
            result["message"] = str(exc)
        except Exception as exc:    # noqa: BLE001 - past the capture setup a weightless model stops somewhere
            result["raised"] = type(exc).__name__
            result["stopped_in"] = traceback.extract_tb(exc.__traceback__)[-1].name
            result["message"] = f"{type(exc).__name__}: {exc}"
        result["aux_hidden_state_layers"] = list(getattr(holder, "aux_hidden_state_layers", None) or ()) or \
            sorted(getattr(holder, "_output_aux_hidden_states_kwargs", None) or ())
        result["relay"] = [getattr(holder, "_aux_slot_base_cached", None),
                           getattr(holder, "_aux_upstream_total_cached", None)]
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
