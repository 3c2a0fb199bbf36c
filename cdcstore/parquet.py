"""Parquet as a first-class citizen: a dedup-friendly writer (`write_table`, `write_dataset`).

The page walker that gives the chunker page-aligned cut points is `cdcstore.core.pages`.
"""
from __future__ import annotations

import math
import os

# -- the dedup-friendly writer -------------------------------------------------------------
#
# Row groups are cut by content: each row gets a 64-bit fingerprint (from every
# column of a supported type), and a row group ends before a row whose
# fingerprint falls below a threshold, within [min_rows, max_rows]. Inserting or
# deleting rows therefore changes the row groups around the edit only, instead of
# shifting every later boundary. Inside row groups, Arrow's content-defined page
# chunking keeps unchanged pages byte-identical; dictionaries only for columns with
# few values, sorted for strings, so that an edit does not renumber the pages after it.

WRITER_VERSION = 4
WRITER_METADATA_KEY = b"cdcstore.writer"
#: Arrow CDC options used by the writer, recorded in every file it writes.
CDC_OPTIONS = {"min_chunk_size": 64 * 1024, "max_chunk_size": 512 * 1024, "norm_level": 0}
#: A top-level column is dictionary-encoded only if the whole table has at most this many
#: distinct values in it (version 2). Many values would make the dictionary's first-appearance
#: order shift with every edit, renumbering the data pages after it, and overflow Arrow's
#: dictionary page limit (a fall back to plain at a row that depends on the row group's start).
DICTIONARY_MAX_VALUES = 4096
#: ... and if those values take at most this many bytes (a quarter of Arrow's dictionary page limit).
DICTIONARY_MAX_BYTES = 256 * 1024
DEFAULT_ROW_GROUP_BYTES = 32 * 1024 * 1024
#: Version 3: no row limit per page (Arrow's default ends a page every 20,000 rows, a cut by count
#: that an insert or delete moves), so every data page boundary is Arrow CDC's, by content.
MAX_ROWS_PER_PAGE = 1 << 30
#: Version 4: a table smaller than GROUPS_PER_TABLE row groups of `row_group_bytes` gets smaller
#: row groups (its rows / GROUPS_PER_TABLE, a power of two, at least MIN_GROUP_ROWS): with one or
#: two row groups a file's column chunks are a page or two, and any edit rewrote all of them.
GROUPS_PER_TABLE = 8
MIN_GROUP_ROWS = 1024
_SLICE_ROWS = 65536


