# Each target creates its own virtual environment on first use (.venv by default) and installs
# what it needs: the services' own dependencies for the demo (what the images hold), one of
# pyproject's extras on top for the rest.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench-core clean protos

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# The CPU build of torch lies on disk; pin it first so nothing pulls a CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e .
	touch $(STAMP)

# $(VENV)/.installed-dev, -peers, -protos: that extra of pyproject.toml installed too.
$(VENV)/.installed-%: $(STAMP)
	$(PY) -m pip install -q -e '.[$*]'
	touch $@

demo: $(STAMP)
	$(VENV)/bin/minedraft demo

test: $(VENV)/.installed-dev
	$(PY) -m pytest -q tests

bench-core: $(VENV)/.installed-peers
	$(PY) scripts/bench_core.py

clean:
	rm -rf $(VENV) build *.egg-info

protos: $(VENV)/.installed-protos
	$(PY) -m grpc_tools.protoc -Iprotos --python_out=. --grpc_python_out=. --pyi_out=. protos/minedraft/v1/*.proto
