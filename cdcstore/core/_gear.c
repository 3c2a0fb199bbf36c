/*
 * Native boundary scan for cdcstore's gear-hash content-defined chunker.
 *
 * The algorithm (chunk format v1, see docs/format.md) is specified by the
 * pure-Python reference in tests/reference_chunker.py; this file is only the
 * fast path. For a chunk starting at s:
 *   h = 0; hashing starts at s + max(0, min - 64) (the hash only depends on the
 *   last 64 bytes, so skipping earlier bytes changes nothing observable);
 *   after byte i, len = i - s + 1 and h = (h << 1) + GEAR[byte] (mod 2^64);
 *   cut if len >= min and h < (len < avg ? thr_small : thr_large), or len == max.
 *   thr_small = (2^64-1) / avg / 4, thr_large = (2^64-1) / avg * 4 (saturating):
 *   FastCDC's normalized chunking, level 2, tested on the high bits of h.
 * The scan releases the GIL; `split` scans two halves in two threads (scan_split).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <pthread.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

static uint64_t GEAR[256];

static void init_gear(void) {
    /* splitmix64, seed "cdcgear1": part of the chunk format. */
    uint64_t x = 0x6364636765617231ULL;
    for (int i = 0; i < 256; i++) {
        x += 0x9E3779B97F4A7C15ULL;
        uint64_t z = x;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
        GEAR[i] = z ^ (z >> 31);
    }
}

/* Rolls h over p[i..end) and returns the first position whose hash is below
 * t, or end. Four bytes per step: the table-value sums are computed off the
 * h dependency chain, so the chain costs one shift and one add per step. */
static inline size_t scan_phase(const uint8_t *p, size_t i, size_t end, uint64_t *hp, uint64_t t) {
    uint64_t h = *hp;
    for (; i + 3 < end; i += 4) {
        uint64_t g0 = GEAR[p[i]], g1 = GEAR[p[i + 1]], g2 = GEAR[p[i + 2]], g3 = GEAR[p[i + 3]];
        uint64_t s1 = (g0 << 1) + g1, s2 = (s1 << 1) + g2, s3 = (s2 << 1) + g3;
        uint64_t h1 = (h << 1) + g0, h2 = (h << 2) + s1, h3 = (h << 3) + s2, h4 = (h << 4) + s3;
        if (__builtin_expect((h1 < t) | (h2 < t) | (h3 < t) | (h4 < t), 0)) {
            if (h1 < t) { *hp = h1; return i; }
            if (h2 < t) { *hp = h2; return i + 1; }
            if (h3 < t) { *hp = h3; return i + 2; }
            *hp = h4;
            return i + 3;
        }
        h = h4;
    }
    for (; i < end; i++) {
        h = (h << 1) + GEAR[p[i]];
        if (h < t) { *hp = h; return i; }
    }
    *hp = h;
    return i;
}

/* Returns the length of the chunk starting at p (n bytes available), or 0
 * when more bytes are needed to decide (only when !eof). */
static inline size_t next_cut(const uint8_t *p, size_t n, size_t min, size_t avg,
                              size_t max, uint64_t ts, uint64_t tl, int eof) {
    if (n < min) return eof ? n : 0;
    size_t limit = n < max ? n : max;
    size_t i = min > 64 ? min - 64 : 0;
    uint64_t h = 0;
    /* warm up: positions whose length is below min */
    for (; i + 1 < min; i++) h = (h << 1) + GEAR[p[i]];
    /* small phase: len in [min, avg) */
    size_t end_s = avg - 1 < limit ? avg - 1 : limit;
    i = scan_phase(p, i, end_s, &h, ts);
    if (i < end_s) return i + 1;
    /* large phase: len in [avg, max) */
    i = scan_phase(p, i, limit, &h, tl);
    if (i < limit) return i + 1;
    if (limit == max) return max;
    return eof ? n : 0;
}

typedef struct {
    const uint8_t *p;
    size_t n, min, avg, max;
    uint64_t ts, tl;
    int eof;
    uint64_t *ends;  /* absolute offsets, room for n / min + 2 */
    size_t count;
} run_t;

