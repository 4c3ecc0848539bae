"""The workbook's stand-in for ``sgl_kernel`` on a CPU host (SGLang 0.5.23; docs/sglang-cpu.md).

SGLang's CPU code imports ``sgl_kernel`` at module level in about 13 places, and no CPU build of it
is on the registry. This package goes on the SGLang process's ``PYTHONPATH`` (never into .venv) and
answers every import: the ops an EAGLE-3 run calls are torch implementations
(``helpers.engines.sglang.cpu.ops``), the two attention ops registered as ``torch.ops.sgl_kernel.*`` because
the intel_amx backend calls them through the dispatcher; any other name, and the submodules CPU code
imports unguarded (``STUB_SUBMODULES``), resolves to a function that raises ``NotImplementedError``
naming itself when called, so a path the workbook never exercised fails loudly instead of at import.
Other submodules stay absent: SGLang try-imports some (``sgl_kernel.scalar_type``) and falls back to
its own code on ImportError, which a stub would defeat.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

import torch

from helpers.engines.sglang.cpu import ops as _ops

__version__ = "0.0.0+eagle3-workbook-cpu-standin"
EAGLE3_WORKBOOK_STANDIN = True

for _name in _ops.IMPLEMENTED:
    globals()[_name] = getattr(_ops, _name)

_SCHEMAS = {
    "decode_attention_cpu": (
        "(Tensor query, Tensor(a!) k_cache, Tensor(b!) v_cache, float key_scale, float value_scale, "
        "Tensor(c!) output, Tensor? key, Tensor? value, Tensor loc, Tensor attn_logits, Tensor req_to_token, "
        "Tensor req_pool_indices, Tensor seq_lens, float sm_scale, float logit_cap, bool is_cross_attention, "
        "int sliding_window_size, Tensor? encoder_lens, Tensor? sinks) -> ()"),
    "extend_attention_cpu": (
        "(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, Tensor k_buffer, "
        "Tensor v_buffer, float key_scale, float value_scale, Tensor req_to_token, Tensor req_pool_indices, "
        "Tensor seq_lens, Tensor extend_seq_lens, Tensor extend_start_loc, int? max_len_extend, "
        "float sm_scale, float logit_cap, bool is_cross_attention, int sliding_window_size, "
        "Tensor? encoder_lens, Tensor? sinks, Tensor? custom_mask, bool is_causal) -> ()"),
}



def _register() -> list:
    """Define the two ops once per process (a re-import must not define them twice)."""
    if hasattr(torch.ops.sgl_kernel, "decode_attention_cpu"):
        return []
    lib = torch.library.Library("sgl_kernel", "DEF")
    for name, schema in _SCHEMAS.items():
        lib.define(name + schema)
        lib.impl(name, getattr(_ops, name), "CPU")
    return [lib]


_LIBS = _register()   # kept alive: dropping a Library unregisters its ops


def _missing(qualname: str):
    def call(*_args, **_kwargs):
        raise NotImplementedError(
            f"{qualname} is not implemented by the workbook's sgl_kernel stand-in "
            f"(helpers/engines/sglang/cpu): SGLang took a CPU path an EAGLE-3 run of the workbook's pairs "
            f"never needed")
    call.__name__ = call.__qualname__ = qualname.rsplit(".", 1)[-1]
    return call


def _resolver(module: str):
    def resolve(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _missing(f"{module}.{name}")
    return resolve


__getattr__ = _resolver(__name__)


STUB_SUBMODULES = ("mamba",)   # srt/layers/attention/linear/gdn_backend.py:184, kda_backend.py:39


class _StubSubmodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``sgl_kernel.<STUB_SUBMODULES>``: modules whose every public name is a ``_missing`` function."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in {f"{__name__}.{m}" for m in STUB_SUBMODULES}:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _resolver(spec.name)
        return module

    def exec_module(self, module):
        pass


if not any(isinstance(f, _StubSubmodules) for f in sys.meta_path):
    sys.meta_path.append(_StubSubmodules())
