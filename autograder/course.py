"""Which nbgrader course is graded: its source notebooks, its id, its assignments, its own configuration.

    Course.find()                          # this repository's course (the default, from a checkout)
    Course.find("path/to/course_root")     # an nbgrader course root with its nbgrader_config.py
    Course.find("path/to/source", ["hw1"]) # a folder holding one folder per assignment

A course root's ``nbgrader_config.py`` is read as nbgrader reads it (its course id, its source
folder, its stubs, ...); the autograder then sets only what grading needs (where it works, the
gradebook, its own preprocessors). Without a configuration file the folder itself is the
source and its name the course id.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from traitlets.config import Config

CONFIG_FILE = "nbgrader_config.py"
# a checkout of this repository is itself an nbgrader course root (see its nbgrader_config.py)
CHECKOUT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Course:
    source: Path  # one folder per assignment, holding the instructor's notebooks
    course_id: str
    assignments: tuple[str, ...]
    config_file: Path | None = None

    @classmethod
    def find(cls, path: str | Path | None = None, assignments=None) -> Course:
        if path is None:
            if not (CHECKOUT / CONFIG_FILE).is_file():
                raise FileNotFoundError(
                    "no course given and this is not a checkout of the ALiBi course: pass --course, an nbgrader "
                    "course root (with nbgrader_config.py) or a folder with one folder per assignment")
            path = CHECKOUT
        path = Path(path).resolve()
        if not path.is_dir():
            raise FileNotFoundError(f"course folder {path} does not exist")
        config_file = path / CONFIG_FILE if (path / CONFIG_FILE).is_file() else None
        course_id, source = path.name, path
        if config_file is not None:
            directory = load_config(config_file).CourseDirectory
            course_id = directory.get("course_id") or course_id
            source = path / directory.get("source_directory", "source")
        found = tuple(sorted(p.name for p in source.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))) \
            if source.is_dir() else ()
        chosen = tuple(assignments) if assignments else found
        if not chosen:
            raise FileNotFoundError(f"no assignments in {source}: expected one folder of notebooks per assignment")
        unknown = [a for a in chosen if a not in found]
        if unknown:
            raise FileNotFoundError(f"no assignment {', '.join(map(repr, unknown))} in {source}: "
                                    f"it has {', '.join(found) or 'none'}")
        return cls(source=source, course_id=course_id, assignments=chosen, config_file=config_file)

    def root_files(self) -> list[str]:
        """The files of the course root its configuration names by a path relative to the root, as nbgrader reads
        them (it works in the course root): the header and footer notebooks (``nbgrader quickstart`` writes
        ``c.IncludeHeaderFooter.header = "source/header.ipynb"``) and the autotests' templates (``autotests.yml``,
        read from the root when an assignment has none of its own). The grader works in a course root of its own,
        so it copies these in."""
        if self.config_file is None:
            return []
        root, config = self.config_file.parent, load_config(self.config_file)
        named = [config.IncludeHeaderFooter.get(which, "") for which in ("header", "footer")]
        named.append(config.InstantiateTests.get("autotest_filename", "autotests.yml"))
        return sorted({name for name in named if name and _inside(root, name)})


def _inside(root: Path, name: str) -> bool:
    """Whether ``name`` is a regular file under ``root``, reached through no link (the copy must not leave the
    course root, nor read what a link names)."""
    path = root / name
    parts = [root / Path(*Path(name).parts[: i + 1]) for i in range(len(Path(name).parts))]
    return (not Path(name).is_absolute() and ".." not in Path(name).parts and path.is_file()
            and not any(part.is_symlink() for part in parts))


def load_config(path: Path) -> Config:
    """A course's nbgrader_config.py, read with traitlets as nbgrader itself reads it."""
    from traitlets.config.loader import PyFileConfigLoader

    return PyFileConfigLoader(path.name, path=str(path.parent)).load_config()
