"""The hands-on panel: pick a boundary for each slot and compare layouts side by side.

Remembering numbers between layouts is what made the one-layout panel hard to use, so the
explorer keeps a comparison: the presets it was given (served, trained/recorded, best) are
pinned columns, a hand-picked layout joins them with "add to comparison", and the layout in
the dropdowns always has a column of its own. A per-step acceptance plot redraws with it.

Everything the panel shows is kept as data (``last``: a ``LayoutScore``; ``history``: every
layout tried; ``rows()``: the comparison) so that tests drive it by setting widget values and
clicking buttons, and notebooks render the same numbers the callbacks computed. ``snapshot_html``
is the same comparison as plain HTML with the plot inlined: a report opened offline, where no
widget can render, still shows it.
"""
from __future__ import annotations

import base64
import html
import io

import ipywidgets as widgets
from IPython.display import HTML, display

from ..boundaries import boundary_label, layout_label
from ..investigation.evaluate import EvalInputError, LayoutScore, TargetCaptures, evaluate_layout
from ..progress import interactive_frontend

# one colour per comparison column, in column order (matplotlib's default cycle, written out so the
# table's swatches and the plot's lines agree)
COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf"]


class LayoutExplorer:
    def __init__(self, draft, caps: TargetCaptures, start, steps: int = 3, presets: dict | None = None,
                 max_windows: int | None = 4):
        self.draft, self.caps, self.steps, self.max_windows = draft, caps, steps, max_windows
        L = caps.num_layers
        options = [(f"{boundary_label(b, L)} ({b})", b) for b in sorted(caps.states)]
        self.slots = [widgets.Dropdown(options=options, value=int(b), description=f"slot {i}",
                                 layout=widgets.Layout(width="180px")) for i, b in enumerate(start)]
        self.steps_slider = widgets.IntSlider(value=steps, min=1, max=max(steps, 5), description="TTT steps")
        self.presets = {k: tuple(int(b) for b in v) for k, v in (presets or {}).items()}
        self.buttons = []
        for name, lay in self.presets.items():
            b = widgets.Button(description=f"{name} {layout_label(lay, L)}",
                               layout=widgets.Layout(width="auto"),
                               tooltip=f"set the slots to the {name} layout {lay}")
            b.on_click(lambda _b, lay=lay: self.set_layout(lay))
            self.buttons.append(b)
        self.add_button = widgets.Button(description="add to comparison", button_style="info",
                                   tooltip="keep the layout in the dropdowns as a column of the comparison")
        self.add_button.on_click(lambda _b: self.add_current())
        self.clear_button = widgets.Button(description="clear added", tooltip="drop the hand-picked columns")
        self.clear_button.on_click(lambda _b: self.clear_added())
        self.out = widgets.HTML()          # the layout in the dropdowns, or why it cannot be scored
        self.table = widgets.HTML()        # the comparison, one column per layout
        self.plot = widgets.HTML()         # per-step acceptance of every compared layout (inline PNG)
        self.last: LayoutScore | None = None
        self.error: str | None = None
        self.history: list[dict] = []
        self.added: list[tuple[int, ...]] = []
        self._scores: dict[tuple, LayoutScore] = {}
        self._quiet = False
        for w in self.slots + [self.steps_slider]:
            w.observe(self._changed, names="value")
        self.update()

    @property
    def layout(self) -> tuple[int, ...]:
        return tuple(int(s.value) for s in self.slots)

    def set_layout(self, layout) -> None:
        """Set every slot at once and score once (a preset button)."""
        self._quiet = True
        try:
            for s, b in zip(self.slots, layout):
                s.value = int(b)
        finally:
            self._quiet = False
        self.update()

    def add_current(self) -> None:
        """Pin the layout in the dropdowns as a column (the "add to comparison" button)."""
        lay = self.layout
        if self.last is not None and lay not in self.added and lay not in self.presets.values():
            self.added.append(lay)
        self._redraw()

    def clear_added(self) -> None:
        self.added = []
        self._redraw()

    def _changed(self, _change) -> None:
        if not self._quiet:
            self.update()

    def _score(self, layout) -> LayoutScore:
        """Scores are cached per (layout, steps): moving the slider or a preset press re-scores
        only what it has not seen, so the panel stays responsive with several columns."""
        key = (tuple(layout), self.steps_slider.value)
        if key not in self._scores:
            self._scores[key] = evaluate_layout(self.draft, self.caps, layout, self.steps_slider.value,
                                                max_windows=self.max_windows)
        return self._scores[key]

    def update(self) -> LayoutScore | None:
        try:
            self.last = self._score(self.layout)
            self.error = None
        except (EvalInputError, ValueError) as exc:
            self.last, self.error = None, str(exc)
        self.history.append({"layout": self.layout, "score": self.last, "error": self.error})
        self.out.value = self.render()
        self._redraw()
        return self.last

    def _redraw(self) -> None:
        rows = self.rows()
        self.table.value = self.comparison_html(rows)
        self.plot.value = self.plot_html(rows)

    def rows(self) -> list[dict]:
        """The comparison's columns, in order: pinned presets (a layout two presets share is one
        column naming both), hand-picked layouts, then the dropdowns' layout if it is none of those.
        Each row: layout, names, score (a LayoutScore, or None with the error), current."""
        names: dict[tuple, list[str]] = {}
        for name, lay in self.presets.items():
            names.setdefault(lay, []).append(name)
        for lay in self.added:
            names.setdefault(lay, []).append("added")
        if self.layout not in names:
            names[self.layout] = []
        out = []
        for lay, ns in names.items():
            try:
                score, err = self._score(lay), None
            except (EvalInputError, ValueError) as exc:
                score, err = None, str(exc)
            out.append({"layout": lay, "names": ns, "score": score, "error": err,
                        "current": lay == self.layout})
        return out

    def render(self) -> str:
        """One line on the layout in the dropdowns (its full figures are its column in the table),
        or why it cannot be scored."""
        L = self.caps.num_layers
        if self.last is None:
            return f"<b style='color:#b00'>{html.escape(self.error or '')}</b>"
        s = self.last
        named = [n for n, lay in self.presets.items() if lay == self.layout]
        head = f"<b>{layout_label(self.layout, L)}</b>" + (f" &mdash; {', '.join(named)}" if named else "")
        return (f"{head}: full_acc_0 {s.full_acc[0]:.3f}, simulated accept length {s.sim_accept_length:.2f}, "
                f"cross-entropy {s.ce:.3f} over {s.tokens} positions, {s.steps} draft steps")

    def comparison_html(self, rows: list[dict] | None = None) -> str:
        """One column per layout, one row per figure. Cells carry ``data-layout``/``data-metric``
        so a browser test reads the numbers the page shows rather than parsing labels."""
        rows = self.rows() if rows is None else rows
        L, steps = self.caps.num_layers, self.steps_slider.value
        cell = "border:1px solid #ccc;padding:3px 8px;"
        td = f"style='{cell}text-align:right'"
        th = f"style='{cell}background:#f3f5f8;text-align:left'"
        head = f"<th {th}>layout</th>"
        for i, r in enumerate(rows):
            tag = ", ".join(r["names"]) + (" (in the dropdowns)" if r["current"] else "")
            bold = "font-weight:bold;" if r["current"] else ""
            lay = ",".join(map(str, r["layout"]))
            head += (f"<th style='{cell}background:#f3f5f8;text-align:left;{bold}' data-layout='{lay}' "
                     f"data-names='{html.escape(','.join(r['names']))}'>"
                     f"<span style='color:{COLOURS[i % len(COLOURS)]}'>&#9632;</span> "
                     f"{layout_label(r['layout'], L)}<br><small>{html.escape(tag) or '&nbsp;'}</small></th>")
        metrics = ([(f"full_acc_{j}", f"full_acc_{j}", lambda s, j=j: f"{s.full_acc[j]:.3f}")
                    for j in range(steps)]
                   + [(f"cond_acc_{j}", f"cond_acc_{j}", lambda s, j=j: f"{s.cond_acc[j]:.3f}")
                      for j in range(steps)]
                   + [("sim_accept_length", "sim. accept length", lambda s: f"{s.sim_accept_length:.2f}"),
                      ("ce", "cross-entropy (nats)", lambda s: f"{s.ce:.3f}"),
                      ("tokens", "positions", lambda s: str(s.tokens))])
        body = ""
        for key, label, fmt in metrics:
            body += f"<tr><th {th}>{label}</th>"
            for r in rows:
                lay = ",".join(map(str, r["layout"]))
                val = fmt(r["score"]) if r["score"] is not None else "&ndash;"
                body += f"<td {td} data-layout='{lay}' data-metric='{key}'>{val}</td>"
            body += "</tr>"
        errors = "".join(f"<p style='color:#b00'>{layout_label(r['layout'], L)}: "
                         f"{html.escape(r['error'])}</p>" for r in rows if r["error"])
        return (f"<table class='layout-comparison' style='border-collapse:collapse'><tr>{head}</tr>{body}"
                f"</table>{errors}<small>full_acc_k: steps 0..k all right; cond_acc_k: step k right given "
                f"0..k-1 were; simulated accept length 1 + a0 + a0*a1 + ... from cond_acc; cross-entropy of "
                f"step 0 against the target's distribution.</small>")

    def plot_png(self, rows: list[dict] | None = None) -> bytes:
        """Per-step acceptance (cond_acc_k) of every compared layout, as PNG bytes. Drawn on a
        bare Figure, not pyplot, so redraws neither display by themselves nor pile up figures."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        rows = self.rows() if rows is None else rows
        L, steps = self.caps.num_layers, self.steps_slider.value
        fig = Figure(figsize=(6.4, 3.0), dpi=90)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for i, r in enumerate(rows):
            if r["score"] is None:
                continue
            s = r["score"]
            tag = f" ({', '.join(r['names'])})" if r["names"] else " (dropdowns)"
            ax.plot(range(steps), s.cond_acc, marker="o", color=COLOURS[i % len(COLOURS)],
                    lw=2.5 if r["current"] else 1.5, label=f"{layout_label(r['layout'], L)}{tag}, "
                    f"sim. tau {s.sim_accept_length:.2f}")
        ax.set_xticks(range(steps))
        ax.set_xlabel("draft step k")
        ax.set_ylabel("cond_acc_k (accepted | 0..k-1 were)")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()

    def plot_html(self, rows: list[dict] | None = None) -> str:
        data = base64.b64encode(self.plot_png(rows)).decode()
        return (f"<img class='layout-acceptance' alt='per-step acceptance of the compared layouts' "
                f"src='data:image/png;base64,{data}'>")

    def snapshot_html(self) -> str:
        """The comparison and its plot as static HTML, for a page with no widget manager."""
        rows = self.rows()
        return ("<div class='layout-comparison-snapshot'><p><b>Layout comparison</b> (snapshot of the panel "
                f"when this notebook ran; {self.steps_slider.value} draft steps)</p>"
                f"{self.comparison_html(rows)}<br>{self.plot_html(rows)}</div>")

    def widget(self):
        buttons = widgets.HBox(self.buttons + [self.add_button, self.clear_button])
        return widgets.VBox([widgets.HBox(self.slots), self.steps_slider, buttons, self.out, self.table,
                             self.plot])

    def _ipython_display_(self):
        """The live panel; where nothing can run widgets (papermill, nbconvert --execute) also the
        static snapshot, so the executed notebook and its HTML report show the comparison offline."""
        display(self.widget())
        if not interactive_frontend():
            display(HTML(self.snapshot_html()))
