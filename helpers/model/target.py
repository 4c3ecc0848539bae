"""The target model: configs for the embedded families, and loading (``factory.target_training`` trains one).

The default target is a miniature of Kimi-K2.5's family -- DeepSeek-V3 (MLA attention,
MoE with a shared expert, first layer dense) -- because that is the class SGLang serves
through ``deepseek_v2.py``, where the seed's bug lived. A Llama-family variant exists so
the workbook is exercised on a second family with a different id convention.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import torch

from ..errors import (
    BadCheckpoint,
    BadConfig,
    check_architectures,
    check_finite_weights,
    pickle_refusal,
    read_json_file,
    safetensors_shapes_of,
    warn_once,
)
from ..rules.conventions import architectures


def target_config(arch: str, vocab_size: int, num_layers: int, hidden: int = 256, max_pos: int = 1024,
                  special_ids: dict | None = None):
    """A small config of the asked family; the numbers keep a 12-layer model CPU-trainable.
    ``special_ids``: the tokenizer's ``bos/eos/pad_token_id`` (default 0, 1, 2)."""
    from transformers import DeepseekV3Config, LlamaConfig

    common = dict(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=num_layers,
                  max_position_embeddings=max_pos, tie_word_embeddings=False, rms_norm_eps=1e-6,
                  **(special_ids or {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}))
    if arch == "deepseek_v3":
        return DeepseekV3Config(
            **common, intermediate_size=2 * hidden, moe_intermediate_size=hidden // 2,
            num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
            num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
            routed_scaling_factor=1.0, kv_lora_rank=64, q_lora_rank=None, qk_rope_head_dim=16,
            qk_nope_head_dim=32, v_head_dim=32, rope_interleave=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            # Real DeepSeek-V3/Kimi configs name the router HF always builds (sigmoid scores, a
            # correction bias); vLLM reads these keys and builds another router without them.
            topk_method="noaux_tc", scoring_func="sigmoid",
        )
    if arch == "llama":
        return LlamaConfig(**common, intermediate_size=2 * hidden + hidden // 2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=hidden // 4,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    raise ValueError(f"unknown target family {arch!r}; expected 'deepseek_v3' or 'llama'")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "tiktoken.model",
                   "tokenizer.tiktoken")


