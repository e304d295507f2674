# One command each for the demo and the tests; both set themselves up.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.chute-installed

.PHONY: test test-tf demo bench install clean

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
