"""The package's version, its one declaration (``pyproject.toml`` reads it from here).

A leaf: the modules that stamp or report the version import it from here, not from the package root,
whose lazy attributes reach ``predict/``.
"""

__version__ = "0.1.0"