/* Appends the cut points of p[from..n) to r->ends, starting a chunk at `from`. */
static void scan_run(run_t *r, size_t from) {
    size_t pos = from;
    while (pos < r->n) {
        size_t len = next_cut(r->p + pos, r->n - pos, r->min, r->avg, r->max, r->ts, r->tl, r->eof);
        if (len == 0) break;
        pos += len;
        r->ends[r->count++] = pos;
    }
}

static void *scan_thread(void *arg) {
    scan_run((run_t *)arg, 0);
    return NULL;
}

/* Parallel halves: the tail p[m..n) is scanned in a second thread as if a chunk
 * started at m, while this thread scans p[0..m) the usual way and then goes on
 * past m, cut by cut. Its first cut that is also a tail cut is a common cut
 * point: a chunk's end depends only on the bytes from its start, so every later
 * cut of the tail is the sequential one too. A tail that never resynchronises
 * (periodic data, runs of one byte) costs its scan and nothing else: this thread
 * then scans to the end. The result is always the sequential scan's. */
static size_t scan_split(run_t *head, size_t m) {
    run_t tail = *head;
    tail.p = head->p + m;
    tail.n = head->n - m;
    tail.count = 0;
    tail.ends = PyMem_RawMalloc((tail.n / tail.min + 2) * sizeof(uint64_t));
    pthread_t th;
    int threaded = tail.ends != NULL && pthread_create(&th, NULL, scan_thread, &tail) == 0;
    if (!threaded) {
        PyMem_RawFree(tail.ends);
        scan_run(head, 0);
        return head->count;
    }
    run_t first = *head;
    first.n = m;
    first.eof = 0;  /* complete chunks of the head only */
    scan_run(&first, 0);
    head->count = first.count;
    pthread_join(th, NULL);
    size_t pos = head->count ? head->ends[head->count - 1] : 0, j = 0;
    while (pos < head->n) {
        size_t len = next_cut(head->p + pos, head->n - pos, head->min, head->avg, head->max, head->ts,
                              head->tl, head->eof);
        if (len == 0) break;
        pos += len;
        head->ends[head->count++] = pos;
        while (j < tail.count && tail.ends[j] + m < pos) j++;
        if (j < tail.count && tail.ends[j] + m == pos) {  /* resynchronised */
            for (j++; j < tail.count; j++) head->ends[head->count++] = tail.ends[j] + m;
            break;
        }
    }
    PyMem_RawFree(tail.ends);
    return head->count;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t min, avg, max, split = 0;
    int eof;
    if (!PyArg_ParseTuple(args, "y*nnnp|n", &view, &min, &avg, &max, &eof, &split)) return NULL;
    if (min < 1 || avg < min || max < avg) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "chunk sizes must satisfy 1 <= min <= avg <= max");
        return NULL;
    }
    run_t r;
    r.p = (const uint8_t *)view.buf;
    r.n = (size_t)view.len;
    r.min = (size_t)min;
    r.avg = (size_t)avg;
    r.max = (size_t)max;
    r.eof = eof;
    r.ts = (UINT64_MAX / (uint64_t)avg) >> 2;
    uint64_t q = UINT64_MAX / (uint64_t)avg;
    r.tl = q > (UINT64_MAX >> 2) ? UINT64_MAX : q << 2;
    r.count = 0;
    /* the sequential scan needs n / min + 1 ends; parallel halves at most one more */
    r.ends = PyMem_RawMalloc((r.n / r.min + 3) * sizeof(uint64_t));
    if (!r.ends) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    if (split > 0 && (size_t)split < r.n)
        scan_split(&r, (size_t)split);
    else
        scan_run(&r, 0);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);

    size_t count = r.count;
    uint64_t *ends = r.ends;
    PyObject *list = PyList_New((Py_ssize_t)count);
    if (list) {
        for (size_t k = 0; k < count; k++) {
            PyObject *v = PyLong_FromUnsignedLongLong(ends[k]);
            if (!v) { Py_CLEAR(list); break; }
            PyList_SET_ITEM(list, (Py_ssize_t)k, v);
        }
    }
    PyMem_RawFree(ends);
    return list;
}

/* ---- Parquet page groups (forced cut points, revision 4; docs/format.md) ----
 * Walks the page headers of every column chunk (Thrift compact protocol, only the
 * PageHeader's type and compressed size are read; everything else is skipped) and
 * chooses among the page boundaries, online, the ones where a chunk ends. Reads go
 * through one window buffer (pread), so pages smaller than the window cost no syscall. */

