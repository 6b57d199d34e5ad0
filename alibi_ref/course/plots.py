"""Drawing functions shared by the notebooks, the scripts and the tests.

Each takes an optional matplotlib ``ax`` and returns the figure, so a notebook, a
widget callback and a test all draw with the same code. Without an ``ax`` they draw
on a new standalone ``Figure`` (not one of pyplot's): a notebook shows it when it is
the cell's value, and a widget that redraws on every slider move leaves no pyplot
figures behind. Widget callbacks are these functions themselves, so the code that
runs in a callback (where an exception would only be displayed) is the tested code.
"""

from __future__ import annotations

import numpy as np

from ..bias import alibi_bias
from ..lab.figures import axes as _axes
from ..lab.figures import evaluated_lengths, extrapolation_curves
from ..slopes import get_slopes


def bias_heatmap(bias, ax=None, *, labels=None, title: str | None = None, vmin=None, vmax=None):
    """One (q_len, k_len) bias or weight matrix as a heatmap; -inf (masked) cells are left blank.

    ``vmin``/``vmax`` fix the colour scale: give several heads the same one, or a gentle head and a
    steep one look alike and only their colourbars differ.
    """
    bias = _as_array(bias)
    if bias.ndim != 2:
        raise ValueError(f"bias_heatmap draws one (q_len, k_len) matrix, got shape {bias.shape}")
    ax = _axes(ax)
    shown = np.ma.masked_invalid(bias)
    image = ax.imshow(shown, cmap="viridis", aspect="auto", interpolation="nearest", vmin=vmin, vmax=vmax)
    ax.figure.colorbar(image, ax=ax)
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
    if labels is not None:
        ax.set_xticks(range(bias.shape[1]), labels[-bias.shape[1]:], rotation=90)
        ax.set_yticks(range(bias.shape[0]), labels[-bias.shape[0]:])
    if title:
        ax.set_title(title)
    return ax.figure


def shared_scale(*biases) -> dict:
    """vmin and vmax spanning every finite entry of ``biases``: one colour scale for all of them."""
    arrays = [_as_array(b) for b in biases]
    finite = np.concatenate([a[np.isfinite(a)] for a in arrays])
    return {"vmin": float(finite.min()), "vmax": float(finite.max())}


