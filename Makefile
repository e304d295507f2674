# One command each for the demo and the tests; both set themselves up.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.chute-installed
DEMO_STAMP := $(VENV)/.chute-demo
SOURCES := pyproject.toml setup.py $(wildcard src/chute/_native/*.c src/chute/_native/*.h)

.PHONY: test test-asan test-tf demo docs test-all test-wheel bench gpu-wheels install clean

$(STAMP): $(SOURCES)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,docs]'
	touch $@

# The demo needs only the package and the small `demo` extra, not the test stack; building
# in the venv itself (no isolated build env) saves installing setuptools and numpy twice, and
# --no-compile leaves byte-compiling to the imports the demo makes (a fraction of scipy et al.).
$(DEMO_STAMP): $(SOURCES)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --no-compile 'setuptools>=77' 'numpy>=1.26'
	$(BIN)/pip install -q --no-compile --no-build-isolation -e '.[demo]'
	touch $@

install: $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/mypy src
	$(BIN)/lint-imports --no-cache
	$(BIN)/pytest -q
	$(MAKE) --no-print-directory docs

# The compiled core built with AddressSanitizer and UBSan in its own directory, then the store,
# dataset and loader tests run against it: Python finds the sanitized copy of the package first
# (PYTHONPATH), with the sanitizer runtime preloaded into the uninstrumented interpreter.
# Leak checks are off (CPython keeps memory on purpose); SIGSEGV/SIGBUS stay plain signals so
# the child-process harness still sees them; any sanitizer report aborts the test. loaderx's
# own native library dies under the preloaded runtime, so the tests that call it are left out.
ASAN_DIR := build/asan
ASAN_TESTS ?= tests/store tests/datasets/test_dataset.py tests/datasets/test_ragged.py tests/datasets/test_tokens.py tests/datasets/test_tokens_reader.py tests/datasets/test_sharded.py tests/loader tests/metrics/test_curves_native.py
test-asan: $(STAMP)
	rm -rf $(ASAN_DIR) && mkdir -p $(ASAN_DIR)/pkg
	CFLAGS="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all" \
	LDFLAGS="-fsanitize=address,undefined" \
	  $(BIN)/python setup.py -q build_ext --build-lib $(ASAN_DIR)/lib --build-temp $(ASAN_DIR)/tmp
	cp -r src/chute $(ASAN_DIR)/pkg/chute
	rm -f $(ASAN_DIR)/pkg/chute/_native/*.so
	cp $(ASAN_DIR)/lib/chute/_native/*.so $(ASAN_DIR)/pkg/chute/_native/
	PYTHONPATH=$(CURDIR)/$(ASAN_DIR)/pkg \
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so):$$(gcc -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:handle_segv=0:handle_sigbus=0:allow_user_segv_handler=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(BIN)/python -c 'import chute._native._zrecord as z, sys; assert "/$(ASAN_DIR)/" in z.__file__, z.__file__' && \
	PYTHONPATH=$(CURDIR)/$(ASAN_DIR)/pkg \
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so):$$(gcc -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:handle_segv=0:handle_sigbus=0:allow_user_segv_handler=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(BIN)/python -m pytest -q -p no:cacheprovider -k "not loaderx" $(ASAN_TESTS)

# TensorFlow in an environment of its own: it cannot share a process with torch or JAX
VENV_TF := .venv-tf
test-tf:
	test -x $(VENV_TF)/bin/python || $(PY) -m venv $(VENV_TF)
	$(VENV_TF)/bin/pip install -q -e '.[tf,insitu]' 'pytest>=8' 'hypothesis>=6.100'
	$(VENV_TF)/bin/pytest -q -p no:cacheprovider tests/insitu/test_tf.py

demo: $(DEMO_STAMP)
	$(BIN)/python examples/demo.py

# The site: mkdocs (material) + mkdocstrings, into site/; --strict turns a broken link or
# reference into a failure.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

# The suite on each Python in its own venv (.venv-3.X). torch has no CPU wheel for 3.12/3.13
# on the package indices here (PyPI's is the CUDA build), so those venvs go without it and the
# torch tests skip, saying so.
PYTHONS ?= 3.11 3.12 3.13
test-all:
	@set -e; for v in $(PYTHONS); do \
	  echo "== Python $$v"; \
	  py=python$$v; \
	  if command -v pyenv > /dev/null; then pv=$$(pyenv versions --bare | grep "^$$v\." | tail -1); \
	    [ -z "$$pv" ] || py="$$(pyenv root)/versions/$$pv/bin/python$$v"; fi; \
	  test -x .venv-$$v/bin/python || $$py -m venv .venv-$$v; \
	  .venv-$$v/bin/pip install -q --upgrade pip; \
	  if [ "$$v" = 3.11 ]; then .venv-$$v/bin/pip install -q -e '.[test]'; \
	  else .venv-$$v/bin/python -c 'import tomllib; t = tomllib.load(open("pyproject.toml", "rb")); \
	    print("\n".join(r for r in t["project"]["optional-dependencies"]["test"] \
	    if not r.startswith("torch")))' > .venv-$$v/test-requirements.txt; \
	    .venv-$$v/bin/pip install -q -e . -r .venv-$$v/test-requirements.txt; \
	    echo "note: no torch in .venv-$$v (the CPU wheel of torch==2.13.0 here is for 3.11;" \
	      "PyPI's is the CUDA build): the tests that import torch skip"; fi; \
	  .venv-$$v/bin/pytest -q -p no:cacheprovider; \
	done

# The built wheel alone in a fresh venv, outside the source tree (tests/test_wheel.py does
# the same inside `make test`).
test-wheel: $(STAMP)
	$(BIN)/pytest -q tests/test_wheel.py

# The benchmarks get their own venv: the peers' packages pin older numpy (mosaicml-streaming:
# numpy < 2.2) and would change what `make test` runs against. They also pull torchvision,
# whose only wheel for the CPU torch here is a CUDA build that cannot load (a broken one breaks
# their imports); no benchmark uses it, so it goes.
BENCH := .venv-bench/bin
bench:
	test -x $(BENCH)/python || $(PY) -m venv .venv-bench
	$(BENCH)/pip install -q -e '.[test,bench]'
	$(BENCH)/pip uninstall -y -q torchvision
	$(BENCH)/python bench/store.py --plot
	$(BENCH)/python bench/sampler.py --plot
	$(BENCH)/python bench/shuffle.py --plot
	$(BENCH)/python bench/loader.py --plot
	$(BENCH)/python bench/metrics.py --plot bench/results/metrics.png
	$(BENCH)/python bench/dashboard.py --plot bench/results/dashboard.png
	$(BENCH)/python bench/insitu.py --s3 --plot
	$(BENCH)/python bench/scale.py --plot
	$(BENCH)/python bench/remote.py --rounds 2
	$(BENCH)/python bench/transforms.py --plot
	$(BENCH)/python bench/tokens.py --plot

# The wheels the GPU machine's prepared run installs (bench/GPU.md): chute built here for its
# Python 3.12 (manylinux, the system libzstd linked at run time) and the peers' wheels, into
# .gpuwheels/ (ignored by git; the device tool's carry list names it).
gpu-wheels:
	bash bench/gpu-wheels.sh .gpuwheels

clean:
	rm -rf $(VENV) $(VENV_TF) .venv-3.* .venv-bench .gpuwheels build dist site src/*.egg-info src/chute/_native/*.so