def check_target_folder(path: str | Path) -> dict:
    """Everything about a target folder that can be judged without loading it, in the order a reader
    would look: its config (a model, not a draft), code it asks to run, its weight files complete, a
    tokenizer. Each failure is one line naming the file; the config is returned. Commands call it before
    they look for text or write anything, so a broken target is never reported as something else."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no target model at {path}: expected a Hugging Face directory with "
                                f"config.json")
    cfg = read_json_file(path / "config.json", "target config")
    if not isinstance(cfg, dict):
        raise BadConfig(f"{path / 'config.json'} holds a JSON {type(cfg).__name__}; expected an object (a "
                        f"model config)")
    check_architectures(cfg, path / "config.json")
    archs = architectures(cfg)
    if (cfg.get("speculators_model_type")
            or any("eagle" in str(a).lower() or "speculator" in str(a).lower() for a in archs)):
        raise BadCheckpoint(f"{path} holds an EAGLE-3 draft "
                            f"({', '.join(map(str, archs)) or cfg.get('speculators_model_type')}), "
                            "not a target: pass the target model as the target and the draft as the draft")
    _check_custom_code(path, cfg)
    _check_weight_files(path)
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise BadCheckpoint(f"no tokenizer in {path}: expected {TOKENIZER_FILES[0]} (or "
                            f"{', '.join(TOKENIZER_FILES[1:4])}) beside config.json, as the model was "
                            f"published")
    return cfg


def _check_custom_code(path: Path, cfg: dict) -> None:
    """A config whose ``auto_map`` names Python files asks its loader to run them. The workbook never
    runs a checkpoint's own code: where transformers implements the ``model_type`` that implementation
    runs (said once), otherwise the target is refused."""
    auto_map = cfg.get("auto_map")
    if not auto_map:
        return
    refs = auto_map.values() if isinstance(auto_map, dict) else [auto_map]
    modules = sorted({str(r).split("--")[-1].rsplit(".", 1)[0] + ".py" for v in refs
                      for r in (v if isinstance(v, (list, tuple)) else [v]) if r})
    from transformers import CONFIG_MAPPING

    model_type = cfg.get("model_type")
    if isinstance(model_type, str) and model_type in CONFIG_MAPPING:
        warn_once(f"{path / 'config.json'}: auto_map names the checkpoint's own code "
                  f"({', '.join(modules)}); the workbook never runs it and loads transformers' {model_type} "
                  f"implementation")
        return
    raise BadCheckpoint(f"{path / 'config.json'}: model_type {model_type!r} is not one transformers "
                        f"implements and auto_map names the checkpoint's own code ({', '.join(modules)}), "
                        f"which the "
                        f"workbook does not run; expected a model_type transformers knows (a checkpoint of a "
                        f"known architecture published with custom code can name it, e.g. deepseek_v3)")


def _check_weight_files(path: Path) -> None:
    """Weight files present, and every safetensors file whole (``errors.safetensors_shapes_of``): its header
    parses and its tensors end where the file ends (a truncated copy fails here, named, not in a loader)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        idx = read_json_file(index, "safetensors index")
        shards = sorted(set((idx.get("weight_map") or {}).values())) if isinstance(idx, dict) else []
        if not shards:
            raise BadCheckpoint(f"{index} maps no tensors; expected a weight_map of tensor names to shard "
                                f"files")
        files = [path / s for s in shards]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise BadCheckpoint(f"{index} names shard(s) not in {path}: {', '.join(missing[:4])}"
                                f"{' ...' if len(missing) > 4 else ''}; expected every shard beside it "
                                f"(partly copied?)")
    else:
        files = sorted(f for f in path.iterdir() if f.suffix == ".safetensors")
        if not files and not any(f.suffix == ".bin" for f in path.iterdir()):
            raise BadCheckpoint(f"no weights in {path}: expected model.safetensors (or sharded "
                                f"model-*.safetensors with their index, or pytorch_model.bin)")
    for f in files:
        safetensors_shapes_of(f)


def load_target(path: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """Any HF causal LM directory -> (model in eval mode, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = Path(path)
    check_target_folder(path)
    weights = [f.name for f in sorted(path.iterdir()) if f.suffix in (".safetensors", ".bin")]
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=False
                                                     ).to(device).eval()
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as exc:
        raise BadCheckpoint(_load_failure(path, weights, exc)) from None
    except pickle.UnpicklingError as exc:   # weights_only refused a pickle that would run code: nothing ran
        f = path / (weights[0] if weights else "pytorch_model.bin")
        raise BadCheckpoint(f"{f} is not a weights-only PyTorch state dict ({pickle_refusal(exc)}: it "
                            f"would run code when loaded; nothing ran); expected safetensors or plain "
                            f"tensors") from None
    except Exception as exc:  # safetensors' SafetensorError derives from Exception only
        if type(exc).__name__ != "SafetensorError":
            raise
        raise BadCheckpoint(_load_failure(path, weights, exc)) from None
    check_finite_weights(model.state_dict().items(), f"target {path}")
    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadCheckpoint(f"cannot load the target's tokenizer from {path}: "
                            f"{(str(exc).splitlines() or [type(exc).__name__])[0]}") from None
    return model, tok


def _load_failure(path: Path, weights: list[str], exc: BaseException) -> str:
    """Which file would not load and why, on one line (transformers' own message is a paragraph)."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    files = ", ".join(weights) if weights else "no *.safetensors or *.bin file"
    return (f"cannot load the target's weights from {path} ({files}): {type(exc).__name__}: {first}; "
            f"expected a complete Hugging Face checkpoint (truncated or partly copied?)")


def describe(model) -> dict:
    cfg = model.config
    return {"architectures": type(model).__name__, "num_hidden_layers": cfg.num_hidden_layers,
            "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
            "parameters": sum(p.numel() for p in model.parameters())}
