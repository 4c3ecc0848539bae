"""Import-time hooks inside SGLang's processes on a CPU host: the accommodations that cannot be flags.

Installed by ``site/sitecustomize.py`` (this folder's, on the PYTHONPATH of a workbook CPU launch only)
in every interpreter of the launch (launcher, scheduler, detokenizer). They adjust a few SGLang modules
right after they execute, before any other module binds their names, so no SGLang file is edited; each
adjustment appends one record to the launch's report. Everything here names private symbols of sglang
0.5.23 (line numbers below are that wheel's), so ``install`` refuses any other release. The model-registry
hooks (the guard, the capture record, a capture rule, the fc probe) are not accommodations: they live in
``helpers.engines.sglang.hooks`` and are installed here too only because a CPU launch needs both.
"""
from __future__ import annotations

import sys

from ..hooks import install_watch, installed_release, report, watch
from . import RELEASE


def _torchvision_schemas() -> None:
    """PyPI's torchvision is a CUDA build; beside torch 2.13.0+cpu its ops library does not load, and its
    ``_meta_registrations.py:163`` then fails registering fakes for ops that do not exist. SGLang imports
    it from ``srt/configs/nano_nemotron_vl.py:22`` but never calls nms; defining the two schemas lets the
    import finish."""
    import torch

    try:
        torch.ops.torchvision.nms  # noqa: B018 - a loaded ops library already defines them
        return
    except (AttributeError, RuntimeError):
        pass
    lib = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _KEEP.append(lib)
    report("torchvision-schemas", "defined torchvision::nms and torchvision::qnms (schemas only)",
           "PyPI's torchvision is a CUDA build whose import fails beside CPU torch without them",
           "torchvision/_meta_registrations.py:163 via srt/configs/nano_nemotron_vl.py:22")


_KEEP: list = []


def _amx(module) -> None:
    """The only reader of ``has_amx`` that matters here is the server-args pass that rewrites
    ``--attention-backend intel_amx`` to torch_native on a CPU without AMX; the intel_amx backend's two
    ops come from the stand-in, which needs no AMX. Direct ``cpu_has_amx_support()`` checks (AMX GEMM
    and MoE kernels) stay False, so layers keep their native torch paths."""
    module.override_platform(has_amx=True).install()
    report("amx-reported", "get_platform().has_amx reads True (platform override; cpu_has_amx_support() "
           "itself unchanged)", "otherwise --attention-backend intel_amx falls back to torch_native, which "
           "EAGLE rejects", "srt/arg_groups/overrides.py:1301-1310, srt/runtime_context.py:1838")


def _rope(module) -> None:
    """``get_rope_cpu`` asserts a yarn ``rope_scaling``; a target with default rope takes the generic
    ``get_rope`` instead, whose ``forward_cpu`` falls back to the native rotation."""
    original = module.get_rope_cpu
    generic = module.get_rope
    reported = []

    def get_rope_cpu(head_size, rotary_dim, max_position, base, is_neox_style=True, rope_scaling=None,
                     dtype=None, partial_rotary_factor=1.0, device=None):
        if rope_scaling is None:
            if not reported:
                reported.append(1)
                report("default-rope", "a default-rope target takes get_rope instead of get_rope_cpu",
                       "get_rope_cpu accepts only deepseek_yarn scaling",
                       "srt/layers/rotary_embedding/factory.py:478")
            return generic(head_size, rotary_dim, max_position, base, is_neox_style, rope_scaling, dtype,
                           partial_rotary_factor)
        return original(head_size, rotary_dim, max_position, base, is_neox_style, rope_scaling, dtype,
                        partial_rotary_factor, device)

    module.get_rope_cpu = get_rope_cpu



def _fork_children(module) -> None:
    """SGLang starts its scheduler and detokenizer with ``spawn`` (``srt/entrypoints/engine.py:1995``), so
    each imports SGLang and torch again: about 12 of a start's 28-30 s on a quiet 2-core CPU. ``spawn``
    protects a CUDA context, and a CPU launch has none: its children are forked from the launcher,
    which has imported everything and run no torch kernel yet. Measured on the tiny DeepSeek pair, one
    engine alone: 16-19 s a start against 28-30 s."""
    import multiprocessing

    original = multiprocessing.set_start_method

    def set_start_method(method, force=False):
        if method == "spawn":
            report("fork-children", "the scheduler and the detokenizer are forked from the launcher, not "
                   "spawned", "a CPU launch has no CUDA context for spawn to protect, and a spawned child "
                   "imports SGLang and torch again (docs/sglang-cpu.md: the start times measured)",
                   "srt/entrypoints/engine.py:1995")
            method = "fork"
        return original(method, force=force)

    module.mp = _ForkFirst(multiprocessing, set_start_method)


class _ForkFirst:
    """``multiprocessing`` as ``srt/entrypoints/engine.py`` sees it, with ``set_start_method`` replaced
    (only that module's reference: nothing else in the process changes)."""

    def __init__(self, inner, set_start_method):
        self._inner, self.set_start_method = inner, set_start_method

    def __getattr__(self, name):
        return getattr(self._inner, name)


def install() -> None:
    """Called from this folder's sitecustomize when ``EAGLE3_WORKBOOK_SGLANG_HOOKS=cpu``: the accommodations
    name private symbols of one release and refuse (exit status 2, one line) any other."""
    found = installed_release()
    if found != RELEASE:
        sys.stderr.write(f"eagle3-workbook: the SGLang CPU accommodations are written for sglang=={RELEASE}; "
                         f"found sglang=={found}\n")
        raise SystemExit(2)
    watch("torchvision", before=_torchvision_schemas)
    watch("sglang.srt.runtime_context", after=_amx)
    watch("sglang.srt.layers.rotary_embedding.factory", after=_rope)
    watch("sglang.srt.entrypoints.engine", after=_fork_children)
    install_watch()
