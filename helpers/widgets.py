"""The hands-on panel: pick a boundary for each slot and watch the draft's accuracy move.

The panel keeps its last result as data (``last``: a ``LayoutScore``; ``history``: every
layout tried) so that tests drive it by setting widget values, and notebooks render the
same numbers the callbacks computed.
"""
from __future__ import annotations

import html

import ipywidgets as W

from .boundaries import boundary_label, layout_label
from .evaluate import EvalInputError, LayoutScore, TargetCaptures, evaluate_layout


class LayoutExplorer:
    def __init__(self, draft, caps: TargetCaptures, start, steps: int = 3, presets: dict | None = None,
                 max_windows: int | None = 4):
        self.draft, self.caps, self.steps, self.max_windows = draft, caps, steps, max_windows
        L = caps.num_layers
        options = [(f"{boundary_label(b, L)} ({b})", b) for b in sorted(caps.states)]
        self.slots = [W.Dropdown(options=options, value=int(b), description=f"slot {i}",
                                 layout=W.Layout(width="180px")) for i, b in enumerate(start)]
        self.steps_slider = W.IntSlider(value=steps, min=1, max=max(steps, 5), description="TTT steps")
        self.presets = {k: tuple(v) for k, v in (presets or {}).items()}
        self.buttons = []
        for name, lay in self.presets.items():
            b = W.Button(description=f"{name} {layout_label(lay, L)}", layout=W.Layout(width="auto"))
            b.on_click(lambda _b, lay=lay: self.set_layout(lay))
            self.buttons.append(b)
        self.out = W.HTML()
        self.last: LayoutScore | None = None
        self.error: str | None = None
        self.history: list[dict] = []
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

    def _changed(self, _change) -> None:
        if not self._quiet:
            self.update()

    def update(self) -> LayoutScore | None:
        try:
            self.last = evaluate_layout(self.draft, self.caps, self.layout, self.steps_slider.value,
                                        max_windows=self.max_windows)
            self.error = None
        except (EvalInputError, ValueError) as exc:
            self.last, self.error = None, str(exc)
        self.history.append({"layout": self.layout, "score": self.last, "error": self.error})
        self.out.value = self.render()
        return self.last

    def render(self) -> str:
        L = self.caps.num_layers
        if self.last is None:
            return f"<b style='color:#b00'>{html.escape(self.error or '')}</b>"
        s = self.last
        named = [n for n, lay in self.presets.items() if lay == self.layout]
        head = f"<b>{layout_label(self.layout, L)}</b>" + (f" &mdash; {', '.join(named)}" if named else "")
        cells = "".join(f"<td>{a:.3f}</td><td>{c:.3f}</td>" for a, c in zip(s.full_acc, s.cond_acc))
        cols = "".join(f"<th>full_acc_{j}</th><th>cond_acc_{j}</th>" for j in range(s.steps))
        return (f"{head}<table><tr>{cols}<th>sim. accept length</th><th>ce</th></tr>"
                f"<tr>{cells}<td>{s.sim_accept_length:.2f}</td><td>{s.ce:.3f}</td></tr></table>"
                f"<small>{s.tokens} positions</small>")

    def widget(self):
        return W.VBox([W.HBox(self.slots), self.steps_slider, W.HBox(self.buttons), self.out])

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget())
