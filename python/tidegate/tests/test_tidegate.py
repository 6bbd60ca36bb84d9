"""Unit tests of the `tidegate` package against real Delta tables and real files in a temp folder,
with the environment a Tidegate attempt sets. Run by the Rust test `python_helper` in CI:
`python -m unittest discover -s tests`.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

import tidegate as tg
from tidegate import _outputs


class Attempt(unittest.TestCase):
    """A temp folder laid out as an attempt's: an output folder, a checkpoint file, a lake with
    one input table `raw` at versions 0 (two rows) and 1 (a third row), pinned at 0."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        root = self.tmp.name
        self.out = os.path.join(root, "out")
        os.mkdir(self.out)
        self.raw = os.path.join(root, "lake", "raw")
        day = lambda d: pa.array([d] * 2, pa.string())  # noqa: E731
        write_deltalake(
            self.raw,
            pa.table({"id": pa.array([1, 2], pa.int64()), "name": ["a", "b"], "tg_partition": day("2024-01-01")}),
            partition_by=["tg_partition"],
        )
        write_deltalake(
            self.raw,
            pa.table({"id": pa.array([3], pa.int64()), "name": ["c"], "tg_partition": ["2024-01-02"]}),
            partition_by=["tg_partition"],
            mode="append",
        )
        self.checkpoints = os.path.join(root, "checkpoints.jsonl")
        env = {
            "TIDEGATE_OUTPUT_DIR": self.out,
            "TIDEGATE_OUTPUT_DIR_DAILY": self.out,
            "TIDEGATE_CHECKPOINT_FILE": self.checkpoints,
            "TIDEGATE_INPUT_RAW_URI": self.raw,
            "TIDEGATE_INPUT_RAW_VERSION": "0",
            "TIDEGATE_PARAMS": json.dumps({"Drop-Bots": "true", "batch": "10"}),
            "TIDEGATE_PARTITION": "2024-01-01",
            "TIDEGATE_INTERVAL_START": "2024-01-01T00:00:00Z",
            "TIDEGATE_INTERVAL_END": "2024-01-02T00:00:00Z",
            "TIDEGATE_ATTEMPT": "2",
            "TIDEGATE_RESUME_FROM": "offset=19",
        }
        patch = mock.patch.dict(os.environ, env)
        patch.start()
        self.addCleanup(patch.stop)
        self.addCleanup(self.tmp.cleanup)
        _outputs._pending.clear()

    def lines(self):
        if not os.path.exists(self.checkpoints):
            return []
        with open(self.checkpoints) as f:
            return [json.loads(line) for line in f]

    def visible(self):
        return sorted(n for n in os.listdir(self.out) if not n.startswith((".", "_")))


class Inputs(Attempt):
    def test_an_input_is_read_at_its_pinned_version_not_the_latest(self):
        self.assertEqual(DeltaTable(self.raw).version(), 1, "a newer version exists")
        raw = tg.inputs()["raw"]
        self.assertEqual((raw.name, raw.version), ("raw", 0))
        self.assertEqual(raw.delta().version(), 0)
        self.assertEqual(sorted(raw.arrow()["id"].to_pylist()), [1, 2])

    def test_rows_keep_the_tables_types_and_the_partition_column_unless_asked(self):
        table = tg.input("raw").arrow(partition_column=False)
        self.assertEqual(table.schema, pa.schema([("id", pa.int64()), ("name", pa.string())]))
        with_partition = tg.input("raw").arrow()
        self.assertEqual(with_partition.column_names, ["id", "name", "tg_partition"])
        self.assertEqual(set(with_partition["tg_partition"].to_pylist()), {"2024-01-01"})
        self.assertEqual(tg.input("raw").arrow(columns=["name"]).column_names, ["name"])
        with self.assertRaisesRegex(tg.TaskError, "no column 'nope'"):
            tg.input("raw").arrow(columns=["nope"])

    def test_polars_and_pandas_frames_on_request(self):
        self.assertEqual(sorted(tg.input("raw").polars()["id"].to_list()), [1, 2])
        self.assertEqual(sorted(tg.input("raw").pandas()["name"].tolist()), ["a", "b"])

    def test_an_input_without_a_published_version_and_an_unknown_input_are_clear_errors(self):
        os.environ["TIDEGATE_INPUT_RAW_VERSION"] = ""
        with self.assertRaisesRegex(tg.TaskError, "no published version yet.*TIDEGATE_INPUT_RAW_VERSION"):
            tg.input("raw").arrow()
        with self.assertRaisesRegex(tg.TaskError, r"no input 'events'; its inputs are \['raw'\]"):
            tg.input("events")

    def test_outside_a_task_the_error_names_the_missing_variable(self):
        del os.environ["TIDEGATE_INPUT_RAW_VERSION"]
        with self.assertRaisesRegex(tg.TaskError, "TIDEGATE_INPUT_RAW_VERSION is not set"):
            tg.inputs()


