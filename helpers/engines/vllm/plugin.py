"""The workbook's vLLM plugin: engine-side fixes, applied inside vLLM's own processes, per launch.

vLLM loads every ``vllm.general_plugins`` entry point in each of its processes before it builds a
model (``vllm/plugins/__init__.py``, ``load_general_plugins``); this project's ``pyproject.toml``
registers ``register`` below, so a ``.venv-vllm`` with the project installed runs it. It does
nothing unless the launch names fixes in ``EAGLE3_WORKBOOK_VLLM_FIXES`` (comma separated), the way
``patch-sglang`` is applied only when asked. Each fix first decides, from the running release's own
code, whether that release needs it, and records what it did (``applied`` / ``not-needed`` and why)
as one JSON line in the file ``EAGLE3_WORKBOOK_VLLM_REPORT`` names, so a report can say which engine
code measured what. docs/vllm.md says why each fix exists and what checks it.

It also installs the engine guard (``helpers.live.guard``) when ``EAGLE3_WORKBOOK_GUARD`` is on: on both
model runners (V1 and V2), right after vLLM's own code has set the target's capture layers, the live model
is compared with what the draft was trained on before the first token (docs/guard.md).

This module runs in ``.venv-vllm`` (vLLM's pinned transformers), never in the notebooks' kernel:
it imports only vLLM, torch, the standard library and the torch-free ``helpers.live.guard``.
"""
from __future__ import annotations

import ast
import inspect
import json
import os
import sys
import textwrap
import time

from helpers.rules.hooks import v2_calls_setter

FIXES_ENV = "EAGLE3_WORKBOOK_VLLM_FIXES"
REPORT_ENV = "EAGLE3_WORKBOOK_VLLM_REPORT"
# Every fix this plugin knows, in the order they apply.
FIXES = ("rope3d", "mla_width", "boundary0")
MLA_KERNEL_WIDTH = 576     # kv_lora_rank + qk_rope_head_dim the CPU MLA decode kernel is compiled for
MLA_KERNEL_BLOCK = 16      # ... and its only block size
SHARED_BLOCK = 32          # a size the CPU attention backend (MultipleOf(32)) and the torch MLA path share

_applied: dict[str, dict] = {}


def requested() -> list[str]:
    names = [n.strip() for n in os.environ.get(FIXES_ENV, "").split(",") if n.strip()]
    unknown = [n for n in names if n not in FIXES]
    if unknown:
        raise ValueError(f"{FIXES_ENV}={os.environ.get(FIXES_ENV)!r}: unknown fix(es) {unknown}; "
                         f"known: {', '.join(FIXES)}")
    return names


def register() -> None:
    """The entry point. Safe to call more than once per process (vLLM may)."""
    _install_guard()
    for name in requested():
        if name in _applied:
            continue
        try:
            outcome = _FIX_FUNCS[name]()
        except Exception as exc:   # noqa: BLE001 - the report must say a fix failed, then vLLM goes on
            outcome = {"state": "failed", "why": f"{type(exc).__name__}: {exc}"}
        _applied[name] = outcome
        _report({"fix": name, **outcome})


def _report(record: dict) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    record = {"pid": os.getpid(), "time": round(time.time(), 3), **record}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


# --------------------------------------------------------------------------------------
# rope3d: RotaryEmbedding.forward_cpu on the 3-D [T, H, D] queries MLA passes.


def _rope_cpu_is_wrong_for_3d() -> tuple[bool, str]:
    """Run the release's own forward_cpu and forward_native on one 3-D query and compare: the
    behaviour decides, not a version number."""
    import torch
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    rope = RotaryEmbedding.__new__(RotaryEmbedding)     # no CustomOp registry or vLLM config needed
    torch.nn.Module.__init__(rope)
    rope.head_size, rope.rotary_dim, rope.max_position_embeddings = 8, 8, 16
    rope.base, rope.is_neox_style, rope.dtype = 10000.0, False, torch.float32
    rope.register_buffer("cos_sin_cache", rope._compute_cos_sin_cache().to(torch.float32), persistent=False)
    g = torch.Generator().manual_seed(0)
    pos = torch.arange(5)
    q = torch.randn(5, 3, 8, generator=g)
    k = torch.randn(5, 1, 8, generator=g)
    q_cpu, k_cpu = rope.forward_cpu(pos, q.clone(), k.clone())
    q_nat, k_nat = rope.forward_native(pos, q.clone(), k.clone())
    err = max(float((q_cpu - q_nat).abs().max()), float((k_cpu - k_nat).abs().max()))
    return err > 1e-5, f"forward_cpu vs forward_native on a [5, 3, 8] query: max abs difference {err:.3g}"


