"""The search space: a YAML mapping of config field to distribution, sampled into a trial's config.

    learning_rate: {low: 1.0e-5, high: 1.0e-3, log: true}        # float (Optuna's suggest_float)
    freeze_layers: {low: 0, high: 3}                             # int: both bounds integers (step: 1)
    lr_scheduler_type: {choices: [linear, cosine]}               # categorical
    lora_r: {low: 4, high: 32, log: true, when: {use_peft: true}}

``type`` (float | int | categorical) may be given; otherwise it follows from ``choices`` or the bounds.
``when`` makes a choice conditional: the field is sampled only when every named field (one sampled
above it, or the base config's value) has the given value, or one of a list of values; otherwise
it keeps the base config's value. Names are config fields (or their aliases), checked against the
config; every bound and every choice is checked by building the config with it, so a bad space
fails in one line (``file:line``) before any trial runs.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..config import TrainConfig, canonical_name
from ..errors import ConfigError

__all__ = ["MAX_SPACE_BYTES", "Dimension", "SearchSpace"]

MAX_SPACE_BYTES = 1 << 20  # a search space is a few lines; anything this large is not one
_KEYS = {"type", "low", "high", "log", "step", "choices", "when"}
_TYPES = ("float", "int", "categorical")


@dataclass(frozen=True)
class Dimension:
    """One field's distribution, and the condition under which it is sampled."""

    name: str
    kind: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] = ()
    when: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    def applies(self, values: dict[str, Any]) -> bool:
        return all(values.get(name) in allowed for name, allowed in self.when.items())

    def suggest(self, trial: Any) -> Any:
        """The value an Optuna trial draws (``trial.suggest_*``, whose name is the field's)."""
        if self.kind == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        assert self.low is not None and self.high is not None, "a numeric range has both ends (checked when parsed)"
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.name, float(self.low), float(self.high), step=self.step, log=self.log)

    def extremes(self) -> list[Any]:
        return list(self.choices) if self.kind == "categorical" else [self.low, self.high]


@dataclass(frozen=True)
class SearchSpace:
    dimensions: tuple[Dimension, ...]

    @classmethod
    def load(cls, path: str | Path, base: TrainConfig) -> SearchSpace:
        """Read and check ``path`` against ``base``, the config every trial starts from."""
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"search space not found: {p}")
        if p.stat().st_size > MAX_SPACE_BYTES:
            raise ConfigError(f"{p}: {p.stat().st_size} bytes; a search space is at most {MAX_SPACE_BYTES}")
        text = p.read_text(encoding="utf-8", errors="replace")
        try:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: not valid YAML: {exc}".replace("\n", " ")) from None
        if not isinstance(loaded, dict) or not loaded:
            raise ConfigError(
                f"{p}: must map config fields to distributions, e.g. "
                "learning_rate: {low: 1.0e-5, high: 1.0e-3, log: true}"
            )
        lines = (
            {str(k.value): k.start_mark.line + 1 for k, _ in node.value} if isinstance(node, yaml.MappingNode) else {}
        )
        dims: list[Dimension] = []
        for key, spec in loaded.items():
            where = f"{p}:{lines.get(str(key), 1)}"
            try:
                dims.append(_dimension(str(key), spec, [d.name for d in dims]))
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
            lines[dims[-1].name] = lines.get(str(key), 1)
        names = [d.name for d in dims]
        for i, dim in enumerate(dims):
            later = [other for other in dim.when if other in names[i:]]
            if later:
                raise ConfigError(
                    f"{p}:{lines.get(dim.name, 1)}: {dim.name}: when names {later[0]}, which must be sampled above it"
                )
        space = cls(tuple(dims))
        for dim in dims:
            for value in dim.extremes():
                try:
                    space.config(base, {dim.name: value})
                except ConfigError as exc:
                    raise ConfigError(f"{p}:{lines.get(dim.name, 1)}: {dim.name} = {value!r}: {exc}") from None
        return space

    def sample(self, trial: Any, base: TrainConfig) -> dict[str, Any]:
        """The trial's values, in file order; a conditional field only where its condition holds."""
        values = base.to_dict()
        params: dict[str, Any] = {}
        for dim in self.dimensions:
            if dim.applies(values):
                params[dim.name] = values[dim.name] = dim.suggest(trial)
        return params

    def config(self, base: TrainConfig, params: dict[str, Any]) -> TrainConfig:
        """``base`` with ``params``: checked as any config is (a field's bounds, fields that must agree)."""
        return TrainConfig.from_dict({**base.to_dict(), **params})


