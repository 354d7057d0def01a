/* Pipeline point-to-point channels (see pipe.h): one two-rank communicator per channel, a sender
 * thread at its source draining a FIFO of copied messages, a receiver thread at its destination
 * receiving the posted messages ahead of their use. */
#include "worker/pipe.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "pcs/cpu.h"
#include "pcs/mem.h"
#include "planner/mesh.h"

/* A message: its header (sent first when `header`), then count elements of dt (data follows). */
typedef struct pipe_msg {
    struct pipe_msg *next;
    int64_t hdr[2]; /* dtype, count */
    int header;
    size_t count;
    pcs_dtype_t dt;
} pipe_msg_t;

typedef struct pipe_want { /* a posted receive */
    size_t count;
    uint32_t key;
    int header;
} pipe_want_t;

/* One end of a channel with its thread: a send blocked until its receiver gets to it must not
 * hold back the other channels (a 1F1B rank sends an activation forward while its gradient for
 * the previous stage waits), and a receive waits for its data on its own thread. */
typedef struct pipe_end {
    struct pcs_pipe *p;
    pcs_coll_t *c;
    int rx; /* receiving end */
    pthread_t thread;
    int started;
    pipe_msg_t *head, *tail; /* tx: queued to send; rx: arrived, not taken (under p->mu) */
    pipe_want_t *want;       /* rx: posted, not yet received (ring) */
    pcs_dtype_t *key_dt;     /* rx: dtype of the last header per key (receiver thread only) */
    size_t want_head, want_len, want_cap;
    size_t posted; /* rx: posted and not taken */
    int busy;      /* the thread is in a send / receive */
} pipe_end_t;

struct pcs_pipe {
    uint32_t pp, me, n_keys;
    uint32_t *ranks; /* global rank of each pp rank of this replica */
    /* tx[dir][peer]: this rank -> peer (index 0 sends to 1); rx[dir][peer]: peer -> this rank */
    pipe_end_t *tx[2], *rx[2];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int quit;
    pcs_status_t err; /* the first failed send or receive */
    char errmsg[512];
};

static uint32_t peer_of(const pcs_pipe_t *p, pcs_pipe_dir_t dir, uint32_t src)
{
    return dir == PCS_PIPE_FWD ? (src + 1) % p->pp : (src + p->pp - 1) % p->pp;
}

static void abort_all(pcs_pipe_t *p, const char *reason)
{
    for (int d = 0; d < 2; d++)
        for (uint32_t r = 0; r < p->pp; r++) {
            if (p->tx[d] && p->tx[d][r].c)
                pcs_coll_abort(p->tx[d][r].c, reason);
            if (p->rx[d] && p->rx[d][r].c)
                pcs_coll_abort(p->rx[d][r].c, reason);
        }
}

/* Record the first failure (under mu); returns 1 for the first. The caller then ends every
 * channel at once, outside mu (an abort may leave a failure note over RPC): a neighbour still
 * waiting on another channel sees this rank abort (a note that blames nobody) instead of,
 * later, its connections closing, which would blame this live rank for the culprit's death.
 * The communicators outlive every channel thread (destroy joins them all first). */
static int fail_locked(pcs_pipe_t *p, pcs_status_t st, const char *msg)
{
    if (p->err != PCS_OK)
        return 0;
    p->err = st;
    snprintf(p->errmsg, sizeof p->errmsg, "%s", msg);
    return 1;
}

static pcs_status_t send_one(pipe_end_t *e, pipe_msg_t *m)
{
    if (m->header)
        PCS_CHECK(pcs_coll_send(e->c, m->hdr, 2, PCS_DTYPE_INT64, 1, NULL));
    return pcs_coll_send(e->c, m + 1, m->count, m->dt, 1, NULL);
}

