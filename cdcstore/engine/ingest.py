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
import mmap
import os
import threading
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterable, Mapping, cast

from .. import runtime
from ..core import anchors, ids
from ..core import pages, tar
from ..core.chunker import DEFAULT_PARAMS, ChunkParams, Chunker
from ..core.errors import InvalidAddressError
from ..core.manifest import MAX_FILE_BYTES, MAX_MANIFEST_BYTES, Manifest, max_entries
from ..core.pack import (DEFAULT_MAX_PACK_BYTES, DEFAULT_MAX_PACK_CHUNKS, DEFAULT_ZSTD_LEVEL, FileProbe, PackWriter,
                         WRITE_BUFFER, encode_chunk, worth_compressing)
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
    tar_members: bool = True  # cut tar files at their members' data (falls back to byte CDC)
    file_threads: int = 2  # files chunked at once


ENCODE_TASK_BYTES = 1024 * 1024
#: Chunks hashed before their file was whole: offset -> (length, chunk id) (`Ingest.add_file`).
Prehashed = Mapping[int, tuple[int, bytes]]
VOUCHED_FILES = 64  # files whose landed chunk ids an `Ingest` keeps between presence batches


class ReadBlocks:
    """Read blocks of one size, reused: a file is read into a block nothing views any more
    instead of into fresh memory each time (whose pages the kernel faults in and zeroes before
    the read copies over them: ~10% of a push's CPU).

    Chunks are views of the block they were read into (no copies), and they outlive the
    chunker's use of it: queued for the presence query, encoded, waiting in a pack's write
    buffer, kept as the chunker's uncut tail. Writing a block while one such view is alive
    would change a chunk under its id. A block counts the buffers exported from it (every
    memoryview of it holds one, through its base, as long as it or any slice of it lives) and
    refuses to be resized while one is held: `in_use` asks exactly that, so a block is reused
    only once no view of it is alive anywhere. A block still viewed is left alone and a new one
    is made, as a fresh read would; at most `keep` blocks wait for reuse. A new block is
    anonymous memory (`mmap`), untouched until a read fills it (`bytearray(size)` would zero
    every page first). Thread-safe: a block is out of the pool from `take` to `give_back`."""

    def __init__(self, size: int, keep: int):
        self.size = size
        self.keep = keep
        self._free: list[mmap.mmap | bytearray] = []  # given back; reused once nothing views them
        self._lock = threading.Lock()
        self.made = 0
        self.reused = 0

    def take(self) -> mmap.mmap | bytearray:
        with self._lock:
            for i, block in enumerate(self._free):
                busy = in_use(block)
                if busy is None:  # cannot be asked on this platform: never reused
                    self._free.clear()
                    self.keep = 0
                    break
                if not busy:
                    del self._free[i]
                    self.reused += 1
                    return block
            self.made += 1
        return new_block(self.size)

    def give_back(self, block: mmap.mmap | bytearray) -> None:
        """Return a block once its bytes have been fed (views of it may still be alive)."""
        with self._lock:
            if len(self._free) < self.keep:
                self._free.append(block)

    def clear(self) -> None:
        """Let the waiting blocks go (each is freed once nothing views it)."""
        with self._lock:
            self._free.clear()


def new_block(size: int) -> mmap.mmap | bytearray:
    """`size` bytes of private anonymous memory whose pages are untouched until written."""
    try:
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (AttributeError, TypeError, OSError):  # no such maps here (Windows): zeroed memory
        return bytearray(size)


def in_use(block: mmap.mmap | bytearray) -> bool | None:
    """Whether any buffer (a memoryview, or a slice of one) of `block` is alive: a block that
    exports one cannot be resized (BufferError), so it is resized to its own size (an mmap) or
    one byte is appended and removed (a bytearray). None where that cannot be asked."""
    try:
        if isinstance(block, bytearray):
            block.append(0)
            del block[-1]  # (the allocation stays: appending again costs nothing)
        else:
            block.resize(len(block))  # mremap to the same size: the same pages, untouched
    except BufferError:
        return True
    except (OSError, SystemError, ValueError):  # no mremap (macOS)
        return None
    return False