#define PG_WINDOW (256 * 1024)
#define PG_PROBE 4096
#define PG_PROBE_MAX ((size_t)64 << 20)
#define PG_DEPTH 32
#define PG_HASH_BYTES 64

enum { K_SOFT = 0, K_FIRM = 1, K_HARD = 2 };

typedef struct {
    int fd;
    uint64_t size;
    uint8_t *win;       /* bytes [wbase, wbase + wlen) of the file */
    size_t wcap, wlen;
    uint64_t wbase;
    int err;            /* errno of a failed read, else 0 */
    size_t window;      /* bytes read at a miss (0: PG_WINDOW) */
} pg_file_t;

/* Makes [pos, pos + n) (clipped to the file) available in the window; returns a
 * pointer to pos, and the bytes available from it in *avail; NULL on a read error. */
static const uint8_t *pg_bytes(pg_file_t *f, uint64_t pos, size_t n, size_t *avail) {
    if (pos + n > f->size) n = (size_t)(f->size - pos);
    if (!(pos >= f->wbase && pos + n <= f->wbase + f->wlen)) {
        size_t window = f->window ? f->window : PG_WINDOW;
        size_t want = n > window ? n : window;
        if (pos + want > f->size) want = (size_t)(f->size - pos);
        if (want > f->wcap) {
            uint8_t *w = PyMem_RawRealloc(f->win, want ? want : 1);
            if (!w) { f->err = ENOMEM; return NULL; }
            f->win = w;
            f->wcap = want;
        }
        size_t got = 0;
        while (got < want) {
            ssize_t r = pread(f->fd, f->win + got, want - got, (off_t)(pos + got));
            if (r < 0) {
                if (errno == EINTR) continue;
                f->err = errno;
                return NULL;
            }
            if (r == 0) break;  /* the file shrank under us: what is there is all there is */
            got += (size_t)r;
        }
        f->wbase = pos;
        f->wlen = got;
    }
    *avail = (size_t)(f->wbase + f->wlen - pos);
    return f->win + (pos - f->wbase);
}

/* A bounded reader of the compact protocol over p[0..n). */
typedef struct { const uint8_t *p; size_t n, i; int truncated, bad; } tr_t;

static int tr_byte(tr_t *t, uint8_t *out) {
    if (t->i >= t->n) { t->truncated = 1; return 0; }
    *out = t->p[t->i++];
    return 1;
}

static int tr_varint(tr_t *t, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift <= 63; shift += 7) {
        uint8_t b;
        if (!tr_byte(t, &b)) return 0;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) { *out = v; return 1; }
    }
    t->bad = 1;  /* varint too long */
    return 0;
}

static int tr_skip_bytes(tr_t *t, uint64_t k) {
    if (k > t->n - t->i) { t->truncated = 1; return 0; }
    t->i += (size_t)k;
    return 1;
}

static int tr_skip(tr_t *t, int type, int depth);

/* An element of a list, set or map: as a field's value, except that a bool takes a byte. */
static int tr_skip_elem(tr_t *t, int type, int depth) {
    if (type == 1 || type == 2) return tr_skip_bytes(t, 1);
    return tr_skip(t, type, depth);
}

static int tr_skip_struct(tr_t *t, int depth) {
    if (depth > PG_DEPTH) { t->bad = 1; return 0; }
    for (;;) {
        uint8_t h;
        if (!tr_byte(t, &h)) return 0;
        int type = h & 0x0F;
        if (type == 0) return 1;
        if (!(h >> 4)) { uint64_t fid; if (!tr_varint(t, &fid)) return 0; }
        if (!tr_skip(t, type, depth)) return 0;
    }
}