def _mix(x):
    """splitmix64's finalizer over a numpy uint64 array (wrapping arithmetic)."""
    import numpy as np

    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _array_fingerprint(arr):
    """Per-row uint64 fingerprints of one pyarrow Array, or None for unsupported types."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.cast(t.value_type)
        t = arr.type
    valid = arr.is_valid().to_numpy(zero_copy_only=False).astype(np.uint64)
    if pa.types.is_boolean(t):
        vals = arr.cast(pa.uint8()).fill_null(0).to_numpy().astype(np.uint64)
    elif pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) \
            or pa.types.is_large_binary(t):
        vals = _bytes_fingerprint(arr)
    elif _bit_width(t) in (8, 16, 32, 64):
        uint = {8: pa.uint8(), 16: pa.uint16(), 32: pa.uint32(), 64: pa.uint64()}[t.bit_width]
        vals = pc.fill_null(arr.view(uint), 0).to_numpy().astype(np.uint64)
    else:
        return None
    with np.errstate(over="ignore"):
        return _mix(vals * valid + (valid << np.uint64(63)))


def _bit_width(t) -> int:
    try:
        return t.bit_width
    except ValueError:  # not a fixed-width type
        return 0


def _bytes_fingerprint(arr):
    import numpy as np
    import pyarrow as pa

    wide = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64 if wide else np.int32)[
        arr.offset:arr.offset + len(arr) + 1].astype(np.int64)
    base = int(offsets[0])
    rel_off = offsets - base
    total = int(rel_off[-1])
    if total == 0 or bufs[2] is None:
        return (rel_off[1:] - rel_off[:-1]).astype(np.uint64)
    data = np.frombuffer(bufs[2], dtype=np.uint8)[base:base + total].astype(np.uint64)
    lens = rel_off[1:] - rel_off[:-1]
    pos = np.arange(total, dtype=np.int64) - np.repeat(rel_off[:-1], lens)
    with np.errstate(over="ignore"):
        weighted = (data + np.uint64(1)) * _mix(pos.astype(np.uint64) + np.uint64(0x51ED27))
        sums = np.concatenate([np.zeros(1, np.uint64), np.cumsum(weighted, dtype=np.uint64)])
        return sums[rel_off[1:]] - sums[rel_off[:-1]] + lens.astype(np.uint64)


def _column_fingerprint(col):
    import numpy as np

    parts = []
    for chunk in col.chunks:
        for s in range(0, len(chunk), _SLICE_ROWS):
            fp = _array_fingerprint(chunk.slice(s, _SLICE_ROWS))
            if fp is None:
                return None
            parts.append(fp)
    return np.concatenate(parts) if parts else np.zeros(0, np.uint64)


def key_columns(table, min_distinct: float = 0.5) -> list[str]:
    """The columns that fingerprint rows: supported columns in schema order, as
    few as give at least `min_distinct` distinct fingerprints per row. Few
    columns keep row-group boundaries in place when other columns are added,
    dropped or edited, and spare hashing wide text columns."""
    import numpy as np

    chosen: list[str] = []
    h = None
    n = max(1, table.num_rows)
    for name in table.column_names:
        fp = _column_fingerprint(table[name])
        if fp is None:
            continue
        h = _combine(h, fp)
        chosen.append(name)
        if len(np.unique(h)) >= min_distinct * n:
            break
    return chosen


def _combine(h, fp):
    import numpy as np

    if h is None:
        return _mix(fp)
    with np.errstate(over="ignore"):
        return _mix(h * np.uint64(0x9E3779B97F4A7C15) + fp)


def row_fingerprints(table, columns: list[str] | None = None):
    """One uint64 per row from `columns` (default: `key_columns(table)`), or None
    if no column has a supported type."""
    columns = key_columns(table) if columns is None else columns
    h = None
    for name in columns:
        fp = _column_fingerprint(table[name])
        if fp is not None:
            h = _combine(h, fp)
    return h


def plan_row_groups(fingerprints, target_rows: int, min_rows: int, max_rows: int) -> list[int]:
    """Row-group end offsets (pure logic). A group ends before a row whose
    fingerprint is below 2^64/target once it has `min_rows`; past twice the
    target, below 8x that threshold (still content-defined, so a long gap does
    not end at a position that counts rows); `max_rows` is a last resort."""
    import numpy as np

    n = len(fingerprints)
    limit = (2**64 - 1) // max(1, target_rows)
    loose = np.uint64(min(2**64 - 1, limit * 8))
    strict = np.uint64(limit)
    candidates = np.nonzero(fingerprints < loose)[0].tolist()
    ends = []
    start = 0
    for c in candidates + [n]:
        while c - start > max_rows:
            start += max_rows
            ends.append(start)
        d = c - start
        if c == n or (d >= min_rows and (fingerprints[c] < strict or d >= 2 * target_rows)):
            if c > start:
                ends.append(c)
                start = c
    return ends


def _target_rows(table, nbytes: int) -> int:
    """Rows per `nbytes` of Arrow memory, rounded to a power of two so that a small
    change in row width (a column added) keeps the same target."""
    rows = max(1, nbytes // max(1, table.nbytes // max(1, table.num_rows)))
    return 1 << max(0, round(math.log2(rows)))


def _small_table_rows(n: int) -> int:
    """The row-group target of a table too small for GROUPS_PER_TABLE groups of the byte target:
    n / GROUPS_PER_TABLE rounded to a power of two (it moves only when the table doubles or halves,
    and then the cuts of the larger target are among the smaller one's: half the groups stay)."""
    return max(MIN_GROUP_ROWS, 1 << max(0, round(math.log2(max(1, n / GROUPS_PER_TABLE)))))


def _row_group_ends(table, row_group_bytes: int, fps, target: int | None = None) -> list[int]:
    n = table.num_rows
    if n == 0:
        return []
    target = target or min(_target_rows(table, row_group_bytes), _small_table_rows(n))
    if fps is None:  # nothing to hash: fixed-size groups
        return list(range(target, n, target)) + [n]
    return plan_row_groups(fps, target, max(1, target // 4), target * 32)


def dictionary_columns(table, max_values: int = DICTIONARY_MAX_VALUES) -> list[str]:
    """Parquet column paths to dictionary-encode: top-level columns of a flat type with at
    most `max_values` distinct values (of at most DICTIONARY_MAX_BYTES) in `table`, and the
    leaves of nested columns (Arrow's default for them). Pure function of the table's values,
    so versions agree."""
    import pyarrow as pa

    paths = []
    for field in table.schema:
        if pa.types.is_nested(field.type):
            paths.extend(_leaf_paths(field))
        elif _few_distinct(table[field.name], max_values):
            paths.append(field.name)
    return paths


def _leaf_paths(field) -> list[str]:
    """Parquet leaf column paths of one (nested) Arrow field, as pyarrow names them."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table({field.name: pa.array([], field.type)}), buf)
    schema = pq.ParquetFile(io.BytesIO(buf.getvalue())).schema
    return [schema.column(i).path for i in range(len(schema))]


def _few_distinct(col, max_values: int) -> bool:
    """True if the chunked array `col` has at most `max_values` distinct values (stops early)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    seen = None
    for chunk in col.chunks:
        if pa.types.is_dictionary(chunk.type):
            chunk = chunk.dictionary_decode()
        for s in range(0, len(chunk), _SLICE_ROWS):
            try:
                part = pc.unique(chunk.slice(s, _SLICE_ROWS))
                seen = part if seen is None else pc.unique(pa.concat_arrays([seen, part]))
            except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
                return True  # a type unique() does not know: leave Arrow's default
            if len(seen) > max_values or seen.nbytes > DICTIONARY_MAX_BYTES:
                return False
    return True


def _plan(table, row_group_bytes: int, key: list[str] | None, rows: int | None = None):
    key = key_columns(table) if key is None else list(key)
    fps = row_fingerprints(table, key)
    return key, fps, _row_group_ends(table, row_group_bytes, fps, rows)


def write_dataset(table, directory: str, *, file_bytes: int = 512 * 1024 * 1024,
                  row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES, key_columns: list[str] | None = None,
                  row_group_rows: int | None = None, basename: str = "part-{:05d}.parquet",
                  **kwargs) -> list[str]:
    """Write `table` as several dedup-friendly files of about `file_bytes` of Arrow
    memory each; returns the file paths.

    File boundaries are content-defined too: a file ends at a row-group boundary
    whose next row has a fingerprint below 2^64 / (target rows per file), so an
    edit early in the dataset leaves later files byte-identical.
    """
    import numpy as np

    os.makedirs(directory, exist_ok=True)
    key, fps, rg_ends = _plan(table, row_group_bytes, key_columns, row_group_rows)
    target = _target_rows(table, file_bytes)
    threshold = np.uint64((2**64 - 1) // target)
    files, start = [], 0
    for e in rg_ends:
        rows = e - start
        natural = e < table.num_rows and fps is not None and fps[e] < threshold and rows >= target // 4
        if natural or rows >= target * 4 or e == table.num_rows:
            files.append((start, e))
            start = e
    paths = []
    for i, (a, b) in enumerate(files):
        path = os.path.join(directory, basename.format(i))
        ends = [e - a for e in rg_ends if a < e <= b]
        _write_groups(table.slice(a, b - a), path, ends, row_group_bytes, key, **kwargs)
        paths.append(path)
    return paths


def write_table(table, where, *, row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
                key_columns: list[str] | None = None, row_group_rows: int | None = None, **kwargs) -> list[int]:
    """Write `table` as a dedup-friendly Parquet file; returns the row-group sizes.

    Arrow content-defined page chunking (options in `CDC_OPTIONS`), content-defined
    row groups of about `row_group_bytes` of Arrow memory each, and a page index.
    Row fingerprints come from `key_columns` (default: the first columns that tell
    rows apart, see `key_columns()`); pass them, and `row_group_rows` (a target in
    rows instead of one derived from `row_group_bytes` and the row width), to keep
    boundaries stable across versions whatever else changes, columns added or
    dropped included. Dictionary encoding only for columns with few distinct
    values (`dictionary_columns()`). The options are recorded under
    the `cdcstore.writer` schema metadata key. `compression` (default zstd),
    `use_dictionary` (overrides the choice) and other keyword arguments go to
    `pyarrow.parquet.ParquetWriter`.
    """
    key, _, ends = _plan(table, row_group_bytes, key_columns, row_group_rows)
    return _write_groups(table, where, ends, row_group_bytes, key, **kwargs)


def _write_groups(table, where, ends: list[int], row_group_bytes: int, key: list[str], *,
                  compression: str = "zstd", use_dictionary=None, **options) -> list[int]:
    import json

    import pyarrow.parquet as pq

    if use_dictionary is None:
        use_dictionary = dictionary_columns(table)
    ordered = [] if "store_schema" in options else sorted_dictionary_columns(table, use_dictionary)
    meta = dict(table.schema.metadata or {})
    meta[WRITER_METADATA_KEY] = json.dumps({
        "version": WRITER_VERSION, "cdc": CDC_OPTIONS, "row_group_bytes": row_group_bytes,
        "key_columns": key, "compression": compression, "dictionary": use_dictionary,
        "sorted_dictionary": ordered, "max_rows_per_page": options.get("max_rows_per_page", MAX_ROWS_PER_PAGE)}).encode()
    wschema, stored_meta = _writer_schema(table.schema.with_metadata(meta), ordered)
    if ordered:
        options["store_schema"] = False  # the table's own schema is stored instead (ARROW:schema)
    options.setdefault("max_rows_per_page", MAX_ROWS_PER_PAGE)
    sizes = []
    with pq.ParquetWriter(where, wschema, compression=compression, use_content_defined_chunking=CDC_OPTIONS,
                          write_page_index=True, use_dictionary=use_dictionary, **options) as w:
        start = 0
        for end in ends:
            w.write_table(_with_sorted_dictionaries(table.slice(start, end - start), ordered, wschema),
                          row_group_size=end - start)
            sizes.append(end - start)
            start = end
        if stored_meta:
            w.add_key_value_metadata(stored_meta)
    return sizes


def _sortable(t) -> bool:
    """Types whose Arrow dictionary Arrow's Parquet writer keeps in its order (measured with
    pyarrow 26: string and binary; it re-encodes numeric and temporal dictionaries by first
    appearance) and that read back as the plain type."""
    import pyarrow as pa

    return t in (pa.string(), pa.binary())


def sorted_dictionary_columns(table, use_dictionary) -> list[str]:
    """The dictionary-encoded top-level columns whose dictionary the writer sorts (all of
    `use_dictionary` that have a type `_sortable` accepts)."""
    if not isinstance(use_dictionary, (list, tuple)):
        return []
    wanted = set(use_dictionary)
    return [f.name for f in table.schema if f.name in wanted and _sortable(f.type)]


def _writer_schema(schema, ordered: list[str]):
    """(schema the Parquet writer gets, key-value metadata to store or None): the columns in
    `ordered` are handed over as dictionary arrays, and `schema` itself is stored as
    ARROW:schema (as pyarrow stores it) so that readers still get the plain types."""
    import base64

    import pyarrow as pa

    if not ordered:
        return schema, None
    wschema = pa.schema([pa.field(f.name, pa.dictionary(pa.int32(), f.type), f.nullable, f.metadata)
                         if f.name in ordered else f for f in schema], schema.metadata)
    meta = dict(schema.metadata or {})
    meta[b"ARROW:schema"] = base64.b64encode(schema.serialize().to_pybytes())
    return wschema, meta


def _with_sorted_dictionaries(part, ordered: list[str], wschema):
    """`part` with each column of `ordered` as a dictionary array whose dictionary is the
    column's distinct values in sorted order. Arrow's Parquet writer keeps a given
    dictionary's order, so a value's index depends on which values the row group holds,
    not on where each first appears: after an edit, pages away from it keep their bytes."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not ordered:
        return part.replace_schema_metadata(wschema.metadata)
    cols = []
    for f in part.schema:
        col = part[f.name]
        if f.name in ordered:
            values = col.combine_chunks()
            uniq = pc.unique(values).drop_null()
            uniq = uniq.take(pc.array_sort_indices(uniq))
            col = pa.DictionaryArray.from_arrays(pc.index_in(values, value_set=uniq).cast(pa.int32()), uniq)
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=wschema)
