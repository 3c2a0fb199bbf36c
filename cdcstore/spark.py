"""Spark reads and writes `cdc://` through a Python data source (pyspark 4).

    import cdcstore.spark
    cdcstore.spark.register(spark)                      # once per SparkSession
    df = spark.read.format("cdc").option("store", url).load("cdc://imagenet@v3/train/")
    df.write.format("cdc").option("store", url).mode("append").save("cdc://imagenet@main/out/")

Reading: the revision is resolved once, on the driver, to a commit id that every task reads
(a push during the job changes nothing). The schema is the files' Parquet schema mapped to
Spark's types; each batch is cast to what Spark expects (Arrow `large_string` to `string`,
nanoseconds to microseconds, which Spark's own Parquet reader refuses), so no cast is needed by the caller. One partition per row
group (option `rowGroupsPerPartition` groups more). Each task reads only its row groups'
column chunks of the columns in the schema: Spark 4 does not push a projection down to a
Python data source, so name the columns in the schema to prune (`.schema("id long, score
double")`, a subset of the files' columns, checked against them) or with `.option("columns",
"id,score")`.

Writing: upload first, commit once. Each task writes its rows to a local Parquet file and
uploads it (chunks, then manifest: `Store.upload`) without committing, returning its small
entry to the driver; when every task has succeeded the driver lands ONE commit with all
entries (`Store.commit_entries`), made against the branch head seen when the job started
(newer commits that touch other paths are kept; overlapping ones conflict). A failed job
lands nothing: uploaded but uncommitted data is invisible and gc deletes it after its grace
window. `mode("overwrite")` replaces every file under the path in that same commit.

Options (all strings): `store` (default $CDCSTORE_STORE), `token` (default $CDCSTORE_TOKEN),
`cache` (a chunk cache path shared by the tasks of a machine, "true" for the default one;
default none), `columns`, `rowGroupsPerPartition`, `message` (the commit message), `compression`
(the Parquet codec of written files, default zstd). Modes: `append` and `overwrite`.
"""
from __future__ import annotations

import os
import tempfile
import uuid
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceReader, InputPartition,
                                    WriterCommitMessage)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from .api import Store
from .core.address import SCHEME, check_write_target, parse
from .core.commit import FileEntry
from .core.errors import InvalidAddressError
from .fs import CdcFileSystem

NAME = "cdc"


def register(spark) -> None:
    """Make `spark.read.format("cdc")` and `df.write.format("cdc")` work in this session."""
    spark.dataSource.register(CdcDataSource)


def _cache(value: str | None):
    if value is None or value.lower() in ("", "false", "0", "no"):
        return False
    return True if value.lower() in ("true", "1", "yes") else value


def _store_args(options) -> dict:
    return {"store": options.get("store") or None, "token": options.get("token") or None,
            "cache": _cache(options.get("cache"))}


def _url(options) -> str:
    url = options.get("path")
    if not url:
        raise InvalidAddressError('the cdc data source needs a path: .load("cdc://REPO@REV/PATH")')
    if not url.startswith(SCHEME):
        raise InvalidAddressError(f"not a cdc:// address: {url!r} (expected cdc://REPO[@REV]/PATH)")
    return url


def spark_schema(arrow: pa.Schema) -> StructType:
    """The Spark schema of Parquet files whose Arrow schema is `arrow` (large types, dictionary
    columns and unsigned integers map to what Spark holds)."""
    return from_arrow_schema(pa.schema([pa.field(f.name, _plain(f.type), f.nullable) for f in arrow]))


def _plain(t: pa.DataType) -> pa.DataType:
    """An Arrow type Spark's converter takes: large and view variants as the plain ones,
    dictionaries as their values, unsigned integers one size up (as Spark reads Parquet)."""
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_dictionary(t):
        return _plain(t.value_type)
    if pa.types.is_large_list(t) or pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return pa.list_(pa.field(t.value_field.name, _plain(t.value_type), t.value_field.nullable))
    if pa.types.is_list(t):
        return pa.list_(pa.field(t.value_field.name, _plain(t.value_type), t.value_field.nullable))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(pa.field(t.value_field.name, _plain(t.value_type), t.value_field.nullable))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _plain(f.type), f.nullable) for f in t])
    if pa.types.is_map(t):
        return pa.map_(_plain(t.key_type), _plain(t.item_type))
    if pa.types.is_timestamp(t) and t.unit == "ns":
        return pa.timestamp("us", t.tz)
    for small, big in ((pa.uint8(), pa.int16()), (pa.uint16(), pa.int32()), (pa.uint32(), pa.int64()),
                       (pa.uint64(), pa.decimal128(20, 0))):
        if t == small:
            return big
    return t


class RowGroups(InputPartition):
    """One task's share: row groups of one file (REPO@COMMIT/PATH) at one commit."""

    def __init__(self, path: str, row_groups: list[int]):
        super().__init__((path, row_groups))
        self.path, self.row_groups = path, row_groups


