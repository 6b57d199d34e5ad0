import nbformat, sys, time
from nbclient import NotebookClient
nb = nbformat.read("solutions/alibi/09_train_short_test_long.ipynb", as_version=4)
steps = sys.argv[1]
for c in nb.cells:
    if c.metadata.get("nbgrader",{}).get("grade_id") == "lookback_experiment":
        c.source = c.source.replace("steps=150", f"steps={steps}")
t = time.time()
NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": "solutions/alibi"}}).execute()
print("wall", round(time.time() - t, 1))
for c in nb.cells:
    if c.metadata.get("nbgrader",{}).get("grade_id") in ("ablation_experiment", "readonly-reveal-ablation"):
        for o in c.outputs:
            if o.output_type=="stream": print(o.text)
