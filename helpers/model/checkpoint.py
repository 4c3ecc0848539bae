"""The EAGLE-3 draft's checkpoints: the formats real drafts ship in, read into ``draft.Eagle3Draft`` and
written back (the role speculators' ``convert/`` plays; the module itself lives in ``model.draft``).

Formats read and written:
- SGLang / SpecForge / EAGLE reference: ``architectures: ["LlamaForCausalLMEagle3"]``, ids under
  ``eagle_config.eagle_aux_hidden_state_layer_ids``, weights ``midlayer.*``.
- speculators: ``architectures: ["Eagle3Speculator"]``, ``transformer_layer_config``,
  top-level ``eagle_aux_hidden_state_layer_ids``, weights ``layers.0.*``.

Weights are read from ``model.safetensors``, a sharded ``model.safetensors.index.json``, or
``pytorch_model.bin`` (the EAGLE reference code and some SpecForge runs write only that), under
either layer prefix, since tools mix them. Real drafts differ in ways that change the forward
without changing any tensor shape (``norm_before_residual``, a missing or partial vocabulary
map), so those are read and checked here rather than left to defaults that would run silently.
"""
from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ..engines.sglang.rule import NORM_BEFORE_RESIDUAL_ON_SGLANG
from ..errors import BadConfig, check_finite_weights, pickle_refusal
from ..record import read_record
from ..rules.conventions import (
    MLA_DRAFT_ARCH,
    SPECULATORS_ARCH,
    architectures,
    ids_in_config,
    is_eagle_reference_config,
    read_draft_config,
)
from ..rules.flags import FORWARD_FLAGS, draft_flags, engine_draft_class
from .draft import SGLANG_ARCH, DraftConfig, DraftFormatError, Eagle3Draft, ServingMismatchWarning


class NoEmbeddingError(DraftFormatError):
    """The draft ships no embed_tokens and no target was given to borrow the embedding from."""


def _layer_cfg_from(cfg_json: dict) -> dict:
    return cfg_json.get("transformer_layer_config") or cfg_json


def _need(d: dict, key: str, where: str = "config"):
    """A field the forward cannot be built without: a BadConfig naming it, not a bare KeyError."""
    if key not in d or d[key] is None:
        raise BadConfig(f"{where} lacks {key!r}; an EAGLE-3 draft config must state hidden_size, "
                        f"intermediate_size, num_attention_heads and vocab_size")
    return d[key]


def draft_format(cfg_json: dict) -> str:
    arch = next(iter(architectures(cfg_json)), "")
    if arch == SPECULATORS_ARCH or cfg_json.get("speculators_model_type") == "eagle3":
        return "speculators"
    if "eagle3" in arch.lower() or "eagle_config" in cfg_json or is_eagle_reference_config(cfg_json):
        return "sglang"                      # the EAGLE reference head has SGLang's weight names
    raise DraftFormatError(f"config architectures {list(architectures(cfg_json))} is not an EAGLE-3 draft "
                           f"(expected {SGLANG_ARCH}, {MLA_DRAFT_ARCH} or {SPECULATORS_ARCH})")


def _flag(cfg_json: dict, layer: dict, name: str) -> bool:
    """A boolean the tools write top-level (speculators, SGLang-style configs) or, rarely, in the
    layer config. A string such as "true" is refused: it would read as set whatever it says."""
    value = cfg_json.get(name, layer.get(name, False))
    if value is None:
        return False
    if not isinstance(value, bool):
        raise DraftFormatError(f"config {name} is {value!r}; expected true or false")
    return value


def _mla_fields(layer: dict) -> dict:
    """The DeepSeek attention numbers an MLA draft config must state (as the published Kimi-K2.5
    MLA drafts do); q_lora_rank may be null (a full q_proj, which vLLM builds and SGLang refuses)."""
    out = {}
    for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        value = layer.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise DraftFormatError(f"MLA draft ({MLA_DRAFT_ARCH}) config {key} is {value!r}; expected a "
                                   f"positive integer (kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, "
                                   f"v_head_dim)")
        out[key] = value
    if out["qk_rope_head_dim"] % 2:
        raise DraftFormatError(f"MLA draft qk_rope_head_dim is {out['qk_rope_head_dim']}; rotary dims "
                               f"come in pairs, so it must be even")
    q = layer.get("q_lora_rank")
    if q is not None and (not isinstance(q, int) or isinstance(q, bool) or q < 1):
        raise DraftFormatError(f"MLA draft q_lora_rank is {q!r}; expected a positive integer or null")
    rs = layer.get("rope_scaling") or layer.get("rope_parameters") or None
    interleave = layer.get("rope_interleave", True)
    return {**out, "q_lora_rank": q, "rope_interleave": bool(interleave),
            "rope_scaling": dict(rs) if isinstance(rs, dict) else None}