class FileChunks:
    """The chunks of an open binary file, block by block: iterating yields
    (bytes read, chunks completed by them), and last (0, the final chunks). Parquet files
    are cut in page groups when `parquet_pages`, tar files at their members when `tar_members`
    (then `mode` says so; anything else, or a file whose structure is not trusted, is cut by the
    byte rule). With `blocks`, every
    whole block of the file is read into a block of that pool (the chunks are views of it, see
    `ReadBlocks`); a shorter read (a small file, the end of a large one) gets new bytes of its
    own size, so that a few small chunks never hold a whole block."""

    def __init__(self, f, params: ChunkParams, parquet_pages: bool = True, block_size: int = 8 << 20,
                 blocks: ReadBlocks | None = None, tar_members: bool = True):
        self.f, self.block_size = f, block_size
        self._blocks = blocks if blocks is not None and blocks.size == block_size else None
        size = os.fstat(f.fileno()).st_size
        self._left = size  # bytes not yet read, as the file's size said at the start
        self._first = self._read()
        first = self._first[1]
        cuts: list[int] | None = None
        self.regions: list[int] = []  # regions: where a Parquet file's column chunks start
        if parquet_pages and bytes(first[:4]) == pages.MAGIC:
            geometry = pages.page_geometry(f, size, params)
            if geometry is not None:
                cuts, self.regions = geometry
            f.seek(len(first))
            self.mode = "parquet-pages" if cuts else "bytes"
        elif tar_members and tar.is_tar_header(first[:tar.BLOCK]):
            cuts = tar.member_cuts_of(f.fileno(), size, params)
            self.mode = "tar-members" if cuts else "bytes"
        else:
            self.mode = "bytes"
        self.chunker = Chunker(params, cuts or (), whole_segments=bool(cuts))

    def _read(self) -> tuple[mmap.mmap | bytearray | None, bytes | memoryview]:
        """The next block: (the pool's block, or None; the bytes read, empty at end of file)."""
        if self._blocks is None or self._left < self.block_size:
            data: bytes | memoryview = self.f.read(self.block_size)
            self._left -= len(data)
            return None, data
        block = self._blocks.take()
        n = self.f.readinto(block)
        self._left -= n
        return block, memoryview(block)[:n]

    def _feed(self, read: tuple[mmap.mmap | bytearray | None, bytes | memoryview]) -> tuple[int, list[memoryview]]:
        block, data = read
        n = len(data)
        if block is None:
            return n, (self.chunker.feed(data) if n else [])
        assert isinstance(data, memoryview) and self._blocks is not None  # (a block comes from the pool)
        chunks = self.chunker.feed_block(data) if n else []
        data.release()  # ours: the chunks and the chunker's tail are views of their own
        self._blocks.give_back(block)
        return n, chunks

    def __iter__(self):  # (int, list of chunks: read-only memoryviews)
        read, self._first = self._first, (None, b"")
        n, chunks = self._feed(read)
        if n:
            yield n, chunks
            while True:
                n, chunks = self._feed(self._read())
                if not n:
                    break
                yield n, chunks
        yield 0, self.chunker.finish()


def manifest_of(path: str, opts: IngestOptions) -> Manifest:
    """The manifest `Ingest.add_file` would give a local file, with no store: chunked and
    hashed only (what a push compares with the store's trees before it sends anything)."""
    file_hash = ids.weak_hasher()
    chunk_ids: list[bytes] = []
    lengths: list[int] = []
    size = 0
    blocks = ReadBlocks(opts.block_size, 2)  # each block's chunks are hashed and dropped at once
    with open(path, "rb") as f:
        for n, chunks in FileChunks(f, opts.params, opts.parquet_pages, opts.block_size, blocks, opts.tar_members):
            size += n
            for c in chunks:  # the whole-file hash in the same pass as the ids (chunks are in file order)
                chunk_ids.append(ids.digest(c))
                file_hash.update(c)
            lengths.extend(len(c) for c in chunks)
            if len(chunk_ids) > max_entries():
                raise InvalidAddressError(f"{path}: over {max_entries()} chunks after {size} bytes, more than one "
                                          f"manifest holds: split the file (any file up to {MAX_FILE_BYTES} bytes fits)")
    return Manifest(chunk_ids, lengths, size, file_hash.digest())


