"""Run inside .venv-sglang by tests/test_sglang_guard.py: stock SGLang's own plugin loader
(``sglang.srt.plugins.load_plugins``) finds the workbook's installed entry point, then SGLang's own
``DeepseekV2ForCausalLM.set_eagle3_layers_to_capture`` runs on stub ranks (the model class registered with
SGLang's ``ModelRegistry`` and resolved through it, as a launch resolves its target). Prints one JSON line.

argv: a JSON list of cases {"draft": DIR, "ids": [...], "last": bool}.
"""
import importlib.util
import json
import sys
import types

# This CPU venv pairs PyPI's CUDA torchvision with CPU torch: importing sglang needs two op schemas defined
# first. It is the venv's, not SGLang's; the sgl_kernel stand-in and every other accommodation stay off.
from helpers.engines.sglang.cpu.hooks import _torchvision_schemas

_torchvision_schemas()

from sglang.srt.plugins import load_plugins  # noqa: E402

load_plugins()

from sglang.srt import runtime_context  # noqa: E402
from sglang.srt.models import registry  # noqa: E402
from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM  # noqa: E402
from torch import nn  # noqa: E402

from helpers.live.guard import GuardRefused  # noqa: E402


class StubModel(nn.Module):
    """What the setter and the capture loop touch: ``layers`` and ``layers_to_capture``."""

    def __init__(self, n: int):
        super().__init__()
        self.layers = nn.ModuleList([nn.Identity() for _ in range(n)])
        self.layers_to_capture = []


class MovedCapture(StubModel):
    """A release that keeps the capture under another name: what the setter writes is not readable as
    ``layers_to_capture`` afterwards (SGLang's main branch moves aux state into a ``spec_aux_config``)."""

    @property
    def layers_to_capture(self):
        raise AttributeError("layers_to_capture")

    @layers_to_capture.setter
    def layers_to_capture(self, value):
        self.__dict__["spec_aux_layers"] = value


class StubDeepseekForCausalLM(nn.Module):
    """A pipeline rank of a 12-layer DeepSeek-V3 target, carrying SGLang 0.5.23's own setter."""

    set_eagle3_layers_to_capture = DeepseekV2ForCausalLM.set_eagle3_layers_to_capture

    def __init__(self, n: int, last: bool):
        super().__init__()
        self.model = StubModel(n)
        self.pp_group = types.SimpleNamespace(is_last_rank=last, is_first_rank=not last)
        self.config = types.SimpleNamespace(num_hidden_layers=n, architectures=["DeepseekV3ForCausalLM"])


registry.ModelRegistry.models["StubDeepseekForCausalLM"] = StubDeepseekForCausalLM
cls, _ = registry.ModelRegistry.resolve_model_cls(["StubDeepseekForCausalLM"])


def load(case):
    # the launch's server args where SGLang publishes them (runtime_context, 0.5.23): the guard reads them
    args = types.SimpleNamespace(speculative_draft_model_path=case["draft"])
    runtime_context._CONTEXT._server_args = None if case.get("no_server_args") else args
    model = cls(12, case["last"])
    if case.get("capture_elsewhere"):
        model.model = MovedCapture(12)
    model.set_eagle3_layers_to_capture(case["ids"])
    return model


out = {"sgl_kernel": getattr(importlib.util.find_spec("sgl_kernel"), "origin", None), "cases": []}
for case in json.loads(sys.argv[1]):
    try:
        model = load(case)
        ltc = getattr(model.model, "layers_to_capture", None) or []
        out["cases"].append({"served": True, "layers_to_capture": list(ltc)})
    except GuardRefused:
        out["cases"].append({"served": False})
print("PROBE " + json.dumps(out))
