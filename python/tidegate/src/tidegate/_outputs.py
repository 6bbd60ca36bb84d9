"""Output files written atomically, and checkpoints that cover only rows durably written.

Tidegate stages every visible file of the output folder and ignores names starting with `.` or
`_`. `output()` writes under such a hidden name, fsyncs, and renames: a file is visible only
whole, so a task that dies mid-write leaves nothing Tidegate would stage. `checkpoint()` reports
a granule only after checking that its files are complete, hold the rows it declares, and are on
disk; the line it appends declares `rows`, which Tidegate checks again against what it staged.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Dict, List, Optional

from . import _env
from ._env import TaskError

#: Tidegate's limits on a checkpoint line's granule and position (engine `checkpoint.rs`).
MAX_GRANULE_BYTES = 256
MAX_POSITION_BYTES = 4096

#: Files `output()` wrote since the last checkpoint, relative to the output folder, with their rows.
_pending: Dict[str, int] = {}


class CheckpointRefused(TaskError):
    """A checkpoint whose rows are not all durably written: reporting it would lose rows."""


def output(data, dataset: Optional[str] = None, name: Optional[str] = None) -> str:
    """Writes `data` as one Parquet file of `dataset`'s output, atomically; returns its name
    relative to the output folder (what `checkpoint(files=...)` takes).

    `data`: a `pyarrow.Table` or `RecordBatch`, an iterable of record batches (streamed: a task
    that dies half way leaves only a hidden file), a Polars or pandas `DataFrame`, or anything
    with `__arrow_c_stream__`. `dataset` may be left out when the task has one output. `name`
    defaults to the next free `part-NNNNN.parquet`; an existing file is never replaced.
    """
    folder = _folder_of(dataset)
    name = _file_name(folder, name)
    final = os.path.join(folder, name)
    temp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    try:
        n_rows = _write_parquet(temp, data)
        os.rename(temp, final)
    except BaseException:
        _remove_quietly(temp)
        raise
    _fsync(folder)
    relative = os.path.relpath(final, _env.output_dir())
    _pending[relative] = n_rows
    return relative


def checkpoint(
    position: str,
    rows: int,
    granule: Optional[str] = None,
    files: Optional[List[str]] = None,
    data_version: Optional[int] = None,
) -> None:
    """Reports a finished granule: a retry resumes after `position` (`resume_from()`).

    `files` (relative to the output folder) defaults to what `output()` wrote since the last
    checkpoint. Refused with `CheckpointRefused` unless every file is complete and they hold
    `rows` rows together; then they are fsynced and one line is appended to the checkpoint file
    and fsynced. `granule` defaults to the position (hashed when it is too long for a granule).
    """
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise TaskError(f"rows must be a count of rows (an int >= 0), got {rows!r}")
    if len(position.encode()) > MAX_POSITION_BYTES:
        raise TaskError(f"position is longer than {MAX_POSITION_BYTES} bytes")
    granule = granule if granule is not None else _granule_of(position)
    _check_granule(granule)
    names = list(_pending) if files is None else list(files)
    counted = {n: _pending.get(n) if files is None else _count_rows(n) for n in names}
    total = sum(counted.values())
    if total != rows:
        shown = ", ".join(f"{n}: {c}" for n, c in counted.items()) or "no file"
        raise CheckpointRefused(
            f"checkpoint {granule!r} declares {rows} rows but its files hold {total} ({shown}); "
            "a checkpoint covering rows not written would let a retry skip them"
        )
    for n in names:
        _fsync(os.path.join(_env.output_dir(), n))
    line = {"granule": granule, "position": position, "files": names, "rows": rows}
    if data_version is not None:
        line["data_version"] = data_version
    _append_line(_env.checkpoint_file(), json.dumps(line) + "\n")
    for n in names:
        _pending.pop(n, None)


def _folder_of(dataset: Optional[str]) -> str:
    folders = _env.output_dirs()
    if dataset is None:
        if len(folders) != 1:
            raise TaskError(f"this task writes {sorted(folders)}: name the dataset, output(data, dataset=...)")
        return next(iter(folders.values()))
    if dataset not in folders:
        raise TaskError(f"this task does not write {dataset!r}; its outputs are {sorted(folders)}")
    return folders[dataset]


def _file_name(folder: str, name: Optional[str]) -> str:
    if name is None:
        taken = set(os.listdir(folder))
        n = len(taken)
        while f"part-{n:05}.parquet" in taken:
            n += 1
        return f"part-{n:05}.parquet"
    if os.sep in name or name.startswith((".", "_")) or not name.endswith(".parquet"):
        raise TaskError(f"output file name {name!r} must be a plain name ending in .parquet, not starting with . or _")
    if os.path.exists(os.path.join(folder, name)):
        raise TaskError(f"output file {name!r} exists already; output() never replaces a file")
    return name


def _write_parquet(path: str, data) -> int:
    """Writes `data` to `path`, fsynced; returns its row count."""
    import pyarrow.parquet as pq

    batches = _batches(data)
    first = next(batches, None)
    if first is None:
        raise TaskError("output() got no record batch: pass a table (an empty one keeps the schema)")
    n_rows = 0
    with open(path, "wb") as sink:
        with pq.ParquetWriter(sink, first.schema) as writer:
            for batch in _chain(first, batches):
                writer.write_batch(batch)
                n_rows += batch.num_rows
        sink.flush()
        os.fsync(sink.fileno())
    return n_rows


def _batches(data):
    """`data` as an iterator of pyarrow record batches."""
    import pyarrow as pa

    if isinstance(data, (pa.Table, pa.RecordBatch)):
        return iter([_one_batch(data)])
    kind = type(data).__module__.split(".")[0]
    if kind == "polars":
        return _batches(data.to_arrow())
    if kind == "pandas":
        return _batches(pa.Table.from_pandas(data, preserve_index=False))
    if hasattr(data, "__arrow_c_stream__"):
        return iter(pa.RecordBatchReader.from_stream(data))
    if hasattr(data, "__iter__"):
        return (_one_batch(b) for b in data)
    raise TaskError(f"output() writes Arrow data (a table, batches, a Polars or pandas frame), got {type(data).__name__}")


def _one_batch(item):
    import pyarrow as pa

    if isinstance(item, pa.RecordBatch):
        return item
    if isinstance(item, pa.Table):
        batches = item.combine_chunks().to_batches()
        return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=item.schema)
    raise TaskError(f"output() got an iterable of {type(item).__name__}; it takes record batches or tables")


def _chain(first, rest):
    yield first
    yield from rest


def _count_rows(name: str) -> int:
    """The rows of a complete output file; `CheckpointRefused` for one not (yet) complete."""
    path = os.path.join(_env.output_dir(), name)
    if os.path.isabs(name) or ".." in name.split("/") or not os.path.isfile(path) or os.path.islink(path):
        raise CheckpointRefused(f"file {name!r} is not a regular file in the output folder")
    if os.path.basename(name).startswith((".", "_")):
        raise CheckpointRefused(f"file {name!r} is hidden: Tidegate ignores names starting with . or _")
    if name.endswith((".parquet", ".pq")):
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(path).metadata.num_rows
        except Exception as e:  # a file without its footer is still being written
            raise CheckpointRefused(f"file {name!r} is not a complete Parquet file: {e}") from e
    with open(path, "rb") as f:
        text = f.read()
    if text and not text.endswith(b"\n"):
        raise CheckpointRefused(f"file {name!r} does not end with a newline: its last line is still being written")
    lines = [line for line in text.splitlines() if line.strip()]
    if name.endswith(".csv"):
        return max(len(lines) - 1, 0)
    if name.endswith((".jsonl", ".ndjson", ".json")):
        return len(lines)
    raise CheckpointRefused(f"file {name!r} is not Parquet, CSV or JSON lines")


def _granule_of(position: str) -> str:
    ok = 0 < len(position.encode()) <= MAX_GRANULE_BYTES and not any(ord(c) < 32 or ord(c) == 127 for c in position)
    return position if ok else "position-" + hashlib.sha256(position.encode()).hexdigest()[:40]


def _check_granule(granule: str) -> None:
    if not 0 < len(granule.encode()) <= MAX_GRANULE_BYTES or any(ord(c) < 32 or ord(c) == 127 for c in granule):
        raise TaskError(f"granule must be 1 to {MAX_GRANULE_BYTES} bytes without control characters, got {granule!r}")


def _append_line(path: str, text: str) -> None:
    """Appends `text` with one `O_APPEND` write (Tidegate reads only lines ending in a newline), fsynced."""
    data = text.encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync(path: str) -> None:
    """Flushes a file's data, or a folder's entries (a rename), to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