def _as_array(x) -> np.ndarray:
    """A NumPy float64 copy of an array or a tensor (on any device, with or without a gradient): NumPy's own
    functions on a tensor give tensors back (np.isfinite: a uint8 tensor, which then indexes by position)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()  # NumPy has no bfloat16
    return np.asarray(x, dtype=np.float64)


def draw_bias_explorer(n_heads: int = 8, head: int = 1, max_bias: float = 8.0, length: int = 16,
                       causal: bool = False, slope: float | None = None, query: int | None = None,
                       ax=None, row_ax=None):
    """The chapter's bias explorer: one head's bias as a heatmap, and one query's attention row as bars.

    ``slope`` overrides the schedule's slope for ``head`` (set it to 0: standard attention). The
    colour scale is fixed, from 0 down to -(length - 1) (a slope of 1), so a gentle head looks
    gentle. The bars are the query's weights when every content score is equal: softmax of its
    bias row, the head's pure positional preference. Without axes it draws both on a new figure.
    """
    if not 1 <= head <= n_heads:
        raise ValueError(f"head must be in 1..{n_heads}, got {head}")
    schedule = get_slopes(n_heads, max_bias=max_bias)[head - 1]
    slope = schedule if slope is None else float(slope)
    query = length - 1 if query is None else min(int(query), length - 1)
    if ax is None:
        from matplotlib.figure import Figure

        ax, row_ax = Figure(figsize=(10, 4), layout="constrained").subplots(1, 2)
    bias = alibi_bias([slope], length, causal=causal)[0]
    kind = "causal" if causal else "symmetric"
    own = "" if slope == schedule else f" (schedule: {schedule:.4g})"
    bias_heatmap(bias, ax, title=f"head {head} of {n_heads}: m = {slope:.4g}{own}, {kind}",
                 vmin=-(length - 1), vmax=0)
    ax.axhline(query, color="white", linewidth=0.8)
    if row_ax is not None:
        row = np.exp(bias[query] - bias[query].max())  # -inf (masked) keys get weight 0
        row_ax.bar(np.arange(length), row / row.sum(), color="tab:blue")
        row_ax.set_ylim(0, 1)
        row_ax.set_xlabel("key position j")
        row_ax.set_ylabel("attention weight (equal content scores)")
        row_ax.set_title(f"query {query}: softmax of its bias row")
    return ax.figure


def bias_explorer():
    """ipywidgets over ``draw_bias_explorer``: heads, head, max_bias, the head's slope, length, query, causal.

    The slope slider follows the schedule whenever heads, head or max_bias move; drag it to 0 to see
    ALiBi become standard attention (part 3).
    """
    import ipywidgets as widgets

    n_heads = widgets.IntSlider(value=8, min=1, max=32, description="heads")
    head = widgets.IntSlider(value=1, min=1, max=8, description="head")
    max_bias = widgets.FloatSlider(value=8.0, min=0.5, max=16.0, step=0.5, description="max_bias")
    slope = widgets.FloatSlider(value=0.5, min=0.0, max=1.0, step=0.001, readout_format=".4f", description="slope")
    length = widgets.IntSlider(value=16, min=2, max=64, description="length")
    query = widgets.IntSlider(value=15, min=0, max=15, description="query")
    # the head slider can never point past the last head, nor the query past the last position
    widgets.dlink((n_heads, "value"), (head, "max"))
    widgets.dlink((length, "value"), (query, "max"), transform=lambda n: n - 1)

    def follow_schedule(_=None):
        slope.value = float(get_slopes(n_heads.value, max_bias=max_bias.value)[head.value - 1])

    for control in (n_heads, head, max_bias):
        control.observe(follow_schedule, names="value")
    return Explorer(draw_bias_explorer, n_heads=n_heads, head=head, max_bias=max_bias, length=length,
                        causal=widgets.Checkbox(value=False, description="causal"), slope=slope, query=query,
                        ax=widgets.fixed(None), row_ax=widgets.fixed(None))


class Explorer:
    """Controls that redraw a figure: the controls are a widget, the figure an ordinary image output.

    The figure is displayed with a display id and replaced in place whenever a control moves, so
    a saved notebook keeps the last figure as a PNG. An HTML export of the notebook (nbconvert,
    which can only render widgets from their saved state and a script fetched from the network)
    then still shows it; a figure kept inside the widget's own output area would be blank there.
    ``draw`` is called with every control's value by name (``widgets.fixed`` for fixed ones).
    """

    def __init__(self, draw, **controls):
        import ipywidgets as widgets

        self._draw, self._controls = draw, controls
        self.children = tuple(c for c in controls.values() if isinstance(c, widgets.DOMWidget))
        self.widget = widgets.VBox(self.children)
        self.widget.add_class("alibi-explorer")
        self._shown = None
        self.result = self._redraw()
        for control in self.children:
            control.observe(self._changed, names="value")

    def _redraw(self):
        return self._draw(**{name: control.value for name, control in self._controls.items()})

    def _changed(self, _change) -> None:
        self.result = self._redraw()
        if self._shown is not None:
            self._shown.update(self._png())

    def _png(self):
        """The figure as a PNG image, whatever matplotlib backend the kernel has (or none)."""
        import io

        from IPython.display import Image

        buffer = io.BytesIO()
        self.result.savefig(buffer, format="png", bbox_inches="tight")
        return Image(data=buffer.getvalue(), format="png")

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)
        self._shown = display(self._png(), display_id=True)


def extrapolation_explorer(results: dict):
    """The chapter's extrapolation comparison: choose methods and how far past L to look."""
    import ipywidgets as widgets

    methods = list(results["perplexity"])
    lengths = evaluated_lengths(results)
    return Explorer(
        extrapolation_curves, results=widgets.fixed(results), ax=widgets.fixed(None),
        methods=widgets.SelectMultiple(options=methods, value=tuple(methods), description="methods"),
        max_length=widgets.SelectionSlider(options=lengths, value=lengths[-1], description="up to"),
    )


def weights_vs_distance(slopes, max_distance: int = 20, ax=None, *, labels=None):
    """Each head's attention weight on a key d steps back, for a query with equal content scores.

    The query sits at the end of ``max_distance + 1`` keys, so its weights are softmax(-m_h * d):
    the pure positional preference of each head.
    """
    slopes = np.asarray(slopes, dtype=np.float64)
    distance = np.arange(max_distance + 1)
    logits = -slopes[:, None] * distance  # (H, d)
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    ax = _axes(ax, (6, 4))
    for h, row in enumerate(weights):
        label = labels[h] if labels is not None else f"head {h + 1}: m = {slopes[h]:.4g}"
        ax.plot(distance, row, marker=".", label=label)
    ax.set_yscale("log")  # the heads differ by orders of magnitude: on a linear axis most look flat
    ax.set_xlabel("distance i - j")
    ax.set_ylabel("attention weight (equal content scores, log scale)")
    ax.legend(fontsize="small")
    return ax.figure


def row_change_bars(changes: dict, tokens, ax=None):
    """Grouped bars: for each setting (e.g. symmetric, causal), how much each row changed."""
    ax = _axes(ax, (6, 3.5))
    width = 0.8 / max(len(changes), 1)
    x = np.arange(len(tokens))
    for n, (name, values) in enumerate(changes.items()):
        values = np.asarray(values, dtype=np.float64)
        bars = ax.bar(x + n * width, values, width, label=name)
        # a bar of exactly 0 is invisible: say so, since "exactly unchanged" is the finding
        ax.bar_label(bars, labels=["0 (exact)" if v == 0 else "" for v in values], rotation=90, fontsize=7,
                     padding=2)
    ax.set_xticks(x + width * (len(changes) - 1) / 2, tokens)
    ax.margins(y=0.25)
    ax.set_ylabel("max |change| of the row's weights")
    ax.legend()
    return ax.figure