/* Receive the next message as posted: its header and checks, then its elements. */
static pcs_status_t recv_one(pipe_end_t *e, const pipe_want_t *w, pipe_msg_t **out)
{
    size_t want = w->count;
    if (w->header) {
        int64_t hdr[2];
        PCS_CHECK(pcs_coll_recv(e->c, hdr, 2, PCS_DTYPE_INT64, 0, NULL));
        if ((hdr[0] != PCS_DTYPE_FP32 && hdr[0] != PCS_DTYPE_BF16 && hdr[0] != PCS_DTYPE_FP16) ||
            hdr[1] != (int64_t)want)
            return pcs_set_error(PCS_ERR_INVALID_ARG,
                                 "a message of %lld elements of dtype %lld where %zu elements of "
                                 "fp32, bf16 or fp16 were expected",
                                 (long long)hdr[1], (long long)hdr[0], want);
        e->key_dt[w->key] = (pcs_dtype_t)hdr[0];
    }
    pcs_dtype_t dt = e->key_dt[w->key];
    if (dt == PCS_DTYPE_NONE)
        return pcs_set_error(PCS_ERR_STATE, "a message of key %u before its header", w->key);
    pipe_msg_t *m = NULL;
    PCS_CHECK(pcs_calloc(1, sizeof *m + want * pcs_dtype_size(dt), (void **)&m));
    m->count = want;
    m->dt = dt;
    pcs_status_t st = pcs_coll_recv(e->c, m + 1, want, dt, 0, NULL);
    if (st != PCS_OK) {
        free(m);
        return st;
    }
    *out = m;
    return PCS_OK;
}

static void *end_main(void *arg)
{
    pipe_end_t *e = arg;
    pcs_thread_name("pcs-pipe");
    pcs_pipe_t *p = e->p;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!(e->rx ? e->want_len : e->head != NULL) && !p->quit)
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->quit) /* destroy: what was not flushed is dropped */
            break;
        pipe_msg_t *m = NULL;
        pipe_want_t want = {0, 0, 0};
        if (e->rx) {
            want = e->want[e->want_head];
            e->want_head = (e->want_head + 1) % e->want_cap;
            e->want_len--;
        } else {
            m = e->head;
            e->head = m->next;
            if (!e->head)
                e->tail = NULL;
        }
        e->busy = 1;
        int failed = p->err != PCS_OK;
        pthread_mutex_unlock(&p->mu);
        pcs_status_t st = PCS_OK;
        if (!failed)
            st = e->rx ? recv_one(e, &want, &m) : send_one(e, m);
        char msg[512] = "";
        if (st != PCS_OK)
            snprintf(msg, sizeof msg, "%s", pcs_last_error());
        if (!e->rx || st != PCS_OK) {
            free(m);
            m = NULL;
        }
        pthread_mutex_lock(&p->mu);
        if (st != PCS_OK && fail_locked(p, st, msg)) {
            pthread_mutex_unlock(&p->mu);
            abort_all(p, "pipeline: another channel of this rank failed");
            pthread_mutex_lock(&p->mu);
        }
        if (m) {
            if (e->tail)
                e->tail->next = m;
            else
                e->head = m;
            e->tail = m;
        }
        e->busy = 0;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static pcs_status_t make_channel(const pcs_pipe_config_t *cfg, const char *name, uint32_t src,
                                 uint32_t dst, uint32_t index, pcs_coll_t **out)
{
    char gname[512]; /* pcs_coll_create refuses a name over 64 bytes */
    snprintf(gname, sizeof gname, "%s%s-%u", cfg->job_tag ? cfg->job_tag : "", name, dst);
    pcs_coll_config_t cc;
    memset(&cc, 0, sizeof cc);
    cc.backend = PCS_COLL_GLOO;
    cc.kv = cfg->kv;
    cc.group_name = gname;
    cc.group_id = (int)src;
    cc.rank = (int)index;
    cc.size = 2;
    cc.timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : 30000;
    cc.hostname = cfg->hostname;
    cc.cuda_device = -1;
    cc.transport = PCS_COLL_TRANSPORT_TCP; /* send/recv only: no collective uses a segment */
    pcs_status_t st = pcs_coll_create(&cc, out);
    if (st != PCS_OK)
        return pcs_set_error(st, "pipeline channel %s rank %u -> %u: %s", name, src, dst,
                             pcs_last_error());
    return PCS_OK;
}

