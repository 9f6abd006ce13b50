# The two commands of the README's quick start. Each creates .venv if it is missing.
#   make demo   - run the main job on the embedded default
#   make test   - run the test suite (starts a throwaway PostgreSQL server for the storage tests)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test bench

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tunehub demo

test: $(STAMP)
	bash scripts/run-tests.sh
