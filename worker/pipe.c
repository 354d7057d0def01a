/* Pipeline point-to-point channels (see pipe.h): one two-rank communicator per channel, a sender
 * thread draining a FIFO of copied messages, receives on the caller's thread. */
#include "worker/pipe.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pcs/mem.h"
#include "planner/mesh.h"

typedef struct pipe_msg {
    struct pipe_msg *next;
    size_t count;
    pcs_dtype_t dt;
    /* data follows */
} pipe_msg_t;

/* One outgoing channel with its own sender thread: a send blocked until its receiver gets to
 * it must not hold back the other channels (a 1F1B rank sends an activation forward while its
 * gradient for the previous stage waits). */
typedef struct pipe_tx {
    struct pcs_pipe *p;
    pcs_coll_t *c;
    pthread_t thread;
    int started;
    pipe_msg_t *head, *tail; /* under p->mu */
    int busy;
} pipe_tx_t;

struct pcs_pipe {
    uint32_t pp, me;
    uint32_t *ranks; /* global rank of each pp rank of this replica */
    /* tx[dir][peer]: this rank -> peer (index 0 sends to 1); rx[dir][peer]: peer -> this rank */
    pipe_tx_t *tx[2];
    pcs_coll_t **rx[2];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int quit;
    pcs_status_t err; /* the first failed send */
    char errmsg[512];
};

static uint32_t peer_of(const pcs_pipe_t *p, pcs_pipe_dir_t dir, uint32_t src)
{
    return dir == PCS_PIPE_FWD ? (src + 1) % p->pp : (src + p->pp - 1) % p->pp;
}

static void *sender_main(void *arg)
{
    pipe_tx_t *tx = arg;
    pcs_pipe_t *p = tx->p;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!tx->head && !p->quit)
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->quit) /* destroy: what was not flushed is dropped */
            break;
        pipe_msg_t *m = tx->head;
        tx->head = m->next;
        if (!tx->head)
            tx->tail = NULL;
        tx->busy = 1;
        int failed = p->err != PCS_OK;
        pthread_mutex_unlock(&p->mu);
        pcs_status_t st = PCS_OK;
        if (!failed)
            st = pcs_coll_send(tx->c, m + 1, m->count, m->dt, 1, NULL);
        free(m);
        pthread_mutex_lock(&p->mu);
        if (st != PCS_OK && p->err == PCS_OK) {
            p->err = st;
            snprintf(p->errmsg, sizeof p->errmsg, "%s", pcs_last_error());
        }
        tx->busy = 0;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static pcs_status_t make_channel(const pcs_pipe_config_t *cfg, const char *name, uint32_t src,
                                 uint32_t dst, uint32_t index, pcs_coll_t **out)
{
    char gname[160];
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
    PCS_CHECK_GOTO(pcs_calloc(n, sizeof *p->ranks, (void **)&p->ranks), st, fail);
    PCS_CHECK_GOTO(pcs_plan_group_ranks(cfg->plan, PCS__V1__GROUP_KIND__GROUP_KIND_PP, cfg->rank,
                                        p->ranks, &n, &my),
                   st, fail);
    for (int d = 0; d < 2; d++) {
        PCS_CHECK_GOTO(pcs_calloc(n, sizeof *p->tx[d], (void **)&p->tx[d]), st, fail);
        for (uint32_t r = 0; r < n; r++)
            p->tx[d][r].p = p;
        PCS_CHECK_GOTO(pcs_calloc(n, sizeof *p->rx[d], (void **)&p->rx[d]), st, fail);
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
                                            &p->rx[d][src]),
                               st, fail);
        }
    }
    for (int d = 0; d < 2; d++)
        for (uint32_t r = 0; r < n; r++) {
            pipe_tx_t *tx = &p->tx[d][r];
            if (!tx->c)
                continue;
            if (pthread_create(&tx->thread, NULL, sender_main, tx) != 0) {
                st = pcs_set_error(PCS_ERR_SYSTEM, "pipe: cannot start a sender thread");
                goto fail;
            }
            tx->started = 1;
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

static pcs_status_t sender_error_locked(pcs_pipe_t *p)
{
    return pcs_set_error(p->err, "pipeline send: %s", p->errmsg);
}

pcs_status_t pcs_pipe_send(pcs_pipe_t *p, pcs_pipe_dir_t dir, uint32_t peer, const void *data,
                           size_t count, pcs_dtype_t dt)
{
    if ((dir != PCS_PIPE_FWD && dir != PCS_PIPE_BWD) || peer >= p->pp || !p->tx[dir][peer].c)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pipe: pp rank %u has no %s channel to %u",
                             p->me, dir == PCS_PIPE_FWD ? "activation" : "gradient", peer);
    size_t bytes = count * pcs_dtype_size(dt);
    pipe_msg_t *m = NULL;
    PCS_CHECK(pcs_calloc(1, sizeof *m + bytes, (void **)&m));
    m->next = NULL;
    m->count = count;
    m->dt = dt;
    if (bytes)
        memcpy(m + 1, data, bytes);
    pthread_mutex_lock(&p->mu);
    if (p->err != PCS_OK) {
        pcs_status_t st = sender_error_locked(p);
        pthread_mutex_unlock(&p->mu);
        free(m);
        return st;
    }
    pipe_tx_t *tx = &p->tx[dir][peer];
    if (tx->tail)
        tx->tail->next = m;
    else
        tx->head = m;
    tx->tail = m;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return PCS_OK;
}

pcs_status_t pcs_pipe_recv(pcs_pipe_t *p, pcs_pipe_dir_t dir, uint32_t peer, void *data,
                           size_t count, pcs_dtype_t dt)
{
    if ((dir != PCS_PIPE_FWD && dir != PCS_PIPE_BWD) || peer >= p->pp || !p->rx[dir][peer])
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pipe: pp rank %u has no %s channel from %u",
                             p->me, dir == PCS_PIPE_FWD ? "activation" : "gradient", peer);
    pcs_status_t st = pcs_coll_recv(p->rx[dir][peer], data, count, dt, 0, NULL);
    if (st != PCS_OK)
        return pcs_set_error(st, "pipeline receive of %s from pp rank %u (rank %u): %s",
                             dir == PCS_PIPE_FWD ? "an activation" : "a gradient", peer,
                             p->ranks[peer], pcs_last_error());
    return PCS_OK;
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
    pcs_status_t st = p->err != PCS_OK ? sender_error_locked(p) : PCS_OK;
    pthread_mutex_unlock(&p->mu);
    return st;
}

static void each_channel(pcs_pipe_t *p, void (*fn)(pcs_coll_t *, const char *), const char *why)
{
    for (int d = 0; d < 2; d++)
        for (uint32_t r = 0; r < p->pp; r++) {
            if (p->tx[d] && p->tx[d][r].c)
                fn(p->tx[d][r].c, why);
            if (p->rx[d] && p->rx[d][r])
                fn(p->rx[d][r], why);
        }
}

static void abort_one(pcs_coll_t *c, const char *why)
{
    pcs_coll_abort(c, why);
}

void pcs_pipe_abort(pcs_pipe_t *p, const char *reason)
{
    if (p)
        each_channel(p, abort_one, reason);
}

int pcs_pipe_blame(const pcs_pipe_t *p, pcs_coll_fault_t *fault)
{
    if (fault)
        *fault = PCS_COLL_FAULT_NONE;
    if (!p)
        return -1;
    for (int d = 0; d < 2; d++)
        for (uint32_t r = 0; r < p->pp; r++) {
            /* index 0 of a channel is its sender, 1 its receiver */
            const pcs_coll_t *cs[2] = {p->tx[d][r].c, p->rx[d][r]};
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

static void destroy_one(pcs_coll_t *c, const char *why)
{
    (void)why;
    pcs_coll_destroy(c);
}

void pcs_pipe_destroy(pcs_pipe_t *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    int busy = p->tx[0] && p->tx[1] && sending_locked(p);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (busy) /* a send blocked on a peer that never receives returns only when aborted */
        pcs_pipe_abort(p, "pipeline destroyed");
    for (int d = 0; d < 2; d++)
        for (uint32_t r = 0; p->tx[d] && r < p->pp; r++) {
            pipe_tx_t *tx = &p->tx[d][r];
            if (tx->started)
                pthread_join(tx->thread, NULL);
            while (tx->head) {
                pipe_msg_t *m = tx->head;
                tx->head = m->next;
                free(m);
            }
        }
    each_channel(p, destroy_one, NULL);
    for (int d = 0; d < 2; d++) {
        free(p->tx[d]);
        free(p->rx[d]);
    }
    free(p->ranks);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}
