# The two commands of the README's quick start. Each creates .venv if it is missing.
#   make demo   - the main job: `tunehub serve` on the embedded default, submit an example model
#                 job over HTTP, print its URL, follow it to a verified artifact
#   make test   - run the test suite (starts a throwaway PostgreSQL server for the storage tests)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint bench

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tunehub demo --serve

test: $(STAMP)
	bash scripts/run-tests.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet -d /tmp/tunehub-site
