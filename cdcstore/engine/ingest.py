"""The write path: files -> chunks -> new chunks encoded in parallel -> packs.

`Ingest` is one push session against a store backend. The calling threads read,
chunk (native, GIL released; a large segment in two halves at once) and hash; one
batched presence query decides which chunks the store lacks; a thread pool encodes
those (zstd only where a probe says it pays; zstd releases the GIL) and appends them
to the current pack, which is flushed - made durable, then indexed - whenever it
reaches its cap. Chunking threads never write packs, so they never wait for a disk.
In-flight memory is bounded by `max_inflight_bytes`, and a file is read `block_size`
bytes at a time, so memory does not grow with file size.
"""
from __future__ import annotations

import collections
import os
import threading
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterable, cast

from .. import runtime
from ..core import anchors, ids
from ..core import pages
from ..core.chunker import DEFAULT_PARAMS, ChunkParams, Chunker
from ..core.errors import InvalidAddressError
from ..core.manifest import MAX_FILE_BYTES, MAX_MANIFEST_BYTES, Manifest, max_entries
from ..core.pack import (DEFAULT_MAX_PACK_BYTES, DEFAULT_MAX_PACK_CHUNKS, DEFAULT_ZSTD_LEVEL, FileProbe, PackWriter,
                         WRITE_BUFFER, encode_chunk)
from ..storage.local import write_all
from ..storage.roles import ChunkSink


@dataclass
class IngestOptions:
    params: ChunkParams = DEFAULT_PARAMS
    zstd_level: int = DEFAULT_ZSTD_LEVEL
    max_pack_bytes: int = DEFAULT_MAX_PACK_BYTES
    max_pack_chunks: int = DEFAULT_MAX_PACK_CHUNKS
    workers: int = max(1, os.cpu_count() or 1)
    max_inflight_bytes: int = 64 * 1024 * 1024
    block_size: int = 8 * 1024 * 1024
    parquet_pages: bool = True  # cut Parquet files at page boundaries (falls back to byte CDC)
    file_threads: int = 2  # files chunked at once


ENCODE_TASK_BYTES = 1024 * 1024
VOUCHED_FILES = 64  # files whose landed chunk ids an `Ingest` keeps between presence batches


class FileChunks:
    """The chunks of an open binary file, block by block: iterating yields
    (block, chunks completed by it), and last (b"", the final chunks). Parquet files
    are cut in page groups when `parquet_pages` (then `mode` says so)."""

    def __init__(self, f, params: ChunkParams, parquet_pages: bool = True, block_size: int = 8 << 20):
        self.f, self.block_size = f, block_size
        self.first = f.read(block_size)
        cuts: list[int] | None = None
        self.regions: list[int] = []  # regions: where a Parquet file's column chunks start
        if parquet_pages and self.first[:4] == pages.MAGIC:
            geometry = pages.page_geometry(f, os.fstat(f.fileno()).st_size, params)
            if geometry is not None:
                cuts, self.regions = geometry
            f.seek(len(self.first))
        self.mode = "parquet-pages" if cuts else "bytes"
        self.chunker = Chunker(params, cuts or (), whole_segments=bool(cuts))

    def __iter__(self):
        block = self.first
        if block:
            yield block, self.chunker.feed(block)
            while True:
                block, chunks = self.chunker.read_from(self.f, self.block_size)
                if not block:
                    break
                yield block, chunks
        yield b"", self.chunker.finish()


def manifest_of(path: str, opts: IngestOptions) -> Manifest:
    """The manifest `Ingest.add_file` would give a local file, with no store: chunked and
    hashed only (what a push compares with the store's trees before it sends anything)."""
    file_hash = ids.weak_hasher()
    chunk_ids: list[bytes] = []
    lengths: list[int] = []
    size = 0
    with open(path, "rb") as f:
        for block, chunks in FileChunks(f, opts.params, opts.parquet_pages, opts.block_size):
            file_hash.update(block)
            size += len(block)
            chunk_ids.extend(ids.digest(c) for c in chunks)
            lengths.extend(len(c) for c in chunks)
            if len(chunk_ids) > max_entries():
                raise InvalidAddressError(f"{path}: over {max_entries()} chunks after {size} bytes, more than one "
                                          f"manifest holds: split the file (any file up to {MAX_FILE_BYTES} bytes fits)")
    return Manifest(chunk_ids, lengths, size, file_hash.digest())


