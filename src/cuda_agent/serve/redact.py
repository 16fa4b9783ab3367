"""Server paths out of answers: a verdict's messages and logs name the staging folder, the build
cache, scratch folders and the Python installation of the service's host; clients see neutral
names instead (``solution/model_new.py``, ``<cache>``, ``<scratch>``, ``<python>``)."""

from __future__ import annotations

import re
import sys
import sysconfig
from pathlib import Path
from typing import Any


class PathRedactor:
    """Rewrites every string of a JSON value, replacing this host's paths.

    Args:
        staging_dir: where jobs' files are staged (``<staging_dir>/<content hash>/...``).
        cache_dir: the build cache and baselines.
        scratch_roots: folders holding ``cuda-agent-*`` scratch folders.
    """

    def __init__(self, staging_dir: Path, cache_dir: Path, scratch_roots: tuple[Path, ...]) -> None:
        python_dirs = {sysconfig.get_paths()[key] for key in ("purelib", "platlib", "stdlib")}
        python_dirs |= {sys.prefix, sys.base_prefix}
        rules = [(rf"{re.escape(str(staging_dir))}/[0-9a-f]{{64}}", "solution"),
                 *((rf"{re.escape(str(root))}/cuda-agent-[\w.-]+", "<scratch>") for root in scratch_roots),
                 (re.escape(str(cache_dir)), "<cache>"),
                 *((re.escape(path), "<python>") for path in sorted(python_dirs, key=len, reverse=True))]
        self._rules = [(re.compile(pattern), label) for pattern, label in rules]

    def text(self, text: str) -> str:
        for pattern, label in self._rules:
            text = pattern.sub(label, text)
        return text

    def __call__(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {key: self(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self(item) for item in value]
        return value
