"""The dump diagnosis at the original case's width, measured (``python -m helpers scale-check``).

Kimi-K2.5's draft is 7168 wide with a 3 x 7168 -> 7168 ``fc``; its target cannot run here, but
its dump can be scored. This writes a randomly initialised draft of that shape (bf16, as drafts
ship) and a synthetic speculators dump of the same width, then scores every layout in a fresh
process and reports that process's peak memory against the draft's weights plus one record, and
the seconds per 1000 tokens per layout. The numbers are about cost, not accuracy: the weights
and states are random.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..errors import BadOption
from ..model.checkpoint import config_to_json
from ..model.draft import KIMI_YARN, MLA_DRAFT_ARCH, DraftConfig, Eagle3Draft

SCORER = r"""
import json, resource, sys, time, torch
from helpers.model.checkpoint import load_draft
from helpers.investigation.dumps import open_dump
from helpers.investigation.dump_diagnose import candidate_slots, score_layouts
draft_dir, dump_dir, steps, device = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
base = int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) * 1024
t0 = time.perf_counter()
draft = load_draft(draft_dir, device=device)
t1 = time.perf_counter()
dump = open_dump(dump_dir)
layouts = candidate_slots(dump.num_slots, draft.cfg.num_aux)
scored = score_layouts(draft, dump, layouts, steps, progress=False)
if device.startswith("cuda"):
    torch.cuda.synchronize()
t2 = time.perf_counter()
out = {"load_s": t1 - t0, "score_s": t2 - t1, "layouts": len(layouts),
       "tokens_streamed": sum(r.tokens for r in dump.records()),
       "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
       "baseline_rss_bytes": base}
if device.startswith("cuda"):
    out["peak_cuda_bytes"] = torch.cuda.max_memory_allocated()
print("SCALE" + json.dumps(out))
"""


# Draft variants at Kimi width (docs/conventions.md "Forward flags"): the MLA numbers are those of the
# published Kimi-K2.5 MLA drafts (k-l-lambda/Kimi-K2.5-Eagle3, lightseekorg/kimi-k2.5-eagle3-mla).
KIMI_MLA = {"arch": MLA_DRAFT_ARCH, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "rope_scaling": dict(KIMI_YARN)}
VARIANTS = {"plain": {}, "mla": KIMI_MLA, "norm_before_fc": {"norm_before_fc": True},
            "fc_norm": {"fc_norm": True}, "norm_output": {"norm_output": True},
            "eagle31_mla": {**KIMI_MLA, "fc_norm": True, "norm_output": True}}


def write_random_draft(out: Path, hidden: int, vocab: int, intermediate: int, head_dim: int = 128,
                       kv_heads: int = 8, num_aux: int = 3, seed: int = 0, variant: str = "plain") -> int:
    """An SGLang-format draft of ``variant`` (VARIANTS) with its own embedding and a full draft
    vocabulary, in the checkpoint layout ``draft.save_draft`` writes; returns its parameter count."""
    g = torch.Generator().manual_seed(seed)
    heads = hidden // head_dim
    ids = [2, 30, 58] if num_aux == 3 else [2 + i * 28 for i in range(num_aux)]
    cfg = DraftConfig(hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=heads,
                      num_key_value_heads=min(kv_heads, heads), head_dim=head_dim, vocab_size=vocab,
                      draft_vocab_size=vocab, target_hidden_size=hidden, num_aux=num_aux, eagle_ids=ids,
                      max_position_embeddings=8192, **VARIANTS[variant])
    with torch.device("meta"):      # shapes only: the weights are filled below, in bf16
        state = Eagle3Draft(cfg).state_dict()
    shapes = {k: tuple(v.shape) for k, v in state.items() if k not in ("d2t", "t2d")}
    tensors = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            t = torch.empty(shape, dtype=torch.bfloat16)
            for i in range(0, shape[0], 2048):          # fill in slices: no fp32 copy of a whole matrix
                t[i:i + 2048] = (torch.randn((min(2048, shape[0] - i), shape[1]), generator=g)
                                 * 0.02).to(t.dtype)
            tensors[name] = t
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config_to_json(cfg, "sglang"), indent=2) + "\n",
                                     encoding="utf-8")
    return sum(t.numel() for t in tensors.values())


def write_random_dump(out: Path, hidden: int, vocab: int, slots: int = 4, records: int = 2, tokens: int = 512,
                      seed: int = 1) -> int:
    """A speculators (>= 0.5) dump of random states; returns one record's size in bytes."""
    g = torch.Generator().manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    size = 0
    for i in range(records):
        hs = torch.randn((tokens, slots, hidden), generator=g).to(torch.bfloat16)
        ids = torch.randint(0, vocab, (tokens,), generator=g)
        save_file({"hidden_states": hs, "token_ids": ids}, str(out / f"hs_{i}.safetensors"))
        size = hs.numel() * hs.element_size() + ids.numel() * 8
    return size