class GatherFile:
    """A binary file written with `os.writev` of the pieces it was given, `WRITE_BUFFER` bytes
    at a time: the pieces (views of the read blocks, or compressed chunks) are not copied into
    a buffer first, and the page cache still gets large writes (large folios)."""

    def __init__(self, path: str):
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._pieces: list = []
        self._size = 0

    def write(self, data) -> None:
        if len(data):
            self._pieces.append(data)
            self._size += len(data)
            if self._size >= WRITE_BUFFER:
                self.flush()

    def flush(self) -> None:
        pieces, self._pieces, self._size = self._pieces, [], 0
        write_all(self._fd, pieces)

    def close(self) -> None:
        if self._fd >= 0:
            try:
                self.flush()
            finally:
                os.close(self._fd)
                self._fd = -1


class PackSink:
    """Appends encoded chunks to a temp pack file; a full pack is finished here and
    handed to one background thread that names it (the hash of its bytes), makes it
    durable and indexes it (BLAKE3 and fsync release the GIL), so chunking goes on meanwhile."""

    def __init__(self, store: ChunkSink, opts: IngestOptions):
        self.store = store
        self.opts = opts
        self.stored_bytes = 0  # chunk records written (compressed chunks), as `stats` counts them
        self.pack_bytes = 0  # whole pack files: the records plus each pack's header, index and trailer
        self._file: GatherFile | None = None
        self._tmp = ""
        self._writer: PackWriter | None = None
        self._publisher = runtime.pool("publish", 1)  # packs become durable in the order they were made
        self._published: list = []
        self.lock = threading.Lock()  # encoding threads append to the pack one at a time

    def add(self, chunk_id: bytes, codec: int, stored, raw_len: int, check: int | None = None) -> None:
        if self._writer is None:
            self._tmp = self.store.tmp_path()
            self._file = GatherFile(self._tmp)
            # a GatherFile writes like a binary file (all a PackWriter asks of it)
            self._writer = PackWriter(cast(BinaryIO, self._file), hash_as_written=False)  # named by the publisher
        self._writer.add(chunk_id, codec, stored, raw_len, check)
        w = self._writer
        if w.size >= self.opts.max_pack_bytes or len(w.entries) >= self.opts.max_pack_chunks:
            self.flush()

    def flush(self) -> None:
        """Finish the current pack and queue it for publishing."""
        if self._writer is None:
            return
        self._writer.finish()
        assert self._file is not None  # made with the writer
        self._file.close()
        self.pack_bytes += self._writer.size
        self.stored_bytes += sum(e.stored_len for e in self._writer.entries)
        self._published.append(self._publisher.submit(self._publish, self._tmp, self._writer.entries))
        self._writer = self._file = None

    def _publish(self, tmp: str, entries: list):
        """On the publisher thread: name the finished pack by the BLAKE3 of its bytes (read back
        from the page cache 4 MiB at a time, off the encoding threads' lock; BLAKE3 releases the
        GIL), then add it to the store."""
        h = ids.hasher()
        with open(tmp, "rb") as f:
            while piece := f.read(4 << 20):
                h.update(piece)
        return self.store.add_pack(tmp, h.hexdigest(), entries)

    def wait(self) -> None:
        """Block until every queued pack is durable and indexed. A backend that uploads
        in the background returns a future from `add_pack`: this session waits for its
        own uploads, never relying on a backend-wide flush that a concurrent session
        in another thread may have emptied first."""
        done, self._published = self._published, []
        for fut in done:
            upload = fut.result()
            if upload is not None:
                upload.result()

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            try:
                os.unlink(self._tmp)
            except FileNotFoundError:
                pass
        self._writer = self._file = None
        runtime.wait(self._published)


