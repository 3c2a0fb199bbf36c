"""The global sample order of a streamed epoch, its split across consumers, and resume (pure logic).

Units are Parquet row groups, numbered in file order, each with a row count. For an epoch:

1. the *sequence* is the rows of all units, with the units in an order permuted by (seed, epoch)
   when shuffling (file order otherwise);
2. the *global order* cuts the sequence into fixed windows of `window` rows and permutes the rows
   inside each window, seeded by (seed, epoch, window index); position p of the global order holds
   sequence row `window_start + perm[p - window_start]`;
3. consumers (ranks x DataLoader workers) split the global order, from a resume position `start`,
   into blocks of `block` positions dealt round robin: block b goes to consumer b mod C; with more
   than one rank, the tail that would leave ranks with unequal numbers of steps is cut into one
   near-equal run per rank instead (`even_tail`), so every rank takes the same steps.

Everything depends on (row counts, seed, epoch) only, so a count of positions consumed is a resume
point that holds for any number of consumers. See docs/streaming.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def rng(*key: int) -> np.random.Generator:
    """A generator keyed by non-negative integers (PCG64 via SeedSequence: stable across runs)."""
    return np.random.default_rng([int(k) for k in key])


def consumer_index(rank: int, world_size: int, worker: int, num_workers: int) -> tuple[int, int]:
    """(index, count) of a consumer. Worker-major, so that block b of the global order goes to rank
    b mod world_size: after every rank took t batches from its DataLoader (whose workers answer in
    turn), exactly the first t * world_size blocks are consumed."""
    if not (0 <= rank < world_size and 0 <= worker < num_workers):
        raise ValueError(f"rank {rank} of {world_size}, worker {worker} of {num_workers}: out of range")
    return worker * world_size + rank, world_size * num_workers


def epoch_end(total: int, start: int, block: int, consumers: int, drop_last: bool) -> int:
    """Where an epoch stops. Without drop_last every row is served; with it, the tail that would
    give consumers unequal numbers of full blocks is left out (it depends on the consumer count)."""
    if not drop_last:
        return total
    whole = (total - start) // (block * consumers) * block * consumers
    return start + max(whole, 0)


def consumer_steps(start: int, end: int, block: int, consumer: int, consumers: int, rows: int = 1024,
                   span: int = 1024, ranks: int = 1):
    """The positions of one consumer in arrays of whole blocks, in order: about `rows` positions
    each, spread over at most max(`span`, one round of blocks) positions of the global order.

    With `ranks` > 1 every rank takes the same number of steps: blocks are dealt while whole rounds
    of `ranks` blocks remain, and the tail is shared by the ranks (`even_cut`, `even_run`)."""
    stride = block * consumers
    cut, parts = even_cut(start, end, block, ranks)
    per = max(1, min(rows // block, span // stride))
    first = start + consumer * block
    count = max(0, -(-(cut - first) // stride))
    offsets = np.arange(block, dtype=np.int64)
    for i in range(0, count, per):
        starts = first + stride * np.arange(i, min(i + per, count), dtype=np.int64)
        pos = (starts[:, None] + offsets).ravel()
        yield pos[pos < cut]
    round_ = (cut - start) // (block * ranks)  # the tail's first round: a rank's steps go where its blocks would
    rank = consumer % ranks
    for j in range(parts):
        if ((round_ + j) * ranks + rank) % consumers == consumer:
            yield even_run(cut, end, parts, j, rank, ranks)


def even_cut(start: int, end: int, block: int, ranks: int) -> tuple[int, int]:
    """Where the even tail of [start, end) begins, and the steps it takes on every rank. The tail is
    what follows the last whole round of `ranks` blocks, one step; when it has fewer rows than
    ranks (some rank would get none), the last whole round joins it and it takes two steps, each
    a contiguous part of the tail (possible when block >= 2). One rank: no tail."""
    if ranks <= 1:
        return end, 0
    rnd = block * ranks
    cut = start + (end - start) // rnd * rnd
    if cut == end:
        return end, 0
    if end - cut < ranks and block >= 2 and cut - start >= rnd:
        return cut - rnd, 2
    return cut, 1


def even_run(cut: int, end: int, parts: int, part: int, rank: int, ranks: int) -> np.ndarray:
    """Rank `rank`'s step in part `part` of the tail [cut, end): the tail cut into `parts`
    contiguous parts, each cut into `ranks` runs whose lengths differ by at most one. A rank left
    without a row (fewer rows than ranks, with block 1 or no whole round to join) repeats the
    part's first row, so that it still takes its step."""
    lo, hi = cut + (end - cut) * part // parts, cut + (end - cut) * (part + 1) // parts
    a, b = lo + (hi - lo) * rank // ranks, lo + (hi - lo) * (rank + 1) // ranks
    return np.arange(a, b, dtype=np.int64) if b > a else np.array([lo], dtype=np.int64)


