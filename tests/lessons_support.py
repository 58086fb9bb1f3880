"""Imports docs/lessons/regenerate.py (not a package) for the lessons' tests."""

from __future__ import annotations

import sys
from pathlib import Path

LESSONS_DIR = Path(__file__).resolve().parents[1] / "docs" / "lessons"
if str(LESSONS_DIR) not in sys.path:
    sys.path.insert(0, str(LESSONS_DIR))

import regenerate  # noqa: E402

__all__ = ["regenerate"]
