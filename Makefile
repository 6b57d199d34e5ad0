# `make demo` and `make test` build .venv from requirements.txt on first use and
# only re-install when requirements.txt or pyproject.toml change.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SANDBOX := $(VENV)/.sandbox

# nbgrader runs helper programs (alembic) from the environment's bin folder
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: demo test lint release lab clean

# the main job: regenerate the student release, then grade the sample class end to end
demo: $(STAMP) $(SANDBOX)
	$(PY) -m nbgrader generate_assignment alibi --force --log-level=WARN
	$(PY) -m autograder grade autograder/sample_class/submissions --output grading --cell-timeout 10 --timeout 30

test: $(STAMP) $(SANDBOX) lint
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check alibi_ref autograder tests benchmarks solutions

# regenerate the student release course/ from the instructor's solutions/
release: $(STAMP)
	$(PY) -m nbgrader generate_assignment alibi --force

# open the course in JupyterLab
lab: $(STAMP)
	$(PY) -m jupyterlab --notebook-dir=course

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python >= 3.10 needed, found " + sys.version'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

# bubblewrap sandboxes the autograder's student kernels; without it the autograder warns and runs
# them unsandboxed (see README). Installed from Debian's packages where this user may.
$(SANDBOX): $(STAMP)
	@if command -v bwrap >/dev/null; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null \
		|| echo "WARNING: could not install bubblewrap: the autograder will run student code unsandboxed"; \
	else echo "WARNING: bubblewrap (bwrap) is missing and cannot be installed here (need root and apt-get):" \
		"the autograder will run student code unsandboxed"; fi
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis gradebook.db
