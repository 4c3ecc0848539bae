"""Training data and training-time-test (TTT) training of an EAGLE-3 draft.

The data is produced the way the seed's pipeline produced it: each sample holds
``input_ids``, ``loss_mask`` and ``hidden_states`` -- a list of captured states, the last
of which is the verifier's final state. ``standardize_data_v1`` then decides what the draft
sees: ``cat(hidden_states[:-1])``. That one line is where a training layout is fixed, and
nothing in the saved draft records it -- which is how the seed's bug was born.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..investigation.evaluate import TargetCaptures, accuracy_table, step_correct, verifier_logits
from ..model.capture import capture_boundaries, decoder_parts
from ..model.checkpoint import save_draft
from ..model.draft import Eagle3Draft, new_draft_config, vocab_maps
from ..model.target import load_target
from ..profile import from_record, write_profile
from ..record import read_record
from .corpus import stdlib_corpus
from .target_training import write_json


@dataclass
class SampleSet:
    """Samples stacked for speed; ``sample(i)`` gives the per-sample dict real pipelines write."""

    input_ids: torch.Tensor          # [N, T]
    loss_mask: torch.Tensor          # [N, T]
    hidden_states: torch.Tensor      # [N, S, T, H] float16, S captured states per token
    boundaries: tuple[int, ...]      # what each of the S states is

    def __len__(self):
        return self.input_ids.shape[0]

    def sample(self, i: int) -> dict:
        return {"input_ids": self.input_ids[i], "loss_mask": self.loss_mask[i],
                "hidden_states": list(self.hidden_states[i].unbind(0))}


def standardize_data_v1(sample: dict) -> dict:
    """speculators v0.3-0.4 semantics: all but the last state feed the draft; the last is the verifier's."""
    hs = sample["hidden_states"]
    return {"input_ids": sample["input_ids"], "loss_mask": sample["loss_mask"],
            "hidden_states": torch.cat(hs[:-1], dim=-1), "verifier_last_hidden_states": hs[-1]}


@torch.no_grad()
def generate_samples(target, token_stream: torch.Tensor, n_samples: int, seq_len: int,
                     capture: tuple[int, ...], regen_fraction: float = 0.5, seed: int = 0,
                     batch: int = 16, desc: str = "samples") -> SampleSet:
    """Windows of real text; a fraction have their second half regenerated greedily by the
    target, as pipelines do so the draft learns the target's own continuations."""
    gen = torch.Generator().manual_seed(seed)
    n_regen = int(round(n_samples * regen_fraction))
    starts = torch.randint(0, token_stream.numel() - seq_len - 1, (n_samples,), generator=gen)
    windows = torch.stack([token_stream[s:s + seq_len] for s in starts])
    half = seq_len // 2
    for s in tqdm(range(0, n_regen, batch), desc=f"{desc}: regenerate", mininterval=2.0):
        e = min(s + batch, n_regen)
        out = target.generate(input_ids=windows[s:e, :half],
                              attention_mask=torch.ones_like(windows[s:e, :half]),
                              max_new_tokens=seq_len - half, min_new_tokens=seq_len - half, do_sample=False,
                              pad_token_id=target.config.pad_token_id)
        windows[s:e] = out[:, :seq_len]
    states = []
    for s in tqdm(range(0, n_samples, batch), desc=f"{desc}: capture {capture}", mininterval=2.0):
        x = windows[s:s + batch]
        with capture_boundaries(target, capture) as store:
            target.model(input_ids=x, use_cache=False)
        states.append(torch.stack([store[b].to(torch.float16) for b in capture], 1))
    return SampleSet(windows, torch.ones_like(windows), torch.cat(states), tuple(capture))


@dataclass
class DraftTrainLog:
    training_boundaries: tuple[int, ...]
    steps: int
    ttt_steps: int
    seconds: float = 0.0
    history: list[dict] = field(default_factory=list)   # per validation: step, loss, full_acc, cond_acc

    @property
    def final(self) -> dict:
        return self.history[-1] if self.history else {}

    def to_dict(self) -> dict:
        return {"training_boundaries": list(self.training_boundaries), "steps": self.steps,
                "ttt_steps": self.ttt_steps, "seconds": self.seconds, "history": self.history}