class Context(Attempt):
    def test_params_partition_interval_attempt_and_resume_position(self):
        self.assertEqual(tg.params(), {"Drop-Bots": "true", "batch": "10"})
        self.assertEqual(tg.partition(), "2024-01-01")
        start, end = tg.interval()
        self.assertEqual((start.isoformat(), end.isoformat()), ("2024-01-01T00:00:00+00:00", "2024-01-02T00:00:00+00:00"))
        self.assertEqual((tg.attempt(), tg.resume_from()), (2, "offset=19"))


class Outputs(Attempt):
    def test_a_table_is_written_as_parquet_under_a_visible_name_only_once_complete(self):
        name = tg.output(pa.table({"id": [1, 2, 3]}))
        self.assertEqual(name, "part-00000.parquet")
        self.assertEqual(os.listdir(self.out), [name], "no temp file is left")
        self.assertEqual(pq.read_table(os.path.join(self.out, name))["id"].to_pylist(), [1, 2, 3])
        self.assertEqual(tg.output(pa.table({"id": [4]})), "part-00001.parquet")

    def test_polars_pandas_and_batches_are_written_typed(self):
        import pandas as pd
        import polars as pl

        tg.output(pl.DataFrame({"x": [1.5]}), name="polars.parquet")
        tg.output(pd.DataFrame({"x": [2.5]}), name="pandas.parquet")
        batch = pa.record_batch({"x": pa.array([3.5], pa.float64())})
        tg.output(iter([batch, batch]), name="stream.parquet")
        for name, rows in [("polars.parquet", 1), ("pandas.parquet", 1), ("stream.parquet", 2)]:
            table = pq.read_table(os.path.join(self.out, name))
            self.assertEqual((table.num_rows, table.schema.field("x").type), (rows, pa.float64()), name)

    def test_a_stream_that_fails_half_way_leaves_no_file(self):
        def dies():
            yield pa.record_batch({"id": [1]})
            raise RuntimeError("the source went away")

        with self.assertRaisesRegex(RuntimeError, "went away"):
            tg.output(dies())
        self.assertEqual(os.listdir(self.out), [])

    def test_a_process_killed_mid_write_leaves_only_a_hidden_file(self):
        script = (
            "import os, pyarrow as pa, tidegate as tg\n"
            "def dies():\n"
            "    yield pa.record_batch({'id': [1]})\n"
            "    os._exit(75)\n"
            "tg.output(dies())\n"
        )
        done = subprocess.run([sys.executable, "-c", script], env=dict(os.environ), capture_output=True)
        self.assertEqual(done.returncode, 75, done.stderr)
        self.assertEqual(self.visible(), [], "Tidegate would stage nothing")
        self.assertEqual(len(os.listdir(self.out)), 1, "the half-written file stays hidden")

    def test_an_existing_file_is_never_replaced_and_names_are_checked(self):
        tg.output(pa.table({"id": [1]}), name="a.parquet")
        with self.assertRaisesRegex(tg.TaskError, "exists already"):
            tg.output(pa.table({"id": [2]}), name="a.parquet")
        for bad in [".a.parquet", "_a.parquet", "a.csv", "sub/a.parquet"]:
            with self.assertRaisesRegex(tg.TaskError, "must be a plain name"):
                tg.output(pa.table({"id": [2]}), name=bad)
        self.assertEqual(pq.read_table(os.path.join(self.out, "a.parquet"))["id"].to_pylist(), [1])

    def test_with_several_outputs_the_dataset_is_named(self):
        os.environ["TIDEGATE_OUTPUT_DIR_OTHER"] = os.path.join(self.out, "other")
        os.mkdir(os.environ["TIDEGATE_OUTPUT_DIR_OTHER"])
        os.environ["TIDEGATE_OUTPUT_DIR_DAILY"] = os.path.join(self.out, "daily")
        os.mkdir(os.environ["TIDEGATE_OUTPUT_DIR_DAILY"])
        with self.assertRaisesRegex(tg.TaskError, r"writes \['daily', 'other'\]: name the dataset"):
            tg.output(pa.table({"id": [1]}))
        with self.assertRaisesRegex(tg.TaskError, "does not write 'nope'"):
            tg.output(pa.table({"id": [1]}), dataset="nope")
        self.assertEqual(tg.output(pa.table({"id": [1]}), dataset="other"), os.path.join("other", "part-00000.parquet"))


