"""One declaration per command-line option: its name, type, default, range, help and environment variable.

Every command builds its parser (``add_options``) and checks its values (``check_options``) from ``Option``s,
so that ``--help``, the generated reference pages, the range checks and (for ``serve``) ``/info`` follow from
one place, as text-embeddings-inference's router declares each flag once. An option used by several commands
is declared once, in ``options/shared.py``. A dataclass whose fields are options (``ServeConfig``,
``BatchJob``) declares them with ``Option.field()``; ``options_of`` reads them back, in field order.

"No limit" is a type, not a convention: ``limit`` turns ``0`` into ``None`` when the flag is parsed, so the
code behind it only ever sees a positive number or ``None``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeAlias

from ..errors import ConfigError

NO_LIMIT = "0: no limit"
Raised: TypeAlias = "type[Exception]"  # spelled apart: Option's field ``type`` hides the builtin in its body


class OptionError(ConfigError):
    """An option's value is out of range or ill-formed; the message names the flag (or its variable)."""


def limit(text: str) -> int | None:
    """The type of an option where ``0`` means no limit: ``None`` then, the number otherwise (a negative one is
    left for ``check_options`` to refuse, naming the flag)."""
    value = int(text)
    return None if value == 0 else value


@dataclasses.dataclass(frozen=True)
class Option:
    """A flag ``--name-with-dashes`` (or a positional ``name``): everything argparse, the checks and the pages use.
    ``minimum`` and ``maximum`` are inclusive, ``above`` exclusive (a timeout: more than 0 seconds); ``env`` names
    the variable that stands in for a flag that is not given (``fill_from_env``), and the help says so."""

    name: str = ""
    default: Any = None
    help: str | None = None
    type: Callable[[str], Any] | None = None
    choices: Sequence[str] | None = None
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None
    env: str | None = None
    switch: bool = False  # store_true: given or not
    action: Any = None  # another argparse action (argparse.BooleanOptionalAction: --x / --no-x)
    required: bool = False
    positional: bool = False
    nargs: str | None = None
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return self.name if self.positional else "--" + self.name.replace("_", "-")

    def field(self) -> Any:
        """This option as a dataclass field (named by the field when the option has no name)."""
        return dataclasses.field(default=self.default, metadata={"option": self})

    def argparse_kwargs(self) -> dict[str, Any]:
        if self.switch:
            return {"action": "store_true", "help": self.help}
        if self.action is not None:
            return {"action": self.action, "default": self.default, "help": self.help}
        value_type = self.type
        if value_type is None and isinstance(self.default, (int, float)) and not isinstance(self.default, bool):
            value_type = type(self.default)
        kwargs: dict[str, Any] = {"default": self.default, "required": (self.required and not self.positional) or None}
        kwargs.update(help=self.help, type=value_type, choices=self.choices, nargs=self.nargs, metavar=self.metavar)
        return {key: value for key, value in kwargs.items() if value is not None or key == "default"}

    def check(self, value: Any, error: Raised = OptionError, prefix: str = "") -> None:
        """Raise ``error`` naming the flag when ``value`` is out of range (``None``: not given, or no limit)."""
        if value is None or isinstance(value, bool):
            return
        if self.choices is not None and value not in self.choices:
            raise error(f"{prefix}unknown {self.flag} {value!r}; choose one of {', '.join(self.choices)}")
        if not isinstance(value, (int, float)):
            return
        if self.type is limit and value < 0:
            raise error(f"{prefix}{self.flag} must be >= 0 ({NO_LIMIT}), got {value}")
        if self.type is limit and value == 0:  # only from code: parsed, 0 is None
            raise error(f"{prefix}{self.flag}: no limit is None once parsed, got 0")
        if self.minimum is not None and value < self.minimum:
            raise error(f"{prefix}{self.flag} must be >= {self.minimum:g}{self._zero_means()}, got {value}")
        if self.maximum is not None and value > self.maximum:
            raise error(f"{prefix}{self.flag} must be <= {self.maximum:g}, got {value}")
        if self.above is not None and not value > self.above:
            raise error(f"{prefix}{self.flag} must be > {self.above:g}, got {value}")

    def _zero_means(self) -> str:
        """``(0: ...)`` from the help, where 0 is allowed and means something."""
        if self.minimum != 0 or not self.help or "0: " not in self.help:
            return ""
        meaning = self.help.split("0: ", 1)[1].split(";")[0].split(")")[0].split(",")[0]
        return f" (0: {meaning})"


def options_of(cls: type) -> list[Option]:
    """The options a dataclass declares with ``Option.field()``, named by their fields, in field order."""
    found = []
    for f in dataclasses.fields(cls):
        option = f.metadata.get("option")
        if option is None:
            continue
        if option.name and option.name != f.name:
            raise TypeError(f"{cls.__name__}.{f.name} is declared with the option {option.name!r}")
        found.append(dataclasses.replace(option, name=f.name))
    return found


def add_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, options: Iterable[Option]) -> None:
    for option in options:
        parser.add_argument(option.flag, **option.argparse_kwargs())


def check_options(values: Any, options: Iterable[Option], error: Raised = OptionError, prefix: str = "") -> None:
    """Every option's range, on parsed arguments or on a dataclass of them (``values.NAME``)."""
    for option in options:
        option.check(getattr(values, option.name), error, prefix)


def fill_from_env(values: Any, options: Iterable[Option], error: Raised = OptionError) -> None:
    """Each option with a variable that is not given on the command line takes the variable's value, converted by
    the option's type (one that does not convert: ``error`` naming the variable)."""
    for option in options:
        if option.env is None or getattr(values, option.name) is not None:
            continue
        raw = os.environ.get(option.env)
        if not raw:  # unset or empty: the flag's default
            continue
        try:
            setattr(values, option.name, option.type(raw) if option.type is not None else raw)
        except ValueError:
            raise error(f"{option.env}={raw!r} is not a valid {option.flag}") from None


def by_name(options: Iterable[Option], *names: str) -> list[Option]:
    found = {option.name: option for option in options}
    return [found[name] for name in names]
