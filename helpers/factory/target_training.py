"""Training the embedded targets from scratch (``build-default``): a fixed number of AdamW steps, so a seed
fixes the result; validation loss and perplexity beside the curve."""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm


@dataclass
class TargetTrainReport:
    steps: int
    tokens: int
    seconds: float
    final_train_loss: float
    val_loss: float
    val_ppl: float
    curve: list[tuple[int, float]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return self.__dict__ | {"curve": [list(c) for c in self.curve]}


def batches(ids: torch.Tensor, batch: int, seq: int, generator: torch.Generator):
    """Random contiguous windows of the token stream, forever."""
    n = ids.numel() - seq - 1
    while True:
        starts = torch.randint(0, n, (batch,), generator=generator)
        yield torch.stack([ids[s:s + seq] for s in starts])


@torch.no_grad()
def eval_loss(model, ids: torch.Tensor, seq: int = 256, max_windows: int = 64) -> float:
    model.eval()
    losses = []
    for s in range(0, min(ids.numel() - seq - 1, max_windows * seq), seq):
        x = ids[s:s + seq].unsqueeze(0)
        losses.append(model(input_ids=x, labels=x).loss.item())
    model.train()
    return float(sum(losses) / max(len(losses), 1))


def train_target(model, train_ids: torch.Tensor, val_ids: torch.Tensor, steps: int, batch: int = 16,
                 seq: int = 256, lr: float = 2e-3, seed: int = 0, desc: str = "target") -> TargetTrainReport:
    """AdamW with warmup and cosine decay; a fixed number of steps so a seed fixes the result."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    warm = max(steps // 20, 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (min(1.0, (s + 1) / warm)
                        * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))))
    model.train()
    it = batches(train_ids, batch, seq, gen)
    curve, ema = [], None
    t0 = time.perf_counter()
    bar = tqdm(range(steps), desc=desc, mininterval=2.0)
    for step in bar:
        x = next(it)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if step % 25 == 0 or step == steps - 1:
            curve.append((step, round(ema, 4)))
            bar.set_postfix(loss=f"{ema:.3f}")
    seconds = time.perf_counter() - t0
    model.eval()
    val = eval_loss(model, val_ids, seq)
    return TargetTrainReport(steps, steps * batch * seq, round(seconds, 1), round(ema, 4), round(val, 4),
                             round(math.exp(val), 2), curve)


def save_target(model, out_dir: Path, half: bool = True) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    if half:
        model = model.to(torch.bfloat16)
    model.save_pretrained(out_dir)
    if half:
        model.to(torch.float32)


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
