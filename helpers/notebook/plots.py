"""Figures, each drawn from data a helper returned (never from numbers typed in here)."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from ..boundaries import boundary_label


def throughput_bars(rows: pd.DataFrame, title: str = "Throughput, one run, same prompts"):
    """rows: wiring, baseline_tok_s, spec_tok_s, tau (one row per wiring)."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    x = range(len(rows))
    w = 0.38
    ax.bar([i - w / 2 for i in x], rows["baseline_tok_s"], w, label="baseline (no draft)", color="#9aa5b1")
    bars = ax.bar([i + w / 2 for i in x], rows["spec_tok_s"], w, label="EAGLE-3", color="#2f6fde")
    timing = rows["timing"] if "timing" in rows else ["ok"] * len(rows)
    speedup = rows["speedup"] if "speedup" in rows else rows["spec_tok_s"] / rows["baseline_tok_s"]
    for b, tau, sp, t in zip(bars, rows["tau"], speedup, timing):
        ratio = "timing\nunusable" if t == "unusable" else f"{sp:.2f}x" + (" (noisy)" if t == "noisy" else "")
        ax.annotate(f"tau {tau:.2f}\n{ratio}", (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), rows["wiring"])
    ax.set_ylabel("tokens / s (all paired runs)")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=8)
    ax.margins(y=0.25)
    fig.tight_layout()
    return fig


def step_accuracy(rows: pd.DataFrame, steps: int, title: str = "Draft accuracy per TTT step"):
    """rows: one per wiring/source with full_acc_0.. columns."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for _, r in rows.iterrows():
        ys = [r[f"full_acc_{j}"] for j in range(steps)]
        ax.plot(range(steps), ys, marker="o", label=r["wiring"])
    ax.set_xticks(range(steps))
    ax.set_xlabel("draft step k")
    ax.set_ylabel("full_acc_k (steps 0..k all right)")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def slot_heatmap(sweep: pd.DataFrame, num_layers: int, value: str = "acc0", base=None):
    """Slots x boundaries: what each slot's accuracy would be with each boundary swapped in."""
    table = sweep.pivot(index="slot", columns="boundary", values=value)
    fig, ax = plt.subplots(figsize=(min(1.0 + 0.55 * table.shape[1], 14), 0.7 + 0.6 * table.shape[0]))
    im = ax.imshow(table.values, aspect="auto", cmap="viridis" if value == "acc0" else "viridis_r")
    ax.set_xticks(range(table.shape[1]), [boundary_label(b, num_layers) for b in table.columns], rotation=45)
    ax.set_yticks(range(table.shape[0]),
                  [f"slot {s}" + (f" (base {boundary_label(base[s], num_layers)})" if base else "")
                                          for s in table.index])
    for i in range(table.shape[0]):
        for j in range(table.shape[1]):
            ax.text(j, i, f"{table.values[i, j]:.2f}", ha="center", va="center", fontsize=7, color="w")
    fig.colorbar(im, ax=ax, label=value)
    ax.set_title(f"{value} with one slot swapped, others fixed")
    fig.tight_layout()
    return fig


def ranking_bars(ranking: pd.DataFrame, top: int = 15, highlight: dict | None = None):
    """The best layouts by the ranking's measure (accepted tokens per verify step; cross-entropy for a
    ranking that has no such column); ``highlight`` maps a layout to a name (served, trained). Only the
    rows scored like the first (``scored_by``) are drawn: a screen's rows below them are on another scale."""
    measure = ranking["scored_by"].iloc[0] if "scored_by" in ranking and len(ranking) else None
    final = ranking if measure is None else ranking[ranking["scored_by"] == measure]
    head = final.head(top).iloc[::-1]
    col = "sim_accept_length" if "sim_accept_length" in head else "ce"
    fig, ax = plt.subplots(figsize=(7, 0.4 * len(head) + 1))
    names = {tuple(k): v for k, v in (highlight or {}).items()}
    colors = ["#d9534f" if tuple(l) in names and names[tuple(l)] == "served" else
              "#2f6fde" if tuple(l) in names else "#9aa5b1" for l in head["layout"]]
    ax.barh(head["label"] + [f"  [{names[tuple(l)]}]" if tuple(l) in names else "" for l in head["layout"]],
            head[col], color=colors)
    ax.set_xlabel("expected accepted tokens per verify step (higher = better)" if col != "ce" else
                  "draft cross-entropy vs target (nats/token, lower = better)")
    ax.set_xlim(head[col].min() * 0.98, head[col].max() * 1.01)
    ax.set_title(f"Top {len(head)} of {len(ranking)} layouts" + (f" ({measure})" if measure else ""))
    fig.tight_layout()
    return fig


