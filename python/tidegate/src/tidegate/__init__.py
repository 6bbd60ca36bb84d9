"""Helpers for Tidegate command tasks written in Python.

The right thing is the easy thing: `inputs()` reads each input at the version pinned for the step
(never a newer one), `output()` writes Parquet atomically, `checkpoint()` refuses to report rows
that are not durably written, and `params()` gives the task's params as the spec spells them.
See docs/command-tasks.md in the Tidegate repository.
"""

from ._env import TaskError, attempt, interval, params, partition, resume_from
from ._inputs import Input, input, inputs
from ._outputs import CheckpointRefused, checkpoint, output

__all__ = [
    "CheckpointRefused",
    "Input",
    "TaskError",
    "attempt",
    "checkpoint",
    "input",
    "inputs",
    "interval",
    "output",
    "params",
    "partition",
    "resume_from",
]