def config_from_json(cfg_json: dict) -> DraftConfig:
    fmt = draft_format(cfg_json)
    layer = _layer_cfg_from(cfg_json)
    arch = SPECULATORS_ARCH if fmt == "speculators" else next(iter(architectures(cfg_json)), SGLANG_ARCH)
    flags = draft_flags(cfg_json)
    for name in FORWARD_FLAGS:
        _flag(cfg_json, layer, name)                  # a non-boolean value is refused, not read as set
    h = _need(layer, "hidden_size")
    heads = _need(layer, "num_attention_heads")
    ids, where = ids_in_config(cfg_json)
    rope = layer.get("rope_parameters") or layer.get("rope_scaling") or {}
    theta = layer.get("rope_theta") or rope.get("rope_theta") or 10000.0
    nested = cfg_json.get("eagle_config") if isinstance(cfg_json.get("eagle_config"), dict) else {}
    nested_ids = nested.get("eagle_aux_hidden_state_layer_ids")
    k = cfg_json.get("num_aux_hidden_states") or (len(nested_ids) if isinstance(nested_ids, list) else 3)
    mla = _mla_fields(layer) if engine_draft_class(arch) == "mla" else {}
    return DraftConfig(
        hidden_size=h, intermediate_size=_need(layer, "intermediate_size"), num_attention_heads=heads,
        num_key_value_heads=layer.get("num_key_value_heads") or heads,
        head_dim=layer.get("head_dim") or h // heads,
        vocab_size=cfg_json.get("vocab_size") or _need(layer, "vocab_size"),
        draft_vocab_size=(cfg_json.get("draft_vocab_size") or layer.get("draft_vocab_size")
                          or _need(layer, "vocab_size")),
        target_hidden_size=cfg_json.get("target_hidden_size") or layer.get("target_hidden_size") or h,
        num_aux=int(k),
        rms_norm_eps=layer.get("rms_norm_eps", 1e-6), rope_theta=float(theta),
        max_position_embeddings=layer.get("max_position_embeddings", 2048),
        eagle_ids=ids, ids_location=where, format=fmt, arch=arch, **flags, **mla,
    )


def _llama_layer_json(cfg: DraftConfig) -> dict:
    return {
        "model_type": "llama", "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim, "num_hidden_layers": 1, "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings, "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }


def _mla_layer_json(cfg: DraftConfig) -> dict:
    """As k-l-lambda/Kimi-K2.5-Eagle3 and lightseekorg/kimi-k2.5-eagle3-mla write it: DeepSeek keys
    on a one-layer config (``model_type`` kimi_k2)."""
    out = {**_llama_layer_json(cfg), "model_type": "kimi_k2", "q_lora_rank": cfg.q_lora_rank,
           "kv_lora_rank": cfg.kv_lora_rank, "qk_nope_head_dim": cfg.qk_nope_head_dim,
           "qk_rope_head_dim": cfg.qk_rope_head_dim, "v_head_dim": cfg.v_head_dim,
           "rope_scaling": cfg.rope_scaling, "num_key_value_heads": cfg.num_attention_heads}
    if not cfg.rope_interleave:
        out["rope_interleave"] = False
    return out


def config_to_json(cfg: DraftConfig, fmt: str, extra: dict | None = None) -> dict:
    """The config a real tool would write for ``cfg``; forward flags only when set (as SpecForge,
    ModelOpt and TorchSpec write them), ``num_aux_hidden_states`` when fc is not 3 slots wide
    (engines size fc from it, then from the ids' count)."""
    flags = {f: True for f in FORWARD_FLAGS if getattr(cfg, f)}
    if fmt == "sglang":
        layer = _mla_layer_json(cfg) if cfg.mla else _llama_layer_json(cfg)
        out = {"architectures": [MLA_DRAFT_ARCH if cfg.mla else SGLANG_ARCH], **layer,
               "draft_vocab_size": cfg.draft_vocab_size, "target_hidden_size": cfg.target_hidden_size}
        if cfg.eagle_ids is not None:
            out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(cfg.eagle_ids),
                                   "use_aux_hidden_state": True}
        out.update(flags)     # top-level, where both engines read them (norm_before_fc also nested)
    elif fmt == "speculators":
        if cfg.mla:
            raise ValueError(f"an MLA draft has no speculators format (speculators and vLLM's speculators "
                             f"mapping know llama and qwen3 layers); save it as fmt='sglang' "
                             f"({MLA_DRAFT_ARCH})")
        out = {"architectures": [SPECULATORS_ARCH], "speculators_model_type": "eagle3",
               "transformer_layer_config": _llama_layer_json(cfg), "draft_vocab_size": cfg.draft_vocab_size,
               "target_hidden_size": cfg.target_hidden_size, **flags,
               "norm_before_residual": cfg.norm_before_residual, "speculators_version": "0.5.0"}
        if cfg.eagle_ids is not None:
            out["eagle_aux_hidden_state_layer_ids"] = list(cfg.eagle_ids)
    else:
        raise ValueError(f"unknown draft format {fmt!r}; expected 'sglang' or 'speculators'")
    if cfg.num_aux != 3:
        out["num_aux_hidden_states"] = cfg.num_aux
    out.update(extra or {})
    return out