def acceptance_histograms(results: dict):
    """results: name -> BenchResult; share of verify steps accepting n draft tokens."""
    fig, ax = plt.subplots(figsize=(7, 3.4))
    n = len(results)
    w = 0.8 / max(n, 1)
    for i, (name, r) in enumerate(results.items()):
        total = sum(r.histogram) or 1
        xs = [x + i * w - 0.4 + w / 2 for x in range(len(r.histogram))]
        ax.bar(xs, [h / total for h in r.histogram], w, label=f"{name} (tau {r.tau:.2f})")
    ax.set_xlabel("draft tokens accepted in a verify step")
    ax.set_ylabel("share of verify steps")
    ax.legend(fontsize=8)
    ax.set_title("Acceptance histogram")
    fig.tight_layout()
    return fig


def training_curve(history: list[dict], steps: int):
    """full_acc_k over training, from a draft's training record."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    xs = [h["step"] for h in history]
    for j in range(steps):
        ax.plot(xs, [h["full_acc"][j] for h in history], marker=".", label=f"full_acc_{j}")
    ax.set_xlabel("training step")
    ax.set_ylabel("validation accuracy")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, ncol=3)
    ax.grid(alpha=0.3)
    ax.set_title("Training log (validation split)")
    fig.tight_layout()
    return fig


def speedup_vs_tau(results: dict, title: str = "Each prompt: accept length against speedup"):
    """results: name -> BenchResult. One point per prompt; the dashed line is speedup = tau / break-even,
    where the run's measured round cost puts a prompt with that accept length."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    top = 1.0
    for name, r in results.items():
        taus = [p["tau"] for p in r.per_prompt]
        dots = ax.scatter(taus, [p["speedup"] for p in r.per_prompt], s=22, alpha=0.8,
                          label=f"{name} (break-even tau {r.break_even_tau:.2f})")
        top = max([top] + taus)
        if r.break_even_tau:
            ax.plot([1.0, top], [1.0 / r.break_even_tau, top / r.break_even_tau], ls="--", lw=0.8, alpha=0.6,
                    color=dots.get_facecolor()[0])
    ax.axhline(1.0, color="k", lw=0.8)
    ax.text(1.0, 1.0, " slower than baseline below", va="top", fontsize=7)
    ax.set_xlabel("accept length tau (per prompt)")
    ax.set_ylabel("speedup over baseline")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def acceptance_profile(verdict: dict, title: str = "Per-position acceptance: served against expected"):
    """``diagnose --metrics``'s JSON (``MetricsVerdict.to_dict``): the engine's per-position acceptance
    with its 95% intervals, beside what the draft should reach and what the predicted served layout
    simulates to."""
    rows = verdict["per_position"]
    if not rows:
        return accept_length_profile(verdict, title)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    x = [r["position"] for r in rows]
    ys = [r["rate"] for r in rows]
    err = [[y - r["interval"][0] for y, r in zip(ys, rows)], [r["interval"][1] - y for y, r in zip(ys, rows)]]
    ax.bar(x, ys, 0.5, yerr=err, capsize=4, color="#2f6fde",
           label=f"served ({verdict['engine']}, {verdict['drafts']} drafts)")
    for key, src, style, name in (("expected_per_position", "expected_source", "k--o", "expected"),
                                  ("served_predicted_per_position", "served_predicted_source", "r:s",
                                   "served layout, simulated")):
        if verdict.get(key):
            ax.plot(x[:len(verdict[key])], verdict[key][:len(x)], style, label=name)
    ax.set_xticks(x)
    ax.set_xlabel("draft position")
    ax.set_ylabel("share of drafts accepted")
    ax.set_ylim(0, 1)
    ax.set_title(f"{title}: {verdict['explanation']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def accept_length_profile(verdict: dict, title: str = "Accept length: served against expected"):
    """``diagnose --metrics``'s JSON for an export without per-position counts (SGLang's /metrics, its log
    or /server_info, llama.cpp's totals): the served accept length (with its interval where the export
    gives a count) beside the expected one and the predicted served layout's, simulated."""
    k = verdict.get("num_spec_tokens")
    bars = [(f"served ({verdict['engine']})", verdict["accept_length"], verdict["accept_length_interval"],
             "#2f6fde")]
    if verdict.get("expected_accept_length") is not None:
        bars.append(("expected", verdict["expected_accept_length"], None, "#444444"))
    if verdict.get("served_predicted_per_position"):
        sim = verdict["served_predicted_per_position"]
        bars.append(("served layout, simulated", 1.0 + sum(sim[:k] if k else sim), None, "#c0392b"))
    fig, ax = plt.subplots(figsize=(6, 3.4))
    for i, (name, y, iv, color) in enumerate(bars):
        yerr = None if iv is None else [[y - iv[0]], [iv[1] - y]]
        ax.bar(i, y, 0.55, yerr=yerr, capsize=4, color=color)
        ax.annotate(f"{y:.2f}", (i, y), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 3), textcoords="offset points")
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
    ax.set_ylabel("tokens per verify step")
    ax.set_ylim(0, max(1 + (k or 0), max(b[1] for b in bars)) * 1.1)
    what = verdict.get("gauge_scope") or verdict.get("level")
    ax.set_title(f"{title}: {verdict['explanation']}\n(no per-position counts in this export: {what})",
                 fontsize=9)
    fig.tight_layout()
    return fig


