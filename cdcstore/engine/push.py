"""The write path: files -> chunks -> new chunks encoded in parallel -> packs.

`Ingest` is one push session against a store backend. The calling thread reads,
chunks (native, GIL released) and hashes; a thread pool compresses and verifies
only the chunks the store lacks (zstd releases the GIL); the calling thread
appends finished chunks to the current pack, which is flushed - made durable,
then indexed - whenever it reaches its cap. In-flight memory is bounded by
`max_inflight_bytes`, and a file is read `block_size` bytes at a time, so memory
does not grow with file size.
"""
from __future__ import annotations

import collections
import os
import threading
from dataclasses import dataclass
from typing import Callable

from .. import runtime
from ..core import ids
from ..core import pages
from ..core.chunker import DEFAULT_PARAMS, ChunkParams, Chunker
from ..core.manifest import Manifest
from ..core.pack import (DEFAULT_MAX_PACK_BYTES, DEFAULT_MAX_PACK_CHUNKS, DEFAULT_ZSTD_LEVEL, PackWriter, WRITE_BUFFER,
                   encode_chunk)
from ..storage.backend import Backend


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


class FileChunks:
    """The chunks of an open binary file, block by block: iterating yields
    (block, chunks completed by it), and last (b"", the final chunks). Parquet files
    are cut at page boundaries when `parquet_pages` (then `mode` says so)."""

    def __init__(self, f, params: ChunkParams, parquet_pages: bool = True, block_size: int = 8 << 20):
        self.f, self.block_size = f, block_size
        self.first = f.read(block_size)
        cuts = None
        if parquet_pages and self.first[:4] == pages.MAGIC:
            cuts = pages.page_cuts_of(f, os.fstat(f.fileno()).st_size)
            f.seek(len(self.first))
        self.mode = "parquet-pages" if cuts else "bytes"
        self.chunker = Chunker(params, cuts or ())

    def __iter__(self):
        block = self.first
        while block:
            yield block, self.chunker.feed(block)
            block = self.f.read(self.block_size)
        yield b"", self.chunker.finish()


def _encode_all(task: list[tuple[bytes, bytes]], level: int) -> list[tuple[int, bytes]]:
    return [encode_chunk(data, cid, level) for cid, data in task]


