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


def bias_heatmap(bias, ax=None, *, labels=None, title: str | None = None):
    """One (q_len, k_len) bias or weight matrix as a heatmap; -inf (masked) cells are left blank."""
    bias = np.asarray(bias, dtype=np.float64)
    if bias.ndim != 2:
        raise ValueError(f"bias_heatmap draws one (q_len, k_len) matrix, got shape {bias.shape}")
    ax = _axes(ax)
    shown = np.ma.masked_invalid(bias)
    image = ax.imshow(shown, cmap="viridis", aspect="auto", interpolation="nearest")
    ax.figure.colorbar(image, ax=ax)
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
    if labels is not None:
        ax.set_xticks(range(bias.shape[1]), labels[-bias.shape[1]:], rotation=90)
        ax.set_yticks(range(bias.shape[0]), labels[-bias.shape[0]:])
    if title:
        ax.set_title(title)
    return ax.figure


def draw_bias_explorer(n_heads: int = 8, head: int = 1, max_bias: float = 8.0, length: int = 16,
                       causal: bool = False, ax=None):
    """The chapter's bias explorer: head ``head`` (1-based) of the paper schedule, as a heatmap."""
    if not 1 <= head <= n_heads:
        raise ValueError(f"head must be in 1..{n_heads}, got {head}")
    slope = get_slopes(n_heads, max_bias=max_bias)[head - 1]
    bias = alibi_bias([slope], length, causal=causal)[0]
    kind = "causal" if causal else "symmetric"
    return bias_heatmap(bias, ax, title=f"head {head} of {n_heads}: m = {slope:.4g} ({kind})")


def bias_explorer():
    """ipywidgets controls (heads, head, max_bias, length, causal) over ``draw_bias_explorer``."""
    import ipywidgets as widgets

    n_heads = widgets.IntSlider(value=8, min=1, max=32, description="heads")
    head = widgets.IntSlider(value=1, min=1, max=8, description="head")
    # the head slider can never point past the last head
    widgets.dlink((n_heads, "value"), (head, "max"))
    return _interactive(
        draw_bias_explorer, n_heads=n_heads, head=head,
        max_bias=widgets.FloatSlider(value=8.0, min=0.5, max=16.0, step=0.5, description="max_bias"),
        length=widgets.IntSlider(value=16, min=2, max=64, description="length"),
        causal=widgets.Checkbox(value=False, description="causal"),
        ax=widgets.fixed(None),
    )


def _interactive(draw, **controls):
    """ipywidgets' interactive with ``draw`` as the callback and its returned figure displayed."""
    import ipywidgets as widgets

    # interactive() alone keeps the result without showing it (auto_display is interact()'s)
    return widgets.interactive(draw, {"auto_display": True}, **controls)


def extrapolation_explorer(results: dict):
    """The chapter's extrapolation comparison: choose methods and how far past L to look."""
    import ipywidgets as widgets

    methods = list(results["perplexity"])
    lengths = evaluated_lengths(results)
    return _interactive(
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
    ax.set_xlabel("distance i - j")
    ax.set_ylabel("attention weight (equal content scores)")
    ax.legend(fontsize="small")
    return ax.figure


def row_change_bars(changes: dict, tokens, ax=None):
    """Grouped bars: for each setting (e.g. symmetric, causal), how much each row changed."""
    ax = _axes(ax, (6, 3.5))
    width = 0.8 / max(len(changes), 1)
    x = np.arange(len(tokens))
    for n, (name, values) in enumerate(changes.items()):
        ax.bar(x + n * width, np.asarray(values, dtype=np.float64), width, label=name)
    ax.set_xticks(x + width * (len(changes) - 1) / 2, tokens)
    ax.set_ylabel("max |change| of the row's weights")
    ax.legend()
    return ax.figure