static int tr_skip(tr_t *t, int type, int depth) {
    uint64_t v;
    uint8_t b;
    switch (type) {
    case 1: case 2: return 1;                                  /* bool true / false */
    case 3: return tr_byte(t, &b);                             /* byte */
    case 4: case 5: case 6: return tr_varint(t, &v);           /* i16, i32, i64 */
    case 7: return tr_skip_bytes(t, 8);                        /* double */
    case 8: return tr_varint(t, &v) && tr_skip_bytes(t, v);    /* binary */
    case 9: case 10: {                                         /* list, set */
        if (depth + 1 > PG_DEPTH) { t->bad = 1; return 0; }
        if (!tr_byte(t, &b)) return 0;
        uint64_t size = b >> 4;
        int et = b & 0x0F;
        if (size == 15 && !tr_varint(t, &size)) return 0;
        if (size > t->n - t->i) { t->truncated = 1; return 0; }  /* each element takes a byte at least */
        if (et == 0 || et > 12) { if (size) { t->bad = 1; return 0; } return 1; }
        for (uint64_t k = 0; k < size; k++)
            if (!tr_skip_elem(t, et, depth + 1)) return 0;
        return 1;
    }
    case 11: {                                                 /* map */
        if (depth + 1 > PG_DEPTH) { t->bad = 1; return 0; }
        uint64_t size;
        if (!tr_varint(t, &size)) return 0;
        if (!size) return 1;
        if (!tr_byte(t, &b)) return 0;
        int kt = b >> 4, vt = b & 0x0F;
        if (kt == 0 || kt > 12 || vt == 0 || vt > 12) { t->bad = 1; return 0; }
        if (size > (t->n - t->i) / 2) { t->truncated = 1; return 0; }  /* a key and a value: two bytes at least */
        for (uint64_t k = 0; k < size; k++)
            if (!tr_skip_elem(t, kt, depth + 1) || !tr_skip_elem(t, vt, depth + 1)) return 0;
        return 1;
    }
    case 12: return tr_skip_struct(t, depth + 1);
    default: t->bad = 1; return 0;
    }
}

/* Reads the PageHeader at p[0..n): its length and compressed page size. Returns 1 on
 * success, 0 if more bytes are needed, -1 if it is not a page header. */
static int page_header(const uint8_t *p, size_t n, size_t *hlen, uint64_t *body) {
    tr_t t = {p, n, 0, 0, 0};
    int have_type = 0, have_size = 0;
    int64_t size = -1;
    uint64_t fid = 0;
    for (;;) {
        uint8_t h;
        if (!tr_byte(&t, &h)) break;
        int type = h & 0x0F;
        if (type == 0) {
            if (!have_type || !have_size || size < 0) return -1;
            *hlen = t.i;
            *body = (uint64_t)size;
            return 1;
        }
        if (h >> 4) fid += h >> 4;
        else {
            uint64_t z;
            if (!tr_varint(&t, &z)) break;
            fid = (uint64_t)((int64_t)(z >> 1) ^ -(int64_t)(z & 1));
        }
        if ((fid == 1 || fid == 3) && type >= 3 && type <= 6) {
            int64_t v;
            if (type == 3) {
                uint8_t b;
                if (!tr_byte(&t, &b)) break;
                v = b;
            } else {
                uint64_t z;
                if (!tr_varint(&t, &z)) break;
                v = (int64_t)(z >> 1) ^ -(int64_t)(z & 1);
            }
            if (fid == 1) have_type = 1;
            else { have_size = 1; size = v; }
        } else {
            if (fid == 1) have_type = 0;  /* the last value of a field counts, as in a dict */
            if (fid == 3) have_size = 0;
            if (!tr_skip(&t, type, 0)) break;
        }
    }
    return t.bad ? -1 : 0;
}

typedef struct {
    uint64_t min, avg, max, small, large;
    uint64_t s, prev;      /* start of the current chunk; the previous candidate */
    uint64_t *cuts;
    size_t count, cap;
    int have;              /* a candidate is pending (its successor is not known yet) */
    uint64_t c, region, hash;
    int kind;
} sel_t;

static int sel_push_cut(sel_t *g, uint64_t c) {
    if (g->count == g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 1024;
        uint64_t *n = PyMem_RawRealloc(g->cuts, cap * sizeof(uint64_t));
        if (!n) return 0;
        g->cuts = n;
        g->cap = cap;
    }
    g->cuts[g->count++] = c;
    g->s = c;
    return 1;
}

