# privtrain — the two commands: `make run` and `make test`.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: run test venv migrate lint docs bench clean

$(STAMP): pyproject.toml client/pyproject.toml common/pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e './common[model,hf]' -e './client[yaml]' -e '.[worker,dev]'
	touch $(STAMP)

venv: $(STAMP)

## Run the service in the embedded mode (SQLite + filesystem broker + one worker), on HOST:PORT
## (`make run PORT=8080 HOST=0.0.0.0`; default: PRIVTRAIN_HOST and PRIVTRAIN_PORT, else 127.0.0.1:8000).
HOST ?=
PORT ?=
run: $(STAMP)
	$(BIN)/privtrain-admin serve $(if $(HOST),--host $(HOST)) $(if $(PORT),--port $(PORT))

## Run the whole test suite (unit, API, integration with a real worker, services when configured)
## in TEST_WORKERS processes (pytest-xdist; 0 runs it in this one), printing the slowest tests.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --durations=25 $(PYTEST_ARGS)

migrate: $(STAMP)
	$(BIN)/privtrain-admin migrate

## Build the documentation site into site/ (strict: a broken link or a missing page fails).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --site-dir site

## Lint, format check and type check (configuration in pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .privtrain .pytest_cache site