class GatherFile:
    """A binary file written with `os.writev` of the pieces it was given, `WRITE_BUFFER` bytes
    at a time: the pieces (views of the read blocks, or compressed chunks) are not copied into
    a buffer first, and the page cache still gets large writes (large folios). With `hasher`,
    each batch is hashed just after it is written, while the copy has left it in the CPU's
    cache: the file is named as it is written, never read back."""

    def __init__(self, path: str, hasher: ids.Hasher | None = None):
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._pieces: list = []
        self._size = 0
        self.hasher = hasher

    def write(self, data) -> None:
        if len(data):
            self._pieces.append(data)
            self._size += len(data)
            if self._size >= WRITE_BUFFER:
                self.flush()

    def flush(self) -> None:
        pieces, self._pieces, self._size = self._pieces, [], 0
        write_all(self._fd, pieces)
        if self.hasher is not None:
            for piece in pieces:
                self.hasher.update(piece)

    def close(self) -> None:
        if self._fd >= 0:
            try:
                self.flush()
            finally:
                os.close(self._fd)
                self._fd = -1


class PackSink:
    """Appends encoded chunks to a temp pack file, hashed as they are written (a pack is named
    by the BLAKE3 of its bytes); a full pack is finished here and handed to one background
    thread that makes it durable and indexes it (fsync releases the GIL), so chunking goes on
    meanwhile."""

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
            # the pack is named as it is written: the GatherFile hashes each batch of records just
            # after writing it (hot in the CPU's cache), so it is never read back to be named
            self._file = GatherFile(self._tmp, ids.hasher())
            # a GatherFile writes like a binary file (all a PackWriter asks of it)
            self._writer = PackWriter(cast(BinaryIO, self._file), hash_as_written=False)
        self._writer.add(chunk_id, codec, stored, raw_len, check)
        w = self._writer
        if w.size >= self.opts.max_pack_bytes or len(w.entries) >= self.opts.max_pack_chunks:
            self.flush()

    def flush(self) -> None:
        """Finish the current pack and queue it for publishing."""
        if self._writer is None:
            return
        self._writer.finish()
        assert self._file is not None and self._file.hasher is not None  # made with the writer
        self._file.close()
        name = self._file.hasher.hexdigest()  # every byte of the pack, the last batch included
        self.pack_bytes += self._writer.size
        self.stored_bytes += sum(e.stored_len for e in self._writer.entries)
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
        # read blocks, reused once no chunk views them: about as many as in-flight chunks
        # (queued and encoding) can hold at once, plus each file thread's own (at most 32: a
        # `take` asks each waiting block whether it is free)
        o = self.opts
        self.blocks = ReadBlocks(o.block_size, min(32, (o.max_inflight_bytes * 3 // 2) // o.block_size
                                                   + 2 * o.file_threads + 2))
        store.begin_push()

    def add_files(self, pairs: list[tuple[str, str]],
                  prehashed: Mapping[str, Prehashed] | None = None) -> list[Manifest]:
        """`add_file` for many (path, key) pairs, `opts.file_threads` files at a time
        (reading, chunking and hashing release the GIL); manifests in input order.
        `prehashed`: key -> that file's `Prehashed` chunks."""
        pre = prehashed or {}
        if self.opts.file_threads <= 1 or len(pairs) < 2:
            return [self.add_file(p, k, pre.get(k)) for p, k in pairs]
        return list(runtime.pool("chunk", self.opts.file_threads).map(
            lambda pk: self.add_file(pk[0], pk[1], pre.get(pk[1])), pairs))

    def add_file(self, path: str, key: str | None = None, prehashed: Prehashed | None = None) -> Manifest:
        """Chunk one local file, schedule its new chunks, and return its manifest.

        `key` names the file in `file_new` and `file_mode` (default: its path). `prehashed`:
        chunks of this file's exact bytes that this process hashed already (offset -> (length,
        id); a multipart upload's `engine.prechunk`): a chunk cut at the same offset with the same
        length takes that id unhashed. Only the caller can vouch that the bytes are the same."""
        key = path if key is None else key
        with self._lock:
            self.file_new.setdefault(key, 0)
        file_hash = ids.weak_hasher()  # the whole-file check (xxh3-128), not a name
        chunk_ids: list[bytes] = []
        lengths: list[int] = []
        size = 0
        with open(path, "rb") as f:
            first_anchor = os.fstat(f.fileno()).st_size >= anchors.FIRST_MIN  # its first chunk: a lookup
            blocks = FileChunks(f, self.opts.params, self.opts.parquet_pages, self.opts.block_size, self.blocks,
                                self.opts.tar_members)
            self.file_mode[key] = blocks.mode
            probe = FileProbe(blocks.regions)  # which of the file's chunks are worth zstd, in file order
            at = 0  # where the next chunk starts
            for n, chunks in blocks:
                size += n
                at = self._add_chunks(chunks, chunk_ids, lengths, key, probe, first_anchor, file_hash,
                                      prehashed, at)
                if len(chunk_ids) > max_entries():
                    raise InvalidAddressError(
                        f"{path}: over {max_entries()} chunks after {size} bytes, more than one manifest holds "
                        f"({MAX_MANIFEST_BYTES} bytes): split the file (any file up to {MAX_FILE_BYTES} bytes fits)")
                if self.progress and n:
                    self.progress(n)
        with self._lock:
            self.bytes += size
        return Manifest(chunk_ids, lengths, size, file_hash.digest())

    def add_chunks(self, chunks: list, key: str, probe: FileProbe | None = None) -> list[bytes]:
        """Hash chunks that belong to no manifest yet (`engine.prechunk`: a file still
        arriving) and schedule the new ones like a file's; their ids. `finish` makes them durable.
        `probe`: None probes every chunk for zstd (where a file's column chunks begin is unknown)."""
        with self._lock:
            self.file_new.setdefault(key, 0)
        out: list[bytes] = []
        self._add_chunks(chunks, out, [], key, probe)
        return out

    def drain(self) -> None:
        """Ask about every queued chunk and wait until the new ones are in a pack, and send the
        pack to be made durable (in the background): nothing queued holds a view of the
        caller's bytes after, and `finish` has little left to do."""
        with self._lock:
            self._decide()
        for fut in list(self._tasks):
            fut.result()
        self._tasks = []
        with self.sink.lock:
            self.sink.flush()

    def _add_chunks(self, chunks: list[bytes], chunk_ids: list[bytes], lengths: list[int], key: str,
                    probe: FileProbe | None, first_anchor: bool = False, file_hash: ids.Hasher | None = None,
                    prehashed: Prehashed | None = None, at: int = 0) -> int:
        """Record chunks in the manifest; queue them for one batched presence query. The
        whole-file hash takes each chunk just after its id (chunks come in file order), while
        its bytes are still in the CPU's cache: no second pass over the file's blocks. `at`: the
        file offset where the first chunk starts (what `prehashed` is keyed by); returns where
        the next one starts."""
        new_ids = []  # outside the lock: hashing releases the GIL
        digest = ids.digest
        offset = at
        for c in chunks:
            hit = prehashed.get(offset) if prehashed else None
            new_ids.append(hit[1] if hit is not None and hit[0] == len(c) else digest(c))
            offset += len(c)
            if file_hash is not None:
                file_hash.update(c)
        worth = [probe.worth(c) if probe is not None else worth_compressing(c) for c in chunks]  # in file order
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
        return offset

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
            # each id was computed in `_add_chunks` from the same read-only view, of bytes nothing
            # writes while it is alive (`ReadBlocks`)
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
        self.blocks.clear()

    @property
    def stored_bytes(self) -> int:
        """Bytes of the chunk records written (compressed chunks, no pack framing)."""
        return self.sink.stored_bytes

    @property
    def pack_bytes(self) -> int:
        """Bytes of the pack files written (records, headers, indexes and trailers)."""
        return self.sink.pack_bytes