/* Decides the pending candidate, now that the next one (`next`) is known. */
static int sel_decide(sel_t *g, uint64_t next) {
    if (!g->have) return 1;
    g->have = 0;
    uint64_t c = g->c, gap = c - g->prev, len = c - g->s;
    g->prev = c;
    int cut;
    if (g->kind == K_HARD) cut = 1;
    else if (next - g->s > g->max) cut = 1;
    else if (g->kind == K_FIRM) cut = g->region >= g->min || len >= g->min;
    else if (len < g->min) cut = 0;
    else {
        uint64_t thr = len < g->avg ? g->small : g->large;
        uint64_t t = (thr && gap > UINT64_MAX / thr) ? UINT64_MAX : gap * thr;
        cut = g->hash < t;
    }
    return cut ? sel_push_cut(g, c) : 1;
}

static int sel_add(sel_t *g, uint64_t c, int kind, uint64_t region, uint64_t hash) {
    if (g->have && c == g->c) {  /* the same offset twice: the stronger kind counts */
        if (kind > g->kind) { g->kind = kind; g->region = region; }
        else if (kind == g->kind && region > g->region) g->region = region;  /* a column chunk's end and the next's start */
        return 1;
    }
    if (!sel_decide(g, c)) return 0;
    g->have = 1;
    g->c = c;
    g->kind = kind;
    g->region = region;
    g->hash = hash;
    return 1;
}

/* The gear hash of the (up to) 64 bytes before p[k]: p[k - 64 .. k). */
static uint64_t gear_before(const uint8_t *p, size_t k) {
    uint64_t h = 0;
    for (size_t i = k > PG_HASH_BYTES ? k - PG_HASH_BYTES : 0; i < k; i++) h = (h << 1) + GEAR[p[i]];
    return h;
}

/* 1: the walk finished; 0: not a Parquet layout we trust (fall back to bytes); -1: error set. */
static int page_groups_run(pg_file_t *f, const uint64_t *ranges, size_t nranges, const uint64_t *hard,
                           size_t nhard, sel_t *g) {
    size_t h = 0;
    for (size_t r = 0; r < nranges; r++)  /* column chunks sorted, disjoint, inside the file */
        if (ranges[2 * r] > ranges[2 * r + 1] || ranges[2 * r + 1] > f->size || (r && ranges[2 * r] < ranges[2 * r - 1]))
            return 0;
    for (size_t k = 0; k < nhard; k++)
        if (hard[k] > f->size || (k && hard[k] <= hard[k - 1])) return 0;
    for (size_t r = 0; r <= nranges; r++) {
        uint64_t start = r < nranges ? ranges[2 * r] : f->size, end = r < nranges ? ranges[2 * r + 1] : f->size;
        while (h < nhard && hard[h] <= start) {  /* hard points up to this column chunk */
            uint64_t region = (h + 1 < nhard ? hard[h + 1] : f->size) - hard[h];
            if (hard[h] > 0 && hard[h] < f->size && !sel_add(g, hard[h], K_HARD, region, 0)) return -2;
            h++;
        }
        if (r == nranges) break;
        uint64_t next_fixed = r + 1 < nranges ? ranges[2 * r + 2] : f->size;
        if (h < nhard && hard[h] < next_fixed) next_fixed = hard[h];
        if (start > 0 && !sel_add(g, start, K_FIRM, end - start, 0)) return -2;
        uint64_t pos = start;
        while (pos < end) {
            if (pos > start) {  /* a page start inside the column chunk: a soft candidate */
                uint64_t from = pos >= PG_HASH_BYTES ? pos - PG_HASH_BYTES : 0;
                size_t avail;
                const uint8_t *b = pg_bytes(f, from, (size_t)(pos - from), &avail);
                if (!b) return -1;
                if (avail < pos - from) return 0;
                if (!sel_add(g, pos, K_SOFT, 0, gear_before(b, (size_t)(pos - from)))) return -2;
            }
            size_t probe = PG_PROBE, hlen = 0;
            uint64_t body = 0;
            for (;;) {
                size_t want = end - pos < probe ? (size_t)(end - pos) : probe, avail;
                const uint8_t *b = pg_bytes(f, pos, want, &avail);
                if (!b) return -1;
                if (avail > end - pos) avail = (size_t)(end - pos);
                int rc = page_header(b, avail < want ? avail : want, &hlen, &body);
                if (rc < 0) return 0;
                if (rc > 0) break;
                if (avail < want || want >= end - pos || probe >= PG_PROBE_MAX) return 0;
                probe *= 16;
            }
            if (body > end - pos - hlen) return 0;  /* a page past its column chunk */
            pos += hlen + body;
        }
        if (h < nhard && hard[h] < end) return 0;  /* a hard point inside a column chunk */
        if (end > 0 && end < f->size) {
            uint64_t region = next_fixed > end ? next_fixed - end : 0;
            if (!sel_add(g, end, K_FIRM, region, 0)) return -2;
        }
    }
    return 1;
}

