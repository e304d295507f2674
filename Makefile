# One command each for the demo and the tests; both set themselves up.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.chute-installed

.PHONY: test test-asan test-tf demo bench install clean

$(STAMP): pyproject.toml setup.py $(wildcard src/chute/_native/*.c src/chute/_native/*.h)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

install: $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/mypy src
	$(BIN)/pytest -q

# The compiled core built with AddressSanitizer and UBSan in its own directory, then the store,
# dataset and loader tests run against it: Python finds the sanitized copy of the package first
# (PYTHONPATH), with the sanitizer runtime preloaded into the uninstrumented interpreter.
# Leak checks are off (CPython keeps memory on purpose); SIGSEGV/SIGBUS stay plain signals so
# the child-process harness still sees them; any sanitizer report aborts the test. loaderx's
# own native library dies under the preloaded runtime, so the tests that call it are left out.
ASAN_DIR := build/asan
ASAN_TESTS ?= tests/store tests/test_dataset.py tests/test_ragged.py tests/loader tests/test_sampler.py
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
	$(VENV_TF)/bin/pip install -q -e '.[tf]'
	$(VENV_TF)/bin/pytest -q -p no:cacheprovider tests/insitu/test_tf.py

demo: $(STAMP)
	$(BIN)/python examples/demo.py

bench: $(STAMP)
	$(BIN)/pip install -q -e '.[test,bench]'
	$(BIN)/python bench/store.py --plot
	$(BIN)/python bench/sampler.py --plot
	$(BIN)/python bench/loader.py --plot
	$(BIN)/python bench/metrics.py --plot bench/results/metrics.png
	$(BIN)/python bench/insitu.py --s3 --plot

clean:
	rm -rf $(VENV) $(VENV_TF) build src/*.egg-info src/chute/_native/*.so
