# `make demo` and `make test` build .venv from requirements.txt on first use and
# only re-install when requirements.txt or pyproject.toml change.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

# nbgrader runs helper programs (alembic) from the environment's bin folder
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: demo test lint release lab clean

demo: $(STAMP)
	$(PY) -m alibi_ref example

test: $(STAMP) lint
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

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis gradebook.db
