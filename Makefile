# Two entry points, both usable on a fresh machine (see README):
#   make book   install everything, then build the book, executing every notebook on CPU
#               (tools/build_book.py: several chapters at a time, into _build/source;
#               RECORD=results/book-build/NAME.json keeps the times with their provenance;
#               only the chapters whose inputs changed since the last build execute again,
#               FORCE=1 executes all of them, as RECORD does)
#   make test   install everything, then run all the tests (unit tests + notebooks under nbval)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Data: a local copy when ../shared/data exists (CI, and machines without internet); otherwise
# the data code downloads the official files (with sha256 checks) into ~/.cache/annotated.
ANNOTATED_DATA ?= $(shell [ -d ../shared/data ] && cd ../shared/data && pwd)
ifneq ($(ANNOTATED_DATA),)
export ANNOTATED_DATA
endif

.PHONY: help book test lint other-cpu lab install browser export notebooks clean translator

help:                      ## list the targets
	@grep -E '^[a-z]+:.*## ' Makefile | sed 's/:.*## /\t/'

install: $(STAMP) book/vendor/MANIFEST.json browser   ## create .venv with everything the book needs

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

book/vendor/MANIFEST.json: book/package.json book/package-lock.json tools/vendor_js.py \
		book/js/*.js $(wildcard book/translator/*)
	$(PY) tools/vendor_js.py

# The live translator's model (chapter 14), committed in book/translator: RUN's kept checkpoints,
# averaged and exported to ONNX, with RESULTS' scores of exactly those checkpoints.
RUN ?= runs/multi30k-cpu
RESULTS ?= results/multi30k-cpu
translator: $(STAMP)      ## export RUN (default runs/multi30k-cpu) as the page's translator
	$(PY) tools/browser_model.py --run $(RUN) --results $(RESULTS)
	$(PY) tools/vendor_js.py

# The browser test (tests/test_browser.py) drives Debian's Chromium: installed here when it is
# missing and this runs as root; otherwise the line says what to do.
browser:
	@command -v chromium >/dev/null || [ -n "$$CHROMIUM" ] || { [ "$$(id -u)" = 0 ] \
		&& command -v apt-get >/dev/null \
		&& { apt-get install -y -q chromium >/dev/null \
			|| { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; }; } \
		|| echo "Chromium not found: install it (apt-get install chromium) or set CHROMIUM" \
		"to a Chromium binary; the browser test fails without it."

book: install              ## build the book into _build/html, executing every notebook
	$(PY) tools/build_book.py $(if $(RECORD),--record $(RECORD)) $(if $(FORCE),--force)
	@echo "The book is in _build/html/index.html"

# The notebooks' kernels start under another CPU's kernels and two threads (conftest.py): each
# notebook executes once, and a stored output that depends on this machine's kernels fails.
test: install lint         ## every test: lint, unit tests, notebooks under nbval, packaging
	ANNOTATED_NOTEBOOK_CPU=other OMP_NUM_THREADS=1 $(PY) -m pytest -n 2 --dist loadfile --durations=15

# ruff with pyproject.toml's rules (line length 100, imports, likely bugs) and ruff's formatting, on
# everything that holds code: the generated package, the notebooks, tools, tests and benchmarks;
# then mypy on the package with pyproject.toml's settings (strict on the model's modules).
LINTED := annotated notebooks tools tests benchmarks conftest.py

lint: install              ## ruff on all the code, notebooks included; mypy on the package
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/mypy annotated

# Only the notebooks, as `make test` runs them: under another CPU's kernels (tools/other_cpu.py)
# and two threads each, two notebooks at a time. Threads that wait for work sleep
# (OMP_WAIT_POLICY=PASSIVE) rather than spin, so that four share two cores.
other-cpu: install         ## only the notebooks, under another CPU's kernels and 2 threads, as make test runs them
	ANNOTATED_NOTEBOOK_CPU=other $(PY) -m pytest -n 2 --dist loadfile --durations=10 notebooks/

export: install            ## after editing a notebook: regenerate annotated/
	$(PY) tools/export.py

notebooks: install         ## re-execute notebooks in place so their stored outputs are fresh
	$(PY) tools/run_notebooks.py

lab: install               ## open the chapters in JupyterLab with the project's environment
	$(VENV)/bin/jupyter lab notebooks/

clean:                     ## remove the built book and vendored JavaScript
	rm -rf _build book/vendor book/node_modules