def _layer_prefix(fmt: str) -> str:
    return "midlayer." if fmt == "sglang" else "layers.0."


def save_draft(draft: Eagle3Draft, out_dir: str | Path, fmt: str = "sglang", extra_config: dict | None = None,
               dtype: torch.dtype = torch.bfloat16, with_embedding: bool | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors``.

    The embedding normally stays with the target (engines borrow it); a draft whose width
    differs from the target's cannot borrow it, so by default its own is written, or the
    checkpoint could not be loaded again. ``with_embedding`` overrides that choice.
    """
    out = Path(out_dir)
    if with_embedding is None:
        with_embedding = draft.cfg.hidden_size != draft.cfg.target_hidden_size
    cfg_json = config_to_json(draft.cfg, fmt, extra_config)     # rejects an unknown format before any write
    out.mkdir(parents=True, exist_ok=True)
    prefix = _layer_prefix(fmt)
    tensors = {}
    for name, t in draft.state_dict().items():
        if name.startswith("embed_tokens.") and not with_embedding:
            continue
        key = prefix + name[len("midlayer."):] if name.startswith("midlayer.") else name
        tensors[key] = t.detach().to(dtype).contiguous() if t.is_floating_point() else t.contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg_json, indent=2) + "\n", encoding="utf-8")
    return out


# Looked for in this order (the order transformers prefers); the first present is read.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


_LAYER_PREFIXES = ("midlayer.", "layers.0.")


# Some speculators versions keep the verifier's frozen head beside the draft; it is the
# target's, not part of the draft's forward.
_VERIFIER_PREFIXES = ("verifier_lm_head.", "verifier_norm.")


def _read_weight_file(f: Path, as_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """``as_dtype``: floating tensors converted as each is read, so a large draft never holds its
    stored (bf16) copy and its compute (fp32) copy whole at the same time."""
    if f.name.endswith(".safetensors"):
        try:
            if as_dtype is None:
                return load_file(str(f))
            out = {}
            with safe_open(str(f), framework="pt") as st:
                for k in st.keys():
                    t = st.get_tensor(k)
                    out[k] = t.to(as_dtype) if t.is_floating_point() else t
            return out
        except Exception as e:  # SafetensorError (truncated, bad header) has no importable base class
            raise DraftFormatError(f"{f} is not a readable safetensors file ({type(e).__name__}: "
                                   f"{str(e).splitlines()[0] if str(e) else 'no detail'}); truncated or "
                                   f"overwritten? expected a complete model.safetensors") from None
    try:
        obj = torch.load(f, weights_only=True, map_location="cpu")
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as e:
        raise DraftFormatError(f"{f} is not a weights-only PyTorch state dict ({pickle_refusal(e)}); "
                               f"expected safetensors or plain tensors") from e
    if not isinstance(obj, dict):
        raise DraftFormatError(f"{f} holds a {type(obj).__name__}; expected a dict of tensor name -> tensor")
    bad = [f"{k!r} ({type(v).__name__})" for k, v in obj.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise DraftFormatError(f"{f} holds non-tensor entries {bad[:5]}; expected a dict of tensor name -> "
                               f"tensor")
    return obj


def _read_sharded(index: Path, as_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Shards named by ``weight_map``; every mapped key must be found in its shard, or the
    checkpoint is incomplete (a shard overwritten or from another run)."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
    except (json.JSONDecodeError, AttributeError) as e:
        raise DraftFormatError(f"{index} is not a shard index: expected JSON with a weight_map") from e
    if not isinstance(weight_map, dict) or not weight_map:
        raise DraftFormatError(f"{index} has no weight_map {{tensor name: shard file}}; got {weight_map!r}")
    out: dict[str, torch.Tensor] = {}
    held: dict[str, str] = {}           # tensor -> the shard it came from
    for shard in sorted(set(weight_map.values())):
        f = index.parent / shard
        if not f.is_file():
            raise FileNotFoundError(f"{index} names shard {shard}, which is not in {index.parent}")
        tensors = _read_weight_file(f, as_dtype)
        twice = sorted(k for k in tensors if k in held)
        if twice:    # which copy the draft would run is an accident of file order
            raise DraftFormatError(f"{index}: tensor {twice[0]!r} is in two shards ({held[twice[0]]} and "
                                   f"{shard}){f' (and {len(twice) - 1} more)' if len(twice) > 1 else ''}; "
                                   f"expected each tensor in the one shard weight_map names")
        held.update(dict.fromkeys(tensors, shard))
        out.update(tensors)
    lost = [f"{k} (in {v})" for k, v in weight_map.items() if k not in out]
    if lost:
        raise DraftFormatError(f"{index} maps tensors its shards do not hold: {lost[:5]}")
    return out


def read_draft_weights(path: str | Path,
                       as_dtype: torch.dtype | None = None) -> tuple[dict[str, torch.Tensor], Path]:
    """The raw tensors of a draft directory (floating ones in ``as_dtype`` when given), and the
    file they came from (for error messages)."""
    path = Path(path)
    for name in WEIGHT_FILES:
        f = path / name
        if f.is_file():
            return (_read_sharded(f, as_dtype) if name.endswith(".index.json")
                    else _read_weight_file(f, as_dtype)), f
    raise FileNotFoundError(f"no weights at {path / WEIGHT_FILES[0]}: expected one of "
                            f"{', '.join(WEIGHT_FILES)} in {path}")


def canonical_state(raw: dict[str, torch.Tensor],
                    source: str | Path = "checkpoint") -> dict[str, torch.Tensor]:
    """Map the names real drafts use onto this module's: the layer as ``midlayer.*`` whether
    the file says ``midlayer.*`` (SGLang, SpecForge, EAGLE reference) or ``layers.0.*``
    (speculators), with an HF-style ``model.`` wrapper dropped. A second decoder layer is
    refused rather than dropped: the draft would run without it."""
    state: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    deeper: set[str] = set()
    for key, v in raw.items():
        k = key[len("model."):] if key.startswith("model.") else key
        if k.startswith(_VERIFIER_PREFIXES):
            continue
        if k.startswith("layers.0."):
            k = "midlayer." + k[len("layers.0."):]
        elif k.startswith("layers.") and k.split(".")[1].isdigit():
            deeper.add(f"layers.{k.split('.')[1]}.*")
            continue
        if k in state:
            raise DraftFormatError(f"{source} holds both {origin[k]!r} and {key!r}, two names for the "
                                   f"draft's {k}")
        state[k] = v
        origin[k] = key
    if deeper:
        raise DraftFormatError(f"{source} has weights for more decoder layers ({', '.join(sorted(deeper))}); "
                               f"this draft, like SGLang's LlamaForCausalLMEagle3, runs exactly one "
                               f"(midlayer.* or layers.0.*)")
    return state


def _vocab_buffers(state: dict, cfg: DraftConfig, source) -> tuple[torch.Tensor, torch.Tensor]:
    """``d2t`` is what engines use (vLLM and SGLang drop ``t2d``), so it is required whenever
    the draft vocabulary is a subset; ``t2d`` follows from it and, when shipped, must agree."""
    d2t, t2d = state.get("d2t"), state.get("t2d")
    if d2t is None:
        if cfg.draft_vocab_size != cfg.vocab_size:
            has = "t2d but no d2t" if t2d is not None else "no d2t"
            raise DraftFormatError(
                f"{source} has {has}, but draft_vocab_size {cfg.draft_vocab_size} differs from the target "
                f"vocab_size {cfg.vocab_size}: an identity map (draft id i = target id i) is only right when "
                f"they are equal, and engines read only d2t")
        d2t = torch.zeros(cfg.draft_vocab_size, dtype=torch.long)
    if d2t.is_floating_point() or d2t.dtype == torch.bool or d2t.dim() != 1:
        raise DraftFormatError(f"d2t is {d2t.dtype} of shape {tuple(d2t.shape)}; expected int64 offsets of "
                               f"shape ({cfg.draft_vocab_size},)")
    d2t = d2t.long()
    check_vocab_map(d2t, cfg)
    derived = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    derived[torch.arange(d2t.numel()) + d2t] = True
    if t2d is None:
        return d2t, derived
    if tuple(t2d.shape) != (cfg.vocab_size,):
        raise DraftFormatError(f"t2d has shape {tuple(t2d.shape)}; expected ({cfg.vocab_size},), one flag "
                               f"per target id")
    t2d = t2d.bool()
    if not torch.equal(t2d, derived):
        i = int((t2d != derived).nonzero()[0])
        raise DraftFormatError(
            f"t2d and d2t disagree: t2d marks {int(t2d.sum())} target ids, d2t maps to {int(derived.sum())}; "
            f"first difference at target id {i} (t2d says {bool(t2d[i])}, d2t says {bool(derived[i])})")
    return d2t, t2d


def load_draft(path: str | Path, target=None, device="cpu", dtype=torch.float32) -> Eagle3Draft:
    """Read any of the formats above.

    ``target`` supplies the embedding when the checkpoint has none (and is checked for fit);
    a checkpoint's own ``embed_tokens`` wins, as it does in SGLang and vLLM. Warns with
    :class:`ServingMismatchWarning` where SGLang would run the draft differently.
    """
    path = Path(path)
    cfg_json = read_draft_config(path)
    try:
        cfg = config_from_json(cfg_json)
    except (BadConfig, DraftFormatError) as exc:
        raise type(exc)(f"{path / 'config.json'}: {exc}") from None
    raw, source = read_draft_weights(path, as_dtype=dtype)
    state = canonical_state(raw, source)
    if "fc.weight" not in state:
        raise DraftFormatError(f"{source} has no fc.weight; keys start {sorted(raw)[:5]}")
    check_finite_weights(state.items(), f"draft {source}")
    if state["fc.weight"].dim() != 2 or state["fc.weight"].shape[0] != cfg.hidden_size:
        raise DraftFormatError(f"{path / 'config.json'} says hidden_size {cfg.hidden_size}, but {source} "
                               f"holds fc.weight {tuple(state['fc.weight'].shape)} "
                               f"({state['fc.weight'].shape[0]} wide): the config does not describe these "
                               f"weights")
    fc_in = state["fc.weight"].shape[1]
    stated = cfg_json.get("target_hidden_size") or _layer_cfg_from(cfg_json).get("target_hidden_size")
    hint = "" if stated else (" (the config has no target_hidden_size, so the draft's own hidden size was "
                              "assumed)")
    if fc_in % cfg.target_hidden_size:
        raise DraftFormatError(f"fc.weight is {tuple(state['fc.weight'].shape)}; its input width {fc_in} is "
                               f"not a multiple of the target hidden size {cfg.target_hidden_size}{hint}")
    if target is not None and hint and cfg.target_hidden_size != target.config.hidden_size:
        raise DraftFormatError(f"draft expects target hidden size {cfg.target_hidden_size}; the target has "
                               f"{target.config.hidden_size}{hint}; fc.weight is "
                               f"{tuple(state['fc.weight'].shape)}")
    cfg.num_aux = fc_in // cfg.target_hidden_size
    own_embedding = "embed_tokens.weight" in state
    if target is not None:
        check_fits_target(cfg, target, has_own_embedding=own_embedding)
    with torch.device("meta"):      # no random init: a 7168-wide draft would hold its weights twice
        draft = Eagle3Draft(cfg)
    if not own_embedding:
        if target is None:
            raise NoEmbeddingError("the draft has no embed_tokens; pass the target to borrow its embedding")
        state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().to(dtype, copy=True)
    state["d2t"], state["t2d"] = _vocab_buffers(state, cfg, source)
    expected = draft.state_dict()
    wrong = [f"{k} {tuple(v.shape)} (config implies {tuple(expected[k].shape)})"
             for k, v in state.items() if k in expected and tuple(v.shape) != tuple(expected[k].shape)]
    if wrong:
        raise DraftFormatError(f"draft weights disagree with {path / 'config.json'}: " + "; ".join(wrong))
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    for key, flag in (("input_norm.weight", "norm_before_fc"), ("fc_norm.0.weight", "fc_norm")):
        if key in unexpected or key in missing:
            has = "holds" if key in unexpected else "lacks"
            raise DraftFormatError(
                f"{source} {has} {key.split('.')[0]}.* but {path / 'config.json'} "
                f"{'does not set' if key in unexpected else 'sets'} {flag}: engines build the norm from the "
                f"config and skip weights they did not build, so this checkpoint would be served "
                f"{'without the norm it was trained with' if key in unexpected else 'with an untrained norm'}"
                f"; expected the flag and the weights together")
    if missing or unexpected:
        raise DraftFormatError(
            f"{source} does not match an EAGLE-3 draft{' with MLA attention' if cfg.mla else ''}: missing "
            f"{missing}, unexpected {unexpected} (expected fc.weight, norm.weight, lm_head.weight, one "
            f"decoder layer under midlayer.* or layers.0.*, optionally embed_tokens.weight, d2t, t2d)")
    del raw                         # the state holds the same tensors; converting one at a time frees each
    for k in list(state):
        if state[k].is_floating_point():
            state[k] = state[k].to(dtype)
    draft.load_state_dict(state, assign=True)
    draft.embed_tokens.weight.requires_grad_(False)
    if cfg.norm_before_residual:
        warnings.warn(f"{path}: {NORM_BEFORE_RESIDUAL_ON_SGLANG} Evaluate what SGLang runs by setting "
                      f"draft.cfg.norm_before_residual = False.", ServingMismatchWarning, stacklevel=2)
    return draft.to(device=device, dtype=dtype).eval()


def check_vocab_map(d2t: torch.Tensor, cfg: DraftConfig) -> None:
    if d2t.numel() != cfg.draft_vocab_size:
        raise DraftFormatError(f"d2t has {d2t.numel()} entries; draft_vocab_size is {cfg.draft_vocab_size}")
    ids = d2t + torch.arange(d2t.numel())
    bad = ((ids < 0) | (ids >= cfg.vocab_size)).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        raise DraftFormatError(f"d2t maps draft id {i} to target id {int(ids[i])}, outside the target "
                               f"vocabulary 0..{cfg.vocab_size - 1}")


def check_fits_target(cfg: DraftConfig, target, has_own_embedding: bool = False) -> None:
    """A draft may be narrower or wider than its target (``target_hidden_size`` set, fc input
    n x target width); then it cannot borrow the target's embedding and must ship its own."""
    tcfg = target.config
    th = tcfg.hidden_size
    tv = tcfg.vocab_size
    if cfg.target_hidden_size != th:
        raise DraftFormatError(f"draft expects target hidden size {cfg.target_hidden_size}; the target has "
                               f"{th}")
    if cfg.num_aux * th != cfg.fc_in or cfg.num_aux < 1:
        raise DraftFormatError(f"draft fc input {cfg.fc_in} is not a multiple of the target hidden size {th}")
    if cfg.vocab_size != tv:
        raise DraftFormatError(f"draft vocab_size is {cfg.vocab_size}; the target's vocabulary has {tv} "
                               f"tokens")
    width = target.get_input_embeddings().weight.shape[1]
    if cfg.hidden_size != width and not has_own_embedding:
        raise DraftFormatError(
            f"draft hidden size {cfg.hidden_size} differs from the target's embedding width {width}, so it "
            f"cannot share it: expected the checkpoint to ship its own embed_tokens.weight "
            f"[{cfg.vocab_size}, {cfg.hidden_size}]; it has none")


def read_training_record(path: str | Path) -> dict | None:
    """``training.json`` beside a draft, as written (its layout and metric log), through the one reader and
    validation every command shares (``helpers.record``)."""
    rec = read_record(path)
    return rec.raw if rec else None