class Checkpoints(Attempt):
    def test_a_checkpoint_covers_what_output_wrote_since_the_last_one_and_declares_its_rows(self):
        tg.output(pa.table({"id": list(range(10))}))
        tg.checkpoint("offset=9", rows=10)
        tg.checkpoint("offset=9+", rows=0)
        self.assertEqual(
            self.lines(),
            [
                {"granule": "offset=9", "position": "offset=9", "files": ["part-00000.parquet"], "rows": 10},
                {"granule": "offset=9+", "position": "offset=9+", "files": [], "rows": 0},
            ],
        )

    def test_a_checkpoint_declaring_rows_not_written_is_refused_and_reports_nothing(self):
        tg.output(pa.table({"id": list(range(7))}))
        with self.assertRaisesRegex(tg.CheckpointRefused, r"declares 10 rows but its files hold 7 \(part-00000.parquet: 7\)"):
            tg.checkpoint("offset=29", rows=10)
        self.assertEqual(self.lines(), [])
        tg.output(pa.table({"id": [7, 8, 9]}))
        tg.checkpoint("offset=29", rows=10, granule="batch-3")
        self.assertEqual(self.lines()[0]["files"], ["part-00000.parquet", "part-00001.parquet"])

    def test_named_files_are_counted_and_must_be_complete(self):
        def write(name, data):
            with open(os.path.join(self.out, name), "wb") as f:
                f.write(data)

        write("done.csv", b"id\n1\n2\n")
        write("half.csv", b"id\n1\n2")
        write("rows.jsonl", b'{"id": 1}\n{"id": 2}\n\n')
        pq.write_table(pa.table({"id": [1, 2, 3]}), os.path.join(self.out, "whole.parquet"))
        with open(os.path.join(self.out, "whole.parquet"), "rb") as f:
            write("cut.parquet", f.read()[:-12])
        write(".hidden.csv", b"id\n1\n")
        tg.checkpoint("p1", rows=7, files=["done.csv", "rows.jsonl", "whole.parquet"])
        self.assertEqual(self.lines()[0]["rows"], 7)
        for name, why in [
            ("half.csv", "still being written"),
            ("cut.parquet", "not a complete Parquet file"),
            (".hidden.csv", "is hidden"),
            ("missing.csv", "not a regular file"),
            ("../escape.csv", "not a regular file"),
        ]:
            with self.assertRaisesRegex(tg.CheckpointRefused, why):
                tg.checkpoint("p2", rows=2, files=[name])
        self.assertEqual(len(self.lines()), 1)

    def test_granules_and_rows_are_checked_before_anything_is_written(self):
        long = "offset=" + "9" * 300
        tg.checkpoint(long, rows=0)
        self.assertTrue(self.lines()[0]["granule"].startswith("position-"))
        self.assertEqual(self.lines()[0]["position"], long)
        for rows in [True, -1, 1.0]:
            with self.assertRaisesRegex(tg.TaskError, "rows must be a count"):
                tg.checkpoint("p", rows=rows)
        with self.assertRaisesRegex(tg.TaskError, "granule must be"):
            tg.checkpoint("p", rows=0, granule="a\nb")
        with self.assertRaisesRegex(tg.TaskError, "position is longer"):
            tg.checkpoint("9" * 5000, rows=0)
        self.assertEqual(len(self.lines()), 1)


if __name__ == "__main__":
    unittest.main()
