/* Shared-memory transport (see shm.h for the protocol and its guarantees).
 *
 * Segment of rank w: [header | slot 0 | slot 1]. Header words, each on its own cache line:
 *   posted   last round whose input w has put in slot round % 2
 *   reduced  last round whose owned all_reduce result w has put back into its slot
 *   state    0 live, 1 aborted, 2 closed
 *   waiters  how many processes sleep on a word of this header (wakes are skipped at 0)
 *   done[p]  last round rank p finished reading from w (written by p)
 *   desc[2]  what w is doing in the round held by each slot (checked by readers)
 * Rounds are numbered from 1 by every rank alike (the same operations with the same counts give
 * the same rounds); counters are compared with wrap-around arithmetic, which holds because every
 * counter moves in every round (a broadcast's non-roots post their desc without data, and a round
 * that is not an all_reduce publishes `reduced` with `posted`): no counter lags by more than two
 * rounds. Before rank w fills slot R % 2 it waits for done[p] >= R - 2 of every peer p: at most
 * one round ahead of its slowest reader.
 *
 * Names are /pcs-coll-<pid namespace>-<pid>-<n>-<ns>, unlinked once every rank mapped them. A
 * rank killed in between leaves its name behind; the next segment created in the same PID
 * namespace removes the names of processes that no longer exist. */
#define _GNU_SOURCE
#include "coll/shm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "pcs/clock.h"
#include "pcs/log.h"

#define SHM_MAGIC   0x70637368u /* "pcsh" */
#define SHM_VERSION 1u
#define LINE        64
#define HDR_BYTES   8192
#define SPIN        256
#define SLICE_MS    10

enum { ST_LIVE = 0, ST_ABORTED = 1, ST_CLOSED = 2 };
enum { OP_AG = 1, OP_BC = 2, OP_RS = 3, OP_AR = 4 };
static const char *op_names[] = {"?", "all_gather", "broadcast", "reduce_scatter", "all_reduce"};

typedef struct line_u32 {
    uint32_t v;
    char pad[LINE - sizeof(uint32_t)];
} line_u32_t;

typedef struct op_desc {
    uint32_t kind, dtype;
    uint64_t count; /* elements (bytes for AG/BC) */
    uint64_t seq;   /* operation number on this communicator */
    int32_t root;
    uint32_t pad;
} op_desc_t;

typedef struct shm_hdr {
    uint32_t magic, version;
    int32_t rank, size, pid;
    uint32_t slot_bytes;
    char pad0[LINE - 6 * sizeof(uint32_t)];
    line_u32_t posted, reduced, state, waiters;
    line_u32_t done[PCS_SHM_MAX_RANKS];
    op_desc_t desc[2];
} shm_hdr_t;

_Static_assert(sizeof(shm_hdr_t) <= HDR_BYTES, "shm header outgrew its page");

struct pcs_shm {
    int rank, size, timeout_ms;
    char name[64];
    int linked;
    size_t map_bytes;
    char *seg[PCS_SHM_MAX_RANKS]; /* every rank's mapping (own included) */
    uint32_t round;               /* last round started */
    uint64_t seq;                 /* operations started */
    pcs_shm_cancel_fn cancel;
    void *cancel_arg;
    char *tmp; /* all_reduce accumulator, one slot */
};

static shm_hdr_t *H(const pcs_shm_t *s, int r)
{
    return (shm_hdr_t *)s->seg[r];
}

static char *slot(const pcs_shm_t *s, int r, uint32_t round)
{
    return s->seg[r] + HDR_BYTES + (size_t)(round % 2) * PCS_SHM_SLOT_BYTES;
}

static uint32_t load(const uint32_t *w)
{
    return __atomic_load_n(w, __ATOMIC_SEQ_CST);
}

static int reached(uint32_t v, uint32_t target)
{
    return (int32_t)(v - target) >= 0;
}

