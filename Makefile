# Two set-up commands do everything on a fresh machine: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

BROWSER := $(VENV)/.browser
WEBJS   := node_modules/.installed

.PHONY: demo test lint venv browser webjs clean gpu-wheels

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU build of torch (a local wheel on CI machines); an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,modelview,gpu]'
	touch $(STAMP)

venv: $(STAMP)

# Debian's Chromium for the report/web-view browser tests (Playwright drives it; it never downloads a browser).
$(BROWSER): scripts/install-browser.sh | $(STAMP)
	bash scripts/install-browser.sh
	touch $(BROWSER)

browser: $(BROWSER)

# plotly.js's cartesian bundle (pinned in package-lock.json) for the report and web view: a third of the full bundle's
# start-up time. Without npm, pages fall back to plotly.py's full bundle (slower first visits).
$(WEBJS): package.json package-lock.json
	@if command -v npm >/dev/null; then npm ci --no-audit --no-fund --loglevel=error && touch $(WEBJS); \
	else echo "warning: npm not found; the report and web view use plotly.py's full plotly.js bundle"; fi

webjs: $(WEBJS)

# Wheels a GPU machine without a network installs from (scripts/gpu-check.sh; carry gpu-wheels/ to it): FlashRNN,
# the GPU bench's anchor, for the GPU machines' Python 3.12 on x86-64.
gpu-wheels: | $(STAMP)
	$(BIN)/pip download -q -d gpu-wheels --no-deps --only-binary=:all: --python-version 3.12 \
		--platform manylinux2014_x86_64 flashrnn==1.0.8 einops ninja

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP) $(BROWSER) $(WEBJS)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup -m 'not timing' tests
	# Tests that assert on measured speed run alone: a parallel worker's load is not the machine's noise.
	$(BIN)/python -m pytest -q -m timing tests

demo: $(STAMP) $(WEBJS)
	$(BIN)/python -m nnforge.demo

clean:
	rm -rf $(VENV) node_modules build *.egg-info .pytest_cache
