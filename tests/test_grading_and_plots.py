import base64
from pathlib import Path

import matplotlib
import numpy as np
import pytest
import torch

import alibi_ref
from alibi_ref import get_slopes
from alibi_ref.course import plots
from alibi_ref.course.judge import compare
from alibi_ref.course.model import Case
from alibi_ref.course.wire import decode, encode

matplotlib.use("Agg")


# ----------------------------------------------------------------------------- the checks' comparisons

class AlwaysEqual(np.ndarray):
    """An array that claims to equal anything: the trick a bare == or allclose can fall for."""

    def __eq__(self, other):
        return np.ones(self.shape, dtype=bool)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return np.zeros(self.shape, dtype=bool) if ufunc is np.greater else np.ones(self.shape, dtype=bool)


def _compare(got, expected, **case):
    return compare(decode(encode(got)), expected, Case("x", **case))


def test_an_array_subclass_crosses_as_plain_numbers():
    liar = np.array([0.0, 9.0]).view(AlwaysEqual)
    assert "1 of 2 entries are off" in _compare(liar, np.array([0.0, 1.0]), atol=1e-6)


def test_comparison_messages_say_what_differs_and_no_more():
    assert _compare([0.1, 0.2], np.array([0.1, 0.3]), atol=1e-4) == (
        "1 of 2 entries are off. Worst: [1] expected 0.3, got 0.2")
    assert _compare(np.zeros(3), np.zeros((3, 1)), atol=1) == "expected shape (3, 1), got (3,)"
    assert "at (1,) expected 0.3, got -inf" in _compare([0.1, -np.inf], np.array([0.1, 0.3]), atol=1)
    finfo_min = _compare([0.1, np.finfo(np.float32).min], np.array([0.1, -np.inf]), atol=1)
    assert "a large negative number stands in for -inf" in finfo_min
    assert "stands in" not in _compare([0.1, 2.0], np.array([0.1, -np.inf]), atol=1)
    assert _compare(None, np.array([1.0]), atol=1) == "expected an array of shape (1,), got None"
    assert _compare((np.ones(2), np.ones(3)), (np.ones(2), np.zeros(3)), atol=0.1).startswith("[1]: 3 of 3")


def test_matching_infinities_and_tensors_compare_equal():
    assert _compare(torch.tensor([[0.0, -float("inf")]]), np.array([[0.0, -np.inf]]), atol=1e-12) is None
    assert _compare([1.0, 2.0], np.array([1.0, 2.0 + 1e-9]), atol=1e-8) is None


def test_layers_import_only_downwards():
    """The library imports neither the lab nor the course; the lab does not import the course."""
    import ast

    package = Path(alibi_ref.__file__).parent
    for path in package.rglob("*.py"):
        if path.name == "__main__.py":  # the command line is the application over all three layers
            continue
        layer = path.relative_to(package).parts[0] if path.parent != package else "library"
        above = {"library": ("course", "lab"), "lab": ("course",), "course": ()}[layer]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                # resolve a relative import to the package path it names
                base = list(path.relative_to(package).parent.parts)[: len(path.relative_to(package).parts) - node.level]
                target = (base + (node.module or "").split(".")) if node.level else (node.module or "").split(".")[1:]
                names = [target[0]] if target and target[0] else [a.name for a in node.names]
                assert not set(names) & set(above), f"{path.relative_to(package)} ({layer}) imports {names} from above"


# ----------------------------------------------------------------------------- plots

def test_bias_heatmap_shows_the_matrix_and_blanks_the_mask():
    bias = alibi_ref.alibi_bias([0.5], 4, causal=True)[0]
    fig = plots.bias_heatmap(bias, title="t")
    shown = fig.axes[0].images[0].get_array()
    np.testing.assert_array_equal(shown.mask, ~np.isfinite(bias))
    np.testing.assert_array_equal(shown.data[np.isfinite(bias)], bias[np.isfinite(bias)])
    assert fig.axes[0].get_title() == "t"


def test_bias_heatmap_refuses_a_stack():
    with pytest.raises(ValueError, match=r"one \(q_len, k_len\) matrix, got shape \(2, 3, 3\)"):
        plots.bias_heatmap(np.zeros((2, 3, 3)))


def test_plots_draw_on_a_given_axis():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    assert plots.draw_bias_explorer(12, 9, 8.0, 6, False, ax=ax) is fig
    np.testing.assert_allclose(ax.images[0].get_array()[0, 1], -(2**-0.5))
    assert "head 9 of 12" in ax.get_title()