class CdcDataSource(DataSource):
    """`format("cdc")`: Parquet files at a `cdc://` address (see the module doc)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def _fs(self) -> CdcFileSystem:
        return CdcFileSystem(**_store_args(self.options))

    def _files(self) -> tuple[CdcFileSystem, list[str]]:
        """The Parquet files the path names, pinned to the commit its revision names now."""
        fs = self._fs()
        a = parse(_url(self.options))
        cid, _ = fs.store.resolve_ref(a.repo, a.ref)
        root = f"{a.repo}@{cid}/{a.path}".rstrip("/")
        if fs.isfile(root):
            files = [root]
        else:
            files = sorted(p for p in fs.find(root) if not os.path.basename(p).startswith(("_", ".")))
        if not files:
            raise FileNotFoundError(f"no files at {_url(self.options)}")
        return fs, files

    def schema(self) -> StructType:
        fs, files = self._files()
        schema = spark_schema(pq.read_schema(files[0], filesystem=fs))
        wanted = [c.strip() for c in (self.options.get("columns") or "").split(",") if c.strip()]
        missing = [c for c in wanted if c not in schema.fieldNames()]
        if missing:
            raise InvalidAddressError(f"option columns names {missing}, not in the files' columns "
                                      f"{schema.fieldNames()}")
        return StructType([schema[c] for c in wanted]) if wanted else schema

    def reader(self, schema: StructType) -> "CdcReader":
        return CdcReader(self.options, schema, *self._files())

    def writer(self, schema: StructType, overwrite: bool) -> "CdcWriter":
        return CdcWriter(self.options, schema, overwrite)


class CdcReader(DataSourceReader):
    def __init__(self, options, schema: StructType, fs: CdcFileSystem, files: list[str]):
        self.fs = fs  # pickles with its resolved commits
        self.files = files
        file_schema = pq.read_schema(files[0], filesystem=fs)
        missing = [c for c in schema.fieldNames() if c not in file_schema.names]
        if missing:
            raise InvalidAddressError(f"the schema names columns {missing} that {_url(options)} does not "
                                      f"have (its columns: {file_schema.names})")
        self.columns = schema.fieldNames()
        self.target = to_arrow_schema(schema, timezone="UTC")
        self.per_partition = max(1, int(options.get("rowGroupsPerPartition") or 1))

    def partitions(self) -> list[RowGroups]:
        out = []
        for path in self.files:
            n = pq.read_metadata(path, filesystem=self.fs).num_row_groups
            out += [RowGroups(path, list(range(i, min(n, i + self.per_partition))))
                    for i in range(0, n, self.per_partition)]
        return out or [RowGroups(self.files[0], [])]

    # pyspark's stub takes an InputPartition: ours are RowGroups (`partitions`)
    def read(self, partition: RowGroups):  # type: ignore[override]
        if not partition.row_groups:
            return
        with self.fs.open(partition.path, "rb") as f:
            pf = pq.ParquetFile(f)
            for batch in pf.iter_batches(row_groups=partition.row_groups, columns=self.columns):
                yield _conform(batch, self.target)


def _conform(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """`batch` as exactly `target` (Spark checks the Arrow schema strictly)."""
    columns = []
    for f in target:
        col = batch.column(f.name)
        if col.type != f.type:
            col = col.cast(f.type, safe=not pa.types.is_timestamp(f.type))  # ns -> us truncates
        columns.append(col)
    return pa.RecordBatch.from_arrays(columns, schema=target)


@dataclass
class Uploaded(WriterCommitMessage):
    """What one task uploaded: {path in the repo: entry}, and its rows."""

    entries: dict[str, FileEntry] = field(default_factory=dict)
    rows: int = 0


class CdcWriter(DataSourceArrowWriter):
    """Tasks upload, the driver commits once (see the module doc)."""

    def __init__(self, options, schema: StructType, overwrite: bool):
        self.url = _url(options)
        self.address = parse(self.url)
        check_write_target(self.address.ref)
        if not self.address.path:
            raise InvalidAddressError(f"{self.url} names a repo, not a folder: save to cdc://REPO@BRANCH/FOLDER/")
        self.args = _store_args(options)
        self.overwrite = overwrite
        self.message = options.get("message") or ""
        self.compression = options.get("compression") or "zstd"
        self.job = uuid.uuid4().hex[:16]
        with Store(self.args["store"], token=self.args["token"], cache=False) as s:  # the head the job started at
            a = self.address
            self.base = s.branches(a.repo).get(a.ref) if a.repo in s.repos() else None

    def write(self, iterator) -> Uploaded:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        part = ctx.partitionId() if ctx else 0
        name = f"part-{part:05d}-{self.job}.parquet"
        fd, tmp = tempfile.mkstemp(prefix="cdcstore-spark-", suffix=".parquet")
        os.close(fd)
        rows, writer = 0, None
        try:
            for batch in iterator:
                if writer is None:
                    writer = pq.ParquetWriter(tmp, batch.schema, compression=self.compression)
                writer.write_batch(batch)
                rows += batch.num_rows
            if writer is None:
                return Uploaded()
            writer.close()
            dest = f"{SCHEME}{self.address.repo}/{self.address.path.rstrip('/')}/{name}"
            with Store(self.args["store"], token=self.args["token"], cache=self.args["cache"]) as s:
                entries = s.upload(tmp, dest)
            return Uploaded(entries, rows)
        finally:
            if writer is not None:
                writer.close()  # a task that failed mid-write closes its file too (closing twice is a no-op)
            os.unlink(tmp)

    def commit(self, messages) -> None:
        entries = [m.entries for m in messages if m is not None and m.entries]
        if not entries and not self.overwrite:
            return
        a = self.address
        rows = sum(m.rows for m in messages if m is not None)
        message = self.message or f"spark: write {rows} rows in {sum(map(len, entries))} files to {a.path}"
        with Store(self.args["store"], token=self.args["token"], cache=False) as s:
            s.commit_entries(f"{a.repo}@{a.ref}", entries, message, parent=self.base,
                             remove_under=a.path.rstrip("/") if self.overwrite else None)

    def abort(self, messages) -> None:
        """Nothing landed; the uploaded files are unreferenced and gc deletes them."""
