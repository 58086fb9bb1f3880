"""The BentoML service of the peer benchmark (``serve_bentoml.py`` starts ``bentoml serve`` on it, with its
settings in ``SETTINGS_ENV``)."""

from __future__ import annotations

import json
import os
from typing import Any

import bentoml

from . import serve_model
from .serve_bentoml import PEER, SETTINGS_ENV

_SETTINGS = json.loads(os.environ[SETTINGS_ENV])
_CONFIG = _SETTINGS["config"]


@bentoml.service(**_CONFIG["bentoml.service"])
class Classifier:
    def __init__(self) -> None:
        self.predictor = serve_model.load(_SETTINGS["checkpoint"], PEER, _CONFIG)

    @bentoml.api(**_CONFIG["bentoml.api"])  # type: ignore[untyped-decorator]  # bentoml ships no types
    def predict(self, texts: list[str]) -> list[dict[str, Any]]:
        return serve_model.classify(self.predictor, texts)
