"""Build the sample class in autograder/sample_class/submissions from the release and the solutions.

    .venv/bin/python tests/make_sample_class.py

Each student is the release notebook with the answer cells filled from the solutions, then
changed the way real students change them: the mistakes people make, a crash, loops, edited
and deleted test cells, attempts to cheat. What each should score is in expected.csv.
"""

from __future__ import annotations

import re
import shutil
import zipfile
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
RELEASE = REPO / "course" / "alibi"
SOLUTIONS = REPO / "solutions" / "alibi"
OUT = REPO / "autograder" / "sample_class" / "submissions"


def _solution_sources(name: str) -> dict[str, str]:
    nb = nbformat.read(SOLUTIONS / f"{name}.ipynb", as_version=4)
    sources = {}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            text = re.sub(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*(\n|\Z)", "", cell.source, flags=re.M)
            sources[meta["grade_id"]] = text
    return sources


def filled(name: str, edits: dict | None = None, unanswered=()) -> nbformat.NotebookNode:
    """The release notebook ``name`` answered with the solutions, then ``edits``: grade_id -> (old, new)."""
    nb = nbformat.read(RELEASE / f"{name}.ipynb", as_version=4)
    answers = _solution_sources(name)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers and grade_id not in unanswered:
            cell.source = answers[grade_id]
        for old, new in (edits or {}).get(grade_id, []):
            assert old in cell.source, (name, grade_id, old)
            cell.source = cell.source.replace(old, new)
    return nb


def cell(nb, grade_id):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


NOTEBOOKS = sorted(p.stem for p in RELEASE.glob("*.ipynb"))


def students() -> dict[str, dict[str, object]]:
    s: dict[str, dict[str, object]] = {}
    # full marks, every notebook
    s["ada"] = {name: filled(name) for name in NOTEBOOKS}
    # partial: two notebooks, the second half done
    s["ben"] = {"01_slopes_and_bias": filled("01_slopes_and_bias"),
                "02_worked_example": filled("02_worked_example", unanswered=("multi_head", "sat_rows", "sat_answer"))}
    # the paper's slopes stretched into one geometric sequence: wrong for 12 heads
    s["cy"] = {"01_slopes_and_bias": filled("01_slopes_and_bias", {"paper_slopes": [
        ("    if p == n_heads:\n        return geometric(n_heads)\n",
         "    return geometric(n_heads)\n")]})}
    # the 1/sqrt(d) forgotten
    s["dee"] = {"02_worked_example": filled("02_worked_example", {"alibi_head": [
        ("scaled = scores / np.sqrt(d_k)", "scaled = scores")]})}
    # a flipped sign: nearby tokens punished, far ones favoured
    s["eve"] = {"01_slopes_and_bias": filled("01_slopes_and_bias", {"alibi_bias": [
        ("bias = -slopes[:, None, None]", "bias = slopes[:, None, None]")]}),
                "06_extrapolation": filled("06_extrapolation", {"kerple_log_bias": [
                    ("return -r1[:, None, None] * np.log1p", "return r1[:, None, None] * np.log1p")]})}
    # symmetric where causal was asked
    s["fay"] = {"04_causal": filled("04_causal", {"causal_alibi_scores": [
        ("- slope * (i - j)\n    return np.where(j > i, -np.inf, scores)",
         "- slope * np.abs(i - j)\n    return scores")]})}
    # the decode offset forgotten: the new query treated as position 0
    s["gus"] = {"01_slopes_and_bias": filled("01_slopes_and_bias", {"alibi_bias": [
                    ("i = np.arange(q_len)[:, None] + (k_len - q_len)", "i = np.arange(q_len)[:, None]")]}),
                "04_causal": filled("04_causal", {"decode_step": [
                    ("- slope * (t - np.arange(t + 1))", "- slope * np.arange(t + 1)")]})}
    # ends its kernel half-way (exit() in alibi_head): the cells up to the first call keep their points
    s["hal"] = {"02_worked_example": filled("02_worked_example", {"alibi_head": [
        ("    N, d_k = Qh.shape\n", "    N, d_k = Qh.shape\n    exit()\n")]})}
    # an infinite loop that prints as it goes: interrupted at the cell limit, its output cut at the cell's
    # budget as it arrives (before, about 150 MB a second piled up in the grading process)
    s["ivy"] = {"05_schedules": filled("05_schedules", {"schedules": [
        # a thousand lines a print, a hundred prints a second: past the 2 MiB a cell keeps within a second or two
        # however loaded the grading machine (one line a print reached it in 0.1 s unloaded, not at all loaded)
        ('    h = np.arange(1, n_heads + 1)\n',
         '    import time\n\n    while True:\n        print(f"still looking for {n_heads}\\n" * 1000, end="")\n'
         '        time.sleep(0.01)\n')]})}
    # a loop that swallows the interrupt: stopped at the notebook limit
    # (asleep in its loop: what is tested is the interrupt it swallows, and a busy loop would only take a CPU from
    # the rest of the suite for the notebook limit, twice)
    s["jay"] = {"03_slope_zero": filled("03_slope_zero", {"standard_attention": [
        ("    d_k, d_v =", "    import time\n\n    while True:\n        try:\n            time.sleep(0.05)\n"
                         "        except KeyboardInterrupt:\n            pass\n    d_k, d_v =")]})}
    # a wrong answer behind an edited test cell, and a deleted test cell
    jon = filled("01_slopes_and_bias", {"paper_slopes": [
        ("    p = 2 ** int", "    return np.zeros(n_heads)\n    p = 2 ** int")]})
    cell(jon, "test_paper_slopes").source = "print('paper_slopes: all visible checks pass')"
    jon.cells.remove(cell(jon, "test_textbook_slopes"))
    s["jon"] = {"01_slopes_and_bias": jon}
    # hands back the reference's answer, reached without an import
    s["kim"] = {"01_slopes_and_bias": filled("01_slopes_and_bias", {"paper_slopes": [
        ("    def geometric(n):",
         "    return plots.get_slopes(n_heads, max_bias=max_bias)\n\n    def geometric(n):")]})}
    # one notebook cut off mid-file, another fine, handed in as a zip
    s["lou.zip"] = {"01_slopes_and_bias": nbformat.writes(filled("01_slopes_and_bias"))[:3000],
                    "02_worked_example": filled("02_worked_example")}
    # asks for far more memory than a kernel gets
    s["max"] = {"03_slope_zero": filled("03_slope_zero", {"standard_attention": [
        ("    d_k, d_v =", "    workspace = np.ones((2**31,))\n    d_k, d_v =")]})}
    # correct, but warns
    s["ned"] = {"02_worked_example": filled("02_worked_example", {"softmax": [
        ('    x = np.asarray(x, dtype=np.float64)\n',
         '    import warnings\n\n    warnings.warn("softmax: casting to float64")\n'
         '    x = np.asarray(x, dtype=np.float64)\n')]})}
    # tries to read the solutions and the gradebook, to leave a process behind, and to patch numpy
    # its tries print in a cell of its own that calls the answer (a test cell shows only its verdicts)
    s["oli"] = {"01_slopes_and_bias": own_cell(filled("01_slopes_and_bias", {"textbook_slopes": [
        ("    return 0.5 ** np.arange(1, n_heads + 1)",
         "    for secret in ['" + str(REPO / "solutions/alibi/01_slopes_and_bias.ipynb") + "', '"
         + str(REPO / "grading/gradebook.db") + "']:\n"
         "        try:\n"
         "            print('read', len(np.fromfile(secret, dtype=np.uint8)), 'bytes of', secret)\n"
         "        except OSError as err:\n"
         "            print('cannot read', secret, '-', type(err).__name__)\n"
         "    return 0.5 ** np.arange(1, n_heads + 1)")]}), "test_textbook_slopes", "textbook_slopes(1);"),
        "02_worked_example": filled("02_worked_example", {"softmax": [
            ("def softmax(x):", "np.testing.assert_allclose = lambda *args, **kwargs: None\n\n\ndef softmax(x):"),
            ("    e = np.exp(", "    return np.zeros_like(x)\n    e = np.exp(")]})}
    # a correct notebook with a cell of its own that claims 100 points
    pat = filled("02_worked_example")
    bonus = nbformat.v4.new_code_cell("print('bonus')", id="bonus-cell")
    bonus.metadata["nbgrader"] = {"grade": True, "grade_id": "bonus", "locked": True, "points": 100,
                                  "schema_version": 3, "solution": False, "task": False}
    pat.cells.append(bonus)
    s["pat"] = {"02_worked_example": pat}
    # Flax: the bias handed to the layer as its mask= (the source's first pitfall), and no nnx answer
    s["uma"] = {"10_jax_flax": filled("10_jax_flax", {"mha_alibi": [(
        "    def alibi_fn(query, key, value, mask=None, **kwargs):\n"
        "        return dot_product_attention(query, key, value, bias=bias, mask=mask, **kwargs)\n\n"
        "    layer = nn.MultiHeadDotProductAttention(num_heads=num_heads, qkv_features=qkv_features, "
        "attention_fn=alibi_fn)\n"
        "    params = layer.init(jax.random.key(seed), x)\n"
        "    return layer.apply(params, x).ravel()",
        "    layer = nn.MultiHeadDotProductAttention(num_heads=num_heads, qkv_features=qkv_features)\n"
        "    params = layer.init(jax.random.key(seed), x)\n"
        "    return layer.apply(params, x, mask=bias).ravel()")]}, unanswered=("mha_alibi_nnx",))}
    s["quinn"] = honest_but_unusual()
    s["rex"] = attacks()
    s["vic"] = attacks_around_the_guard()
    s["wes"] = attacks_outside_the_check()
    s["xan"] = attacks_on_the_way_out()
    s["yul"] = a_copy_of_the_reference()
    s["zed"] = a_compiled_reference()
    s["ora"] = the_reference_in_another_process()
    # every graded cell of a notebook deleted (nbgrader 0.9.6's add_missing_cells fails on that): put back
    sam = filled("01_slopes_and_bias")
    sam.cells = [c for c in sam.cells if not c.metadata.get("nbgrader", {}).get("grade")]
    s["sam"] = {"01_slopes_and_bias": sam, "02_worked_example": filled("02_worked_example")}
    s["tia"] = answers_in_the_wrong_cells()
    s.update(red_team())
    return s


def answers_in_the_wrong_cells() -> dict:
    """Right answers in cells that lost their grading metadata, or beside an answer cell left as released:
    full marks, and the written answer in front of the instructor (before: 0 points for notebook 01, 3 for
    02, and the written answer scored 0 without the instructor seeing it)."""
    # notebook 01 opened in an editor that drops cell metadata: every cell is a plain cell now
    nb01 = filled("01_slopes_and_bias")
    for c in nb01.cells:
        for key in ("nbgrader", "deletable", "editable"):
            c.metadata.pop(key, None)
    nb02 = filled("02_worked_example")
    release = nbformat.read(RELEASE / "02_worked_example.ipynb", as_version=4)
    # alibi_head answered in a new cell above its answer cell, which still raises NotImplementedError; the
    # written answer typed below its answer cell, which still says YOUR ANSWER HERE
    for grade_id, offset in (("alibi_head", 0), ("sat_answer", 1)):
        stub = cell(nb02, grade_id)
        new = (nbformat.v4.new_code_cell if stub.cell_type == "code" else nbformat.v4.new_markdown_cell)(
            stub.source, id=f"own-{grade_id.replace('_', '-')}")
        stub.source = cell(release, grade_id).source
        nb02.cells.insert(nb02.cells.index(stub) + offset, new)
    # multi_head's answer cell deleted, the answer written in a new cell where it stood
    multi = cell(nb02, "multi_head")
    multi.metadata.pop("nbgrader")
    multi.id = "own-multi-head"
    # and notebook 02 downloaded twice: it is handed in under the download's name
    return {"01_slopes_and_bias": nb01, "02_worked_example (1)": nb02}


def honest_but_unusual() -> dict:
    """Correct answers written the way students write them: loops, float32, torch where NumPy was asked,
    extra imports and output, local helpers, reused names, the old import name. Full marks everywhere."""
    nbs = {name: filled(name) for name in NOTEBOOKS}
    # what her kernel holds before any cell of 01 runs: a notebook that never imports torch is not handed it
    nbs["01_slopes_and_bias"].cells.insert(1, nbformat.v4.new_code_cell(
        "import sys\n\nprint('torch before any cell:', 'torch' in sys.modules)", id="own-what-is-loaded"))
    answer(nbs["01_slopes_and_bias"], "paper_slopes", (
        "import math\nimport sys\nimport warnings\n\nprint('note: computing slopes', file=sys.stderr)\n\n\n"
        "def paper_slopes(n_heads, max_bias=8.0):\n"
        "    def geometric(n):\n"
        "        return [2 ** (-max_bias * (h + 1) / n) for h in range(n)]\n\n"
        "    p = 2 ** math.floor(math.log2(n_heads))\n"
        "    slopes = geometric(p)\n"
        "    if p < n_heads:\n"
        "        slopes += geometric(2 * p)[0::2][: n_heads - p]\n"
        "    return np.array(slopes, dtype=np.float32)\n"))
    answer(nbs["01_slopes_and_bias"], "alibi_bias", (
        "def alibi_bias(slopes, q_len, k_len=None, causal=False):\n"
        "    k_len = q_len if k_len is None else k_len\n"
        "    out = np.zeros((len(slopes), q_len, k_len), dtype=np.float32)\n"
        "    for h, m in enumerate(slopes):\n"
        "        for i in range(q_len):\n"
        "            pos = i + k_len - q_len\n"
        "            for j in range(k_len):\n"
        "                out[h, i, j] = -np.inf if (causal and j > pos) else -m * abs(pos - j)\n"
        "    return out\n"))
    answer(nbs["02_worked_example"], "alibi_head", (
        "def _scores(Qh, Kh):\n"
        "    return Qh @ Kh.T / np.sqrt(Qh.shape[1])\n\n\n"
        "def alibi_head(Qh, Kh, Vh, slope):\n"
        "    N = len(Qh)\n"
        "    i = np.arange(N)\n"
        "    weights = softmax(_scores(Qh, Kh) - slope * np.abs(i[:, None] - i[None, :]))\n"
        "    output = weights @ Vh\n"
        "    return weights, output\n"))
    answer(nbs["02_worked_example"], "sat_rows", (
        "weights, output = alibi_head(Q[:, 0:2], K[:, 0:2], V[:, 0:2], 0.5)\n"
        "sat_head1 = weights[2]\n"
        "weights, output = alibi_head(Q[:, 2:4], K[:, 2:4], V[:, 2:4], 0.25)\n"
        "sat_head2 = weights[2]\n"))
    answer(nbs["04_causal"], "causal_alibi_scores", (
        "Qh, Kh = Q[:, :2], K[:, :2]  # the same head 1, written again\n\n\n"
        "def causal_alibi_scores(Qh, Kh, slope):\n"
        "    N = Qh.shape[0]\n"
        "    out = np.full((N, N), -np.inf)\n"
        "    for i in range(N):\n"
        "        for j in range(i + 1):\n"
        "            out[i, j] = Qh[i] @ Kh[j] / np.sqrt(Qh.shape[1]) - slope * (i - j)\n"
        "    return out\n"))
    # its own softmax in a module handed in beside the notebook (nbgrader hands such modules to the notebooks),
    # which imports another; and a module nothing imports, which is not handed over (nor screened)
    answer(nbs["04_causal"], "decode_step", (
        "import torch\nfrom quinn_tools import softmax\n\n\n"
        "def decode_step(q_new, K_cache, V_cache, slope):\n"
        "    q, K_, V_ = (torch.as_tensor(x, dtype=torch.float64) for x in (q_new, K_cache, V_cache))\n"
        "    t = K_.shape[0] - 1\n"
        "    scores = K_ @ q / q.shape[0] ** 0.5 - slope * (t - torch.arange(t + 1))\n"
        "    return softmax(scores) @ V_\n"))
    nbs["quinn_tools.py"] = "from quinn_rows import last_axis\n\n\ndef softmax(x):  # my own\n    return last_axis(x)\n"
    nbs["quinn_rows.py"] = ("import torch\n\n\ndef last_axis(x):\n"
                            "    return torch.softmax(torch.as_tensor(x), dim=-1)\n")
    nbs["scratch_work.py"] = "import subprocess\n\nsubprocess.run(['ls'])\n"
    # a script of hers run with IPython's %run, in a cell of her own, whose function an answer uses, named as no
    # import could reach it (before: the script was not in the graded kernel's folder: NameError, 0 of 3)
    nb03 = nbs["03_slope_zero"]
    nb03.cells.insert(nb03.cells.index(cell(nb03, "standard_attention")), nbformat.v4.new_code_cell(
        "%run quinn-heads.py", id="own-run-quinn-heads"))
    nbs["quinn-heads.py"] = ("import numpy as np\n\n\ndef head(X, n_heads, h):\n"
                             "    d = X.shape[1] // n_heads\n    return X[:, h * d:(h + 1) * d]\n")
    answer(nb03, "standard_attention", (
        "def standard_attention(Q, K, V, n_heads):\n"
        "    outputs, weights = [], []\n"
        "    for h in range(n_heads):\n"
        "        Qh, Kh, Vh = (head(X, n_heads, h) for X in (Q, K, V))\n"
        "        scores = Qh @ Kh.T / np.sqrt(Qh.shape[1])\n"
        "        w = np.exp(scores - scores.max(axis=-1, keepdims=True))\n"
        "        w /= w.sum(axis=-1, keepdims=True)\n"
        "        outputs.append(w @ Vh)\n"
        "        weights.append(w)\n"
        "    return np.hstack(outputs), np.stack(weights)\n"))
    answer(nbs["05_schedules"], "the_head1", (
        "from alibi_ref.course import multi_head_alibi\n\n"
        "the_head1 = {}\n"
        "for name, slopes in [('textbook', [0.5, 0.25]), ('linear', linear_slopes(2)),\n"
        "                     ('constant', constant_slopes(2))]:\n"
        "    out, w = multi_head_alibi(Q, K, V, 2, slopes)\n"
        "    the_head1[name] = w[0, 0].astype(np.float32)\n"))
    answer(nbs["07_pytorch"], "alibi_bias_torch", (
        "def alibi_bias_torch(slopes, q_len, k_len, causal=False):\n"
        "    i = torch.arange(q_len, device=slopes.device).float()[:, None] + (k_len - q_len)\n"
        "    j = torch.arange(k_len, device=slopes.device).float()[None, :]\n"
        "    bias = -slopes.float()[:, None, None] * (i - j).abs()  # float32 throughout\n"
        "    if causal:\n"
        "        bias = bias.masked_fill(j > i, float('-inf'))\n"
        "    return bias.to(slopes.dtype)\n"))
    # the module through her sdpa_alibi, its slopes a float32 buffer left out of state_dict (persistent=False, as
    # x-transformers keeps its ALiBi bias): still a buffer that moves with the model and is never trained
    answer(nbs["07_pytorch"], "alibi_module", (
        "class ALiBiAttention(nn.Module):\n"
        "    def __init__(self, n_heads):\n"
        "        super().__init__()\n"
        "        self.register_buffer('slopes', torch.tensor(get_slopes(n_heads), dtype=torch.float32),\n"
        "                             persistent=False)\n\n"
        "    def forward(self, q, k, v, causal=False):\n"
        "        return sdpa_alibi(q, k, v, self.slopes.to(q.dtype), causal=causal)\n\n"
        "    def explain(self, q, k, v, i, causal=False):\n"
        "        n = k.shape[-2]\n"
        "        content = torch.einsum('hd,hnd->hn', q[0, :, i], k[0]) / q.shape[-1] ** 0.5\n"
        "        penalty = alibi_bias_torch(self.slopes.to(q.dtype), n, n, causal)[:, i]\n"
        "        return dict(content=content, penalty=penalty, weights=torch.softmax(content + penalty, -1))\n"))
    # the text says FlexAttention fuses the score_mod under torch.compile: tried in a cell of the student's own
    # (inductor starts a C++ compiler, which grading refuses for a cell: compiled code runs eagerly there)
    flex_demo = next(c for c in nbs["07_pytorch"].cells if "your score_mod inside FlexAttention" in c.source)
    nbs["07_pytorch"].cells.insert(nbs["07_pytorch"].cells.index(flex_demo) + 1, nbformat.v4.new_code_cell(
        "compiled_flex = torch.compile(flex_attention)\n"
        "out = compiled_flex(q, k, v, score_mod=alibi_score_mod(slopes4, causal=True))\n"
        "print('compiled:', (out - sdpa_alibi(q, k, v, slopes4, causal=True)).abs().max().item())", id="own-compiled"))
    answer(nbs["09_train_short_test_long"], "read_results", (
        "def read_results(results):\n"
        "    L = results['settings']['context']\n"
        "    at = {}\n"
        "    for method, row in results['perplexity'].items():\n"
        "        at[method] = (row[str(L)], row[str(8 * L)])\n"
        "    best, best_ppl = None, float('inf')\n"
        "    for method, (_, late) in at.items():\n"
        "        if isinstance(late, float) and late < best_ppl:\n"
        "            best, best_ppl = method, late\n"
        "    return at['alibi'][1] / at['alibi'][0], at['sinusoidal'][1] / at['sinusoidal'][0], best\n\n\n"
        "alibi_ratio, sinusoidal_ratio, best_at_8L = read_results(results)\n"))
    # each head by a loop over the rows, the batch dimensions flattened first
    answer(nbs["09_train_short_test_long"], "mean_lookback", (
        "import numpy as np\n\n\n"
        "def mean_lookback(weights):\n"
        "    w = np.asarray(weights)\n"
        "    H, N = w.shape[-3], w.shape[-1]\n"
        "    w = w.reshape(-1, H, N, N)\n"
        "    total = np.zeros(H)\n"
        "    for i in range(N):\n"
        "        total += (w[:, :, i, : i + 1] * (i - np.arange(i + 1))).sum(axis=(0, 2))\n"
        "    return total / (len(w) * N)\n"))
    # KERPLE's bias entry by entry in float32, with math.log1p and a nested loop
    answer(nbs["06_extrapolation"], "kerple_log_bias", (
        "import math\n\n\n"
        "def kerple_log_bias(r1, r2, q_len, k_len=None):\n"
        "    k_len = k_len or q_len\n"
        "    out = np.zeros((len(r1), q_len, k_len), dtype=np.float32)\n"
        "    for h in range(len(r1)):\n"
        "        for i in range(q_len):\n"
        "            for j in range(k_len):\n"
        "                out[h, i, j] = -r1[h] * math.log1p(r2[h] * abs(i + k_len - q_len - j))\n"
        "    return out\n"))
    # the legacy PRNGKey, a batch axis added and removed, slopes and bias in NumPy, a named closure
    answer(nbs["10_jax_flax"], "mha_alibi", (
        "import functools\n\n\n"
        "def _with_bias(query, key, value, bias=None, mask=None, *, alibi, **kwargs):\n"
        "    return dot_product_attention(query, key, value, bias=alibi, mask=mask, **kwargs)\n\n\n"
        "def mha_alibi(seed, x, num_heads, qkv_features):\n"
        "    T = x.shape[0]\n"
        "    slopes = np.power(2.0, -8.0 * np.arange(1, num_heads + 1) / num_heads)\n"
        "    dist = np.abs(np.subtract.outer(np.arange(T), np.arange(T)))\n"
        "    alibi = jnp.asarray(-slopes[:, None, None] * dist, dtype=jnp.float32)\n"
        "    layer = nn.MultiHeadDotProductAttention(num_heads=num_heads, qkv_features=qkv_features,\n"
        "                                            attention_fn=functools.partial(_with_bias, alibi=alibi))\n"
        "    params = layer.init(jax.random.PRNGKey(seed), x[None])\n"
        "    return np.asarray(layer.apply(params, x[None])[0]).reshape(-1)\n"))
    return nbs


def attacks() -> dict:
    """Answers that try to earn what they did not: each gets nothing for the trick."""
    return {
        # patches numpy and the judge itself (in the kernel, where nothing is judged), returns zeros: flagged
        "01_slopes_and_bias": filled("01_slopes_and_bias", {"paper_slopes": [(
            "def paper_slopes(n_heads, max_bias=8.0):",
            "import alibi_ref.course.checks as c\n\n"
            "np.testing.assert_allclose = lambda *a, **k: None\n"
            "c.judge = lambda payload: c.Verdict(True, 'all pass')\n\n\n"
            "def paper_slopes(n_heads, max_bias=8.0):\n    return np.zeros(n_heads)")]}),
        # a wrong softmax, and a hook that hands the grader forged results after every cell: judged like any
        "02_worked_example": filled("02_worked_example", {"softmax": [(
            "def softmax(x):",
            "from IPython.display import display\n\n\n"
            "def _forge(result):\n"
            "    fake = {'value': {'array': '', 'shape': [0], 'dtype': 'float64', 'device': 'cpu'}}\n"
            "    display({'application/vnd.alibi-course.check+json': {'exercise': 'softmax', 'seed': None,\n"
            "             'results': [fake] * 3}}, raw=True)\n\n\n"
            "get_ipython().events.register('post_run_cell', _forge)\n\n\n"
            "def softmax(x):\n    return np.ones_like(np.asarray(x, float)) / np.shape(x)[-1]"),
        ]}),
        # switches the guard off, then hands back the reference's answer
        "03_slope_zero": filled("03_slope_zero", {"standard_attention": [(
            "def standard_attention(Q, K, V, n_heads):",
            "import sys\n\n\n"
            "def standard_attention(Q, K, V, n_heads):\n"
            "    sys.setprofile(None)\n"
            "    return multi_head_alibi(Q, K, V, n_heads, slopes=np.zeros(n_heads))")]}),
        # invented tokens that are all zeros: no point for the extension; row_change is right
        "06_extrapolation": filled("06_extrapolation", {"ten_tokens": [(
            "V10 = np.vstack([V, np.eye(5, 4)[::-1] * 0.5 + 0.25])",
            "V10 = np.vstack([V, np.zeros((5, 4))])\nQ10, K10 = np.vstack([Q, np.zeros((5, 4))]), "
            "np.vstack([K, np.zeros((5, 4))])")]}),
        # "tiled" attention that builds nothing: neither its output nor its memory earns a point
        "08_tiled": filled("08_tiled", {"tiled": [("    H, N, d = q.shape\n",
                                                   "    return np.zeros(q.shape[:-1] + v.shape[-1:])\n")]}),
        # alibi_ref's own Flax attention_fn inside mha_alibi (the notebook shows it; the answer may not use it)
        "10_jax_flax": filled("10_jax_flax", {"mha_alibi": [(
            "    def alibi_fn(query, key, value, mask=None, **kwargs):\n"
            "        return dot_product_attention(query, key, value, bias=bias, mask=mask, **kwargs)\n",
            "    from alibi_ref.flax_layers import alibi_attention_fn\n\n"
            "    alibi_fn = alibi_attention_fn(np.asarray(slopes))\n")]}),
        # the numbers copied from the printed table
        "09_train_short_test_long": filled("09_train_short_test_long", {"read_results": [(
            "    L = results[\"settings\"][\"context\"]\n",
            "    return 1.05, 9.9, \"alibi\"\n")], "mean_lookback": [(
            "    weights = np.asarray(weights, dtype=np.float64)\n",
            "    return np.array([0.0, 5 / 6, 1.5])  # the first visible case's answer, from its label\n")]}),
    }


def attacks_around_the_guard() -> dict:
    """The reference reached by routes the run-time guard alone did not see (each earned full marks once)."""
    nb01 = filled("01_slopes_and_bias", {"alibi_bias": [(
        "def alibi_bias(slopes, q_len, k_len=None, causal=False):",
        "from importlib import import_module\n\n\n"
        "def alibi_bias(slopes, q_len, k_len=None, causal=False):\n"
        "    return import_module('alibi' + '_ref').alibi_bias(slopes, q_len, k_len, causal=causal)\n\n\n"
        "def _unused(slopes, q_len, k_len=None, causal=False):")]})
    # a cell of the student's own, just above, switches the guard's hook off through sys.modules
    tamper = nbformat.v4.new_code_cell(
        "import sys\n\nsetattr(sys.modules['alibi_ref.course.checks'].ReferenceGuard, '_hook', lambda *args: None)",
        id="own-cell")
    nb01.cells.insert(nb01.cells.index(cell(nb01, "alibi_bias")), tamper)
    # the reference run in a worker thread, which the guard (a profile hook on the answer's thread) did not watch
    nb04 = filled("04_causal", {"decode_step": [(
        "def decode_step(q_new, K_cache, V_cache, slope):",
        "from concurrent.futures import ThreadPoolExecutor\n\n\n"
        "def decode_step(q_new, K_cache, V_cache, slope):\n"
        "    import alibi_ref.course.exercises as ref\n\n"
        "    with ThreadPoolExecutor(1) as pool:\n"
        "        return pool.submit(ref.decode_reference, q_new, K_cache, V_cache, slope).result()\n\n\n"
        "def _unused(q_new, K_cache, V_cache, slope):")]})
    # routes that use no name the screen knows (computed ones), stopped at run time. A cell of the student's
    # own walks the interpreter's objects, looking for the guard's state: refused while grading, it raises
    walk = nbformat.v4.new_code_cell(
        "import os\n\ngc = getattr(os.sys, 'modu' + 'les')['gc']\n"
        "hooks = [f for f in gc.get_objects() if 'audit' in getattr(f, '__qualname__', '')]", id="own-walk")
    # the reference reached by a computed name, then the guard's record wiped: the profile function was the
    # guard, bound, and its record its own (full marks before); now the record is out of the answer's reach
    nb02 = filled("02_worked_example", {"alibi_head": [(
        "def alibi_head(Qh, Kh, Vh, slope):",
        "import os\n\n\n"
        "def alibi_head(Qh, Kh, Vh, slope):\n"
        "    reference = getattr(os.sys, 'modu' + 'les')['alibi_ref']\n"
        "    output, weights = reference.alibi_attention(Qh[None], Kh[None], Vh[None], [slope], return_weights=True)\n"
        "    try:\n"
        "        getattr(os.sys.getprofile(), '__se' + 'lf__').call = None\n"
        "    except AttributeError:\n"
        "        pass\n"
        "    return weights[0], output[0]\n\n\n"
        "def _unused(Qh, Kh, Vh, slope):")]})
    nb02.cells.insert(nb02.cells.index(cell(nb02, "alibi_head")), walk)
    # no answer at all: a cell of its own rebinds the checks' run, found by computed names, to one that
    # computes the reference's values for the cases first and hands the real check a table (full marks
    # before the audit hook held the checks' machinery); now no cell after it runs
    rebind = nbformat.v4.new_code_cell(
        "import os\n\nm = getattr(os.sys, 'modu' + 'les')['alibi_ref.course.checks']\nreal_run = m.run\n\n\n"
        "def precomputed(name, answer, seed=None, device=None):\n"
        "    ex = getattr(m, '_exer' + 'cise')(name)\n"
        "    table = [m.expected_value(ex, c) for c in m.cases(name, seed)]\n"
        "    return real_run(name, lambda *args, **kwargs: table.pop(0), seed, device)\n\n\n"
        "m.run = precomputed", id="own-rebind")
    nb03 = filled("03_slope_zero")
    answer(nb03, "standard_attention", "def standard_attention(Q, K, V, n_heads):\n    return None\n")
    answer(nb03, "slope_zero", "alibi_zero_output = max_difference = chapter_difference = 0.0\n")
    nb03.cells.insert(nb03.cells.index(cell(nb03, "standard_attention")), rebind)
    return {"01_slopes_and_bias": nb01, "02_worked_example": nb02, "03_slope_zero": nb03, "04_causal": nb04}


def attacks_outside_the_check() -> dict:
    """Routes that work before the check starts, each a cell of the student's own with computed names (full
    marks for the exercise it serves, until the commits that stopped them)."""
    def own(nb, grade_id: str, source: str, cell_id: str) -> None:
        nb.cells.insert(nb.cells.index(cell(nb, grade_id)), nbformat.v4.new_code_cell(source, id=cell_id))

    # the hidden seeds are small numbers in the hidden cells: guessed, the checks' own cases and reference
    # values for each make a table of every hidden input; the grader's secret takes the hidden inputs out of reach
    nb01 = filled("01_slopes_and_bias")
    own(nb01, "paper_slopes", "import os\n\nm = getattr(os.sys, 'modu' + 'les')['alibi_ref.course.checks']\n"
        "table = {}\nfor seed in [None, *range(2000, 2050)]:\n"
        "    for case, value in zip(m.cases('paper_slopes', seed), m.expected_values('paper_slopes', seed)):\n"
        "        table[case.args[0], case.kwargs.get('max_bias', 8.0)] = value", "own-table")
    answer(nb01, "paper_slopes", "def paper_slopes(n_heads, max_bias=8.0):\n    return table[n_heads, max_bias]")
    # a refusal's traceback held the audit hook's frame, and in it the guards' state: the answer calls the
    # reference, then wipes the running check's record
    nb02 = filled("02_worked_example", {"alibi_head": [(
        "def alibi_head(Qh, Kh, Vh, slope):",
        "def alibi_head(Qh, Kh, Vh, slope):\n"
        "    reference = getattr(os.sys, 'modu' + 'les')['alibi_ref']\n"
        "    output, weights = reference.alibi_attention(Qh[None], Kh[None], Vh[None], [slope], return_weights=True)\n"
        "    for run in state.get('running', {}).values():\n"
        "        run[0] = None\n"
        "    return weights[0], output[0]\n\n\n"
        "def _unused(Qh, Kh, Vh, slope):")]})
    own(nb02, "alibi_head", "import os\nimport traceback\n\ntry:\n    getattr(os.sys, '_getfr' + 'ame')(0)\n"
        "except RuntimeError as err:\n    state = [f.f_locals for f, _ in traceback.walk_tb(err.__traceback__)][-1]",
        "own-traceback")
    # a worker thread an earlier cell started, waiting for work: only threads started during a check were watched
    nb04 = filled("04_causal")
    own(nb04, "decode_step", "import os\n\nmodules = getattr(os.sys, 'modu' + 'les')\n"
        "pool = modules['concurrent.futures'].ThreadPoolExecutor(1)\npool.submit(int).result()\n"
        "reference = modules['alibi_ref.course.exercises'].decode_reference", "own-pool")
    answer(nb04, "decode_step", "def decode_step(q_new, K_cache, V_cache, slope):\n"
                                "    return pool.submit(reference, q_new, K_cache, V_cache, slope).result()")
    return {"01_slopes_and_bias": nb01, "02_worked_example": nb02, "04_causal": nb04}


def attacks_on_the_way_out() -> dict:
    """The values a check hands back pass through the kernel's own code after its guard has ended: alibi_bias
    keeps its inputs and returns zeros, and a cell of its own puts the reference's values (through a helper the
    notebook hands out) into what IPython publishes (full marks until the checks signed what they make)."""
    nb01 = filled("01_slopes_and_bias")
    own = ("kept = []\npublisher = get_ipython().display_pub\nsend = publisher.publish\n\n\n"
           "def publish(data, metadata=None, **kwargs):\n"
           "    handed = data.get('application/vnd.alibi-course.check+json')\n"
           "    if handed and handed['exercise'] == 'alibi_bias':\n"
           "        from alibi_ref.course.checks import encode\n\n"
           "        for result, (slopes, q, k, causal) in zip(handed['results'], kept):\n"
           "            result['value'] = encode(plots.alibi_bias(slopes, q, k, causal=causal))\n"
           "        kept.clear()\n"
           "    return send(data, metadata, **kwargs)\n\n\n"
           "publisher.publish = publish")
    nb01.cells.insert(nb01.cells.index(cell(nb01, "alibi_bias")), nbformat.v4.new_code_cell(own, id="own-publish"))
    answer(nb01, "alibi_bias", "def alibi_bias(slopes, q_len, k_len=None, causal=False):\n"
                               "    k_len = q_len if k_len is None else k_len\n"
                               "    kept.append((np.asarray(slopes, dtype=float), q_len, k_len, causal))\n"
                               "    return np.zeros((len(kept[-1][0]), q_len, k_len))")
    return {"01_slopes_and_bias": nb01}


def a_copy_of_the_reference() -> dict:
    """The guard knew the reference by its files: a cell of its own copies the package into the kernel's folder
    and imports it under another name, and each answer calls the copy (full marks for both exercises, and any
    other, until the guard knew the reference's code by what it is)."""
    copy = ("import os\nimport shutil\n\npackage = os.path.dirname(os.path.dirname(getattr(plots, '__fi' + 'le__')))\n"
            "shutil.copytree(package, 'mine', dirs_exist_ok=True)\nimport mine.attention\nimport mine.bias")
    nb01 = filled("01_slopes_and_bias")
    nb01.cells.insert(nb01.cells.index(cell(nb01, "alibi_bias")), nbformat.v4.new_code_cell(copy, id="own-copy"))
    answer(nb01, "alibi_bias", "def alibi_bias(slopes, q_len, k_len=None, causal=False):\n"
                               "    return mine.bias.alibi_bias(np.asarray(slopes, dtype=float), q_len, k_len, "
                               "causal=causal)")
    nb04 = filled("04_causal")
    where = "import alibi_ref.course.plots as plots\n\n"  # 04 hands out no helper module: the import is allowed
    nb04.cells.insert(nb04.cells.index(cell(nb04, "decode_step")), nbformat.v4.new_code_cell(where + copy,
                                                                                             id="own-copy"))
    answer(nb04, "decode_step", "def decode_step(q_new, K_cache, V_cache, slope):\n"
                                "    out = mine.attention.alibi_attention(q_new[None, None], K_cache[None], "
                                "V_cache[None], [slope], causal=True)\n    return out[0, 0]")
    return {"01_slopes_and_bias": nb01, "04_causal": nb04}


def the_reference_in_another_process() -> dict:
    """Installed code runs commands for whoever calls it: the answers have IPython's shell escape (``!``, and
    ``getoutput``) run the reference in another Python and read its values back (full marks while a guard in
    the kernel watched for the reference): that Python sees the kernel's view of the package, with none."""
    nb01 = filled("01_slopes_and_bias")
    answer(nb01, "paper_slopes", (
        "import json\nimport sys\n\n\n"
        "def paper_slopes(n_heads, max_bias=8.0):\n"
        "    out = 'slopes.json'  # in the kernel's folder, where the other Python starts too\n"
        "    code = (f'import json; from alibi_ref import get_slopes; '\n"
        "            f\"json.dump(get_slopes({n_heads}, max_bias={max_bias}).tolist(), open('{out}', 'w'))\")\n"
        "    !{sys.executable} -c \"{code}\"\n"
        "    return np.array(json.load(open(out)))\n"))
    answer(nb01, "alibi_bias", (
        "import sys\n\n\n"
        "def alibi_bias(slopes, q_len, k_len=None, causal=False):\n"
        "    call = f'alibi_bias({list(map(float, slopes))}, {q_len}, {k_len}, causal={causal})'\n"
        "    code = f'import json; from alibi_ref import alibi_bias; print(json.dumps({call}.tolist()))'\n"
        "    printed = get_ipython().getoutput(f'{sys.executable} -c \"{code}\"')\n"
        "    return np.array(json.loads(printed[-1]))\n"))
    # the same from a module handed in beside the notebook, which the screen reads as a cell of the student's own
    nb04 = filled("04_causal")
    answer(nb04, "decode_step", "from fast_decode import decode_step\n")
    fast_decode = (
        "import json\nimport subprocess\nimport sys\n\n\n"
        "def decode_step(q_new, K_cache, V_cache, slope):\n"
        "    args = json.dumps([x.tolist() for x in (q_new, K_cache, V_cache)] + [slope])\n"
        "    code = ('import json, sys; import numpy as np; '\n"
        "            'from alibi_ref.course.exercises import decode_reference; '\n"
        "            'a = json.loads(sys.argv[1]); '\n"
        "            'print(json.dumps(decode_reference(*map(np.array, a[:3]), a[3]).tolist()))')\n"
        "    done = subprocess.run([sys.executable, '-c', code, args], capture_output=True, text=True)\n"
        "    return json.loads(done.stdout)\n")
    return {"01_slopes_and_bias": nb01, "04_causal": nb04, "fast_decode.py": fast_decode}


def a_compiled_reference() -> dict:
    """A compiled program runs without a frame of the code it was traced from: cells of its own compile the
    reference under jax.jit for every shape the hidden cases draw from, and the answer replays that program
    (full marks until each check emptied JAX's caches, so that the reference is traced again, watched)."""
    nb10 = filled("10_jax_flax")
    warm = ("from alibi_ref import alibi_bias\n\nfast_bias = jax.jit(lambda slopes, T: alibi_bias(slopes, T), "
            "static_argnums=1)\n", "")
    shapes = ("[(2, 4), (1, 1), (8, 9), (4, 16), (16, 3)] + [(H, T) for H in range(2, 5) for T in range(2, 20)]",
              "[(H, T) for H in range(5, 9) for T in range(2, 20)]")  # two cells: each well inside a cell's time
    where = nb10.cells.index(cell(nb10, "alibi_bias_jax"))
    for n, (head, chosen) in enumerate(zip(warm, shapes, strict=True)):
        source = f"{head}for H, T in {chosen}:\n    fast_bias(jnp.ones(H, jnp.float32), T)"
        nb10.cells.insert(where + n, nbformat.v4.new_code_cell(source, id=f"own-warm-up-{n}"))
    answer(nb10, "alibi_bias_jax", "def alibi_bias_jax(slopes, T):\n    return fast_bias(slopes, T)")
    return {"10_jax_flax": nb10}


def own_cell(nb, before: str, source: str):
    """``nb`` with a code cell of the student's own (no grading metadata) before the cell ``before``."""
    at = nb.cells.index(cell(nb, before))
    mine = sum(c.get("id", "").startswith("own-") for c in nb.cells)  # ids fixed, so the class is made the same
    nb.cells.insert(at, nbformat.v4.new_code_cell(source, id=f"own-{mine}"))
    return nb


# paper_slopes answered with zeros: 3 points lost unless an attack that should fail gets them back
ZERO_SLOPES = {"paper_slopes": [("    def geometric(n):", "    return np.zeros(n_heads)\n\n    def geometric(n):")]}


def red_team() -> dict[str, dict[str, object]]:
    """Attacks on grading itself (the sandbox, the grader's reading, its pages, its fairness): each earns only
    what its honest answers deserve, and changes nothing outside its sandbox."""
    s: dict[str, dict[str, object]] = {}
    one = "01_slopes_and_bias"
    # remounts the read-only binds writable (root in bwrap's namespaces could) and plants a .pth in the venv
    s["rt-remount"] = {one: own_cell(filled(one), "paper_slopes", (
        "import os\n"
        "site = os.path.dirname(os.path.dirname(np.__file__))\n"
        "os.system(f'mount -o remount,rw,bind {site} 2>/dev/null')\n"
        "try:\n"
        "    open(os.path.join(site, 'zz_planted.pth'), 'w').write('import os\\n')\n"
        "    print('planted')\n"
        "except OSError as err:\n"
        "    print('refused', type(err).__name__)"))}
    # forks until the machine runs out: the sandbox's bound on its processes stops it
    s["rt-processes"] = {one: own_cell(filled(one), "paper_slopes", (
        "import os\n"
        "children = []\n"
        "try:\n"
        "    for _ in range(3000):\n"
        "        pid = os.fork()\n"
        "        if pid == 0:\n"
        "            os.execv('/bin/sleep', ['sleep', '600'])\n"
        "        children.append(pid)\n"
        "except OSError as err:\n"
        "    print('stopped after', len(children), type(err).__name__)\n"
        "for pid in children:\n"
        "    os.kill(pid, 9)\n"
        "    os.waitpid(pid, 0)"))}
    # looks for a door to the grader: a socket that forks processes on request, the zygote's descriptors
    s["rt-zygote"] = {one: own_cell(filled(one, ZERO_SLOPES), "paper_slopes", (
        "import glob, os, socket\n"
        "doors = []\n"
        "for path in glob.glob('/tmp/**/*.sock', recursive=True) + glob.glob('../*.sock') + glob.glob('*.sock'):\n"
        "    with socket.socket(socket.AF_UNIX) as conn:\n"
        "        try:\n"
        "            conn.connect(path)\n"
        "            doors.append(path)\n"
        "        except OSError:\n"
        "            pass\n"
        "try:\n"
        "    doors += os.listdir(f'/proc/{os.getppid()}/fd')\n"
        "except OSError as err:\n"
        "    print('descriptors refused', type(err).__name__)\n"
        "print('doors', doors)"))}
    # the kernel's memory through a str subclass, which a test of type(path) is str let through
    s["rt-procmem"] = {one: own_cell(filled(one, ZERO_SLOPES), "paper_slopes", (
        "class Quiet(str):\n"
        "    pass\n\n"
        "for name in ('/proc/self/mem', '/proc/self/environ', '/proc/1/environ'):\n"
        "    try:\n"
        "        with open(Quiet(name), 'rb') as f:\n"
        "            seen = f.read(65536) if name.endswith('environ') else b''\n"
        "        print(name, 'opened', seen.replace(b'\\0', b' ').decode(errors='replace'))\n"
        "    except Exception as err:\n"
        "        print(name, 'refused', type(err).__name__)"))}
    # a path object that names /proc/self/environ to open, and another file when asked again
    s["rt-fspath"] = {one: own_cell(filled(one, ZERO_SLOPES), "paper_slopes", (
        "class Twice:\n"
        "    calls = 0\n\n"
        "    def __fspath__(self):\n"
        "        Twice.calls += 1\n"
        "        return '/proc/self/environ' if Twice.calls == 1 else 'notes.txt'\n\n\n"
        "try:\n"
        "    with open(Twice(), 'rb') as f:\n"
        "        print('opened', f.read(65536).replace(b'\\0', b' ').decode(errors='replace'))\n"
        "except Exception as err:\n"
        "    print('refused', type(err).__name__)"))}
    # script in a written answer and in an output, for the instructor's browser
    xss = filled(one)
    cell(xss, "slopes_12_answer").source = (
        "They share the first 8 slopes. <script>document.title='pwned-answer'</script>"
        "<img src=x onerror=\"document.title='pwned-img'\"> See [the rubric](javascript:document.title='pwned-link')."
        # pictures named for the grader's files: a feedback page gets only the release's pictures beside it
        "<img src=\"hidden-cases.key\"><img src=\"../../state/hidden-cases.key\"><img src=\"gradebook.db\">")
    s["rt-xss"] = {one: own_cell(xss, "paper_slopes", (
        "from IPython.display import HTML, Javascript, display\n"
        "display(HTML(\"<b onmouseover=\\\"document.title='pwned-b'\\\">hi</b>\"\n"
        "             \"<script>document.title='pwned'</script>\"))\n"
        "display(Javascript(\"document.title='pwned-js'\"))"))}
    # runs the reference in another Python through _posixsubprocess, which raises no audit event
    s["rt-posix"] = {one: filled(one, {"paper_slopes": [(
        "    def geometric(n):",
        "    import _posixsubprocess  # noqa: F401  (fork_exec: a process the guard never sees)\n\n"
        "    def geometric(n):")]})}
    # prints every cell's source as it starts: the hidden tests' too
    s["rt-hidden-print"] = {one: own_cell(filled(one), "paper_slopes", (
        "def show(info):\n"
        "    print('CELL:', info.raw_cell)\n\n\n"
        "get_ipython().events.register('pre_run_cell', show)"))}
    # errors of 20 MB each, three times: the grader keeps a bounded part
    big = filled(one)
    for n in range(3):
        own_cell(big, "paper_slopes", f"raise ValueError('{n}' * 20_000_000)")
    s["rt-big-errors"] = {one: big}
    # sixty cells of its own, each printing just under a cell's 2 MiB: the notebook's budget keeps 32 MiB of them
    many = filled(one)
    for _ in range(60):
        own_cell(many, "paper_slopes", "print('x' * 1_900_000)")
    s["rt-many-cells"] = {one: many}
    # a FIFO where the grader reads the kernel's last words, then the kernel ends itself: the grader must not block
    s["rt-fifo-log"] = {one: own_cell(filled(one), "readonly-12", (
        "import os\n"
        "for name in ('kernel.log', '../kernel.log'):\n"
        "    try:\n"
        "        os.remove(name)\n"
        "    except OSError:\n"
        "        pass\n"
        "    try:\n"
        "        os.mkfifo(name)\n"
        "    except OSError:\n"
        "        pass\n"
        "os._exit(1)"))}
    # reaches, by a computed name, for the reference's upstream answers that a rescue run lends, and forces rescue
    # runs with a uniform softmax: alibi_head finds none in its own runs, and only multi_head's verdict (its own,
    # right, code) is read from the run that lends them
    two = "02_worked_example"
    s["rt-lent"] = {two: filled(two, {
        "softmax": [("    x = np.asarray(x, dtype=np.float64)\n",
                     "    return np.ones_like(np.asarray(x, float)) / np.shape(x)[-1]\n")],
        "alibi_head": [("    N, d_k = Qh.shape\n",
                        "    import importlib\n\n"
                        "    try:\n"
                        "        lent = importlib.import_module('alibi_ref.course.' + 'upstream')\n"
                        "        return lent.alibi_head(Qh, Kh, Vh, slope)\n"
                        "    except (ImportError, AttributeError):\n"
                        "        pass\n"
                        "    N, d_k = Qh.shape\n"),
                       ("    weights = softmax(alibi_scores)", "    weights = softmax(alibi_scores) * 0")]})}
    # looks through every folder the kernel can see for a copy of the reference's source, to run it
    s["rt-search"] = {one: own_cell(filled(one, ZERO_SLOPES), "paper_slopes", (
        "import os, sys\n"
        "found = []\n"
        "for root in sorted({p for p in sys.path if os.path.isdir(p)} | {'/tmp', '/var/tmp', os.getcwd(), '/usr'}):\n"
        "    for folder, _, names in os.walk(root):\n"
        "        for name in names:\n"
        "            if name.endswith('.py') and name in ('slopes.py', 'bias.py', 'exercises.py', 'attention.py'):\n"
        "                path = os.path.join(folder, name)\n"
        "                try:\n"
        "                    if 'def get_slopes(' in open(path).read():\n"
        "                        found.append(path)\n"
        "                except OSError:\n"
        "                    pass\n"
        "print('copies of the reference found:', found)"))}
    # attention that builds the (H, N, N) scores, with the kernel's own memory measurement (tracemalloc) stopped
    # first: when graded the peak is how far the sandbox's memory rose, measured outside the kernel
    # the backward pass without the softmax's row term (dS = P * dP): the forward and its memory keep their points
    s["ike"] = {"08_tiled": filled("08_tiled", {"tiled_backward": [(
        "    row_term = (d_out * out).sum(axis=-1, keepdims=True)  # D: (H, N, 1)\n",
        "    row_term = np.zeros((H, N, 1))\n")]})}
    # the backward by PyTorch's autograd through a naive forward: right on every short case, but at the hidden
    # N = 32768 its (N, N) weights cannot exist in the sandbox (exercises.HIDDEN_MEMORY_N): MemoryError there
    s["rt-autograd"] = {"08_tiled": filled("08_tiled", {"tiled_backward": [("    H, N, d = q.shape\n", (
        "    import torch\n\n"
        "    leaves = [torch.tensor(np.asarray(x, float), requires_grad=True) for x in (q, k, v, slopes)]\n"
        "    tq, tk, tv, tm = leaves\n"
        "    i = torch.arange(q.shape[1], dtype=torch.float64)\n"
        "    s = tq @ tk.transpose(-1, -2) / q.shape[-1] ** 0.5 - tm[:, None, None] * (i[:, None] - i).abs()\n"
        "    if causal:\n"
        "        s = s.masked_fill(i[None, :] > i[:, None], float('-inf'))\n"
        "    (torch.softmax(s, -1) @ tv).backward(torch.tensor(np.asarray(d_out, float)))\n"
        "    return tuple(x.grad.numpy() for x in leaves)\n"
        "    H, N, d = q.shape\n"))]})}
    # 07's module keeps the slopes as an nn.Parameter: moved and saved, but an optimizer would train them; the
    # hint names it, and the rest of 07 keeps its points
    s["lev"] = {"07_pytorch": filled("07_pytorch", {"alibi_module": [(
        '        self.register_buffer("slopes", torch.tensor(get_slopes(n_heads)))\n',
        '        self.slopes = nn.Parameter(torch.tensor(get_slopes(n_heads)))\n')]})}
    # 09's lookback averages each row's weighted distances over the keys (a mean: divided by N again)
    s["nia"] = {"09_train_short_test_long": filled("09_train_short_test_long", {"mean_lookback": [(
        "    per_row = (weights * distance).sum(axis=-1)  # (..., H, N)\n",
        "    per_row = (weights * distance).mean(axis=-1)  # (..., H, N)\n")]})}
    # a padded batch measured by column index: right where the padding is on the left, wrong where it sits between
    # a prompt and the tokens generated after it; the rest of 04 keeps its points
    s["pia"] = {"04_causal": filled("04_causal", {"padded_decode_step": [(
        "    positions = attention_mask.cumsum(-1) - 1  # (B, T): each real token's place in its own row\n",
        "    positions = np.arange(attention_mask.shape[-1])[None, :]\n")]})}
    s["rt-tracemalloc"] = {"08_tiled": filled("08_tiled", {"tiled": [("    H, N, d = q.shape\n", (
        "    import tracemalloc\n\n"
        "    tracemalloc.stop()\n"
        "    i, j = np.arange(q.shape[1])[:, None], np.arange(q.shape[1])[None, :]\n"
        "    m = np.asarray(slopes, float)[:, None, None]\n"
        "    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1]) - m * abs(i - j)\n"
        "    if causal:\n"
        "        s = np.where(j > i, -np.inf, s)\n"
        "    p = np.exp(s - s.max(-1, keepdims=True))\n"
        "    return (p / p.sum(-1, keepdims=True)) @ v\n"
        "    H, N, d = q.shape\n"))]})}
    # 08's answers made before the check, where no meter looks: a cell of its own reads the cases file the graded
    # kernel is shown, computes naive attention for every tiled_memory case and touches a float32 buffer for N x N
    # scores; the answer is naive, and returns the table's output where it has one. The hidden case's scores
    # cannot exist in the sandbox (exercises.HIDDEN_MEMORY_N): no entry, no buffer, a MemoryError at the check
    s["rt-precompute"] = {"08_tiled": own_cell(filled("08_tiled", {"tiled": [("    H, N, d = q.shape\n", (
        "    if float(q.sum()) in ANSWERS:\n"
        "        return ANSWERS[float(q.sum())]\n"
        "    return naive(q, k, v, slopes, causal)\n"
        "    H, N, d = q.shape\n"))]}), "tiled", (
        "import json\nimport os\n\nfrom alibi_ref.course.wire import GRADING_ENV, unpack\n\n\n"
        "def naive(q, k, v, slopes, causal):\n"
        "    i, j = np.arange(q.shape[1])[:, None], np.arange(q.shape[1])[None, :]\n"
        "    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1]) - np.asarray(slopes)[:, None, None] * abs(i - j)\n"
        "    p = np.exp(np.where((j > i) & causal, -np.inf, s) - s.max(-1, keepdims=True))\n"
        "    return (p / p.sum(-1, keepdims=True)) @ v\n\n\n"
        "ANSWERS = {}\n"
        "if os.environ.get(GRADING_ENV):\n"
        "    with open(os.environ[GRADING_ENV]) as f:\n"
        "        calls = [c for c in json.load(f).values() if c['exercise'] == 'tiled_memory']\n"
        "    for case in (case for call in calls for case in call['cases']):\n"
        "        q, k, v, slopes = unpack(case['args'])\n"
        "        try:\n"
        "            BUFFER = np.ones((q.shape[1],) * 2, np.float32)\n"
        "            ANSWERS[float(q.sum())] = naive(q, k, v, slopes, True)\n"
        "        except MemoryError:\n"
        "            print('no room for', q.shape)\n"))}
    # honest: a note on stderr and a tqdm progress bar while the check runs its answer
    s["hon-notes"] = {one: filled(one, {"paper_slopes": [(
        "    def geometric(n):",
        "    import sys\n    from tqdm.auto import tqdm\n\n"
        "    print(f'note: {n_heads} slopes', file=sys.stderr)\n"
        "    for _ in tqdm(range(3), desc='slopes'):\n        pass\n\n"
        "    def geometric(n):")]})}
    # honest: notebook 10's own fix for linen's dropout pitfall (the closure given dot_product_attention's
    # signature), and a memo kept in a function's __dict__
    ten = "10_jax_flax"
    s["hon-signature"] = {ten: filled(ten, {"mha_alibi": [(
        "    layer = nn.MultiHeadDotProductAttention(",
        "    import inspect\n\n"
        "    alibi_fn.__signature__ = inspect.signature(dot_product_attention)\n"
        "    memo = mha_alibi.__dict__.setdefault('calls', [])\n"
        "    memo.append(num_heads)\n"
        "    layer = nn.MultiHeadDotProductAttention(")]})}
    return s


def red_team_files() -> None:
    """The attacks that are files rather than notebooks: written as the grader would find them."""
    one = nbformat.writes(filled("01_slopes_and_bias"))
    two = nbformat.writes(filled("02_worked_example"))
    # a notebook nested 100,000 lists deep (the parsers recurse), beside a good one
    deep = OUT / "rt-deep" / "alibi"
    deep.mkdir(parents=True)
    (deep / "01_slopes_and_bias.ipynb").write_text(one[:-2] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    (deep / "02_worked_example.ipynb").write_text(two)
    # a zip whose entry says it is encrypted (zipfile then refuses it without a password)
    locked = OUT / "rt-locked.zip"
    with zipfile.ZipFile(locked, "w") as archive:
        archive.writestr(zipfile.ZipInfo("rt-locked/01_slopes_and_bias.ipynb", (2026, 1, 1, 0, 0, 0)), one)
    raw = bytearray(locked.read_bytes())
    for signature, flags_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):  # local header, central directory
        at = raw.index(signature)
        raw[at + flags_at] |= 0x1
    locked.write_bytes(bytes(raw))
    # a zip of 300 KB that holds 260 MiB: two notebooks' worth of zeros, each under the one-file limit
    with zipfile.ZipFile(OUT / "rt-bomb.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        for name in ("01_slopes_and_bias", "02_worked_example"):
            archive.writestr(zipfile.ZipInfo(f"rt-bomb/{name}.ipynb", (2026, 1, 1, 0, 0, 0)), bytes(130 * 2**20),
                             compress_type=zipfile.ZIP_DEFLATED)
    # a notebook of 30 MB of empty objects ("[{},{},...]"), 100 KB zipped: parsed, about 24 times that in memory
    with zipfile.ZipFile(OUT / "rt-objects.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(zipfile.ZipInfo("rt-objects/01_slopes_and_bias.ipynb", (2026, 1, 1, 0, 0, 0)),
                         b"[" + b"{}," * 10_000_000 + b"{}]", compress_type=zipfile.ZIP_DEFLATED)
    # links to the instructor's solutions: a notebook, and the whole folder as a student
    linked = OUT / "rt-link" / "alibi"
    linked.mkdir(parents=True)
    (linked / "01_slopes_and_bias.ipynb").symlink_to("../../../../../solutions/alibi/01_slopes_and_bias.ipynb")
    (linked / "02_worked_example.ipynb").write_text(two)
    (OUT / "rt-linkdir").symlink_to("../../../solutions/alibi")


def answer(nb, grade_id: str, source: str) -> None:
    cell(nb, grade_id).source = source


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    for student, notebooks in students().items():
        # notebooks by name, and Python modules handed in beside them by file name (NAME.py)
        texts = {name if name.endswith(".py") else f"{name}.ipynb": nb if isinstance(nb, str) else nbformat.writes(nb)
                 for name, nb in notebooks.items()}
        if student.endswith(".zip"):
            with zipfile.ZipFile(OUT / student, "w") as archive:
                for name, text in texts.items():
                    info = zipfile.ZipInfo(f"{student[:-4]}/{name}", date_time=(2026, 1, 1, 0, 0, 0))
                    archive.writestr(info, text)
            continue
        folder = OUT / student / "alibi"  # nbgrader's submitted/ layout for the folders
        folder.mkdir(parents=True)
        for name, text in texts.items():
            (folder / name).write_text(text)
    red_team_files()
    print(f"wrote {len(list(OUT.iterdir()))} students to {OUT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
