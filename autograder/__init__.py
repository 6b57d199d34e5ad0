"""autograder: grade a class's ALiBi notebooks with nbgrader, safely and in parallel.

    python -m autograder grade SUBMISSIONS [--output OUT] [--workers N] [--timeout SECONDS] [--db URL]

or, from Python, ``autograder.grade(submissions, output, ...)``.
"""

from .grade import grade

__all__ = ["grade"]