static int read_u64s(PyObject *obj, Py_buffer *view, const uint64_t **out, size_t *n) {
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0) return 0;
    if (view->len % 8) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "expected packed uint64 values");
        return 0;
    }
    *out = (const uint64_t *)view->buf;
    *n = (size_t)view->len / 8;
    return 1;
}

/* What a walk over a file gives Python: rc 1, its cut offsets as a list; 0, None (the file is not to
 * be trusted); -1, the read error `err` (ENOMEM: MemoryError) raised. */
static PyObject *cuts_result(int rc, int err, const uint64_t *cuts, size_t n) {
    if (rc == -1) {
        if (err == ENOMEM) return PyErr_NoMemory();
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (rc == 0) return Py_NewRef(Py_None);
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t k = 0; out && k < n; k++) {
        PyObject *v = PyLong_FromUnsignedLongLong(cuts[k]);
        if (!v) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, (Py_ssize_t)k, v);
    }
    return out;
}

static PyObject *page_groups(PyObject *self, PyObject *args) {
    int fd;
    unsigned long long size;
    PyObject *ranges_obj, *hard_obj;
    Py_ssize_t min, avg, max;
    if (!PyArg_ParseTuple(args, "iKOOnnn", &fd, &size, &ranges_obj, &hard_obj, &min, &avg, &max))
        return NULL;
    if (min < 1 || avg < min || max < avg) {
        PyErr_SetString(PyExc_ValueError, "chunk sizes must satisfy 1 <= min <= avg <= max");
        return NULL;
    }
    Py_buffer rv, hv;
    const uint64_t *ranges, *hard;
    size_t nr, nh;
    if (!read_u64s(ranges_obj, &rv, &ranges, &nr)) return NULL;
    if (!read_u64s(hard_obj, &hv, &hard, &nh)) { PyBuffer_Release(&rv); return NULL; }
    if (nr % 2) {
        PyBuffer_Release(&rv);
        PyBuffer_Release(&hv);
        PyErr_SetString(PyExc_ValueError, "ranges come in (start, end) pairs");
        return NULL;
    }
    pg_file_t f = {fd, size, NULL, 0, 0, 0, 0, 0};
    sel_t g;
    memset(&g, 0, sizeof g);
    g.min = (uint64_t)min;
    g.avg = (uint64_t)avg;
    g.max = (uint64_t)max;
    g.small = (UINT64_MAX / g.avg) >> 2;
    uint64_t q = UINT64_MAX / g.avg;
    g.large = q > (UINT64_MAX >> 2) ? UINT64_MAX : q << 2;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = page_groups_run(&f, ranges, nr / 2, hard, nh, &g);
    if (rc == 1 && !sel_decide(&g, size)) rc = -2;
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&rv);
    PyBuffer_Release(&hv);
    PyMem_RawFree(f.win);
    PyObject *out = cuts_result(rc == -2 ? -1 : rc, rc == -2 ? ENOMEM : f.err, g.cuts, g.count);
    PyMem_RawFree(g.cuts);
    return out;
}

/* ---- TAR members (forced cut points, revision 5; docs/format.md) ----
 * The walk of `core/tar.py` (its reference, in Python), for speed on tars of many small
 * members: every header's checksum checked, sizes checked against the file before anything
 * is read for them, pax and GNU records at most TAR_MAX_RECORD bytes. Returns the start and
 * end of every member's data region of at least `min` bytes, or "untrusted" (byte CDC). */

#define TAR_BLOCK 512
#define TAR_WINDOW (64 * 1024)
#define TAR_MAX_RECORD ((uint64_t)1 << 20)

typedef struct { uint64_t *v; size_t n, cap; } u64s_t;

static int u64s_push(u64s_t *a, uint64_t x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 256;
        uint64_t *v = PyMem_RawRealloc(a->v, cap * sizeof *v);
        if (!v) return 0;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 1;
}

/* An octal header field: up to its first NUL, spaces stripped at both ends, digits 0-7 only
 * (saturating past 2^64: past any file). 1 and *out, or 0 when it is not a number. */