def rank_steps(start: int, end: int, block: int, ranks: int) -> int:
    """Steps each rank takes over [start, end) (the same on every rank when ranks > 1)."""
    cut, parts = even_cut(start, end, block, ranks)
    return -(-(cut - start) // (block * ranks)) + parts


def position_after(start: int, end: int, block: int, ranks: int, steps: int) -> int:
    """The position of the global order before which everything was consumed once every rank
    took `steps` steps from `start`: a resume point."""
    cut, parts = even_cut(start, end, block, ranks)
    full = -(-(cut - start) // (block * ranks))
    if steps <= full:
        return min(start + steps * block * ranks, cut)
    return cut + (end - cut) * min(steps - full, parts) // parts


@dataclass
class EpochOrder:
    """The global order of one epoch over units with `rows[u]` rows."""

    rows: tuple[int, ...]
    seed: int
    epoch: int
    shuffle: bool
    window: int
    units: np.ndarray = field(init=False)  # unit ids in sequence order
    offsets: np.ndarray = field(init=False)  # sequence index of each sequence slot's first row
    slots: np.ndarray = field(init=False)  # the sequence slot of each unit id
    _perm: tuple[int, np.ndarray] | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        n = len(self.rows)
        self.units = rng(self.seed, self.epoch).permutation(n) if self.shuffle else np.arange(n)
        self.slots = np.empty(n, np.int64)
        self.slots[self.units] = np.arange(n)
        counts = np.asarray(self.rows, dtype=np.int64)[self.units]
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.window = max(int(self.window), 1) if self.shuffle else 1

    @property
    def total(self) -> int:
        return int(self.offsets[-1])

    def window_perm(self, w: int) -> np.ndarray:
        """The row permutation of window w (the last one is cached)."""
        if self._perm is None or self._perm[0] != w:
            size = min(self.window, self.total - w * self.window)
            perm = rng(self.seed, self.epoch, w, 1).permutation(size) if self.window > 1 else np.arange(size)
            self._perm = (w, perm)
        return self._perm[1]

    def sequence_index(self, pos: np.ndarray) -> np.ndarray:
        """Sequence indices of global positions (in increasing order)."""
        if self.window == 1:
            return pos
        win = pos // self.window
        out = np.empty_like(pos)
        for w in np.unique(win).tolist():
            mask = win == w
            base = w * self.window
            out[mask] = base + self.window_perm(w)[pos[mask] - base]
        return out

    def locate(self, seq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(unit id, row inside the unit) of each sequence index."""
        slot = np.searchsorted(self.offsets, seq, side="right") - 1
        return self.units[slot], seq - self.offsets[slot]


def release_bound(order: EpochOrder, unit: int) -> int:
    """The first global position past every position that maps into `unit`: a consumer whose
    blocks reached it never needs the unit again (rows only move inside their window)."""
    end = int(order.offsets[order.slots[unit] + 1])
    return -(-end // order.window) * order.window