def scale_check(hidden: int = 7168, vocab: int = 32000, intermediate: int = 18432, tokens: int = 512,
                records: int = 2, slots: int = 4, steps: int = 1, device: str = "cpu", workdir=None,
                variant: str = "plain", num_aux: int = 3) -> dict:
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        slots = max(slots, num_aux + 1)
        params = write_random_draft(tmp / "draft", hidden, vocab, intermediate, num_aux=num_aux,
                                    variant=variant)
        record_bytes = write_random_dump(tmp / "dump", hidden, vocab, slots, records, tokens)
        written_s = time.perf_counter() - t0
        r = subprocess.run([sys.executable, "-c", SCORER, str(tmp / "draft"), str(tmp / "dump"), str(steps),
                            device], capture_output=True, text=True)
        line = next((l for l in r.stdout.splitlines() if l.startswith("SCALE")), None)
        if r.returncode or line is None:
            raise RuntimeError(f"scoring process failed ({r.returncode}): "
                               f"{r.stderr.strip().splitlines()[-1:]}")
        m = json.loads(line[5:])
    weights_fp32 = params * 4
    total_tokens = m["tokens_streamed"]
    return {
        "device": device, "variant": variant, "hidden": hidden, "fc": f"{num_aux * hidden} -> {hidden}",
        "draft_vocab": vocab,
        "intermediate": intermediate, "draft_params": params, "draft_bytes_bf16": params * 2,
        "draft_bytes_fp32": weights_fp32, "record_bytes": record_bytes, "records": records,
        "tokens": total_tokens, "slots": slots, "steps": steps, "layouts": m["layouts"],
        "load_s": round(m["load_s"], 2), "score_s": round(m["score_s"], 2),
        "peak_rss_bytes": m["peak_rss_bytes"],
        # the interpreter with torch imported, before the draft
        "baseline_rss_bytes": m["baseline_rss_bytes"],
        "peak_over_weights_plus_record": round((m["peak_rss_bytes"] - m["baseline_rss_bytes"])
                                               / (weights_fp32 + record_bytes), 3),
        "s_per_1000_tokens_per_layout": round(m["score_s"] / (total_tokens / 1000) / m["layouts"], 3),
        "peak_cuda_bytes": m.get("peak_cuda_bytes"), "setup_s": round(written_s, 1),
    }


def check_workdir(wd: Path) -> None:
    """--workdir must be a folder this user can write: the temporary draft and dump go under it."""
    blocked = next((d for d in (wd, *wd.parents) if d.exists() and not d.is_dir()), None)
    if blocked is not None:
        raise BadOption(f"--workdir {wd}: {blocked} is a file; expected a folder for the temporary draft and "
                        f"dump")
    if not wd.is_dir():
        raise BadOption(f"--workdir {wd} does not exist; expected an existing folder with ~3 GB free")
    if not os.access(wd, os.W_OK | os.X_OK):
        raise BadOption(f"--workdir {wd} is not writable by this user; expected a folder with ~3 GB free")
