"""nbgrader settings for students working in this folder (JupyterLab's Assignment List and Validate).

The course is released to a local exchange, .exchange/ at the repository root, by `make lab`:
the Assignment List shows it there, and a submission goes back into it.
"""

import os

c = get_config()  # noqa: F821 (provided by nbgrader when it loads this file)

c.CourseDirectory.course_id = "alibi"
c.Exchange.root = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, ".exchange")

# Validate runs the autograder's static screen too (a reach for the reference, or around the checks),
# failing the exercises it would fail when graded: what Validate says is what grading will say
from autograder.validate import screen_in_validate  # noqa: E402

screen_in_validate()