static void futex_wake(uint32_t *w)
{
    syscall(SYS_futex, w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Publish v in word w of header h (seq_cst store, then wake sleepers if any: the waiter
 * increments h->waiters before its last check, so one of the two sees the other). */
static void publish(shm_hdr_t *h, uint32_t *w, uint32_t v)
{
    __atomic_store_n(w, v, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&h->waiters.v, __ATOMIC_SEQ_CST) > 0)
        futex_wake(w);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* 1 when process pid is gone or a zombie (a killed rank whose parent has not reaped it yet). */
static int process_gone(int pid)
{
    if (pid <= 0)
        return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 1;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

static pcs_status_t fail(pcs_shm_fail_t *f, int peer, pcs_shm_fault_t k, pcs_status_t st,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static pcs_status_t fail(pcs_shm_fail_t *f, int peer, pcs_shm_fault_t k, pcs_status_t st,
                         const char *fmt, ...)
{
    f->peer = peer;
    f->fault = k;
    va_list ap;
    va_start(ap, fmt);
    pcs_set_errorv(st, fmt, ap);
    va_end(ap);
    return st;
}

/* Wait until word w (in the header of rank `owner`) reaches target; `peer` is the rank expected
 * to move it (blamed if it never does). */
static pcs_status_t wait_for(pcs_shm_t *s, int owner, uint32_t *w, uint32_t target, int peer,
                             const char *what, pcs_shm_fail_t *f)
{
    for (int i = 0; i < SPIN; i++) {
        if (reached(load(w), target))
            return PCS_OK;
        cpu_relax();
    }
    shm_hdr_t *oh = H(s, owner), *ph = H(s, peer);
    uint64_t start = pcs_now_ms(), deadline = start + (uint64_t)s->timeout_ms;
    for (;;) {
        uint32_t v = load(w);
        if (reached(v, target))
            return PCS_OK;
        uint32_t st = load(&ph->state.v);
        if (st != ST_LIVE)
            return fail(f, peer, PCS_SHM_LEFT, PCS_ERR_REMOTE, "rank %d %s (shared memory)", peer,
                        st == ST_ABORTED ? "aborted" : "left the communicator");
        if (s->cancel && s->cancel(s->cancel_arg))
            return fail(f, -1, PCS_SHM_CANCELLED, PCS_ERR_CANCELLED, "cancelled");
        uint64_t now = pcs_now_ms();
        if (now >= deadline)
            return fail(f, peer, PCS_SHM_SILENT, PCS_ERR_TIMEOUT,
                        "timed out waiting for %s of rank %d (shared memory)", what, peer);
        if (now - start >= SLICE_MS && process_gone(ph->pid))
            return fail(f, peer, PCS_SHM_DIED, PCS_ERR_REMOTE,
                        "process %d of rank %d is gone (shared memory)", (int)ph->pid, peer);
        uint64_t left = deadline - now;
        struct timespec ts = {0, (long)(left < SLICE_MS ? left : SLICE_MS) * 1000000L};
        __atomic_add_fetch(&oh->waiters.v, 1, __ATOMIC_SEQ_CST);
        if (load(w) == v)
            syscall(SYS_futex, w, FUTEX_WAIT, v, &ts, NULL, 0);
        __atomic_sub_fetch(&oh->waiters.v, 1, __ATOMIC_SEQ_CST);
    }
}

// ---- setup ----

static unsigned long ns_inode(const char *which)
{
    char path[64];
    struct stat st;
    snprintf(path, sizeof path, "/proc/self/ns/%s", which);
    return stat(path, &st) == 0 ? (unsigned long)st.st_ino : 0ul;
}

/* Remove the names that processes of this PID namespace left behind when they were killed
 * between creating their segment and unlinking it. */
static void sweep_stale(void)
{
    unsigned long ns = ns_inode("pid");
    if (ns == 0) /* no /proc: another namespace's names would look like ours */
        return;
    char prefix[64];
    int pl = snprintf(prefix, sizeof prefix, "pcs-coll-%lu-", ns);
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, (size_t)pl) != 0)
            continue;
        int pid = atoi(e->d_name + pl);
        if (pid > 0 && pid != (int)getpid() && process_gone(pid)) {
            char name[300];
            snprintf(name, sizeof name, "/%s", e->d_name);
            if (shm_unlink(name) == 0)
                PCS_INFO(PCS_SUB_COLL, "removed %s left by process %d", name, pid);
        }
    }
    closedir(d);
}

/* PCS_SHM_FIRST_ROUND (test hook): the round counters start there instead of 0, so that a test
 * crosses the 32-bit wrap in a few rounds. Every rank of a communicator must use the same. */
static uint32_t first_round(void)
{
    const char *v = getenv("PCS_SHM_FIRST_ROUND");
    return v && v[0] ? (uint32_t)strtoul(v, NULL, 0) : 0u;
}

void pcs_shm_locality(char *out, size_t cap)
{
    char host[256] = "", boot[64] = "";
    const char *id = getenv("PCS_HOST_ID");
    if (!id || !id[0]) {
        gethostname(host, sizeof host - 1);
        int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            ssize_t n = read(fd, boot, sizeof boot - 1);
            close(fd);
            boot[n > 0 ? n : 0] = '\0';
            boot[strcspn(boot, "\n")] = '\0';
        }
    }
    snprintf(out, cap, "host=%s%s%s ipc=%lu pid=%lu mnt=%lu net=%lu uid=%u",
             id && id[0] ? id : host, id && id[0] ? "" : " boot=", id && id[0] ? "" : boot,
             ns_inode("ipc"), ns_inode("pid"), ns_inode("mnt"), ns_inode("net"),
             (unsigned)getuid());
}