def _batch_targets(target, draft: Eagle3Draft, verifier: torch.Tensor):
    logits = verifier_logits(target, verifier.float())
    return logits.argmax(-1), F.softmax(logits[..., draft.draft_token_ids], -1)


def ttt_loss(draft, logits_list, probs, loss_mask, decay: float = 0.8):
    """Soft cross-entropy to the target's draft-vocab distribution, step j weighted decay**j."""
    t = probs.shape[1]
    total = 0.0
    for j, logits in enumerate(logits_list):
        n = t - 1 - j
        p = probs[:, 1 + j:1 + j + n].float()
        m = loss_mask[:, 1 + j:1 + j + n].float()
        ce = -(p * F.log_softmax(logits[:, :n].float(), -1)).sum(-1)
        total = total + decay ** j * (ce * m).sum() / m.sum().clamp(min=1)
    return total


@torch.no_grad()
def validate(target, draft, data: SampleSet, ttt_steps: int, batch: int = 16) -> dict:
    draft.eval()
    corr = [[] for _ in range(ttt_steps)]
    losses = []
    for s in range(0, len(data), batch):
        sl = slice(s, s + batch)
        std = standardize_data_v1({"input_ids": data.input_ids[sl], "loss_mask": data.loss_mask[sl],
                                   "hidden_states": list(data.hidden_states[sl].unbind(1))})
        arg, probs = _batch_targets(target, draft, std["verifier_last_hidden_states"])
        logits = draft.ttt_forward(std["input_ids"], std["hidden_states"].float(), ttt_steps)
        losses.append(float(ttt_loss(draft, logits, probs, std["loss_mask"])))
        for j, c in enumerate(step_correct(draft, logits, arg)):
            corr[j].append(c)
    full, cond, _ = accuracy_table([torch.cat(c) for c in corr])
    draft.train()
    return {"loss": round(sum(losses) / len(losses), 4), "full_acc": [round(x, 4) for x in full],
            "cond_acc": [round(x, 4) for x in cond]}


