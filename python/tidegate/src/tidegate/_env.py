"""What Tidegate hands a command task in its environment, read once per call.

Every value comes from a `TIDEGATE_*` variable that the attempt set (docs/command-tasks.md). A
variable that is missing means the code does not run inside a Tidegate command task, and the
error says so rather than guessing a default.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Dict, List, Optional, Tuple


class TaskError(Exception):
    """A task used the helper in a way that would publish wrong data; the message says what to fix."""


def require(name: str) -> str:
    """The value of `name`, or a `TaskError` saying the code runs outside a Tidegate task."""
    value = os.environ.get(name)
    if value is None:
        raise TaskError(
            f"{name} is not set: this runs inside a command task that Tidegate started "
            "(tidegate run, serve or a worker), which sets it"
        )
    return value


def output_dir() -> str:
    """The attempt's output folder: checkpoint files are named relative to it."""
    return require("TIDEGATE_OUTPUT_DIR")


def output_dirs() -> Dict[str, str]:
    """Each output dataset's folder, by dataset name (one output: the output folder itself)."""
    prefix = "TIDEGATE_OUTPUT_DIR_"
    found = {k[len(prefix) :].lower(): v for k, v in os.environ.items() if k.startswith(prefix)}
    if not found:
        require(prefix + "<DATASET>")
    return found


def checkpoint_file() -> str:
    """Where checkpoint lines go."""
    return require("TIDEGATE_CHECKPOINT_FILE")


def pinned_inputs() -> List[Tuple[str, str, Optional[int]]]:
    """Each input as `(dataset, table URI, pinned version or None)`, sorted by dataset."""
    prefix, suffix = "TIDEGATE_INPUT_", "_URI"
    found = []
    for key, uri in os.environ.items():
        if not (key.startswith(prefix) and key.endswith(suffix)):
            continue
        upper = key[len(prefix) : -len(suffix)]
        text = require(f"{prefix}{upper}_VERSION")
        found.append((upper.lower(), uri, int(text) if text else None))
    return sorted(found)


def params() -> Dict[str, str]:
    """The task's `params`, with their keys as the spec spells them."""
    text = require("TIDEGATE_PARAMS")
    value = json.loads(text)
    if not isinstance(value, dict):
        raise TaskError(f"TIDEGATE_PARAMS must be a JSON object, got {text!r}")
    return {str(k): str(v) for k, v in value.items()}


def partition() -> str:
    """The step's partition key (`2024-01-03`, `2024-01-03T06`, `eu`)."""
    return require("TIDEGATE_PARTITION")


def interval() -> Optional[Tuple[datetime, datetime]]:
    """The partition's half-open interval in UTC, or `None` for a partition that is not a time."""
    start, end = os.environ.get("TIDEGATE_INTERVAL_START"), os.environ.get("TIDEGATE_INTERVAL_END")
    if not start or not end:
        return None
    parse = lambda t: datetime.fromisoformat(t.replace("Z", "+00:00"))  # noqa: E731
    return parse(start), parse(end)


def attempt() -> int:
    """1 for the first attempt, 2 for the first retry, ..."""
    return int(require("TIDEGATE_ATTEMPT"))


def resume_from() -> Optional[str]:
    """The position of the last checkpoint a retried attempt resumes after, or `None`."""
    return os.environ.get("TIDEGATE_RESUME_FROM") or None
