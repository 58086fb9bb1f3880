# DistriNews: `make demo` sets up and runs the main job; `make test` runs the tests.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
DATA   := $(if $(DISTRINEWS_DATA),$(DISTRINEWS_DATA),$(abspath ../shared/data/ag_news))
NPROC  ?= 2
export DISTRINEWS_DATA := $(DATA)
export HF_HUB_OFFLINE = 1

.PHONY: setup demo train-quick predict test test-fast clean

$(BIN)/distrinews: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# CPU PyTorch first, pinned, so the loose torch>=2.4 below never pulls a CUDA build.
	$(BIN)/pip install --quiet "torch==$${TORCH_VERSION:-2.13.0}"
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

setup: $(BIN)/distrinews

demo: setup train-quick predict

train-quick: setup
	$(BIN)/distrinews train --config configs/cpu-quick.yaml --nproc-per-node $(NPROC)

predict: setup
	$(BIN)/distrinews predict --checkpoint runs/cpu-quick/best \
		"Apple unveils a new iPhone with a faster chip and better camera" \
		"Oil prices jump after OPEC agrees to cut production"

test: setup
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

clean:
	rm -rf runs .pytest_cache
