"""nbgrader configuration: solutions/ is the instructor's source, course/ the student release.

`nbgrader generate_assignment alibi --force` (or `make release`) regenerates course/alibi from
solutions/alibi. The gradebook (gradebook.db) is local and never committed.
"""

import os

c = get_config()  # noqa: F821 (provided by nbgrader when it loads this file)

c.CourseDirectory.course_id = "alibi"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "course"

c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# a local exchange for `make lab`: the instructor's release_assignment puts the course here, and the
# students' Assignment List (configured in course/nbgrader_config.py) finds it
c.Exchange.root = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".exchange")

# this course's checks: judged by the grader (autograder/verdicts.py), and what its kernels see (views)
c.JudgeChecks.checks_module = "alibi_ref.course.grading"

# the autograder forks each notebook's kernel from a zygote in the student's sandbox that has already
# imported these, those the first notebook it serves imports (autograder/zygote.py): paid once per student
# instead of once per notebook
c.SandboxedExecute.preload = ["numpy", "torch", "matplotlib.pyplot", "matplotlib_inline.backend_inline", "ipywidgets",
                              "alibi_ref.course"]