def _dimension(key: str, spec: Any, earlier: list[str]) -> Dimension:
    name = canonical_name(key)
    if name in earlier:
        raise ConfigError(f"{name} is in the space twice")
    if not isinstance(spec, dict):
        raise ConfigError(
            f"{name}: expects a mapping such as {{low: 0.0, high: 0.1}} or {{choices: [a, b]}}, got {spec!r}"
        )
    unknown = sorted(set(map(str, spec)) - _KEYS)
    if unknown:
        raise ConfigError(f"{name}: unknown key(s) {', '.join(unknown)}; a distribution has {', '.join(sorted(_KEYS))}")
    when = _condition(name, spec.get("when"))
    kind = spec.get("type") or _implied_type(spec)
    if kind not in _TYPES:
        raise ConfigError(f"{name}: type must be one of {', '.join(_TYPES)}, got {kind!r}")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{name}: choices must be a non-empty list")
        if not all(c is None or isinstance(c, (bool, int, float, str)) for c in choices):
            raise ConfigError(f"{name}: choices must be numbers, strings, booleans or null")
        if set(spec) - {"type", "choices", "when"}:
            raise ConfigError(f"{name}: a categorical takes choices (and when) only")
        return Dimension(name, kind, choices=tuple(choices), when=when)
    if "choices" in spec:
        raise ConfigError(f"{name}: choices go with type categorical")
    low, high = _number(name, spec, "low"), _number(name, spec, "high")
    log = spec.get("log", False)
    step = _number(name, spec, "step") if spec.get("step") is not None else None
    if not isinstance(log, bool):
        raise ConfigError(f"{name}: log must be true or false")
    if not low < high:
        raise ConfigError(f"{name}: low must be below high (got {low} and {high})")
    if log and low <= 0:
        raise ConfigError(f"{name}: log needs low > 0 (got {low})")
    if step is not None and (step <= 0 or log):
        raise ConfigError(f"{name}: step must be > 0, and cannot go with log")
    if kind == "int":
        for label, value in (("low", low), ("high", high), ("step", step)):
            if value is not None and value != int(value):
                raise ConfigError(f"{name}: an int distribution needs whole numbers ({label} is {value})")
        return Dimension(name, kind, int(low), int(high), log, None if step is None else int(step), when=when)
    return Dimension(name, kind, float(low), float(high), log, step, when=when)


def _implied_type(spec: dict[str, Any]) -> str:
    """The type a distribution without ``type`` has: categorical with ``choices``, int where both bounds are whole
    numbers (a YAML boolean is not one), float otherwise."""
    if "choices" in spec:
        return "categorical"
    whole = all(isinstance(spec.get(b), int) and not isinstance(spec.get(b), bool) for b in ("low", "high"))
    return "int" if whole else "float"


def _number(name: str, spec: dict[str, Any], key: str) -> float:
    value = spec.get(key)
    if isinstance(value, str):  # YAML 1.1 reads 1e-5 (no dot) as a string
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name}: {key} must be a finite number, got {spec.get(key)!r}")
    return value


def _condition(name: str, when: Any) -> dict[str, tuple[Any, ...]]:
    if when is None:
        return {}
    if not isinstance(when, dict) or not when:
        raise ConfigError(f"{name}: when must map fields to a value or a list of values, e.g. when: {{use_peft: true}}")
    condition: dict[str, tuple[Any, ...]] = {}
    for key, allowed in when.items():
        other = canonical_name(str(key))
        if other == name:
            raise ConfigError(f"{name}: when cannot name the field itself")
        condition[other] = tuple(allowed) if isinstance(allowed, list) else (allowed,)
    return condition
