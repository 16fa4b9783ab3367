"""Turning parsed YAML into the training config dataclasses (strict: unknown keys and wrong types
are errors naming their path), and back into JSON values."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

from cuda_agent.train.config import TrainConfigError, _require


def from_mapping(cls: Any, data: Any, origin: str) -> Any:
    """A config dataclass ``cls`` from a parsed YAML mapping: nested sections become their
    dataclasses, lists become tuples, strings become paths where the field is a path.

    Raises:
        TrainConfigError: an unknown key (listing the valid ones), a value of the wrong type, or
            a value its ``__post_init__`` rejects, each prefixed with ``origin``.
    """
    _require(isinstance(data, dict), f"{origin}: must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    _require(not unknown, f"{origin}: unknown keys {unknown}; valid: {names}")
    kwargs = {key: _convert(hints[key], value, f"{origin}.{key}") for key, value in data.items()}
    try:
        return cls(**kwargs)
    except TrainConfigError as exc:
        raise TrainConfigError(f"{origin}: {exc}") from None


def _convert(hint: Any, value: Any, origin: str) -> Any:
    """``value`` checked against (and converted to) the field type ``hint``."""
    if dataclasses.is_dataclass(hint):
        return from_mapping(hint, value, origin)
    origin_type, args = typing.get_origin(hint), typing.get_args(hint)
    if origin_type in (typing.Union, types.UnionType):
        if value is None:
            _require(type(None) in args, f"{origin}: must not be null")
            return None
        return _convert(next(a for a in args if a is not type(None)), value, origin)
    if origin_type is tuple:
        _require(isinstance(value, (list, tuple)), f"{origin}: must be a list, got {type(value).__name__}")
        items = args[:1] * len(value) if len(args) == 2 and args[1] is Ellipsis else args
        _require(len(items) == len(value), f"{origin}: must have {len(items)} items, got {len(value)}")
        return tuple(_convert(item, v, f"{origin}[{i}]") for i, (item, v) in enumerate(zip(items, value)))
    if origin_type is dict or hint is dict:
        _require(isinstance(value, dict), f"{origin}: must be a mapping, got {type(value).__name__}")
        return dict(value)
    if hint is Path:
        _require(isinstance(value, (str, Path)), f"{origin}: must be a path, got {type(value).__name__}")
        return Path(value)
    if hint is float:
        _require(isinstance(value, (int, float)) and not isinstance(value, bool),
                 f"{origin}: must be a number, got {value!r}")
        return float(value)
    if hint is int:
        _require(isinstance(value, int) and not isinstance(value, bool), f"{origin}: must be an integer, got {value!r}")
        return value
    if hint is bool:
        _require(isinstance(value, bool), f"{origin}: must be true or false, got {value!r}")
        return value
    if hint is str:
        _require(isinstance(value, str), f"{origin}: must be a string, got {value!r}")
        return value
    return value


def to_jsonable(config: Any) -> Any:
    """A config (or part of one) as plain JSON values (paths as strings, tuples as lists)."""
    if dataclasses.is_dataclass(config):
        return {f.name: to_jsonable(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if isinstance(config, dict):
        return {str(k): to_jsonable(v) for k, v in config.items()}
    if isinstance(config, (list, tuple)):
        return [to_jsonable(v) for v in config]
    if isinstance(config, Path):
        return str(config)
    return config