pcs_status_t pcs_shm_create(int rank, int size, int timeout_ms, pcs_shm_t **out)
{
    *out = NULL;
    if (size < 2 || size > PCS_SHM_MAX_RANKS || rank < 0 || rank >= size)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "shm: %d ranks (2..%d supported)", size,
                             PCS_SHM_MAX_RANKS);
    if (ns_inode("pid") == 0) /* liveness checks and names need the PID namespace */
        return pcs_set_error(PCS_ERR_UNSUPPORTED, "shm: no /proc/self/ns/pid");
    pcs_shm_t *s = calloc(1, sizeof *s);
    if (!s)
        return pcs_set_error(PCS_ERR_NOMEM, "shm: out of memory");
    s->rank = rank;
    s->size = size;
    s->timeout_ms = timeout_ms > 0 ? timeout_ms : 30000;
    s->map_bytes = HDR_BYTES + 2 * (size_t)PCS_SHM_SLOT_BYTES;
    s->tmp = malloc(PCS_SHM_SLOT_BYTES);
    if (!s->tmp) {
        free(s);
        return pcs_set_error(PCS_ERR_NOMEM, "shm: out of memory");
    }
    sweep_stale();
    static uint32_t counter;
    int fd = -1;
    for (int attempt = 0; attempt < 8 && fd < 0; attempt++) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        snprintf(s->name, sizeof s->name, "/pcs-coll-%lu-%d-%u-%lx", ns_inode("pid"), (int)getpid(),
                 __atomic_add_fetch(&counter, 1, __ATOMIC_SEQ_CST), (unsigned long)now.tv_nsec);
        fd = shm_open(s->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST)
            break;
    }
    if (fd < 0) {
        pcs_status_t st =
            pcs_set_error(PCS_ERR_SYSTEM, "shm_open %s: %s", s->name, strerror(errno));
        pcs_shm_destroy(s);
        return st;
    }
    s->linked = 1;
    /* fallocate, not ftruncate alone: a full /dev/shm must fail here, not SIGBUS on first touch */
    int e = posix_fallocate(fd, 0, (off_t)s->map_bytes);
    void *p =
        e == 0 ? mmap(NULL, s->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (e == 0 && p == MAP_FAILED)
        e = errno;
    close(fd);
    if (e != 0) {
        pcs_status_t st = pcs_set_error(PCS_ERR_SYSTEM, "shm segment %s (%zu bytes): %s", s->name,
                                        s->map_bytes, strerror(e));
        pcs_shm_destroy(s);
        return st;
    }
    s->seg[rank] = p;
    shm_hdr_t *h = H(s, rank);
    h->rank = rank;
    h->size = size;
    h->pid = (int32_t)getpid();
    h->slot_bytes = PCS_SHM_SLOT_BYTES;
    h->version = SHM_VERSION;
    s->round = first_round();
    h->posted.v = h->reduced.v = s->round;
    for (int q = 0; q < size; q++)
        h->done[q].v = s->round;
    __atomic_store_n(&h->magic, SHM_MAGIC, __ATOMIC_SEQ_CST);
    *out = s;
    return PCS_OK;
}

const char *pcs_shm_name(const pcs_shm_t *s)
{
    return s->name;
}

pcs_status_t pcs_shm_attach(pcs_shm_t *s, int peer, const char *name)
{
    if (peer < 0 || peer >= s->size || peer == s->rank || s->seg[peer])
        return pcs_set_error(PCS_ERR_INVALID_ARG, "shm attach: bad peer %d", peer);
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return pcs_set_error(PCS_ERR_SYSTEM, "shm_open %s (rank %d): %s", name, peer,
                             strerror(errno));
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && (size_t)st.st_size >= s->map_bytes)
        p = mmap(NULL, s->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return pcs_set_error(PCS_ERR_SYSTEM, "shm map %s (rank %d) failed", name, peer);
    const shm_hdr_t *h = p;
    if (__atomic_load_n(&h->magic, __ATOMIC_SEQ_CST) != SHM_MAGIC || h->version != SHM_VERSION ||
        h->rank != peer || h->size != s->size || h->slot_bytes != PCS_SHM_SLOT_BYTES) {
        munmap(p, s->map_bytes);
        return pcs_set_error(PCS_ERR_STATE, "shm segment %s is not rank %d of %d (version %u)",
                             name, peer, s->size, h->version);
    }
    s->seg[peer] = p;
    return PCS_OK;
}

void pcs_shm_unlink(pcs_shm_t *s)
{
    if (s && s->linked) {
        shm_unlink(s->name);
        s->linked = 0;
    }
}

void pcs_shm_set_cancel(pcs_shm_t *s, pcs_shm_cancel_fn fn, void *arg)
{
    s->cancel = fn;
    s->cancel_arg = arg;
}

void pcs_shm_leave(pcs_shm_t *s, int aborted)
{
    if (!s || !s->seg[s->rank])
        return;
    shm_hdr_t *h = H(s, s->rank);
    uint32_t want = aborted ? ST_ABORTED : ST_CLOSED, cur = ST_LIVE;
    if (!__atomic_compare_exchange_n(&h->state.v, &cur, want, 0, __ATOMIC_SEQ_CST,
                                     __ATOMIC_SEQ_CST))
        return;
    /* sleepers re-check states every slice; wake the ones waiting on this rank's words now */
    futex_wake(&h->posted.v);
    futex_wake(&h->reduced.v);
    for (int p = 0; p < s->size; p++) {
        futex_wake(&h->done[p].v);
        if (p != s->rank && s->seg[p])
            futex_wake(&H(s, p)->done[s->rank].v); /* a peer waiting for this rank's release */
    }
}

void pcs_shm_destroy(pcs_shm_t *s)
{
    if (!s)
        return;
    pcs_shm_leave(s, 0);
    pcs_shm_unlink(s);
    for (int r = 0; r < PCS_SHM_MAX_RANKS; r++)
        if (s->seg[r])
            munmap(s->seg[r], s->map_bytes);
    free(s->tmp);
    free(s);
}

// ---- rounds ----

static int mod(int a, int n)
{
    return ((a % n) + n) % n;
}

/* Start round R: wait until every peer finished round R - 2 (which used the same slot). */
static pcs_status_t begin_round(pcs_shm_t *s, pcs_shm_fail_t *f)
{
    uint32_t R = ++s->round;
    shm_hdr_t *me = H(s, s->rank);
    for (int p = 0; p < s->size; p++) {
        if (p == s->rank)
            continue;
        PCS_CHECK(wait_for(s, s->rank, &me->done[p].v, R - 2, p, "the release of a slot", f));
    }
    return PCS_OK;
}

/* This rank is in the round (its input, if any, is in its slot). Outside all_reduce, `reduced`
 * moves along with `posted` (see the header). */
static void post(pcs_shm_t *s, const op_desc_t *d)
{
    shm_hdr_t *me = H(s, s->rank);
    me->desc[s->round % 2] = *d;
    if (d->kind != OP_AR)
        publish(me, &me->reduced.v, s->round);
    publish(me, &me->posted.v, s->round);
}

/* Wait for peer p's input of this round and check it runs the same operation. */
static pcs_status_t await_posted(pcs_shm_t *s, int p, const op_desc_t *d, pcs_shm_fail_t *f)
{
    PCS_CHECK(wait_for(s, p, &H(s, p)->posted.v, s->round, p, "the input", f));
    const op_desc_t *pd = &H(s, p)->desc[s->round % 2];
    if (pd->kind != d->kind || pd->dtype != d->dtype || pd->count != d->count ||
        pd->seq != d->seq || pd->root != d->root) {
        unsigned k = pd->kind < 5 ? pd->kind : 0;
        return fail(f, p, PCS_SHM_MISMATCH, PCS_ERR_STATE,
                    "rank %d runs %s #%llu of %llu %s elements, this rank %s #%llu of %llu %s "
                    "elements (ranks must issue the same collectives in the same order)",
                    p, op_names[k], (unsigned long long)pd->seq, (unsigned long long)pd->count,
                    pcs_dtype_name((pcs_dtype_t)pd->dtype), op_names[d->kind],
                    (unsigned long long)d->seq, (unsigned long long)d->count,
                    pcs_dtype_name((pcs_dtype_t)d->dtype));
    }
    return PCS_OK;
}