pcs_status_t pcs_pipe_create(const pcs_pipe_config_t *cfg, pcs_pipe_t **out)
{
    *out = NULL;
    if (!cfg || !cfg->plan || cfg->plan->pp_size < 2 || !cfg->kv)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pipe: a plan with pp > 1 and a KV store");
    pcs_pipe_t *p = NULL;
    PCS_CHECK(pcs_calloc(1, sizeof *p, (void **)&p));
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    pcs_status_t st;
    uint32_t n = 0, my = 0;
    PCS_CHECK_GOTO(pcs_plan_group_ranks(cfg->plan, PCS__V1__GROUP_KIND__GROUP_KIND_PP, cfg->rank,
                                        NULL, &n, &my),
                   st, fail);
    p->pp = n;
    p->me = my;
    p->n_keys = (uint32_t)cfg->plan->n_stages ? (uint32_t)cfg->plan->n_stages : 1;
    PCS_CHECK_GOTO(pcs_calloc(n, sizeof *p->ranks, (void **)&p->ranks), st, fail);
    PCS_CHECK_GOTO(pcs_plan_group_ranks(cfg->plan, PCS__V1__GROUP_KIND__GROUP_KIND_PP, cfg->rank,
                                        p->ranks, &n, &my),
                   st, fail);
    for (int d = 0; d < 2; d++) {
        PCS_CHECK_GOTO(pcs_calloc(n, sizeof *p->tx[d], (void **)&p->tx[d]), st, fail);
        PCS_CHECK_GOTO(pcs_calloc(n, sizeof *p->rx[d], (void **)&p->rx[d]), st, fail);
        for (uint32_t r = 0; r < n; r++) {
            p->tx[d][r].p = p->rx[d][r].p = p;
            p->rx[d][r].rx = 1;
            PCS_CHECK_GOTO(pcs_calloc(p->n_keys, sizeof *p->rx[d][r].key_dt,
                                      (void **)&p->rx[d][r].key_dt),
                           st, fail);
        }
    }
    /* Every rank walks the same global list of channels and joins the ones it is an end of:
     * the lowest channel not yet connected always has both ends waiting on it, so the
     * rendezvous cannot deadlock. The wrap-around channels exist only with several stages per
     * rank (interleaved schedules). */
    int wrap = cfg->plan->virtual_stages > 1;
    for (int d = 0; d < 2; d++) {
        for (uint32_t src = 0; src < n; src++) {
            uint32_t dst = peer_of(p, (pcs_pipe_dir_t)d, src);
            if (!wrap && (d == PCS_PIPE_FWD ? dst < src : dst > src))
                continue;
            if (src != my && dst != my)
                continue;
            const char *name = d == PCS_PIPE_FWD ? "pp-act" : "pp-grad";
            if (src == my)
                PCS_CHECK_GOTO(make_channel(cfg, name, p->ranks[src], p->ranks[dst], 0,
                                            &p->tx[d][dst].c),
                               st, fail);
            else
                PCS_CHECK_GOTO(make_channel(cfg, name, p->ranks[src], p->ranks[dst], 1,
                                            &p->rx[d][src].c),
                               st, fail);
        }
    }
    for (int d = 0; d < 2; d++)
        for (uint32_t r = 0; r < n; r++)
            for (int k = 0; k < 2; k++) {
                pipe_end_t *e = k ? &p->rx[d][r] : &p->tx[d][r];
                if (!e->c)
                    continue;
                if (pthread_create(&e->thread, NULL, end_main, e) != 0) {
                    st = pcs_set_error(PCS_ERR_SYSTEM, "pipe: cannot start a channel thread");
                    goto fail;
                }
                e->started = 1;
            }
    *out = p;
    return PCS_OK;
fail:
    pcs_pipe_destroy(p);
    return st;
}

uint32_t pcs_pipe_pp_rank(const pcs_pipe_t *p)
{
    return p->me;
}

uint32_t pcs_pipe_pp_size(const pcs_pipe_t *p)
{
    return p->pp;
}

static pcs_status_t error_locked(pcs_pipe_t *p)
{
    return pcs_set_error(p->err, "pipeline: %s", p->errmsg);
}

static pipe_end_t *end_of(pcs_pipe_t *p, pcs_pipe_dir_t dir, uint32_t peer, int rx)
{
    if ((dir != PCS_PIPE_FWD && dir != PCS_PIPE_BWD) || peer >= p->pp)
        return NULL;
    pipe_end_t *e = rx ? &p->rx[dir][peer] : &p->tx[dir][peer];
    return e->c ? e : NULL;
}