static int tar_octal(const uint8_t *f, size_t n, int empty_ok, uint64_t *out) {
    size_t b = 0;
    while (b < n && f[b] != 0) b++;
    size_t a = 0;
    while (a < b && f[a] == ' ') a++;
    while (b > a && f[b - 1] == ' ') b--;
    if (a == b) { *out = 0; return empty_ok; }
    uint64_t v = 0;
    for (size_t i = a; i < b; i++) {
        if (f[i] < '0' || f[i] > '7') return 0;
        v = v > (UINT64_MAX >> 3) ? UINT64_MAX : v * 8 + (uint64_t)(f[i] - '0');
    }
    *out = v;
    return 1;
}

static int tar_checksum_ok(const uint8_t *h) {
    uint64_t want;
    if (!tar_octal(h + 148, 8, 0, &want)) return 0;
    uint64_t sum = 8 * 32, high = 0;
    for (int i = 0; i < TAR_BLOCK; i++) {
        if (i >= 148 && i < 156) continue;
        sum += h[i];
        high += h[i] > 127;
    }
    return want == sum || want == sum - 256 * high;
}

/* The size field: octal, or GNU base-256 (first byte 0x80, the other 11 big-endian). */
static int tar_size_field(const uint8_t *h, uint64_t *out) {
    const uint8_t *f = h + 124;
    if (f[0] & 0x80) {
        if (f[0] != 0x80) return 0;
        uint64_t v = 0;
        for (int i = 1; i < 12; i++) {
            if (i < 4 && f[i]) { *out = UINT64_MAX; return 1; }
            v = (v << 8) | f[i];
        }
        *out = v;
        return 1;
    }
    return tar_octal(f, 12, 1, out);
}

enum { PAX_ABSENT = 0, PAX_SIZE = 1, PAX_BAD = 2 };

/* The records of a pax header (`LENGTH KEY=VALUE\n` each); 0 when they do not parse. A `size`
 * record sets *state (PAX_SIZE and *size, or PAX_BAD when its value is not decimal digits). */
static int tar_pax(const uint8_t *r, size_t n, int *state, uint64_t *size) {
    size_t i = 0;
    while (i < n && r[i] != 0) {
        size_t lim = i + 21 < n ? i + 21 : n, sp = i;
        while (sp < lim && r[sp] != ' ') sp++;
        if (sp == lim || sp == i) return 0;
        uint64_t len = 0;
        for (size_t k = i; k < sp; k++) {
            if (r[k] < '0' || r[k] > '9') return 0;
            len = len > UINT64_MAX / 16 ? UINT64_MAX : len * 10 + (uint64_t)(r[k] - '0');
        }
        if (len <= sp - i + 1 || len > n - i || r[i + len - 1] != '\n') return 0;
        size_t end = i + (size_t)len - 1, eq = sp + 1;
        while (eq < end && r[eq] != '=') eq++;
        if (eq == end) return 0;
        if (eq - (sp + 1) == 4 && memcmp(r + sp + 1, "size", 4) == 0) {
            uint64_t v = 0;
            int ok = eq + 1 < end;
            for (size_t k = eq + 1; ok && k < end; k++) {
                if (r[k] < '0' || r[k] > '9') ok = 0;
                else v = v > UINT64_MAX / 16 ? UINT64_MAX : v * 10 + (uint64_t)(r[k] - '0');
            }
            *state = ok ? PAX_SIZE : PAX_BAD;
            *size = v;
        }
        i += (size_t)len;
    }
    return 1;
}