/* This rank is finished with every peer's slot for the round. */
static void end_round(pcs_shm_t *s)
{
    for (int p = 0; p < s->size; p++)
        if (p != s->rank)
            publish(H(s, p), &H(s, p)->done[s->rank].v, s->round);
}

static op_desc_t desc(pcs_shm_t *s, uint32_t kind, pcs_dtype_t dt, size_t count, int root)
{
    op_desc_t d;
    memset(&d, 0, sizeof d);
    d.kind = kind;
    d.dtype = (uint32_t)dt;
    d.count = count;
    d.seq = ++s->seq;
    d.root = root;
    return d;
}

// ---- the operations ----

pcs_status_t pcs_shm_all_gather(pcs_shm_t *s, const void *in, void *out, size_t bytes,
                                pcs_shm_fail_t *f)
{
    const int P = s->size, r = s->rank;
    char *o = out;
    const op_desc_t d = desc(s, OP_AG, PCS_DTYPE_NONE, bytes, 0);
    f->peer = -1;
    f->fault = PCS_SHM_OK;
    /* own block first (as the ring does): any `in` inside `out` is then read before overwritten */
    char *own = o + (size_t)r * bytes;
    if (in != own)
        memmove(own, in, bytes);
    for (size_t off = 0; off < bytes; off += PCS_SHM_SLOT_BYTES) {
        size_t n = bytes - off < PCS_SHM_SLOT_BYTES ? bytes - off : PCS_SHM_SLOT_BYTES;
        PCS_CHECK(begin_round(s, f));
        memcpy(slot(s, r, s->round), own + off, n);
        post(s, &d);
        for (int k = 1; k < P; k++) {
            int p = mod(r + k, P);
            PCS_CHECK(await_posted(s, p, &d, f));
            memcpy(o + (size_t)p * bytes + off, slot(s, p, s->round), n);
        }
        end_round(s);
    }
    return PCS_OK;
}

pcs_status_t pcs_shm_broadcast(pcs_shm_t *s, void *buf, size_t bytes, int root, pcs_shm_fail_t *f)
{
    const op_desc_t d = desc(s, OP_BC, PCS_DTYPE_NONE, bytes, root);
    f->peer = -1;
    f->fault = PCS_SHM_OK;
    for (size_t off = 0; off < bytes; off += PCS_SHM_SLOT_BYTES) {
        size_t n = bytes - off < PCS_SHM_SLOT_BYTES ? bytes - off : PCS_SHM_SLOT_BYTES;
        PCS_CHECK(begin_round(s, f));
        if (s->rank == root) {
            memcpy(slot(s, root, s->round), (char *)buf + off, n);
            post(s, &d);
            /* every rank posts: a peer that takes another rank (or itself) for the root shows */
            for (int k = 1; k < s->size; k++)
                PCS_CHECK(await_posted(s, mod(root + k, s->size), &d, f));
        } else {
            post(s, &d); /* no data: keeps the counters in step and lets others check the root */
            PCS_CHECK(await_posted(s, root, &d, f));
            memcpy((char *)buf + off, slot(s, root, s->round), n);
        }
        end_round(s);
    }
    return PCS_OK;
}

/* Chunked reduction shared by reduce_scatter (chunks of rc) and all_reduce (the ring's uneven
 * chunks). Round j carries elements [j*q, j*q + q) of every chunk: rank w's slot holds P
 * sub-areas of q elements, sub-area k = w's prepared piece of chunk k. The owner r of chunk r
 * reduces its piece in the ring's order into `res` (reduce_scatter: straight into out; all_reduce:
 * the scratch), applies post_div, and for all_reduce puts the result back into its own sub-area r
 * for the others to copy. */
typedef struct red_job {
    const char *in;
    char *out;
    size_t count; /* all_reduce: total; reduce_scatter: recv count */
    int all;      /* all_reduce */
    pcs_dtype_t dt;
    pcs_red_op_t op;
    double f_pre, f_avg, f_post;
} red_job_t;