class PackSink:
    """Appends encoded chunks to a temp pack file; a full pack is finished here and
    handed to one background thread that makes it durable and indexes it (fsync
    releases the GIL), so chunking goes on meanwhile."""

    def __init__(self, store: Backend, opts: IngestOptions):
        self.store = store
        self.opts = opts
        self.stored_bytes = 0
        self._file = None
        self._tmp = ""
        self._writer: PackWriter | None = None
        self._publisher = runtime.pool("publish", 1)  # packs become durable in the order they were made
        self._published: list = []

    def add(self, chunk_id: bytes, codec: int, stored, raw_len: int) -> None:
        if self._writer is None:
            self._tmp = self.store.tmp_path()
            self._file = open(self._tmp, "wb", buffering=WRITE_BUFFER)
            self._writer = PackWriter(self._file)
        self._writer.add(chunk_id, codec, stored, raw_len)
        w = self._writer
        if w.size >= self.opts.max_pack_bytes or len(w.entries) >= self.opts.max_pack_chunks:
            self.flush()

    def flush(self) -> None:
        """Finish the current pack and queue it for publishing."""
        if self._writer is None:
            return
        name = self._writer.finish()
        self._file.close()
        self.stored_bytes += self._writer.size
        self._published.append(self._publisher.submit(self.store.add_pack, self._tmp, name, self._writer.entries))
        self._writer = self._file = None

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

    def __init__(self, store: Backend, opts: IngestOptions | None = None,
                 progress: Callable[[int], None] | None = None):
        self.store = store
        self.opts = opts or IngestOptions()
        self.progress = progress
        self.sink = PackSink(store, self.opts)
        self.bytes = 0
        self.new_bytes = 0
        self.chunks = 0
        self.new_chunks = 0
        self._seen: set[bytes] = set()
        self._pool = runtime.pool("encode", self.opts.workers)
        self._inflight: collections.deque = collections.deque()
        self._inflight_bytes = 0
        self._undecided: list[tuple[bytes, bytes, str]] = []  # (id, data, file key) awaiting a presence query
        self._undecided_bytes = 0
        self.file_new: dict[str, int] = {}  # file key -> new bytes it brought (complete after finish)
        self.file_mode: dict[str, str] = {}  # file key -> "parquet-pages" or "bytes"
        self._lock = threading.RLock()  # guards everything below the chunking of one file
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
        file_hash = ids.hasher()
        chunk_ids: list[bytes] = []
        lengths: list[int] = []
        size = 0
        with open(path, "rb") as f:
            blocks = FileChunks(f, self.opts.params, self.opts.parquet_pages, self.opts.block_size)
            self.file_mode[key] = blocks.mode
            for block, chunks in blocks:
                file_hash.update(block)
                size += len(block)
                self._add_chunks(chunks, chunk_ids, lengths, key)
                if self.progress and block:
                    self.progress(len(block))
        with self._lock:
            self.bytes += size
        return Manifest(chunk_ids, lengths, size, file_hash.digest())

    def _add_chunks(self, chunks: list[bytes], chunk_ids: list[bytes], lengths: list[int], key: str) -> None:
        """Record chunks in the manifest; queue them for one batched presence query."""
        new_ids = [ids.digest(c) for c in chunks]  # outside the lock: hashing releases the GIL
        chunk_ids.extend(new_ids)
        lengths.extend(len(c) for c in chunks)
        with self._lock:
            for cid, c in zip(new_ids, chunks):
                if cid not in self._seen:
                    self._undecided.append((cid, c, key))
                    self._undecided_bytes += len(c)
            self.chunks += len(chunks)
            if len(self._undecided) >= 4096 or self._undecided_bytes >= self.opts.max_inflight_bytes // 2:
                self._decide()

    def _decide(self) -> None:
        """Ask the store which queued chunks it lacks; encode those on the pool, in
        tasks of about `ENCODE_TASK_BYTES` so that tiny chunks do not pay a thread
        handoff each."""
        batch, self._undecided, self._undecided_bytes = self._undecided, [], 0
        candidates = [c for c in dict.fromkeys(cid for cid, _, _ in batch) if c not in self._seen]
        if candidates:
            data = {cid: c for cid, c, _ in batch}
            self._seen.update(self.store.present_or_prove({cid: data[cid] for cid in candidates}))
        task: list[tuple[bytes, bytes]] = []
        task_bytes = 0
        for cid, data, key in batch:
            if cid in self._seen:
                continue
            self._seen.add(cid)
            self.new_bytes += len(data)
            self.file_new[key] += len(data)
            self.new_chunks += 1
            task.append((cid, data))
            task_bytes += len(data)
            if task_bytes >= ENCODE_TASK_BYTES:
                self._submit(task, task_bytes)
                task, task_bytes = [], 0
        if task:
            self._submit(task, task_bytes)

    def _submit(self, task: list[tuple[bytes, bytes]], nbytes: int) -> None:
        fut = self._pool.submit(_encode_all, task, self.opts.zstd_level)
        self._inflight.append((fut, [(cid, len(data)) for cid, data in task], nbytes))
        self._inflight_bytes += nbytes
        while self._inflight_bytes > self.opts.max_inflight_bytes:
            self._drain_one()

    def _drain_one(self) -> None:
        fut, chunks, nbytes = self._inflight.popleft()
        self._inflight_bytes -= nbytes
        for (cid, raw_len), (codec, stored) in zip(chunks, fut.result()):
            self.sink.add(cid, codec, stored, raw_len)

    def finish(self) -> None:
        """Wait for every scheduled chunk and make the last pack durable."""
        try:
            self._decide()
            while self._inflight:
                self._drain_one()
            self.sink.flush()
            self.sink.wait()
            self.store.flush()
        finally:
            self.close()

    def close(self) -> None:
        for fut, _, _ in self._inflight:
            fut.cancel()
        runtime.wait(fut for fut, _, _ in self._inflight)  # the pool is shared: wait for ours only
        self._inflight.clear()
        self.sink.abort()

    @property
    def stored_bytes(self) -> int:
        return self.sink.stored_bytes
