"""The import graph of alibi_ref/ and autograder/ has no cycle: each module can be read with only the ones below it
in mind. Imports inside functions count too (they are how a cycle hides)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("alibi_ref", "autograder")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")
            if "sample_class" not in path.parts}


def _imported(name: str, path: Path, node: ast.AST, modules: dict[str, Path]) -> set[str]:
    """The project's modules that one import statement of module ``name`` loads (a package's own __init__ not
    counted for its submodules: Python loads it first whatever the order)."""
    if isinstance(node, ast.Import):
        wanted = [alias.name for alias in node.names]
    else:
        if node.level:
            base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            base = base[:len(base) - node.level + 1]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        wanted = [f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in modules else prefix for alias in node.names]
    found = set()
    for target in wanted:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name and not name.startswith(target + "."):
            found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        nodes = (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom)))
        graph[name] = set().union(*(_imported(name, path, node, modules) for node in nodes))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each cycle as the path that closes it, found by a depth-first walk."""
    found, state, stack = [], {}, []

    def walk(module: str) -> None:
        state[module] = "open"
        stack.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                found.append([*stack[stack.index(target):], target])
            elif target not in state:
                walk(target)
        stack.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            walk(module)
    return found


def test_the_walk_sees_imports_at_the_top_and_inside_functions():
    graph = import_graph()
    assert "alibi_ref.dispatch" in graph["alibi_ref.attention"]  # at the top, relative
    assert "alibi_ref.fused" in graph["alibi_ref.dispatch"]  # inside a function
    assert "autograder.distributed" in graph["autograder.grade"]  # inside a function
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_import_cycle_in_alibi_ref_or_autograder():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in found)


def test_the_autograder_alone_loads_neither_torch_nor_the_course():
    """A course other than this one (nbgrader's own example, say) is graded without the ALiBi stack: the
    autograder's modules import neither alibi_ref nor torch; the course's grading module is loaded only where
    its nbgrader_config.py names one (JudgeChecks.checks_module)."""
    import subprocess
    import sys

    code = ("import sys\nimport autograder.__main__, autograder.grade, autograder.execute, autograder.verdicts, "
            "autograder.distributed, autograder.exchange, autograder.export\n"
            "print(sorted(m for m in ('torch', 'alibi_ref', 'jax') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