class Ingest:
    """One push session: add files, then `finish` to make every new chunk durable."""

    def __init__(self, store: ChunkSink, opts: IngestOptions | None = None,
                 progress: Callable[[int], None] | None = None,
                 history: Callable[[str], Iterable[bytes]] | None = None):
        self.store = store
        self.history = history  # file key -> the chunk ids a landed commit holds at that path
        self.opts = opts or IngestOptions()
        self.progress = progress
        self.sink = PackSink(store, self.opts)
        self.bytes = 0
        self.new_bytes = 0
        self.chunks = 0
        self.new_chunks = 0
        self._seen: set[bytes] = set()
        self._firsts: set[bytes] = set()  # each file's first chunk (worth a store-side lookup)
        self._pool = runtime.pool("encode", self.opts.workers)
        self._tasks: list = []  # encode tasks not yet known to have succeeded
        self._inflight_bytes = 0  # raw bytes handed to the encoders and not yet in a pack
        self._room = threading.Condition(threading.Lock())
        self._undecided: list[tuple[bytes, bytes, str, bool]] = []  # (id, data, file key, worth zstd) to ask about
        self._undecided_bytes = 0
        self.file_new: dict[str, int] = {}  # file key -> new bytes it brought (complete after finish)
        self.file_mode: dict[str, str] = {}  # file key -> "parquet-pages" or "bytes"
        self._lock = threading.RLock()  # guards everything below the chunking of one file
        self._vouched_by: collections.OrderedDict[str, frozenset] = collections.OrderedDict()  # `_vouch`
        store.begin_push()

    def add_files(self, pairs: list[tuple[str, str]]) -> list[Manifest]:
        """`add_file` for many (path, key) pairs, `opts.file_threads` files at a time
        (reading, chunking and hashing release the GIL); manifests in input order."""
        if self.opts.file_threads <= 1 or len(pairs) < 2:
            return [self.add_file(p, k) for p, k in pairs]
        return list(runtime.pool("chunk", self.opts.file_threads).map(lambda pk: self.add_file(*pk), pairs))

    def add_file(self, path: str, key: str | None = None) -> Manifest:
        """Chunk one local file, schedule its new chunks, and return its manifest.

        `key` names the file in `file_new` and `file_mode` (default: its path)."""
        key = path if key is None else key
        with self._lock:
            self.file_new.setdefault(key, 0)
        file_hash = ids.weak_hasher()  # the whole-file check (xxh3-128), not a name
        chunk_ids: list[bytes] = []
        lengths: list[int] = []
        size = 0
        with open(path, "rb") as f:
            first_anchor = os.fstat(f.fileno()).st_size >= anchors.FIRST_MIN  # its first chunk: a lookup
            blocks = FileChunks(f, self.opts.params, self.opts.parquet_pages, self.opts.block_size)
            self.file_mode[key] = blocks.mode
            probe = FileProbe(blocks.regions)  # which of the file's chunks are worth zstd, in file order
            for block, chunks in blocks:
                file_hash.update(block)
                size += len(block)
                self._add_chunks(chunks, chunk_ids, lengths, key, probe, first_anchor)
                if len(chunk_ids) > max_entries():
                    raise InvalidAddressError(
                        f"{path}: over {max_entries()} chunks after {size} bytes, more than one manifest holds "
                        f"({MAX_MANIFEST_BYTES} bytes): split the file (any file up to {MAX_FILE_BYTES} bytes fits)")
                if self.progress and block:
                    self.progress(len(block))
        with self._lock:
            self.bytes += size
        return Manifest(chunk_ids, lengths, size, file_hash.digest())

    def _add_chunks(self, chunks: list[bytes], chunk_ids: list[bytes], lengths: list[int], key: str,
                    probe: FileProbe, first_anchor: bool = False) -> None:
        """Record chunks in the manifest; queue them for one batched presence query."""
        new_ids = [ids.digest(c) for c in chunks]  # outside the lock: hashing releases the GIL
        worth = [probe.worth(c) for c in chunks]  # every chunk, in file order
        if not chunk_ids and new_ids and first_anchor:
            with self._lock:
                self._firsts.add(new_ids[0])
        chunk_ids.extend(new_ids)
        lengths.extend(len(c) for c in chunks)
        with self._lock:
            for cid, c, w in zip(new_ids, chunks, worth):
                if cid not in self._seen:
                    self._undecided.append((cid, c, key, w))
                    self._undecided_bytes += len(c)
            self.chunks += len(chunks)
            if len(self._undecided) >= 4096 or self._undecided_bytes >= self.opts.max_inflight_bytes // 2:
                self._decide()

    def _decide(self) -> None:
        """Ask the store which queued chunks it lacks; encode those on the pool, in
        tasks of about `ENCODE_TASK_BYTES` so that tiny chunks do not pay a thread
        handoff each."""
        batch, self._undecided, self._undecided_bytes = self._undecided, [], 0
        candidates = [c for c in dict.fromkeys(cid for cid, _, _, _ in batch) if c not in self._seen]
        if candidates:
            raw = {cid: c for cid, c, _, _ in batch}
            firsts = [c for c in candidates if c in self._firsts]
            vouched = None
            history = self.history
            if history is not None:
                keys: dict[bytes, list[str]] = {}
                for cid, _, key, _ in batch:
                    keys.setdefault(cid, []).append(key)
                vouched = lambda doubt: self._vouch(doubt, keys, history)  # noqa: E731 - asked only for doubtful chunks
            self._seen.update(self.store.present_or_prove({cid: raw[cid] for cid in candidates}, firsts, vouched))
        task: list[tuple[bytes, bytes, bool]] = []
        task_bytes = 0
        for cid, data, key, worth in batch:
            if cid in self._seen:
                continue
            self._seen.add(cid)
            self.new_bytes += len(data)
            self.file_new[key] += len(data)
            self.new_chunks += 1
            task.append((cid, data, worth))
            task_bytes += len(data)
            if task_bytes >= ENCODE_TASK_BYTES:
                self._submit(task, task_bytes)
                task, task_bytes = [], 0
        if task:
            self._submit(task, task_bytes)

    def _vouch(self, doubt: set[bytes], keys: dict[bytes, list[str]],
               history: Callable[[str], Iterable[bytes]]) -> set[bytes]:
        """Of these doubtful chunks (a store would read them to trust them), those the landed
        commit holds in the file at a path they are pushed to (`history`): asked only of files
        with a doubtful chunk, each file's ids kept for the next batches (the latest few)."""
        out: set[bytes] = set()
        for key in dict.fromkeys(k for c in doubt for k in keys.get(c, ())):
            held = self._vouched_by.get(key)
            if held is None:
                held = frozenset(history(key) or ())
                self._vouched_by[key] = held
                while len(self._vouched_by) > VOUCHED_FILES:
                    self._vouched_by.popitem(last=False)
            out |= doubt & held
        return out

    def _submit(self, task: list[tuple[bytes, bytes, bool]], nbytes: int) -> None:
        """Encode and store `task` on the pool, once in-flight bytes leave room for it."""
        with self._room:
            while self._inflight_bytes > self.opts.max_inflight_bytes - nbytes and self._inflight_bytes:
                self._raise_failed()
                self._room.wait(0.5)
            self._inflight_bytes += nbytes
        self._tasks = [f for f in self._tasks if not f.done() or f.cancelled() or f.exception() is not None]
        self._tasks.append(self._pool.submit(self._encode_and_store, task, nbytes))

    def _encode_and_store(self, task: list[tuple[bytes, bytes, bool]], nbytes: int) -> None:
        """On an encoding thread: encode (and verify) the chunks, then append them to the pack."""
        try:
            level = self.opts.zstd_level
            # each id was computed in `_add_chunks` from the same read-only view of immutable bytes
            encoded = [(*encode_chunk(data, cid, level, id_of_raw=True, probe=worth), ids.checksum(data))
                       for cid, data, worth in task]
            with self.sink.lock:
                for (cid, data, _), (codec, stored, check) in zip(task, encoded):
                    self.sink.add(cid, codec, stored, len(data), check)
        finally:
            with self._room:
                self._inflight_bytes -= nbytes
                self._room.notify_all()

    def _raise_failed(self) -> None:
        for fut in self._tasks:
            if fut.done() and not fut.cancelled() and fut.exception() is not None:
                raise fut.exception()

    def finish(self) -> None:
        """Wait for every scheduled chunk and make the last pack durable."""
        try:
            with self._lock:
                self._decide()
            for fut in list(self._tasks):
                fut.result()
            self.sink.flush()
            self.sink.wait()
            self.store.flush()
        finally:
            self.close()

    def close(self) -> None:
        for fut in self._tasks:
            fut.cancel()
        runtime.wait(self._tasks)  # the pool is shared: wait for ours only
        self._tasks = []
        self.sink.abort()

    @property
    def stored_bytes(self) -> int:
        """Bytes of the chunk records written (compressed chunks, no pack framing)."""
        return self.sink.stored_bytes

    @property
    def pack_bytes(self) -> int:
        """Bytes of the pack files written (records, headers, indexes and trailers)."""
        return self.sink.pack_bytes
