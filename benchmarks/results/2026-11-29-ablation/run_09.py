"""09's solution notebook run whole, 9.4's steps set from the command line; prints 9.5's table and the reveal.

    .venv/bin/python benchmarks/results/2026-11-29-ablation/run_09.py STEPS
"""

import sys
import time

import nbformat
from nbclient import NotebookClient

nb = nbformat.read("solutions/alibi/09_train_short_test_long.ipynb", as_version=4)
for cell in nb.cells:
    if cell.metadata.get("nbgrader", {}).get("grade_id") == "lookback_experiment":
        cell.source = cell.source.replace("steps=150", f"steps={sys.argv[1]}")
start = time.time()
NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": "solutions/alibi"}}).execute()
print("wall", round(time.time() - start, 1))
for cell in nb.cells:
    if cell.metadata.get("nbgrader", {}).get("grade_id") in ("ablation_experiment", "readonly-reveal-ablation"):
        print("".join(o.text for o in cell.outputs if o.output_type == "stream"))
