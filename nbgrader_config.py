"""nbgrader configuration: solutions/ is the instructor's source, course/ the student release.

`nbgrader generate_assignment alibi --force` (or `make release`) regenerates course/alibi from
solutions/alibi. The gradebook (gradebook.db) is local and never committed.
"""

c = get_config()  # noqa: F821 (provided by nbgrader when it loads this file)

c.CourseDirectory.course_id = "alibi"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "course"

c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
