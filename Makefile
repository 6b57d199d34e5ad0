# `make demo` and `make test` build .venv from requirements.txt on first use and
# only re-install when requirements.txt or pyproject.toml change.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SYSTEM := $(VENV)/.system-packages
KERNEL := $(VENV)/.fused-kernel

# nbgrader runs helper programs (alembic) from the environment's bin folder
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: demo test lint release lab hub clean

# the students of the sample class that show every status and the classic mistakes: full marks, four classic
# mistakes, a crash, a loop past its time limit, an unreadable zip, a flagged answer (`make test` grades all of them)
DEMO_STUDENTS := ada cy dee eve fay gus hal ivy lou vic

# the main job: regenerate the student release, then grade those students end to end
demo: $(STAMP) $(SYSTEM) $(KERNEL)
	$(PY) -m nbgrader generate_assignment alibi --force --log-level=WARN
	$(PY) -m autograder grade autograder/sample_class/submissions --output grading --cell-timeout 10 --timeout 30 \
		$(DEMO_STUDENTS:%=--student %)

# two pytest-xdist workers, each test file on one: the sample class is graded once for both (tests/conftest.py)
test: $(STAMP) $(SYSTEM) $(KERNEL) lint
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder

lint: $(STAMP)
	$(PY) -m ruff check alibi_ref autograder tests benchmarks solutions deploy

# regenerate the student release course/ from the instructor's solutions/
release: $(STAMP)
	$(PY) -m nbgrader generate_assignment alibi --force --log-level=WARN

# open the course in JupyterLab, with nbgrader's Assignment List fed from a local exchange
lab: release
	mkdir -p .exchange && chmod 777 .exchange
	$(PY) -m nbgrader release_assignment alibi --force --log-level=WARN
	$(PY) -m jupyterlab --ServerApp.root_dir=course $$([ "$$(id -u)" = 0 ] && echo --allow-root)

# the course served to a class by JupyterHub on 127.0.0.1:8000: a system account for each user of hub/roster.csv,
# nbgrader's exchange, the course root in the first instructor's home (autograder/hub.py); as root
HUB := .hub
PROXY := $(HUB)/node_modules/.bin/configurable-http-proxy
hub: $(STAMP) $(SYSTEM) $(PROXY)
	$(PY) -m autograder hub --roster hub/roster.csv --state $(HUB)

# JupyterHub's proxy, from npm
$(PROXY):
	mkdir -p $(HUB)
	npm install --no-audit --no-fund --silent --prefix $(HUB) configurable-http-proxy@5.3.0

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "Python >= 3.10 needed, found " + sys.version'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

# alibi_ref's fused CPU kernel, built for this machine (about 25 s; alibi_ref.fused): where it cannot be,
# a warning, and the library runs its other CPU paths
$(KERNEL): $(STAMP) alibi_ref/csrc/fused_alibi.cpp alibi_ref/fused.py
	$(PY) -m alibi_ref build-kernel --optional
	touch $@

# From Debian's packages, where this user may install them (root with apt-get): bubblewrap, which
# sandboxes the autograder's student kernels (without it the autograder warns and runs them
# unsandboxed), chromium for the browser tests and postgresql for the PostgreSQL gradebook test
# (without them those tests are skipped, saying why).
$(SYSTEM): $(STAMP)
	@missing=""; command -v bwrap >/dev/null || missing="$$missing bubblewrap"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || missing="$$missing postgresql"; \
	if [ -z "$$missing" ]; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		echo "installing from Debian's packages:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null \
		|| echo "WARNING: could not install$$missing (see the README for what works without them)"; \
	else echo "WARNING:$$missing missing and not installable here (need root and apt-get):" \
		"the autograder runs student code unsandboxed and the browser tests are skipped"; fi
	touch $@

clean:
	rm -rf $(VENV) $(HUB) .pytest_cache .ruff_cache .hypothesis gradebook.db
