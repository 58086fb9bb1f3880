"""The errors a user can cause, each reported as one line and exit status 2, never a traceback.

They live apart from the modules that raise them so that the command line (and the launcher
process, which trains nothing) can catch them without importing torch or transformers.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is unknown, ill-typed or out of range; the message names the field."""


class DataError(ValueError):
    """The data is missing or malformed; the message names the file (and line)."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded, as one line naming the file and why: refused (a pickle with code in it,
    stopped by ``weights_only=True`` or the restricted unpickler; a file its manifest does not list; a link), damaged
    or incomplete. The original exception is chained for logs; the message never suggests ``weights_only=False``."""


PREFIX = "distrinews: error: "


def one_line(problem: object) -> str:
    """How a user error is shown: one line, the program's name first."""
    return f"{PREFIX}{problem}"


class DiskFullError(Exception):
    """A save that ran out of space, as one line: where, the filesystem, the space needed and free, and the newest
    complete checkpoint to resume from. The half-written temporary directory is already removed."""


# Raised inside a run's process group by what the user gave it (or a disk they can make room on); the command line
# adds its own (a bad launcher flag, a bad serve option) to these for its exit 2.
USER_ERRORS: tuple[type[Exception], ...] = (ConfigError, DataError, CheckpointError, DiskFullError, FileNotFoundError)