static pcs_status_t no_channel(const pcs_pipe_t *p, pcs_pipe_dir_t dir, uint32_t peer, int rx)
{
    return pcs_set_error(PCS_ERR_INVALID_ARG, "pipe: pp rank %u has no %s channel %s %u", p->me,
                         dir == PCS_PIPE_FWD ? "activation" : "gradient", rx ? "from" : "to",
                         peer);
}

pcs_status_t pcs_pipe_send(pcs_pipe_t *p, pcs_pipe_dir_t dir, uint32_t peer, const float *rows,
                           size_t count, pcs_dtype_t dt, int header)
{
    pipe_end_t *e = end_of(p, dir, peer, 0);
    if (!e)
        return no_channel(p, dir, peer, 0);
    if (dt != PCS_DTYPE_FP32 && dt != PCS_DTYPE_BF16 && dt != PCS_DTYPE_FP16)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pipe: cannot send %s", pcs_dtype_name(dt));
    pipe_msg_t *m = NULL;
    PCS_CHECK(pcs_calloc(1, sizeof *m + count * pcs_dtype_size(dt), (void **)&m));
    m->hdr[0] = (int64_t)dt;
    m->hdr[1] = (int64_t)count;
    m->header = header;
    m->count = count;
    m->dt = dt;
    if (count)
        pcs_from_f32(rows, count, dt, m + 1);
    pthread_mutex_lock(&p->mu);
    if (p->err != PCS_OK) {
        pcs_status_t st = error_locked(p);
        pthread_mutex_unlock(&p->mu);
        free(m);
        return st;
    }
    if (e->tail)
        e->tail->next = m;
    else
        e->head = m;
    e->tail = m;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return PCS_OK;
}

