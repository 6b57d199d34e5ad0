"""The README and docs/ say what the project does: their Python examples run as written, and every
file they link to exists."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(page: Path) -> list[tuple[int, str]]:
    """(line, code) of each ```python block of a markdown page."""
    text = page.read_text()
    return [(text.count("\n", 0, m.start()) + 2, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M)]


EXAMPLES = [pytest.param(code, id=f"{page.name}:{line}") for page in PAGES for line, code in python_blocks(page)]


def test_the_readme_has_examples_to_run():
    assert len(EXAMPLES) >= 2, "the README's Python examples were not found: the pattern no longer matches them"


@pytest.mark.parametrize("code", EXAMPLES)
def test_python_example_runs_as_written(code):
    """As a reader would paste it, on whatever device this machine has (the quick example picks CUDA where
    there is one); its own asserts are its checks."""
    exec(compile(code, "<example>", "exec"), {"__name__": "__example__"})


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_linked_files_exist(page):
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
    local = [t for t in targets if not re.match(r"[a-z]+:", t)]
    missing = [t for t in local if not (page.parent / t).exists()]
    assert not missing, f"{page.name} links to files that do not exist: {missing}"


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_anchors_name_headings_that_exist(page):
    links = re.findall(r"\]\(([^)\s]*)#([^)\s]+)\)", page.read_text())
    broken = []
    for target, anchor in links:
        if re.match(r"[a-z]+:", target):
            continue
        linked = page.parent / target if target else page
        headings = re.findall(r"^#+ (.+)$", linked.read_text(), flags=re.M)
        if anchor not in {slug(h) for h in headings}:
            broken.append(f"{target}#{anchor}")
    assert not broken, f"{page.name} links to headings that do not exist: {broken}"