def train_draft(target, draft: Eagle3Draft, train: SampleSet, val: SampleSet, steps: int, ttt_steps: int = 5,
                batch: int = 8, lr: float = 3e-3, seed: int = 0, evals: int = 6,
                desc: str = "draft") -> DraftTrainLog:
    """TTT training on ``standardize_data_v1`` views of the samples; validation logged as it goes."""
    gen = torch.Generator().manual_seed(seed)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    warm = max(steps // 20, 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (min(1.0, (s + 1) / warm)
                        * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))))
    log = DraftTrainLog(tuple(train.boundaries[:-1]), steps, ttt_steps)
    every = max(steps // max(evals, 1), 1)
    draft.train()
    t0 = time.perf_counter()
    bar = tqdm(range(steps), desc=desc, mininterval=2.0)
    for step in bar:
        idx = torch.randint(0, len(train), (batch,), generator=gen)
        std = standardize_data_v1({"input_ids": train.input_ids[idx], "loss_mask": train.loss_mask[idx],
                                   "hidden_states": list(train.hidden_states[idx].unbind(1))})
        with torch.no_grad():
            _, probs = _batch_targets(target, draft, std["verifier_last_hidden_states"])
        logits = draft.ttt_forward(std["input_ids"], std["hidden_states"].float(), ttt_steps)
        loss = ttt_loss(draft, logits, probs, std["loss_mask"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if (step + 1) % every == 0 or step == steps - 1:
            v = validate(target, draft, val, ttt_steps)
            log.history.append({"step": step + 1, "train_loss": round(float(loss), 4), "val_loss": v["loss"],
                                "full_acc": v["full_acc"], "cond_acc": v["cond_acc"]})
            bar.set_postfix(acc0=f"{v['full_acc'][0]:.3f}", loss=f"{float(loss):.3f}")
    log.seconds = round(time.perf_counter() - t0, 1)
    draft.eval()
    return log


def draft_vocab_from_counts(token_stream: torch.Tensor, vocab_size: int,
                            draft_vocab_size: int) -> torch.Tensor:
    """The ``draft_vocab_size`` most frequent target tokens (ties broken by id)."""
    counts = torch.bincount(token_stream, minlength=vocab_size).double()
    counts = counts - torch.arange(vocab_size, dtype=torch.double) * 1e-9
    return torch.sort(torch.topk(counts, draft_vocab_size).indices).values


def captures_from_samples(target, data: SampleSet, draft: Eagle3Draft) -> TargetCaptures:
    """Samples as evaluation captures (states keyed by boundary; target argmax from the verifier)."""
    states = {b: data.hidden_states[:, i] for i, b in enumerate(data.boundaries)}
    _, layers, _ = decoder_parts(target)
    arg = torch.cat([verifier_logits(target, data.hidden_states[s:s + 16, -1].float()).argmax(-1)
                     for s in range(0, len(data), 16)])
    return TargetCaptures(data.input_ids, states, arg, len(layers))


def train_variant_draft(target_dir, out_dir, layout: tuple[int, ...], eagle_ids: list[int], variant: dict,
                        steps: int = 250, seq_len: int = 128, train_samples: int = 160, val_samples: int = 16,
                        draft_vocab: int = 1024, ttt_steps: int = 3, seed: int = 0, fmt: str = "sglang",
                        corpus_chars: int = 600_000) -> dict:
    """A draft variant (``variant``: DraftConfig fields, e.g. ``mla_variant(H)`` or norm flags) trained
    briefly on ``layout`` against a saved target, saved in its real checkpoint layout with a
    ``training.json``. The recipe is ``build.build_draft``'s (standardize_data_v1 over boundaries
    ``layout + (L,)``, TTT), shortened: minutes, not the embedded pair's quarter hour."""
    t0 = time.perf_counter()
    target, tok = load_target(Path(target_dir))
    L = target.config.num_hidden_layers
    capture = tuple(layout) + (L,)
    corpus = stdlib_corpus(max_chars=corpus_chars)
    train_ids = torch.tensor(tok(corpus.train_text, verbose=False)["input_ids"], dtype=torch.long)
    held_ids = torch.tensor(tok(corpus.heldout_text, verbose=False)["input_ids"], dtype=torch.long)
    vocab_ids = draft_vocab_from_counts(train_ids, target.config.vocab_size, draft_vocab)
    train = generate_samples(target, train_ids, train_samples, seq_len, capture, 0.25, seed, desc="train")
    val = generate_samples(target, held_ids, val_samples, seq_len, capture, 0.25, seed + 1, desc="val")
    torch.manual_seed(seed)
    cfg = new_draft_config(target.config, draft_vocab, eagle_ids, num_aux=len(layout), **variant)
    draft = Eagle3Draft(cfg)
    draft.embed_tokens.weight.data.copy_(target.get_input_embeddings().weight.detach())
    draft.d2t.copy_(vocab_maps(vocab_ids, target.config.vocab_size)[0])
    draft.t2d.copy_(vocab_maps(vocab_ids, target.config.vocab_size)[1])
    log = train_draft(target, draft, train, val, steps, ttt_steps, seed=seed, desc=f"variant on {layout}")
    with torch.no_grad():                       # the precision it is saved in, so numbers reproduce
        for prm in draft.parameters():
            prm.copy_(prm.to(torch.bfloat16).float())
    final = validate(target, draft, val, ttt_steps)
    record = {"training_boundaries": list(layout), "captured_boundaries": list(capture),
              "data_pipeline": "standardize_data_v1: draft input = cat(hidden_states[:-1])",
              "deployed_eagle_ids": list(eagle_ids), "variant": {k: v for k, v in variant.items()},
              "ttt_steps": ttt_steps, "seed": seed, "steps": steps, "final_val": final, "log": log.to_dict(),
              "seconds": round(time.perf_counter() - t0, 1)}
    save_draft(draft, out_dir, fmt)
    write_json(Path(out_dir) / "training.json", record)
    write_profile(out_dir, from_record(read_record(out_dir)))
    return record

