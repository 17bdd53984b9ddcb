# Two commands do everything on a fresh machine (Python >= 3.10 with venv):
#   make demo   - set up, then run the main job on the embedded default
#   make test   - set up, then lint, type-check and run the tests (what CI runs)
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint typecheck proto docs clean
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

demo: setup
	$(BIN)/perfd demo

lint: setup
	$(BIN)/ruff check .

typecheck: setup
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest -q

proto: setup
	$(BIN)/python -m perfd.transport.regen
	$(BIN)/python -m collectors.k8s.regen

docs: setup
	$(BIN)/perfd catalog --doc > docs/metrics.md

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache
