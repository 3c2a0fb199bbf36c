/* XXH3-64 (seed 0, the default secret) and a verified read of a run of chunks.

   XXH3-64 is the checksum a v2 pack entry carries for its raw chunk (docs/format.md);
   this is an implementation of its published specification, checked against the
   `xxhash` package on every length class by tests/test_native_reads.py. It exists so
   that a read can check each chunk in C, right after it lands, with the GIL released:

     read_run(fd, offset, out, lengths, checks) -> int
       reads len(out) bytes of a pack from `offset` into the writable buffer `out` a few
       chunks at a time (pread) and checks each chunk (lengths[k] bytes, back to back)
       against checks[k] while it is still in the CPU's cache. Returns -1 when all match,
       the index of the first chunk that does not, or -2 when the file ended first (the
       pack is truncated). An I/O error raises OSError. Nothing else is touched.

     first_mismatch(buf, lengths, checks) -> int   the same check of bytes already in memory
     xxh3_64(buf) -> int                            one checksum

     Filler(): one native thread that reads and checks runs of chunks into a buffer with no
       GIL at any point, so that a fill ahead never waits for the interpreter while the reader's
       thread runs Python. start(out, runs) hands it a job (runs: (fd, offset, at, lengths,
       checks), each fd dup'ed for the job); wait() takes a share of the job's slices itself
       (both cores fill), waits for the rest and returns None, or (run, k): chunk k of that run
       does not match, k = -2 the file ended first. An I/O error raises OSError.

   The GIL is released around the reads and the hashing; the buffers are held (buffer
   protocol) for the whole call. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define P32_1 0x9E3779B1U
#define P32_2 0x85EBCA77U
#define P32_3 0xC2B2AE3DU
#define P64_1 0x9E3779B185EBCA87ULL
#define P64_2 0xC2B2AE3D27D4EB4FULL
#define P64_3 0x165667B19E3779F9ULL
#define P64_4 0x85EBCA77C2B2AE63ULL
#define P64_5 0x27D4EB2F165667C5ULL
#define MX1 0x165667919E3779F9ULL
#define MX2 0x9FB21C651E98DF25ULL

#define SECRET_SIZE 192
#define STRIPE 64
#define STRIPES_PER_BLOCK ((SECRET_SIZE - STRIPE) / 8)
#define BLOCK (STRIPE * STRIPES_PER_BLOCK)

/* the specification's default secret */
static const uint8_t SECRET[SECRET_SIZE] __attribute__((aligned(64))) = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

static inline uint64_t le64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }  /* x86-64, aarch64: little-endian */
static inline uint32_t le32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t swap64(uint64_t x) { return __builtin_bswap64(x); }

static inline uint64_t fold128(uint64_t a, uint64_t b) {
    __uint128_t p = (__uint128_t)a * b;
    return (uint64_t)p ^ (uint64_t)(p >> 64);
}

static inline uint64_t avalanche(uint64_t h) {
    h ^= h >> 37;
    h *= MX1;
    return h ^ (h >> 32);
}

static inline uint64_t avalanche64(uint64_t h) {  /* XXH64's final mix */
    h ^= h >> 33;
    h *= P64_2;
    h ^= h >> 29;
    h *= P64_3;
    return h ^ (h >> 32);
}

static inline uint64_t rrmxmx(uint64_t h, uint64_t len) {
    h ^= rotl64(h, 49) ^ rotl64(h, 24);
    h *= MX2;
    h ^= (h >> 35) + len;
    h *= MX2;
    return h ^ (h >> 28);
}

static inline uint64_t mix16(const uint8_t *in, const uint8_t *sec) {
    return fold128(le64(in) ^ le64(sec), le64(in + 8) ^ le64(sec + 8));
}

static uint64_t upto16(const uint8_t *p, size_t n) {
    if (n > 8) {
        uint64_t lo = le64(p) ^ (le64(SECRET + 24) ^ le64(SECRET + 32));
        uint64_t hi = le64(p + n - 8) ^ (le64(SECRET + 40) ^ le64(SECRET + 48));
        return avalanche(n + swap64(lo) + hi + fold128(lo, hi));
    }
    if (n >= 4) {
        uint64_t v = (uint64_t)le32(p + n - 4) + ((uint64_t)le32(p) << 32);
        return rrmxmx(v ^ (le64(SECRET + 8) ^ le64(SECRET + 16)), n);
    }
    if (n > 0) {
        uint32_t c = ((uint32_t)p[0] << 16) | ((uint32_t)p[n >> 1] << 24) | (uint32_t)p[n - 1] | ((uint32_t)n << 8);
        return avalanche64((uint64_t)c ^ (uint64_t)(le32(SECRET) ^ le32(SECRET + 4)));
    }
    return avalanche64(le64(SECRET + 56) ^ le64(SECRET + 64));
}

static uint64_t upto128(const uint8_t *p, size_t n) {
    uint64_t acc = n * P64_1;
    if (n > 32) {
        if (n > 64) {
            if (n > 96) {
                acc += mix16(p + 48, SECRET + 96);
                acc += mix16(p + n - 64, SECRET + 112);
            }
            acc += mix16(p + 32, SECRET + 64);
            acc += mix16(p + n - 48, SECRET + 80);
        }
        acc += mix16(p + 16, SECRET + 32);
        acc += mix16(p + n - 32, SECRET + 48);
    }
    acc += mix16(p, SECRET);
    acc += mix16(p + n - 16, SECRET + 16);
    return avalanche(acc);
}

static uint64_t upto240(const uint8_t *p, size_t n) {
    uint64_t acc = n * P64_1;
    size_t rounds = n / 16, i;
    for (i = 0; i < 8; i++) acc += mix16(p + 16 * i, SECRET + 16 * i);
    acc = avalanche(acc);
    for (i = 8; i < rounds; i++) acc += mix16(p + 16 * i, SECRET + 16 * (i - 8) + 3);
    acc += mix16(p + n - 16, SECRET + 136 - 17);
    return avalanche(acc);
}

/* one 64-byte stripe into the eight accumulators */
static inline void stripe(uint64_t *acc, const uint8_t *in, const uint8_t *sec) {
#if defined(__SSE2__)
    __m128i *a = (__m128i *)acc;
    for (int i = 0; i < 4; i++) {
        __m128i d = _mm_loadu_si128((const __m128i *)(in + 16 * i));
        __m128i k = _mm_xor_si128(d, _mm_loadu_si128((const __m128i *)(sec + 16 * i)));
        __m128i prod = _mm_mul_epu32(k, _mm_shuffle_epi32(k, _MM_SHUFFLE(0, 3, 0, 1)));
        __m128i swapped = _mm_shuffle_epi32(d, _MM_SHUFFLE(1, 0, 3, 2));
        a[i] = _mm_add_epi64(a[i], _mm_add_epi64(prod, swapped));
    }
#else
    for (int i = 0; i < 8; i++) {
        uint64_t d = le64(in + 8 * i), k = d ^ le64(sec + 8 * i);
        acc[i ^ 1] += d;
        acc[i] += (uint64_t)(uint32_t)k * (k >> 32);
    }
#endif
}

static inline void scramble(uint64_t *acc, const uint8_t *sec) {
    for (int i = 0; i < 8; i++) {
        uint64_t a = acc[i];
        a ^= a >> 47;
        a ^= le64(sec + 8 * i);
        acc[i] = a * P32_1;
    }
}

/* the long loop, written once for each stripe function (SSE2 or plain C, and AVX2 where the CPU
   has it: about 2.5x the speed on data in cache) */
#define LONG_HASH(name, stripe_fn, attr)                                                              \
    attr static uint64_t name(const uint8_t *p, size_t n) {                                          \
        uint64_t acc[8] __attribute__((aligned(32))) = {P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1}; \
        size_t blocks = (n - 1) / BLOCK, b, s;                                                        \
        for (b = 0; b < blocks; b++) {                                                                \
            const uint8_t *in = p + b * BLOCK;                                                        \
            for (s = 0; s < STRIPES_PER_BLOCK; s++) stripe_fn(acc, in + s * STRIPE, SECRET + 8 * s);  \
            scramble(acc, SECRET + SECRET_SIZE - STRIPE);                                             \
        }                                                                                             \
        size_t stripes = ((n - 1) - BLOCK * blocks) / STRIPE;                                         \
        for (s = 0; s < stripes; s++) stripe_fn(acc, p + blocks * BLOCK + s * STRIPE, SECRET + 8 * s); \
        stripe_fn(acc, p + n - STRIPE, SECRET + SECRET_SIZE - STRIPE - 7);                            \
        uint64_t h = n * P64_1;                                                                       \
        for (int i = 0; i < 4; i++)                                                                   \
            h += fold128(acc[2 * i] ^ le64(SECRET + 11 + 16 * i), acc[2 * i + 1] ^ le64(SECRET + 11 + 16 * i + 8)); \
        return avalanche(h);                                                                          \
    }

LONG_HASH(long_hash_base, stripe, )

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
/* the stripe of `stripe` on 256-bit lanes: two steps instead of four */
__attribute__((target("avx2"))) static inline void stripe_avx2(uint64_t *acc, const uint8_t *in, const uint8_t *sec) {
    __m256i *a = (__m256i *)acc;
    for (int i = 0; i < 2; i++) {
        __m256i d = _mm256_loadu_si256((const __m256i *)(in + 32 * i));
        __m256i k = _mm256_xor_si256(d, _mm256_loadu_si256((const __m256i *)(sec + 32 * i)));
        __m256i prod = _mm256_mul_epu32(k, _mm256_shuffle_epi32(k, _MM_SHUFFLE(0, 3, 0, 1)));
        __m256i swapped = _mm256_shuffle_epi32(d, _MM_SHUFFLE(1, 0, 3, 2));
        a[i] = _mm256_add_epi64(a[i], _mm256_add_epi64(prod, swapped));
    }
}
LONG_HASH(long_hash_avx2, stripe_avx2, __attribute__((target("avx2"))))
static int use_avx2;  /* set once at import */
#endif

static uint64_t long_hash(const uint8_t *p, size_t n) {
#ifdef HAVE_AVX2_PATH
    if (use_avx2) return long_hash_avx2(p, n);
#endif
    return long_hash_base(p, n);
}

static uint64_t xxh3(const uint8_t *p, size_t n) {
    if (n <= 16) return upto16(p, n);
    if (n <= 128) return upto128(p, n);
    if (n <= 240) return upto240(p, n);
    return long_hash(p, n);
}

/* -- the Python face ---------------------------------------------------------------- */

/* lengths and checks as C arrays (sequences of ints of one length); 0 with an exception set on bad input */
static int take_runs(PyObject *lengths, PyObject *checks, Py_ssize_t *count, size_t **lens, uint64_t **sums) {
    PyObject *ls = PySequence_Fast(lengths, "lengths must be a sequence of ints");
    if (!ls) return 0;
    PyObject *cs = PySequence_Fast(checks, "checks must be a sequence of ints");
    if (!cs) { Py_DECREF(ls); return 0; }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ls);
    if (PySequence_Fast_GET_SIZE(cs) != n) {
        PyErr_SetString(PyExc_ValueError, "lengths and checks differ in length");
        goto fail;
    }
    *lens = PyMem_Malloc(sizeof(size_t) * (n ? n : 1));
    *sums = PyMem_Malloc(sizeof(uint64_t) * (n ? n : 1));
    if (!*lens || !*sums) { PyErr_NoMemory(); goto fail_free; }
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t len = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(ls, k));
        unsigned long long sum = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(cs, k));
        if (PyErr_Occurred()) goto fail_free;
        if (len < 0) { PyErr_SetString(PyExc_ValueError, "a chunk length is negative"); goto fail_free; }
        (*lens)[k] = (size_t)len;
        (*sums)[k] = (uint64_t)sum;
    }
    *count = n;
    Py_DECREF(ls);
    Py_DECREF(cs);
    return 1;
fail_free:
    PyMem_Free(*lens);
    PyMem_Free(*sums);
    *lens = NULL;
    *sums = NULL;
fail:
    Py_DECREF(ls);
    Py_DECREF(cs);
    return 0;
}

static int fits(Py_ssize_t count, const size_t *lens, Py_ssize_t room) {
    size_t total = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        total += lens[k];
        if (total > (size_t)room) return 0;
    }
    return total == (size_t)room;
}

static PyObject *py_xxh3_64(PyObject *self, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    uint64_t h;
    Py_BEGIN_ALLOW_THREADS
    h = xxh3((const uint8_t *)b.buf, (size_t)b.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLongLong(h);
}

static PyObject *py_first_mismatch(PyObject *self, PyObject *args) {
    Py_buffer b;
    PyObject *lengths, *checks;
    if (!PyArg_ParseTuple(args, "y*OO:first_mismatch", &b, &lengths, &checks)) return NULL;
    Py_ssize_t count, bad = -1;
    size_t *lens = NULL;
    uint64_t *sums = NULL;
    if (!take_runs(lengths, checks, &count, &lens, &sums)) { PyBuffer_Release(&b); return NULL; }
    if (!fits(count, lens, b.len)) {
        PyErr_SetString(PyExc_ValueError, "the chunk lengths do not add up to the buffer's length");
    } else {
        Py_BEGIN_ALLOW_THREADS
        const uint8_t *p = (const uint8_t *)b.buf;
        for (Py_ssize_t k = 0; k < count; p += lens[k], k++)
            if (xxh3(p, lens[k]) != sums[k]) { bad = k; break; }
        Py_END_ALLOW_THREADS
    }
    PyMem_Free(lens);
    PyMem_Free(sums);
    PyBuffer_Release(&b);
    return PyErr_Occurred() ? NULL : PyLong_FromSsize_t(bad);
}

#define READ_GROUP (256 * 1024)  /* read a few chunks at a time: they are hashed while still in L2 */

static PyObject *py_read_run(PyObject *self, PyObject *args) {
    int fd;
    long long offset;
    Py_buffer b;
    PyObject *lengths, *checks;
    if (!PyArg_ParseTuple(args, "iLw*OO:read_run", &fd, &offset, &b, &lengths, &checks)) return NULL;
    Py_ssize_t count, result = -1;
    size_t *lens = NULL;
    uint64_t *sums = NULL;
    int err = 0;
    if (offset < 0) {
        PyErr_SetString(PyExc_ValueError, "negative offset");
        PyBuffer_Release(&b);
        return NULL;
    }
    if (!take_runs(lengths, checks, &count, &lens, &sums)) { PyBuffer_Release(&b); return NULL; }
    if (!fits(count, lens, b.len)) {
        PyErr_SetString(PyExc_ValueError, "the chunk lengths do not add up to the buffer's length");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    uint8_t *base = (uint8_t *)b.buf;
    size_t at = 0;  /* bytes of the buffer landed and checked */
    Py_ssize_t k = 0;
    while (k < count) {
        Py_ssize_t j = k;  /* chunks [k, j) are read together */
        size_t want = 0;
        do { want += lens[j++]; } while (j < count && want + lens[j] <= READ_GROUP);
        size_t got = 0;
        while (got < want) {
            ssize_t r = pread(fd, base + at + got, want - got, (off_t)(offset + at + got));
            if (r < 0) {
                if (errno == EINTR) continue;
                err = errno;
                break;
            }
            if (r == 0) break;
            got += (size_t)r;
        }
        if (err) break;
        if (got < want) { result = -2; break; }
        for (; k < j; k++) {
            if (xxh3(base + at, lens[k]) != sums[k]) { result = k; break; }
            at += lens[k];
        }
        if (result != -1) break;
    }
    Py_END_ALLOW_THREADS
    if (err) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
    }
done:
    PyMem_Free(lens);
    PyMem_Free(sums);
    PyBuffer_Release(&b);
    return PyErr_Occurred() ? NULL : PyLong_FromSsize_t(result);
}

/* -- Filler: a job of runs read and checked on a native thread and the caller's ------- */

#define SLICE (256 * 1024)  /* a slice: chunks read and hashed together, the unit two threads share */
/* A waiting thread may spin before it sleeps (Filler(spin_us)): a thread woken by another is
   sometimes placed on the waker's core and preempts it. The reader uses none: with other jobs on
   the two cores, spinning took their time (64 KiB reads 0.38x plain with 500 us, 0.49x without). */
#define IDLE_SPIN_NS 500000  /* the thread, after its last slice (the default of spin_us) */
#define DONE_SPIN_NS 200000  /* the caller, for the other thread's last slice (at most spin_us) */

static inline uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

typedef struct {
    int fd;
    long long offset;       /* in the file */
    uint8_t *dst;
    size_t len;
    Py_ssize_t run, first, count;  /* chunks [first, first + count) of the job's arrays, of run `run` */
} slice_t;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_cond_t job_cv, done_cv;
    pthread_t thread;
    int has_thread, quit, active, sleeping;
    uint64_t idle_spin, done_spin;  /* ns */
    unsigned seq;  /* jobs started: the thread spins on it before it sleeps */
    pid_t pid;
    Py_buffer buf;
    int *fds;
    Py_ssize_t nfds;
    size_t *lens;
    uint64_t *sums;
    Py_ssize_t *run_first;  /* each run's first chunk in lens/sums */
    slice_t *slices;
    Py_ssize_t nslices, next, done;
    int stop;  /* a slice failed: the rest are skipped */
    Py_ssize_t bad_slice, bad_chunk;  /* the first failing slice; its chunk (global), -2 short */
    int bad_errno;
} filler_t;

/* one slice: -1 read and matched, a chunk index (global) that does not match, -2 short; errno in *err */
static Py_ssize_t do_slice(filler_t *f, const slice_t *s, int *err) {
    size_t got = 0;
    while (got < s->len) {
        ssize_t r = pread(s->fd, s->dst + got, s->len - got, (off_t)(s->offset + got));
        if (r < 0) {
            if (errno == EINTR) continue;
            *err = errno;
            return -1;
        }
        if (r == 0) return -2;
        got += (size_t)r;
    }
    const uint8_t *p = s->dst;
    for (Py_ssize_t k = s->first; k < s->first + s->count; p += f->lens[k], k++)
        if (xxh3(p, f->lens[k]) != f->sums[k]) return k;
    return -1;
}

/* under mu: the next slice to do, or -1 (a failure skips the rest) */
static Py_ssize_t claim(filler_t *f) {
    if (!f->active) return -1;
    if (f->stop && f->next < f->nslices) {
        __atomic_add_fetch(&f->done, f->nslices - f->next, __ATOMIC_RELEASE);
        f->next = f->nslices;
        if (f->done == f->nslices) pthread_cond_broadcast(&f->done_cv);
    }
    return f->next < f->nslices ? f->next++ : -1;
}

/* under mu: slice k is finished with result r */
static void finish(filler_t *f, Py_ssize_t k, Py_ssize_t r, int err) {
    if ((r != -1 || err) && (f->bad_slice < 0 || k < f->bad_slice)) {
        f->bad_slice = k;
        f->bad_chunk = r;
        f->bad_errno = err;
        f->stop = 1;
    }
    if (__atomic_add_fetch(&f->done, 1, __ATOMIC_RELEASE) == f->nslices) pthread_cond_broadcast(&f->done_cv);
}

/* under mu: do slices until none is left to claim */
static void work(filler_t *f) {
    Py_ssize_t k;
    while ((k = claim(f)) >= 0) {
        slice_t s = f->slices[k];
        int err = 0;
        pthread_mutex_unlock(&f->mu);
        Py_ssize_t r = do_slice(f, &s, &err);
        pthread_mutex_lock(&f->mu);
        finish(f, k, r, err);
    }
}

static void *filler_main(void *arg) {
    filler_t *f = (filler_t *)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);  /* signals go to the interpreter's threads */
    pthread_mutex_lock(&f->mu);
    while (!f->quit) {
        if (f->active && f->next < f->nslices) {
            work(f);
            continue;
        }
        unsigned seq = f->seq;
        pthread_mutex_unlock(&f->mu);
        uint64_t t0 = now_ns();
        while (__atomic_load_n(&f->seq, __ATOMIC_ACQUIRE) == seq && !__atomic_load_n(&f->quit, __ATOMIC_ACQUIRE)
               && now_ns() - t0 < f->idle_spin)
            for (int i = 0; i < 64; i++) relax();
        pthread_mutex_lock(&f->mu);
        if (f->seq == seq && !f->quit) {
            f->sleeping = 1;
            pthread_cond_wait(&f->job_cv, &f->mu);
            f->sleeping = 0;
        }
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

static void filler_init_sync(filler_t *f) {
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->job_cv, NULL);
    pthread_cond_init(&f->done_cv, NULL);
    f->has_thread = f->quit = f->active = f->sleeping = 0;
    f->seq = 0;
    f->pid = getpid();
}

static void job_free(filler_t *f) {  /* with the GIL */
    for (Py_ssize_t i = 0; i < f->nfds; i++) close(f->fds[i]);
    PyMem_Free(f->fds);
    PyMem_Free(f->lens);
    PyMem_Free(f->sums);
    PyMem_Free(f->run_first);
    PyMem_Free(f->slices);
    f->fds = NULL;
    f->lens = NULL;
    f->sums = NULL;
    f->run_first = NULL;
    f->slices = NULL;
    f->nfds = f->nslices = 0;
    if (f->buf.obj) PyBuffer_Release(&f->buf);
    f->buf.obj = NULL;
}

/* the job waited for, the caller helping (GIL released); 0 if there was none */
static int job_wait(filler_t *f) {
    if (!f->active) return 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&f->mu);
    work(f);
    if (f->done < f->nslices) {  /* the other thread's last slice: spin a little, then sleep */
        pthread_mutex_unlock(&f->mu);
        uint64_t t0 = now_ns();
        while (__atomic_load_n(&f->done, __ATOMIC_ACQUIRE) < f->nslices && now_ns() - t0 < f->done_spin)
            for (int i = 0; i < 16; i++) relax();
        pthread_mutex_lock(&f->mu);
        while (f->done < f->nslices) pthread_cond_wait(&f->done_cv, &f->mu);
    }
    f->active = 0;
    pthread_mutex_unlock(&f->mu);
    Py_END_ALLOW_THREADS
    return 1;
}

static void filler_stop(filler_t *f) {
    if (f->pid != getpid()) {  /* a forked child: the thread (and any job) stayed in the parent */
        f->active = 0;
        f->buf.obj = NULL;  /* the parent's hold, not ours to release twice */
        job_free(f);
        filler_init_sync(f);
        return;
    }
    job_wait(f);
    job_free(f);
    if (f->has_thread) {
        pthread_mutex_lock(&f->mu);
        __atomic_store_n(&f->quit, 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&f->job_cv);
        pthread_mutex_unlock(&f->mu);
        Py_BEGIN_ALLOW_THREADS
        pthread_join(f->thread, NULL);
        Py_END_ALLOW_THREADS
        f->has_thread = 0;
        f->quit = 0;
    }
}

static PyObject *filler_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"spin_us", NULL};
    long long spin_us = IDLE_SPIN_NS / 1000;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|L:Filler", kwlist, &spin_us)) return NULL;
    if (spin_us < 0) { PyErr_SetString(PyExc_ValueError, "spin_us is negative"); return NULL; }
    filler_t *f = (filler_t *)type->tp_alloc(type, 0);
    if (!f) return NULL;
    f->idle_spin = (uint64_t)spin_us * 1000;
    f->done_spin = f->idle_spin < DONE_SPIN_NS ? f->idle_spin : DONE_SPIN_NS;
    filler_init_sync(f);
    f->bad_slice = -1;
    return (PyObject *)f;
}

static void filler_dealloc(filler_t *f) {
    filler_stop(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyObject *filler_start(filler_t *f, PyObject *args) {
    PyObject *out, *runs;
    if (!PyArg_ParseTuple(args, "OO:start", &out, &runs)) return NULL;
    if (f->pid != getpid()) filler_stop(f);
    if (f->active) {
        PyErr_SetString(PyExc_RuntimeError, "a job is already running: wait() for it first");
        return NULL;
    }
    job_free(f);
    PyObject *rs = PySequence_Fast(runs, "runs must be a sequence");
    if (!rs) return NULL;
    if (PyObject_GetBuffer(out, &f->buf, PyBUF_WRITABLE) < 0) { f->buf.obj = NULL; Py_DECREF(rs); return NULL; }
    Py_ssize_t nruns = PySequence_Fast_GET_SIZE(rs), total = 0, nslices = 0;
    f->fds = PyMem_Calloc(nruns ? nruns : 1, sizeof(int));
    f->run_first = PyMem_Calloc(nruns ? nruns : 1, sizeof(Py_ssize_t));
    size_t **rl = PyMem_Calloc(nruns ? nruns : 1, sizeof(size_t *));
    uint64_t **rc = PyMem_Calloc(nruns ? nruns : 1, sizeof(uint64_t *));
    Py_ssize_t *rn = PyMem_Calloc(nruns ? nruns : 1, sizeof(Py_ssize_t));
    long long *roff = PyMem_Calloc(nruns ? nruns : 1, sizeof(long long));
    Py_ssize_t *rat = PyMem_Calloc(nruns ? nruns : 1, sizeof(Py_ssize_t));
    if (!f->fds || !f->run_first || !rl || !rc || !rn || !roff || !rat) { PyErr_NoMemory(); goto fail; }
    for (Py_ssize_t r = 0; r < nruns; r++) {
        int fd;
        PyObject *lengths, *checks;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(rs, r), "iLnOO:a run", &fd, &roff[r], &rat[r], &lengths, &checks))
            goto fail;
        if (roff[r] < 0 || rat[r] < 0) { PyErr_SetString(PyExc_ValueError, "negative offset"); goto fail; }
        if (!take_runs(lengths, checks, &rn[r], &rl[r], &rc[r])) goto fail;
        size_t sum = 0;
        for (Py_ssize_t k = 0; k < rn[r]; k++) sum += rl[r][k];
        if (sum > (size_t)f->buf.len || (size_t)rat[r] > (size_t)f->buf.len - sum) {
            PyErr_SetString(PyExc_ValueError, "a run does not fit in the buffer");
            goto fail;
        }
        int dup_fd = dup(fd);
        if (dup_fd < 0) { PyErr_SetFromErrno(PyExc_OSError); goto fail; }
        f->fds[f->nfds++] = dup_fd;
        f->run_first[r] = total;
        total += rn[r];
        for (Py_ssize_t k = 0; k < rn[r];) {  /* slices of the run */
            size_t want = 0;
            do { want += rl[r][k++]; } while (k < rn[r] && want + rl[r][k] <= SLICE);
            nslices++;
        }
    }
    f->lens = PyMem_Malloc(sizeof(size_t) * (total ? total : 1));
    f->sums = PyMem_Malloc(sizeof(uint64_t) * (total ? total : 1));
    f->slices = PyMem_Malloc(sizeof(slice_t) * (nslices ? nslices : 1));
    if (!f->lens || !f->sums || !f->slices) { PyErr_NoMemory(); goto fail; }
    Py_ssize_t n = 0;
    for (Py_ssize_t r = 0; r < nruns; r++) {
        Py_ssize_t g = f->run_first[r];
        memcpy(f->lens + g, rl[r], sizeof(size_t) * rn[r]);
        memcpy(f->sums + g, rc[r], sizeof(uint64_t) * rn[r]);
        size_t at = 0;
        for (Py_ssize_t k = 0; k < rn[r];) {
            slice_t *s = &f->slices[n++];
            s->fd = f->fds[r];
            s->offset = roff[r] + (long long)at;
            s->dst = (uint8_t *)f->buf.buf + rat[r] + at;
            s->run = r;
            s->first = g + k;
            size_t want = 0;
            do { want += rl[r][k++]; } while (k < rn[r] && want + rl[r][k] <= SLICE);
            s->len = want;
            s->count = g + k - s->first;
            at += want;
        }
    }
    for (Py_ssize_t r = 0; r < nruns; r++) { PyMem_Free(rl[r]); PyMem_Free(rc[r]); }
    PyMem_Free(rl); PyMem_Free(rc); PyMem_Free(rn); PyMem_Free(roff); PyMem_Free(rat);
    Py_DECREF(rs);
    if (!f->has_thread) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        int e = pthread_create(&f->thread, &attr, filler_main, f);
        pthread_attr_destroy(&attr);
        if (e) { errno = e; PyErr_SetFromErrno(PyExc_OSError); job_free(f); return NULL; }
        f->has_thread = 1;
    }
    pthread_mutex_lock(&f->mu);
    f->nslices = nslices;
    f->next = f->done = 0;
    f->stop = 0;
    f->bad_slice = -1;
    f->bad_chunk = -1;
    f->bad_errno = 0;
    f->active = 1;
    __atomic_store_n(&f->seq, f->seq + 1, __ATOMIC_RELEASE);
    if (f->sleeping) pthread_cond_signal(&f->job_cv);
    pthread_mutex_unlock(&f->mu);
    Py_RETURN_NONE;
fail:
    if (rl && rc) for (Py_ssize_t r = 0; r < nruns; r++) { PyMem_Free(rl[r]); PyMem_Free(rc[r]); }
    PyMem_Free(rl); PyMem_Free(rc); PyMem_Free(rn); PyMem_Free(roff); PyMem_Free(rat);
    Py_DECREF(rs);
    job_free(f);
    return NULL;
}

static PyObject *filler_wait(filler_t *f, PyObject *unused) {
    if (f->pid != getpid()) {
        filler_stop(f);
        PyErr_SetString(PyExc_RuntimeError, "the job was started in another process");
        return NULL;
    }
    if (!job_wait(f)) { PyErr_SetString(PyExc_RuntimeError, "no job to wait for"); return NULL; }
    PyObject *res;
    if (f->bad_slice < 0) {
        res = Py_NewRef(Py_None);
    } else if (f->bad_errno) {
        errno = f->bad_errno;
        res = PyErr_SetFromErrno(PyExc_OSError);
    } else {
        Py_ssize_t run = f->slices[f->bad_slice].run, c = f->bad_chunk;
        res = Py_BuildValue("nn", run, c == -2 ? (Py_ssize_t)-2 : c - f->run_first[run]);
    }
    job_free(f);
    return res;
}

static PyObject *filler_busy(filler_t *f, void *unused) { return PyBool_FromLong(f->active && f->pid == getpid()); }

static PyObject *filler_close(filler_t *f, PyObject *unused) {
    filler_stop(f);
    Py_RETURN_NONE;
}

static PyMethodDef filler_methods[] = {
    {"start", (PyCFunction)filler_start, METH_VARARGS,
     "start(out, runs): read and check runs ((fd, offset, at, lengths, checks)) into out on the thread"},
    {"wait", (PyCFunction)filler_wait, METH_NOARGS,
     "wait() -> None | (run, k): help with the job, wait for it; k the first bad chunk of run, -2 short"},
    {"close", (PyCFunction)filler_close, METH_NOARGS, "close(): wait for any job and end the thread"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef filler_getset[] = {
    {"busy", (getter)filler_busy, NULL, "a job was started and not waited for", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FillerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cdcstore.core._xxh3.Filler",
    .tp_basicsize = sizeof(filler_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A native thread that reads and checks runs of chunks ahead (start, wait, close).",
    .tp_new = filler_new,
    .tp_dealloc = (destructor)filler_dealloc,
    .tp_methods = filler_methods,
    .tp_getset = filler_getset,
};

static PyObject *py_vector(PyObject *self, PyObject *arg) {  /* tests: the portable path too */
    int on = PyObject_IsTrue(arg), was = 0;
    if (on < 0) return NULL;
#ifdef HAVE_AVX2_PATH
    was = use_avx2;
    use_avx2 = on && __builtin_cpu_supports("avx2");
#endif
    return PyBool_FromLong(was);
}

static PyMethodDef methods[] = {
    {"_vector", py_vector, METH_O, "_vector(on) -> bool: use the AVX2 path when the CPU has it (tests); the old setting"},
    {"xxh3_64", py_xxh3_64, METH_O, "xxh3_64(buffer) -> int: XXH3-64 with seed 0 and the default secret"},
    {"first_mismatch", py_first_mismatch, METH_VARARGS,
     "first_mismatch(buffer, lengths, checks) -> int: the first chunk whose XXH3-64 differs, or -1"},
    {"read_run", py_read_run, METH_VARARGS,
     "read_run(fd, offset, out, lengths, checks) -> int: read and check a run of chunks; -1 all match, "
     "k the first chunk that does not, -2 the file ended first"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_xxh3", "XXH3-64 and verified runs of chunks", -1, methods};

PyMODINIT_FUNC PyInit__xxh3(void) {
#ifdef HAVE_AVX2_PATH
    __builtin_cpu_init();
    use_avx2 = __builtin_cpu_supports("avx2");
#endif
    if (PyType_Ready(&FillerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Filler", (PyObject *)&FillerType) < 0) { Py_DECREF(m); return NULL; }
    return m;
}
