"""A task's inputs, each read at the Delta version Tidegate pinned for the step.

A step's inputs are pinned when it becomes ready, and lineage records those versions. Reading the
table's latest version instead would publish data from a newer version than lineage says, and a
retry would read yet another: so the only way in is through the pinned version, checked.
"""

from __future__ import annotations

from typing import Dict, List, Optional

from . import _env
from ._env import TaskError


class Input:
    """One input dataset of the step, at its pinned version."""

    def __init__(self, name: str, uri: str, version: Optional[int]):
        #: The dataset's name in the spec.
        self.name = name
        #: Its Delta table (a folder or an `s3://` URL).
        self.uri = uri
        #: The Delta version pinned for this step; `None` when the input had no published version.
        self.version = version

    def __repr__(self) -> str:
        return f"Input({self.name!r}, version={self.version})"

    def delta(self):
        """The `deltalake.DeltaTable` at the pinned version."""
        from deltalake import DeltaTable

        if self.version is None:
            raise TaskError(
                f"input {self.name!r} has no published version yet "
                f"(TIDEGATE_INPUT_{self.name.upper()}_VERSION is empty): run the task that writes it first"
            )
        table = DeltaTable(self.uri, version=self.version)
        if table.version() != self.version:
            raise TaskError(f"input {self.name!r}: asked for version {self.version}, got {table.version()}")
        return table

    def arrow(self, columns: Optional[List[str]] = None, partition_column: bool = True):
        """The pinned version's rows as a `pyarrow.Table`, typed as the table is.

        Every partition of that version, with the partition column (`tg_partition` unless the
        dataset names another) to select the ones the task reads; `partition_column=False` leaves
        it out. Read through delta-rs' own engine (`QueryBuilder`): pyarrow's dataset scanner leaves
        threads that abort the interpreter at exit ("terminate called without an active
        exception"), which Tidegate would see as a crash.
        """
        import pyarrow as pa
        from deltalake import QueryBuilder

        table = self.delta()
        schema = pa.schema(table.schema().to_arrow())
        hidden = set() if partition_column else set(table.metadata().partition_columns)
        names = [f.name for f in schema if f.name not in hidden]
        if columns is not None:
            missing = [c for c in columns if c not in names]
            if missing:
                raise TaskError(f"input {self.name!r} has no column {missing[0]!r}; it has {names}")
            names = list(columns)
        if not names:
            raise TaskError(f"input {self.name!r}: no column to read")
        wanted = pa.schema([schema.field(n) for n in names])
        select = ", ".join('"' + n.replace('"', '""') + '"' for n in names)
        reader = QueryBuilder().register("input", table).execute(f"SELECT {select} FROM input")
        result = pa.RecordBatchReader.from_stream(reader).read_all()
        # DataFusion hands strings back as views; the table's own types are what the task expects.
        return result.cast(wanted)

    def polars(self, columns: Optional[List[str]] = None, partition_column: bool = True):
        """The pinned version's rows as a Polars `DataFrame` (needs `polars`)."""
        import polars as pl

        return pl.from_arrow(self.arrow(columns, partition_column))

    def pandas(self, columns: Optional[List[str]] = None, partition_column: bool = True):
        """The pinned version's rows as a pandas `DataFrame` (needs `pandas`)."""
        return self.arrow(columns, partition_column).to_pandas()


def inputs() -> Dict[str, Input]:
    """Every input of the step, by dataset name, each at its pinned version."""
    return {name: Input(name, uri, version) for name, uri, version in _env.pinned_inputs()}


def input(name: str) -> Input:  # noqa: A001 - the name a task author looks for
    """The input `name`, at its pinned version; a `TaskError` naming the inputs if it is none."""
    found = inputs()
    if name not in found:
        raise TaskError(f"this task has no input {name!r}; its inputs are {sorted(found)} (the task's `inputs`)")
    return found[name]
