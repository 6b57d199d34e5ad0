"""The README and docs/ say what the project does: their Python examples run as written, and every
file they link to exists."""

import functools
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


def test_the_readme_has_examples_to_run_and_stays_a_guide():
    assert len(EXAMPLES) >= 2, "the README's Python examples were not found: the pattern no longer matches them"
    size = len((ROOT / "README.md").read_bytes())
    assert size <= 12 * 1024, f"README.md is {size} bytes: at most 12 KiB, the details in docs/"


@pytest.mark.parametrize("code", EXAMPLES)
def test_python_example_runs_as_written(code):
    """As a reader would paste it, on whatever device this machine has (the quick example picks CUDA where
    there is one); its own asserts are its checks."""
    exec(compile(code, "<example>", "exec"), {"__name__": "__example__"})


def local_links(page: Path) -> list[tuple[str, str]]:
    """(file, anchor) of each link of a page that stays in the repository; either may be "" (the page itself; no
    anchor)."""
    links = re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", page.read_text())
    return [(target, anchor) for target, anchor in links if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_linked_files_exist(page):
    missing = [target for target, _ in local_links(page) if target and not (page.parent / target).exists()]
    assert not missing, f"{page.name} links to files that do not exist: {missing}"


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@functools.cache
def anchors(page: Path) -> set[str]:
    return {slug(heading) for heading in re.findall(r"^#+ (.+)$", page.read_text(), flags=re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_anchors_name_headings_that_exist(page):
    broken = [f"{target}#{anchor}" for target, anchor in local_links(page)
              if anchor and anchor not in anchors(page.parent / target if target else page)]
    assert not broken, f"{page.name} links to headings that do not exist: {broken}"
