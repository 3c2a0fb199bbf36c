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
    {"gear_table", gear_table, METH_NOARGS, "The 256-entry gear table (format constant)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gear", "Native gear-hash CDC scan.", -1, methods};

PyMODINIT_FUNC PyInit__gear(void) {
    init_gear();
    return PyModule_Create(&module);
}
