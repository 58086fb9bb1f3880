"""MkDocs hook: adds the generated reference pages (docs/reference_pages.py) and the benchmark pages
(benchmarks/, kept beside their data at the repository's root) to the site."""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT / "src"), str(HERE)]

import reference_pages  # noqa: E402

# Folders kept at the repository's root that pages link to: every file in them goes into the site as it is.
ROOT_FOLDERS = ("benchmarks", "configs")


def on_files(files: Files, config) -> Files:
    for path, text in reference_pages.pages().items():
        files.append(File.generated(config, path, content=text))
    for folder in ROOT_FOLDERS:
        for source in sorted((ROOT / folder).rglob("*")):
            if source.is_file() and not source.is_symlink():
                files.append(File.generated(config, source.relative_to(ROOT).as_posix(), abs_src_path=str(source)))
    # The source, so that a lesson can link to the module that does what it teaches (the .py files only).
    for source in sorted((ROOT / "src").rglob("*.py")):
        if not source.is_symlink():
            files.append(File.generated(config, source.relative_to(ROOT).as_posix(), abs_src_path=str(source)))
    recipes = ROOT / "deploy" / "README.md"
    files.append(File.generated(config, "guide/deploy-recipes.md", abs_src_path=str(recipes)))
    return files