def summary_figure(rows: list[dict], title: str = ""):
    """The run at a glance, from ``Summary.table`` rows: per wiring and engine, the accept length (each
    draft position's acceptance stacked in it) and the speedup with its 95% interval against 1."""
    import numpy as np

    rows = [r for r in rows if isinstance(r.get("accept_length"), (int, float))]
    labels = [f"{r['wiring']}\n{str(r['engine']).split(' (')[0]}" for r in rows]
    y = np.arange(len(rows))[::-1]
    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(9, 0.55 * len(rows) + 1.4), sharey=True)
    for yi, r in zip(y, rows):
        left = 1.0
        ax_t.barh(yi, 1.0, color="#9aa5b1", height=0.6)
        for i, p in enumerate(r.get("per_position") or []):
            ax_t.barh(yi, p, left=left, height=0.6, color=plt.cm.Blues(0.85 - 0.12 * i))
            left += p
        ax_t.annotate(f"{r['accept_length']:.2f}", (r["accept_length"], yi), xytext=(3, 0),
                      textcoords="offset points", va="center", fontsize=8)
        sp, iv = r.get("speedup"), r.get("speedup_interval")
        if isinstance(sp, (int, float)):
            lo, hi = iv if iv else (sp, sp)
            usable = r.get("timing") != "unusable" and iv
            colour = ("#6b7280" if not usable or lo <= 1 <= hi else "#1a7f37" if lo > 1 else "#c4342d")
            ax_s.errorbar(sp, yi, xerr=[[sp - lo], [hi - sp]], fmt="o", color=colour, capsize=3)
            ax_s.annotate(f"{sp:.2f}x" + ("" if usable else " (timing unusable)"), (hi, yi), xytext=(4, 0),
                          textcoords="offset points", va="center",
                          fontsize=8)
    ax_t.set_yticks(y, labels, fontsize=8)
    ax_t.set_xlabel("accept length (tokens per verify step;\nbar segments: draft positions accepted)")
    ax_s.axvline(1.0, color="#333", lw=1, ls="--")
    ax_s.set_xlabel("speedup over no speculation (95% interval)")
    ax_s.margins(x=0.25)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def figure_png(fig) -> str:
    """A figure as a base64 PNG for an ``<img src="data:...">`` (a page that needs no other file)."""
    import base64
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()