/* 1: walked (cuts in *cuts); 0: untrusted; -1: a read failed (f->err). */
static int tar_walk(pg_file_t *f, uint64_t min, u64s_t *cuts) {
    uint64_t size = f->size, off = 0;
    int x_state = PAX_ABSENT, g_state = PAX_ABSENT;
    uint64_t x_size = 0, g_size = 0;
    while (off < size) {
        if (size - off < TAR_BLOCK) return 0;
        size_t avail;
        const uint8_t *h = pg_bytes(f, off, TAR_BLOCK, &avail);
        if (!h) return -1;
        if (avail < TAR_BLOCK) return 0;
        int zero = 1;
        for (int i = 0; i < TAR_BLOCK && zero; i++) zero = h[i] == 0;
        if (zero) return 1;
        if (!tar_checksum_ok(h)) return 0;
        uint8_t kind = h[156];
        int record = kind == 'x' || kind == 'g' || kind == 'L' || kind == 'K';
        uint64_t n;
        if (!tar_size_field(h, &n)) return 0;
        if (!record) {
            int st = x_state != PAX_ABSENT ? x_state : g_state;
            if (st == PAX_BAD) return 0;
            if (st == PAX_SIZE) n = x_state != PAX_ABSENT ? x_size : g_size;
        }
        if (kind >= '1' && kind <= '6') n = 0;
        uint64_t data = off + TAR_BLOCK;
        if (n > size - data) return 0;
        if (record) {
            if (n > TAR_MAX_RECORD) return 0;
            if (kind == 'x' || kind == 'g') {
                const uint8_t *r = pg_bytes(f, data, (size_t)n, &avail);
                if (!r) return -1;
                if (avail < n) return 0;
                int st = PAX_ABSENT;
                uint64_t v = 0;
                if (!tar_pax(r, (size_t)n, &st, &v)) return 0;
                if (kind == 'x') { x_state = st; x_size = v; }
                else if (st != PAX_ABSENT) { g_state = st; g_size = v; }
            } else if (n) {
                const uint8_t *r = pg_bytes(f, data, (size_t)n, &avail);
                if (!r) return -1;
                if (avail < n) return 0;
            }
        } else {
            uint64_t end = data + (n + TAR_BLOCK - 1) / TAR_BLOCK * TAR_BLOCK;
            if (end - data >= min) {
                if ((cuts->n == 0 || cuts->v[cuts->n - 1] != data) && !u64s_push(cuts, data)) {
                    f->err = ENOMEM;
                    return -1;
                }
                if (!u64s_push(cuts, end)) { f->err = ENOMEM; return -1; }
            }
            x_state = PAX_ABSENT;
        }
        off = data + (n + TAR_BLOCK - 1) / TAR_BLOCK * TAR_BLOCK;
    }
    return 1;
}

static PyObject *tar_cuts(PyObject *self, PyObject *args) {
    int fd;
    unsigned long long size, min;
    if (!PyArg_ParseTuple(args, "iKK", &fd, &size, &min)) return NULL;
    pg_file_t f = {fd, size, NULL, 0, 0, 0, 0, TAR_WINDOW};
    u64s_t cuts = {NULL, 0, 0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = tar_walk(&f, min, &cuts);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(f.win);
    PyObject *out = cuts_result(rc, f.err, cuts.v, cuts.n);
    PyMem_RawFree(cuts.v);
    return out;
}

static PyObject *gear_table(PyObject *self, PyObject *noargs) {
    PyObject *t = PyTuple_New(256);
    if (!t) return NULL;
    for (int i = 0; i < 256; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(GEAR[i]);
        if (!v) { Py_DECREF(t); return NULL; }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(buffer, min, avg, max, eof, split=0) -> list of chunk end offsets.\n\n"
     "Without eof, a trailing partial chunk is left out: feed it again with more bytes.\n"
     "With 0 < split < len(buffer), the halves before and after split are scanned in two\n"
     "threads that resynchronise at a common cut point: the result is the same."},
    {"page_groups", page_groups, METH_VARARGS,
     "page_groups(fd, size, ranges, hard, min, avg, max) -> list of cut offsets, or None.\n\n"
     "ranges: packed uint64 (start, end) of every column chunk, sorted and disjoint; hard: packed\n"
     "uint64 offsets that always cut, sorted. None when the pages do not walk cleanly: chunk\n"
     "the file as bytes."},
    {"tar_cuts", tar_cuts, METH_VARARGS,
     "tar_cuts(fd, size, min) -> list of cut offsets, or None.\n\n"
     "The start and end of every member's data region of at least min bytes of the tar file\n"
     "open as fd (size bytes), walked as core/tar.py walks it; None when a header is not to\n"
     "be trusted: chunk the file as bytes."},
    {"gear_table", gear_table, METH_NOARGS, "The 256-entry gear table (format constant)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gear", "Native gear-hash CDC scan.", -1, methods};

PyMODINIT_FUNC PyInit__gear(void) {
    init_gear();
    return PyModule_Create(&module);
}