static void chunk_of(const red_job_t *j, int P, int k, size_t *off, size_t *n)
{
    if (j->all) {
        pcs_coll_chunk(j->count, P, k, off, n);
    } else {
        *off = (size_t)k * j->count;
        *n = j->count;
    }
}

static pcs_status_t run_reduction(pcs_shm_t *s, const red_job_t *j, uint32_t kind,
                                  pcs_shm_fail_t *f)
{
    const int P = s->size, r = s->rank;
    const size_t es = pcs_dtype_size(j->dt);
    const size_t q = PCS_SHM_SLOT_BYTES / ((size_t)P * es);
    size_t max_chunk, dummy;
    chunk_of(j, P, 0, &dummy, &max_chunk);
    const op_desc_t d = desc(s, kind, j->dt, j->count, 0);
    f->peer = -1;
    f->fault = PCS_SHM_OK;
    size_t my_off, my_n;
    chunk_of(j, P, r, &my_off, &my_n);
    for (size_t base = 0; base < max_chunk; base += q) {
        PCS_CHECK(begin_round(s, f));
        char *mine = slot(s, r, s->round);
        for (int k = 0; k < P; k++) {
            size_t off, n;
            chunk_of(j, P, k, &off, &n);
            if (base < n) {
                size_t m = n - base < q ? n - base : q;
                pcs_coll_prepare(mine + (size_t)k * q * es, j->in + (off + base) * es, m, j->dt,
                                 j->f_pre, j->f_avg);
            }
        }
        post(s, &d);
        size_t m = base < my_n ? (my_n - base < q ? my_n - base : q) : 0;
        char *res = j->all ? s->tmp : j->out + base * es;
        const size_t sub = (size_t)r * q * es;
        for (int k = 1; k < P; k++) {
            int p = mod(r + k, P);
            PCS_CHECK(await_posted(s, p, &d, f));
            if (k == 1)
                memcpy(res, slot(s, p, s->round) + sub, m * es);
            else
                pcs_coll_reduce_acc(res, slot(s, p, s->round) + sub, m, j->dt, j->op);
        }
        pcs_coll_reduce_acc(res, mine + sub, m, j->dt, j->op);
        if (j->f_post != 1.0)
            pcs_coll_scale(res, res, m, j->dt, j->f_post);
        if (j->all) {
            memcpy(mine + sub, res, m * es);
            memcpy(j->out + (my_off + base) * es, res, m * es);
            shm_hdr_t *me = H(s, r);
            publish(me, &me->reduced.v, s->round);
            for (int k = 1; k < P; k++) {
                int p = mod(r + k, P);
                size_t off, n;
                chunk_of(j, P, p, &off, &n);
                if (base >= n)
                    continue;
                size_t mp = n - base < q ? n - base : q;
                PCS_CHECK(wait_for(s, p, &H(s, p)->reduced.v, s->round, p, "a reduced chunk", f));
                memcpy(j->out + (off + base) * es, slot(s, p, s->round) + (size_t)p * q * es,
                       mp * es);
            }
        }
        end_round(s);
    }
    return PCS_OK;
}

static pcs_status_t reduction(pcs_shm_t *s, const void *in, void *out, size_t count, int all,
                              pcs_dtype_t dt, const pcs_coll_red_t *red, pcs_shm_fail_t *f)
{
    red_job_t j = {in,
                   out,
                   count,
                   all,
                   dt,
                   red->op == PCS_RED_MAX ? PCS_RED_MAX : PCS_RED_SUM,
                   pcs_coll_div_factor(red->pre_div, dt),
                   red->op == PCS_RED_AVG ? pcs_coll_avg_factor(s->size, dt) : 1.0,
                   pcs_coll_div_factor(red->post_div, dt)};
    return run_reduction(s, &j, all ? OP_AR : OP_RS, f);
}

pcs_status_t pcs_shm_reduce_scatter(pcs_shm_t *s, const void *in, void *out, size_t recv_count,
                                    pcs_dtype_t dt, const pcs_coll_red_t *red, pcs_shm_fail_t *f)
{
    return reduction(s, in, out, recv_count, 0, dt, red, f);
}

pcs_status_t pcs_shm_all_reduce(pcs_shm_t *s, const void *in, void *out, size_t count,
                                pcs_dtype_t dt, const pcs_coll_red_t *red, pcs_shm_fail_t *f)
{
    return reduction(s, in, out, count, 1, dt, red, f);
}