def _fix_rope3d() -> dict:
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    wrong, evidence = _rope_cpu_is_wrong_for_3d()
    if not wrong:
        return {"state": "not-needed", "why": evidence}
    original = RotaryEmbedding.forward_cpu

    def forward_cpu(self, positions, query, key=None):
        if query.dim() == 3 or (key is not None and key.dim() == 3):
            return self.forward_native(positions, query, key)
        return original(self, positions, query, key)

    RotaryEmbedding.forward_cpu = forward_cpu
    return {"state": "applied", "why": evidence + "; 3-D inputs now take forward_native"}


# --------------------------------------------------------------------------------------
# mla_width: the CPU MLA backend for latents other than 576 wide, at a block size CPU attention shares.


def _fix_mla_width() -> dict:
    import torch
    from vllm.model_executor.layers.attention import mla_attention
    from vllm.platforms import cpu as cpu_platform
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.attention.backends.mla import cpu_mla

    backend, impl = cpu_mla.CPUMLABackend, cpu_mla.CPUMLAImpl
    widths = list(backend.get_supported_head_sizes())
    blocks = list(backend.get_supported_kernel_block_sizes())
    if widths != [MLA_KERNEL_WIDTH] and blocks != [MLA_KERNEL_BLOCK]:
        return {"state": "not-needed", "why": f"CPU_MLA takes head sizes {widths}, block sizes {blocks}"}
    kernel_forward_mqa = impl.forward_mqa

    def forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer):
        width = self.kv_lora_rank + self.qk_rope_head_dim
        if width == MLA_KERNEL_WIDTH and kv_c_and_k_pe_cache.shape[1] == MLA_KERNEL_BLOCK:
            return kernel_forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer)
        if isinstance(q, tuple):
            q = torch.cat(q, dim=-1)
        decode = attn_metadata.decode
        cache = kv_c_and_k_pe_cache.reshape(kv_c_and_k_pe_cache.shape[0], -1, width)
        block = cache.shape[1]
        out = torch.empty(q.shape[0], q.shape[1], self.kv_lora_rank, dtype=q.dtype, device=q.device)
        for i in range(q.shape[0]):          # one query token per request (query_len_support SINGLE_ONLY)
            n = int(decode.seq_lens[i])
            ids = decode.block_table[i, : (n + block - 1) // block].long()
            kv = cache[ids].reshape(-1, width)[:n]
            scores = (q[i].float() @ kv.float().T) * self.scale
            out[i] = (torch.softmax(scores, dim=-1) @ kv[:, : self.kv_lora_rank].float()).to(q.dtype)
        return out, None

    impl.forward_mqa = forward_mqa
    # [] = any size (vLLM's own convention); MLA metadata checks the common base class, not the backend
    backend.get_supported_head_sizes = classmethod(lambda cls: [])
    mla_attention.MLACommonBackend.get_supported_head_sizes = classmethod(lambda cls: [])
    backend.get_supported_kernel_block_sizes = staticmethod(lambda kv_cache_spec=None: [MultipleOf(16)])
    backend.supports_block_size = classmethod(lambda cls, size: size is None or size % 16 == 0)

    platform = cpu_platform.CpuPlatform
    original = platform.check_and_update_config.__func__

    def check_and_update_config(cls, vllm_config):
        original(cls, vllm_config)
        model = vllm_config.model_config
        if model is not None and getattr(model, "use_mla", False) \
                and vllm_config.cache_config.block_size == MLA_KERNEL_BLOCK:
            vllm_config.cache_config.block_size = SHARED_BLOCK

    platform.check_and_update_config = classmethod(check_and_update_config)
    return {"state": "applied",
            "why": f"CPU_MLA took only head size {widths} at block sizes {blocks}: any width now decodes "
                   f"in torch, and MLA caches use block size {SHARED_BLOCK}, which CPU attention shares"}


# --------------------------------------------------------------------------------------
# boundary0: the aux capture before layer 0 adds a residual that is still None (the seed's bug).


class _GuardResidual(ast.NodeTransformer):
    """The boundary0 fix: ``hidden_states + residual`` inside ``if idx in self.aux_hidden_state_layers:``
    becomes ``hidden_states if residual is None else hidden_states + residual``: boundary 0 is the embedding
    output itself, every other boundary unchanged. (Whether a forward needs it is read by the guard's one
    reader, ``live.guard.adds_unset_residual``.)"""

    def __init__(self):
        self.count = 0
        self._in_aux = 0

    def visit_If(self, node):
        aux = "aux_hidden_state_layers" in ast.unparse(node.test)
        self._in_aux += aux
        self.generic_visit(node)
        self._in_aux -= aux
        return node

    def visit_BinOp(self, node):
        self.generic_visit(node)
        if (self._in_aux and isinstance(node.op, ast.Add) and isinstance(node.right, ast.Name)
                and node.right.id == "residual" and isinstance(node.left, ast.Name)):
            self.count += 1
            test = ast.Compare(ast.Name("residual", ast.Load()), [ast.Is()], [ast.Constant(None)])
            return ast.copy_location(ast.IfExp(test, ast.Name(node.left.id, ast.Load()), node), node)
        return node


def _fix_boundary0() -> dict:
    from vllm.model_executor.models import deepseek_v2

    cls = deepseek_v2.DeepseekV2Model
    func = cls.forward
    source = textwrap.dedent(inspect.getsource(func))
    tree = ast.parse(source)
    fn = tree.body[0]
    if "residual = None" not in source:
        return {"state": "not-needed", "why": "DeepseekV2Model.forward never starts with residual = None"}
    guard = _GuardResidual()
    guard.visit(fn)
    if guard.count == 0:
        return {"state": "not-needed",
                "why": "DeepseekV2Model.forward's aux capture does not add a bare residual"}
    fn.decorator_list = []
    ast.fix_missing_locations(tree)
    namespace: dict = {}
    code = compile(tree, inspect.getsourcefile(func) or "<deepseek_v2>", "exec")
    exec(code, func.__globals__, namespace)   # the release's own forward, one expression changed
    cls.forward = namespace[fn.name]
    return {"state": "applied",
            "why": f"DeepseekV2Model.forward: {guard.count} aux capture(s) of hidden_states + residual "
                   f"now take hidden_states alone while residual is None (boundary 0)"}


# --------------------------------------------------------------------------------------
# The guard: judge the capture vLLM set up, on the live model, before the first token.


CAPTURE_ATTR = "aux_hidden_state_layers"           # the decoder's capture ids (EagleModelMixin and its kin)
RECORDED_ATTR = "_output_aux_hidden_states_kwargs"  # the Transformers modeling backend's (transformers/)
RECORDED_KEY = "output_aux_hidden_state_"


def _capture_snapshot(model) -> dict[int, tuple]:
    """{id(module): (module, its capture values)} for every module holding capture state in its own dict:
    what the release's setter may write. Compared before and after the setter, it names the holder the
    setter really wrote (Plamo3Decoder, not Plamo3Model's class default), whatever the model's shape."""
    out = {}
    for module in model.modules():
        own = vars(module)
        found = {k: (dict(own[k]) if isinstance(own[k], dict) else tuple(own[k]))
                 for k in (CAPTURE_ATTR, RECORDED_ATTR) if k in own and own[k] is not None}
        if found:
            out[id(module)] = (module, found)
    return out


def _written(before: dict[int, tuple], after: dict[int, tuple]) -> list[tuple]:
    """(module, attr) the setter wrote: new or changed capture values; where it wrote the same value again,
    the modules holding a non-empty one (the setter's holder, already set)."""
    changed = [(m, k) for i, (m, vals) in after.items() for k, v in vals.items()
               if before.get(i, (None, {}))[1].get(k) != v]
    if changed:
        return changed
    return [(m, k) for m, vals in after.values() for k, v in vals.items() if v]


class RecordedCapture:
    """The Transformers modeling backend's capture, read as boundaries: its setter records, for id ``l``, the
    output of layer ``l - 1`` (``_layer_names[layer - 1]``), which is boundary ``l`` (id 0 asks for
    ``_layer_names[-1]``, a dict key that does not exist: the setter raises). Setting
    ``aux_hidden_state_layers`` restores what the release's
    setter wrote at launch (the guard's probes go through the setter itself)."""

    def __init__(self, model, num_layers: int):
        self._model, self.layers = model, [None] * num_layers
        self._saved = _aux_state(model)
        inner = getattr(model, "model", None)
        recs = getattr(inner, "_can_record_outputs", None)
        self._records = dict(recs) if isinstance(recs, dict) else None

    @property
    def aux_hidden_state_layers(self) -> tuple[int, ...]:
        kwargs = getattr(self._model, RECORDED_ATTR, None) or {}
        ids = [int(k[len(RECORDED_KEY):]) for k, on in kwargs.items() if on and k.startswith(RECORDED_KEY)]
        return tuple(ids)

    @aux_hidden_state_layers.setter
    def aux_hidden_state_layers(self, _value) -> None:
        _restore_aux_state(self._model, self._saved)
        inner = getattr(self._model, "model", None)
        if self._records is not None and inner is not None:
            inner._can_record_outputs = dict(self._records)


def _num_layers(model) -> int | None:
    for module in model.modules():
        layers = vars(module).get("_modules", {}).get("layers")
        if layers is not None:
            return len(layers)
    text = getattr(model, "text_config", None) or getattr(model, "config", None)
    n = getattr(text, "num_hidden_layers", None)
    return int(n) if n is not None else None


def _highest_index(holder) -> int:
    """The last capture index the live forward loop tests: L when it also captures after the last layer
    (``EagleModelMixin``'s ``idx + 1`` after each layer, or an ``end_layer`` test, as in 0.32's llama.py
    and deepseek_v2.py), else L - 1 (captures at layer entries only), read from the class's own source."""
    n = len(holder.layers)
    try:
        source = inspect.getsource(type(holder).forward)
    except (OSError, TypeError):
        return n - 1
    after_last = "end_layer in self.aux_hidden_state_layers" in source or (
        "_maybe_add_hidden_state" in source and "idx + 1" in source)
    return n if after_last else n - 1


def _boundary0_hazard(holder) -> dict[int, str]:
    """{0: what serving boundary 0 needs} when this release's forward adds a residual that is still None
    there (the seed's bug) and the boundary0 fix is not applied: read by the guard's one reader of that
    hazard (``live.guard.adds_unset_residual``), as SGLang's hooks read it."""
    from helpers.live import guard

    if _applied.get("boundary0", {}).get("state") == "applied":
        return {}
    try:
        source = inspect.getsource(type(holder).forward)
        count = guard.adds_unset_residual(source, CAPTURE_ATTR)
    except (OSError, TypeError, SyntaxError):
        return {}
    if not count:
        return {}
    return {0: f"boundary 0 crashes {type(holder).__name__}.forward here (it adds a residual that is still "
               f"None): launch with {FIXES_ENV}=boundary0"}


class GuardNotInstalled(RuntimeError):
    """Raised from ``register`` under ``refuse``/``strict`` when a model runner this release has cannot be
    hooked: vLLM calls a loaded plugin outside any ``try`` (vllm/plugins/__init__.py
    ``load_general_plugins``), so the launch stops before a model loads."""


V2_UTILS = "vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils"
V2_RUNNER = "vllm.v1.worker.gpu.model_runner"
V2_SETTER = "set_eagle3_aux_hidden_state_layers"


def _feeds_draft() -> bool:
    """False on a pipeline stage before the last: the draft runs on the last stage only (V1
    gpu_model_runner.py:590, V2 gpu/model_runner.py:295-298 in 0.32). A single process (no parallel groups
    set up) feeds it."""
    from vllm.distributed import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return True
    return bool(parallel_state.get_pp_group().is_last_rank)


def _aux_state(holder) -> dict:
    """The holder's own capture state: ``aux_hidden_state_layers`` and, on an ``EagleModelMixin``, the PP
    relay layout its setter caches beside it (``_aux_slot_base_cached``, interfaces.py:1577-1599 in 0.32).
    The guard's setter probes change all of it; restoring the ids alone would leave a probe's relay layout."""
    return {k: v for k, v in vars(holder).items() if "aux" in k}


def _restore_aux_state(holder, saved: dict) -> None:
    for k in [k for k in vars(holder) if "aux" in k and k not in saved]:
        delattr(holder, k)
    for k, v in saved.items():
        setattr(holder, k, v)


def _judge(model, spec, ids, runner: str, before: dict[int, tuple]) -> None:
    """The guard on the model vLLM's own code has just given its capture layers (either runner): the holder
    is what the setter wrote (``before``: the capture state before it ran). Every way it cannot judge goes
    through the guard's one unjudged path: ``refuse`` stops the launch with one line, ``warn`` starts."""
    from helpers.live import guard

    if guard.mode() is guard.Mode.OFF or getattr(spec, "method", None) != "eagle3":
        return
    import vllm

    draft = getattr(getattr(spec, "draft_model_config", None), "model", None)

    def report(row: dict) -> None:
        _report({"guard": row, "runner": runner})

    try:
        if model is None or draft is None:
            missing = "model" if model is None else "draft path"
            raise RuntimeError(f"the {runner.upper()} runner gave the guard no {missing}")
        written = _written(before, _capture_snapshot(model))
        if not written:
            raise RuntimeError(f"vLLM's setter wrote no capture state the guard can read ({CAPTURE_ATTR} or "
                               f"{RECORDED_ATTR}) on any module of {type(model).__name__}")
        holder, attr = written[0]
        if attr == RECORDED_ATTR:
            n = _num_layers(model)
            if n is None:
                raise RuntimeError(f"{type(model).__name__}'s depth cannot be read")
            holder, highest, hazards = RecordedCapture(model, n), n, {}
        else:
            highest, hazards = _highest_index(holder), _boundary0_hazard(holder)
        feeds = _feeds_draft()
    except Exception as exc:      # noqa: BLE001 - one path for every way the guard cannot judge
        guard.cannot_judge(guard.mode(), draft, exc, report, engine=f"vllm {vllm.__version__}")
        return
    saved = _aux_state(holder) if not isinstance(holder, RecordedCapture) else None
    try:
        guard.at_load(family="vllm", version=vllm.__version__, draft=draft, holder=holder,
                      attr=CAPTURE_ATTR, highest=highest, ids=ids, hazards=hazards, feeds_draft=feeds,
                      set_ids=lambda layers: model.set_aux_hidden_state_layers(tuple(layers)),
                      report=report)
    finally:
        if saved is not None:
            _restore_aux_state(holder, saved)
        else:
            holder.aux_hidden_state_layers = None      # what the release's setter wrote at launch


V1_RUNNER = "vllm.v1.worker.gpu_model_runner"


def _hook_v1() -> str | None:
    """V1 (``vllm/v1/worker/gpu_model_runner.py``, which the CPU runner subclasses up to 0.33): its own method
    that sets the capture layers, judged after it ran. None when this release has no V1 runner (0.34 on)."""
    import importlib.util

    if importlib.util.find_spec(V1_RUNNER) is None:
        return None
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    setup = "_setup_eagle3_aux_hidden_state_outputs"     # its own method from 0.2x; inside load_model before
    name = setup if hasattr(GPUModelRunner, setup) else "load_model"
    original = getattr(GPUModelRunner, name)

    import torch

    def judged(self, *args, **kwargs):
        model = getattr(self, "model", None)
        before = _capture_snapshot(model) if isinstance(model, torch.nn.Module) else {}
        out = original(self, *args, **kwargs)
        if getattr(self, "use_aux_hidden_state_outputs", False):
            model = self.get_model() if hasattr(self, "get_model") else getattr(self, "model", None)
            from_config = getattr(self, "_get_eagle3_aux_layers_from_config", None)
            ids = from_config() if from_config else None
            _judge(model, getattr(self, "speculative_config", None), ids, "v1", before)
        return out

    setattr(GPUModelRunner, name, judged)
    return f"GPUModelRunner.{name}"


def _hook_v2() -> str | None:
    """V2 (``vllm/v1/worker/gpu/model_runner.py``, a class of its own): ``load_model`` calls
    ``set_eagle3_aux_hidden_state_layers(self.model, self.speculative_config)``, a name it imports from
    ``eagle3_utils``. The name is wrapped there, so the runner binds the wrapper when it is imported later,
    and rebound in the runner's module when it is already loaded; first the runner's own file is read to
    check that it imports and calls that name. None when this release has no V2 runner, or an early one
    without ``eagle3_utils`` (it never configures aux capture)."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("vllm.v1.worker.gpu") is None:
        return None
    try:
        has_utils = importlib.util.find_spec(V2_UTILS) is not None
    except ModuleNotFoundError:      # spec_decode/eagle.py, a module, in the early V2 runners
        has_utils = False
    if not has_utils:
        return None            # an early V2 runner: it never sets aux capture, so nothing to judge there
    spec = importlib.util.find_spec(V2_RUNNER)
    if spec is None or not spec.origin:
        raise RuntimeError(f"{V2_RUNNER} is missing")
    with open(spec.origin, encoding="utf-8") as fh:
        if v2_calls_setter(fh.read()) is None:
            raise RuntimeError(f"V2 GPUModelRunner.load_model does not call {V2_SETTER} from eagle3_utils")
    utils = importlib.import_module(V2_UTILS)
    original = getattr(utils, V2_SETTER)
    runner = sys.modules.get(V2_RUNNER)
    if runner is not None and getattr(runner, V2_SETTER, None) is not original:
        raise RuntimeError(f"{V2_RUNNER} does not bind {V2_UTILS}.{V2_SETTER}")

    def judged(model, spec_config, *args, **kwargs):
        before = _capture_snapshot(model)
        out = original(model, spec_config, *args, **kwargs)
        _judge(model, spec_config, utils.get_eagle3_aux_layers_from_config(spec_config), "v2", before)
        return out

    judged.__wrapped__ = original
    setattr(utils, V2_SETTER, judged)
    if runner is not None:
        setattr(runner, V2_SETTER, judged)
    return f"{V2_SETTER} (eagle3_utils, as gpu/model_runner.py imports it)"


def _install_guard() -> None:
    """Hook every model runner this release has; one marker line on stderr names the release, the hook sites
    and the runners it does not have (nothing when off). A runner the release does not have is absent, not
    a failure (0.34 deleted V1). A runner it has but the plugin cannot hook, or no runner at all:
    ``refuse``/``strict`` raise ``GuardNotInstalled``, ``warn`` says so and the engine starts unjudged."""
    from helpers.live import guard

    how = guard.mode()
    if how is guard.Mode.OFF or "guard" in _applied:
        return
    try:
        import vllm

        release = f"vllm {vllm.__version__}"
    except Exception:          # noqa: BLE001 - the marker names what it can
        release = "vllm"
    hooked: dict[str, str] = {}
    failed: dict[str, str] = {}
    absent: list[str] = []
    for label, hook in (("V1", _hook_v1), ("V2", _hook_v2)):
        try:
            where = hook()
        except Exception as exc:     # noqa: BLE001 - any failure is the reason given
            failed[label] = f"{type(exc).__name__}: {exc}"
            continue
        if where:
            hooked[label] = where
        else:
            absent.append(label)
    if not hooked and not failed:
        failed["any"] = "no model runner found"
    runners = "+".join(hooked)
    record = {"state": "installed" if not failed else ("partial" if hooked else "failed"), "mode": str(how),
              "release": release, "runners": list(hooked), "hooks": hooked, "failed": failed,
              "absent": absent}
    _applied["guard"] = record
    _report({"guard_install": record})
    sites = "; ".join(f"{k}: {v}" for k, v in hooked.items())
    tail = f" ({sites})" if sites else ""
    tail += f"; no {'/'.join(absent)} runner in this release" if absent else ""
    if failed:
        why = "; ".join(f"{k}: {v}" for k, v in failed.items())
        line = f"{guard.PREFIX} ({release}, {how}): not installed on {'+'.join(failed)} ({why})"
        if how.refusing:
            sys.stderr.write(line + "; refusing to serve unguarded\n")
            sys.stderr.flush()
            raise GuardNotInstalled(line + "; refusing to serve unguarded")
        line += f"; installed on {runners} runners{tail}" if hooked else ""
        sys.stderr.write(line + "; a launch there starts unjudged\n")
    else:
        sys.stderr.write(f"{guard.PREFIX} ({release}, {how}): installed on {runners} runners{tail}\n")
    sys.stderr.flush()


_FIX_FUNCS = {"rope3d": _fix_rope3d, "mla_width": _fix_mla_width, "boundary0": _fix_boundary0}
