# The course's two entry points. Both set up everything they need themselves:
#   make book   build the HTML book under _build/html, executing every chapter
#   make test   run the whole test suite (CI runs exactly this)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: book test install clean exercises

$(STAMP): requirements.txt solutions/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q -r requirements.txt
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

install: $(STAMP)

book: $(STAMP)
	$(BIN)/jupyter-book build . --warningiserror --keep-going

test: $(STAMP)
	$(BIN)/python -m pytest

# Regenerate exercises/ from solutions/assignments/ (never edit exercises/ by hand).
exercises: $(STAMP)
	$(BIN)/python -m autograder release --all

clean:
	rm -rf _build
