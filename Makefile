# Two set-up commands do everything on a fresh machine: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

BROWSER := $(VENV)/.browser

.PHONY: demo test lint venv browser clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU build of torch (a local wheel on CI machines); an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# Debian's Chromium for the report/web-view browser tests (Playwright drives it; it never downloads a browser).
$(BROWSER): scripts/install-browser.sh | $(STAMP)
	bash scripts/install-browser.sh
	touch $(BROWSER)

browser: $(BROWSER)

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP) $(BROWSER)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n 2 tests

demo: $(STAMP)
	$(BIN)/python -m nnforge.demo

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
