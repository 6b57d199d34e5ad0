# `make demo` and `make test` build .venv from requirements.txt on first use and
# only re-install when requirements.txt or pyproject.toml change.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint clean

demo: $(STAMP)
	$(PY) -m alibi_ref example

test: $(STAMP) lint
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check alibi_ref tests

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python >= 3.10 needed, found " + sys.version'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