pcs_status_t pcs_pipe_post(pcs_pipe_t *p, pcs_pipe_dir_t dir, uint32_t peer, size_t count,
                           uint32_t key, int header)
{
    pipe_end_t *e = end_of(p, dir, peer, 1);
    if (!e)
        return no_channel(p, dir, peer, 1);
    if (key >= p->n_keys)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pipe: key %u of %u", key, p->n_keys);
    pthread_mutex_lock(&p->mu);
    if (p->err != PCS_OK) {
        pcs_status_t st = error_locked(p);
        pthread_mutex_unlock(&p->mu);
        return st;
    }
    pcs_status_t st = PCS_OK;
    if (e->want_len == e->want_cap) {
        size_t cap = e->want_cap ? 2 * e->want_cap : 16;
        pipe_want_t *w = NULL;
        st = pcs_calloc(cap, sizeof *w, (void **)&w);
        if (st == PCS_OK) {
            for (size_t i = 0; i < e->want_len; i++)
                w[i] = e->want[(e->want_head + i) % e->want_cap];
            free(e->want);
            e->want = w;
            e->want_head = 0;
            e->want_cap = cap;
        }
    }
    if (st == PCS_OK) {
        e->want[(e->want_head + e->want_len) % e->want_cap] = (pipe_want_t){count, key, header};
        e->want_len++;
        e->posted++;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return st;
}

pcs_status_t pcs_pipe_take(pcs_pipe_t *p, pcs_pipe_dir_t dir, uint32_t peer, float *rows,
                           size_t count, pcs_dtype_t *dt)
{
    pipe_end_t *e = end_of(p, dir, peer, 1);
    if (!e)
        return no_channel(p, dir, peer, 1);
    pthread_mutex_lock(&p->mu);
    if (!e->posted) {
        pthread_mutex_unlock(&p->mu);
        return pcs_set_error(PCS_ERR_STATE, "pipe: nothing posted from pp rank %u", peer);
    }
    while (!e->head && p->err == PCS_OK)
        pthread_cond_wait(&p->cv, &p->mu);
    if (!e->head) {
        pcs_status_t st = error_locked(p);
        pthread_mutex_unlock(&p->mu);
        return pcs_set_error(st, "receive of %s from pp rank %u (rank %u): %s",
                             dir == PCS_PIPE_FWD ? "an activation" : "a gradient", peer,
                             p->ranks[peer], pcs_last_error());
    }
    pipe_msg_t *m = e->head;
    e->head = m->next;
    if (!e->head)
        e->tail = NULL;
    e->posted--;
    pthread_mutex_unlock(&p->mu);
    pcs_status_t st = PCS_OK;
    if (m->count != count)
        st = pcs_set_error(PCS_ERR_INVALID_ARG,
                           "pipe: the message from pp rank %u has %zu elements, %zu taken", peer,
                           m->count, count);
    else if (count)
        pcs_to_f32(m + 1, m->dt, count, rows);
    *dt = m->dt;
    free(m);
    return st;
}

/* Some channel still has a message queued or in flight (under mu). */
static int sending_locked(const pcs_pipe_t *p)
{
    for (int d = 0; d < 2; d++)
        for (uint32_t r = 0; r < p->pp; r++)
            if (p->tx[d][r].head || p->tx[d][r].busy)
                return 1;
    return 0;
}

pcs_status_t pcs_pipe_flush(pcs_pipe_t *p)
{
    pthread_mutex_lock(&p->mu);
    while (sending_locked(p) && p->err == PCS_OK)
        pthread_cond_wait(&p->cv, &p->mu);
    pcs_status_t st = p->err != PCS_OK ? error_locked(p) : PCS_OK;
    pthread_mutex_unlock(&p->mu);
    return st;
}

void pcs_pipe_abort(pcs_pipe_t *p, const char *reason)
{
    if (p)
        abort_all(p, reason);
}

int pcs_pipe_blame(const pcs_pipe_t *p, pcs_coll_fault_t *fault)
{
    if (fault)
        *fault = PCS_COLL_FAULT_NONE;
    if (!p || !p->tx[0] || !p->tx[1] || !p->rx[0] || !p->rx[1])
        return -1;
    for (int d = 0; d < 2; d++)
        for (uint32_t r = 0; r < p->pp; r++) {
            /* index 0 of a channel is its sender, 1 its receiver */
            const pcs_coll_t *cs[2] = {p->tx[d][r].c, p->rx[d][r].c};
            for (int k = 0; k < 2; k++) {
                if (!cs[k])
                    continue;
                pcs_coll_fault_t f;
                int idx = pcs_coll_blame(cs[k], &f);
                if (idx < 0)
                    continue;
                /* tx: this rank is 0, the peer r is 1; rx: the peer r is 0 */
                int peer_end = k == 0 ? 1 : 0;
                if (fault)
                    *fault = f;
                return (int)(idx == peer_end ? p->ranks[r] : p->ranks[p->me]);
            }
        }
    return -1;
}

static void free_msgs(pipe_msg_t *m)
{
    while (m) {
        pipe_msg_t *n = m->next;
        free(m);
        m = n;
    }
}

void pcs_pipe_destroy(pcs_pipe_t *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    int busy = 0;
    for (int d = 0; d < 2; d++)
        for (uint32_t r = 0; p->tx[d] && p->rx[d] && r < p->pp; r++)
            busy |= p->tx[d][r].busy || p->rx[d][r].busy;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (busy) /* a send or receive blocked on a peer returns only when aborted */
        pcs_pipe_abort(p, "pipeline destroyed");
    /* every thread first: a failing one aborts all the communicators, which must still exist */
    for (int pass = 0; pass < 2; pass++)
        for (int d = 0; d < 2; d++)
            for (uint32_t r = 0; r < p->pp; r++)
                for (int k = 0; k < 2; k++) {
                    pipe_end_t *e = k ? (p->rx[d] ? &p->rx[d][r] : NULL)
                                      : (p->tx[d] ? &p->tx[d][r] : NULL);
                    if (!e)
                        continue;
                    if (pass == 0) {
                        if (e->started)
                            pthread_join(e->thread, NULL);
                        continue;
                    }
                    free_msgs(e->head);
                    free(e->want);
                    free(e->key_dt);
                    pcs_coll_destroy(e->c);
                }
    for (int d = 0; d < 2; d++) {
        free(p->tx[d]);
        free(p->rx[d]);
    }
    free(p->ranks);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}