def test_bias_explorer_widget_redraws_with_its_controls():
    widget = plots.bias_explorer()
    controls = {c.description: c for c in widget.children if hasattr(c, "description")}
    assert {"heads", "head", "max_bias", "length", "causal"} <= set(controls)
    controls["heads"].value = 4
    assert controls["head"].max == 4, "the head slider must follow the number of heads"
    controls["head"].value = 3
    controls["causal"].value = True
    title = widget.result.axes[0].get_title()
    assert "head 3 of 4" in title and "causal" in title
    image = widget.result.axes[0].images[0].get_array()
    assert image.mask[0, 1] and not image.mask[1, 0]
    # the slope follows the schedule, and dragged to 0 the bias is gone: standard attention
    assert controls["slope"].value == pytest.approx(get_slopes(4)[2])
    assert image.min() == pytest.approx(-(controls["length"].value - 1) * get_slopes(4)[2])
    controls["causal"].value = False
    controls["slope"].value = 0.0
    heatmap, bars = widget.result.axes[:2]  # then the colourbar
    assert np.all(heatmap.images[0].get_array() == 0) and "schedule" in heatmap.get_title()
    heights = [bar.get_height() for bar in bars.patches]
    np.testing.assert_allclose(heights, 1 / controls["length"].value), "slope 0: uniform weights"
    controls["query"].value = 0
    controls["slope"].value = 1.0
    heights = [bar.get_height() for bar in widget.result.axes[1].patches]
    assert heights[0] == max(heights) and heights[0] > 0.5, "a steep head attends to the query's own position"


def test_the_explorer_keeps_one_colour_scale_across_heads():
    gentle = plots.draw_bias_explorer(8, 8, length=16).axes[0].images[0]
    steep = plots.draw_bias_explorer(8, 1, length=16).axes[0].images[0]
    assert gentle.get_clim() == steep.get_clim() == (-15, 0)
    assert plots.shared_scale(np.array([[-3.0, -np.inf]]), np.array([[1.0]])) == {"vmin": -3.0, "vmax": 1.0}
    # an answer may return a tensor (the check accepts one): NumPy's isfinite on it is a uint8 tensor, not a mask
    tensor = torch.tensor([[0.0, -1.0], [-float("inf"), -2.0]], requires_grad=True)
    assert plots.shared_scale(tensor, 2 * tensor) == {"vmin": -4.0, "vmax": 0.0}


def test_explorer_refuses_a_head_past_the_last():
    with pytest.raises(ValueError, match=r"head must be in 1\.\.4, got 5"):
        plots.draw_bias_explorer(4, 5)


def test_weights_vs_distance_lines_are_softmax_of_the_penalty():
    slopes = get_slopes(4)
    fig = plots.weights_vs_distance(slopes, max_distance=10)
    lines = fig.axes[0].get_lines()
    assert len(lines) == 4
    for m, line in zip(slopes, lines, strict=True):
        expected = np.exp(-m * np.arange(11))
        np.testing.assert_allclose(line.get_ydata(), expected / expected.sum())


def test_row_change_bars_draw_one_group_per_setting():
    fig = plots.row_change_bars({"symmetric": [0.1, 0.2], "causal": [0.0, 0.0]}, ["a", "b"])
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert heights == [0.1, 0.2, 0.0, 0.0]


def test_extrapolation_explorer_redraws_with_its_controls():
    results = {"settings": {"context": 4}, "perplexity": {
        "alibi": {"4": 5.0, "8": 5.0, "16": 5.1}, "learned": {"4": 6.0, "8": "error: no", "16": "error: no"}}}
    widget = plots.extrapolation_explorer(results)

    def curves():
        return {line.get_label(): list(line.get_xdata()) for line in widget.result.axes[0].get_lines()
                if line.get_label() in results["perplexity"]}

    assert curves() == {"alibi": [4, 8, 16], "learned": [4]}, "learned stops at L: past it there is no number"
    controls = {c.description: c for c in widget.children if hasattr(c, "description")}
    controls["methods"].value = ("alibi",)
    controls["up to"].value = 8
    assert curves() == {"alibi": [4, 8]}


def test_an_html_export_shows_the_explorers_figure(tmp_path):
    """Run the explorer in a real kernel, export the notebook with nbconvert: the figure is a PNG in the page."""
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("from alibi_ref.course import plots\nexplorer = plots.bias_explorer()\nexplorer"),
        nbformat.v4.new_code_cell("explorer.children[1].value = 3  # the head slider, moved after display"),
    ])
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = nb.cells[0].outputs
    assert [sorted(o.data) for o in outputs] == [
        ["application/vnd.jupyter.widget-view+json", "text/plain"], ["image/png", "text/plain"]]
    html, _ = HTMLExporter().from_notebook_node(nb)
    assert f'src="data:image/png;base64,{outputs[1].data["image/png"]}"' in html, "the figure, an image in the page"
    # the slider moved in the next cell: the figure shown is head 3's, replaced in place, not a second one
    assert len(nb.cells[1].outputs) == 0
    here = plots.bias_explorer()
    here.children[1].value = 3
    assert outputs[1].data["image/png"] == base64.b64encode(here._png().data).decode()
