/* Pipeline schedules as data (see schedule.h). Generation follows
 * torch/distributed/pipelining/schedules.py (the compute order of each rank; its None padding is
 * not needed: timing comes from executing the lists); validation executes the lists. */
#include "planner/schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pcs/mem.h"

static const char *const k_names[] = {"gpipe", "1f1b", "interleaved_1f1b", "looped_bfs",
                                      "interleaved_zero_bubble"};

pcs_status_t pcs_sched_parse(const char *name, uint32_t virtual_stages, pcs_sched_kind_t *out)
{
    if (!name || !*name) {
        *out = virtual_stages > 1 ? PCS_SCHED_INTERLEAVED_1F1B : PCS_SCHED_1F1B;
        return PCS_OK;
    }
    for (size_t i = 0; i < sizeof k_names / sizeof k_names[0]; i++)
        if (!strcmp(name, k_names[i])) {
            *out = (pcs_sched_kind_t)i;
            return PCS_OK;
        }
    return pcs_set_error(PCS_ERR_INVALID_ARG, "pipeline.schedule: unknown schedule '%s'", name);
}

const char *pcs_sched_name(pcs_sched_kind_t k)
{
    return (unsigned)k < sizeof k_names / sizeof k_names[0] ? k_names[k] : "?";
}

double pcs_sched_bubble_1f1b(uint32_t pp, uint32_t m)
{
    return (double)(pp - 1) / (double)(m + pp - 1);
}

void pcs_action_str(const pcs_action_t *a, char *buf, size_t n)
{
    static const char letter[] = {'F', 'B', 'I', 'W'};
    switch (a->kind) {
    case PCS_ACT_F:
    case PCS_ACT_B:
    case PCS_ACT_I:
    case PCS_ACT_W:
        snprintf(buf, n, "%u%c%u", a->stage, letter[a->kind], a->mb);
        break;
    case PCS_ACT_SEND_F:
        snprintf(buf, n, "SEND_F %u>%u mb%u", a->stage, a->peer, a->mb);
        break;
    case PCS_ACT_RECV_F:
        snprintf(buf, n, "RECV_F %u<%u mb%u", a->stage, a->peer, a->mb);
        break;
    case PCS_ACT_SEND_B:
        snprintf(buf, n, "SEND_B %u>%u mb%u", a->stage, a->peer, a->mb);
        break;
    case PCS_ACT_RECV_B:
        snprintf(buf, n, "RECV_B %u<%u mb%u", a->stage, a->peer, a->mb);
        break;
    case PCS_ACT_UNSHARD:
        snprintf(buf, n, "UNSHARD %u", a->stage);
        break;
    case PCS_ACT_RESHARD:
        snprintf(buf, n, "RESHARD %u", a->stage);
        break;
    case PCS_ACT_REDUCE_GRAD:
        snprintf(buf, n, "REDUCE_GRAD %u", a->stage);
        break;
    default:
        snprintf(buf, n, "?%u", a->kind);
    }
}

void pcs_schedule_free(pcs_schedule_t *s)
{
    if (!s)
        return;
    for (uint32_t r = 0; s->acts && r < s->pp; r++)
        free(s->acts[r]);
    for (uint32_t r = 0; s->start && r < s->pp; r++)
        free(s->start[r]);
    free(s->acts);
    free(s->n_acts);
    free(s->start);
    free(s);
}

// ---- generation ----

/* A growing action list. */
typedef struct alist {
    pcs_action_t *v;
    size_t n, cap;
    int oom;
} alist_t;

static void push(alist_t *l, pcs_act_kind_t k, uint32_t stage, uint32_t mb, uint32_t peer)
{
    if (l->oom || pcs_grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v) != PCS_OK) {
        l->oom = 1;
        return;
    }
    l->v[l->n++] = (pcs_action_t){(uint8_t)k, stage, mb, peer};
}

/* The compute order of rank r (F, B or I/W only). */
static void compute_order(const pcs_schedule_t *s, uint32_t r, alist_t *l)
{
    uint32_t pp = s->pp, v = s->v, m = s->m;
    switch (s->kind) {
    case PCS_SCHED_GPIPE:
        for (uint32_t i = 0; i < m; i++)
            push(l, PCS_ACT_F, r, i, 0);
        for (uint32_t i = 0; i < m; i++)
            push(l, PCS_ACT_B, r, i, 0);
        return;
    case PCS_SCHED_1F1B: {
        uint32_t w = pp - r - 1 < m ? pp - r - 1 : m; /* warmup forwards */
        for (uint32_t i = 0; i < w; i++)
            push(l, PCS_ACT_F, r, i, 0);
        for (uint32_t i = w; i < m; i++) {
            push(l, PCS_ACT_F, r, i, 0);
            push(l, PCS_ACT_B, r, i - w, 0);
        }
        for (uint32_t i = m - w; i < m; i++)
            push(l, PCS_ACT_B, r, i, 0);
        return;
    }
    case PCS_SCHED_LOOPED_BFS:
        for (uint32_t k = 0; k < v; k++)
            for (uint32_t i = 0; i < m; i++)
                push(l, PCS_ACT_F, k * pp + r, i, 0);
        for (uint32_t k = v; k-- > 0;)
            for (uint32_t i = m; i-- > 0;)
                push(l, PCS_ACT_B, k * pp + r, i, 0);
        return;
    case PCS_SCHED_INTERLEAVED_1F1B:
    case PCS_SCHED_ZERO_BUBBLE: {
        /* _get_warmup_ops / _get_1f1b_rank_ops: depth first over the local stages, rounds of
         * mpr micro-batches; zero bubble defers each weight gradient by r steps */
        int zb = s->kind == PCS_SCHED_ZERO_BUBBLE;
        uint32_t rounds = m / pp > 1 ? m / pp : 1, mpr = m / rounds;
        uint64_t ops = (uint64_t)v * m;
        uint64_t warm = (uint64_t)(v - 1) * mpr + (uint64_t)(zb ? 1 : 2) * (pp - 1 - r);
        warm = warm < ops ? warm : ops;
        uint64_t total = ops + warm; /* warmup F, (ops - warm) F+B pairs, warm cooldown B */
        uint32_t *fmb = NULL, *bmb = NULL, *wmb = NULL;
        uint64_t *bops = NULL;
        if (pcs_calloc(v, sizeof *fmb, (void **)&fmb) != PCS_OK ||
            pcs_calloc(v, sizeof *bmb, (void **)&bmb) != PCS_OK ||
            pcs_calloc(v, sizeof *wmb, (void **)&wmb) != PCS_OK ||
            pcs_calloc(ops + 1, sizeof *bops, (void **)&bops) != PCS_OK) {
            l->oom = 1;
            free(fmb);
            free(bmb);
            free(wmb);
            return;
        }
        size_t nb = 0, nw = 0;
#define FWD_LOCAL(op) (uint32_t)(((op) / mpr) % v)
#define BWD_LOCAL(op) (uint32_t)(v - 1 - (((op) - warm) / mpr) % v)
        for (uint64_t op = 0; op < total; op++) {
            if (op < ops) { /* warmup and steady: a forward */
                uint32_t k = FWD_LOCAL(op);
                push(l, PCS_ACT_F, k * pp + r, fmb[k]++, 0);
            }
            if (op >= warm) { /* steady and cooldown: a backward */
                uint32_t k = BWD_LOCAL(op);
                push(l, zb ? PCS_ACT_I : PCS_ACT_B, k * pp + r, bmb[k]++, 0);
                bops[nb++] = op;
                if (zb && op - warm >= r) {
                    uint32_t kw = BWD_LOCAL(bops[nw]);
                    nw++;
                    push(l, PCS_ACT_W, kw * pp + r, wmb[kw]++, 0);
                }
            }
        }
        while (zb && nw < nb) {
            uint32_t kw = BWD_LOCAL(bops[nw]);
            nw++;
            push(l, PCS_ACT_W, kw * pp + r, wmb[kw]++, 0);
        }
#undef FWD_LOCAL
#undef BWD_LOCAL
        free(fmb);
        free(bmb);
        free(wmb);
        free(bops);
        return;
    }
    }
}

static int is_compute(uint8_t k)
{
    return k <= PCS_ACT_W;
}

/* Rank r's full list: receives before and sends after the compute that needs / makes them, and
 * the FSDP actions (per step: UNSHARD before a stage's first compute, REDUCE_GRAD and RESHARD
 * after its last; per micro-batch: UNSHARD / RESHARD around every compute, REDUCE_GRAD after the
 * last). */
static void full_order(const pcs_schedule_t *s, uint32_t r, const alist_t *c, alist_t *l)
{
    uint32_t S = s->n_stages, pp = s->pp;
    size_t *last = NULL; /* per stage: index in c of its last compute action on this rank */
    if (pcs_calloc(S, sizeof *last, (void **)&last) != PCS_OK) {
        l->oom = 1;
        return;
    }
    for (size_t i = 0; i < c->n; i++)
        last[c->v[i].stage] = i + 1;
    uint8_t *open = NULL;
    if (pcs_calloc(S, 1, (void **)&open) != PCS_OK) {
        free(last);
        l->oom = 1;
        return;
    }
    for (size_t i = 0; i < c->n; i++) {
        const pcs_action_t *a = &c->v[i];
        uint32_t st = a->stage;
        if (a->kind == PCS_ACT_F && st > 0)
            push(l, PCS_ACT_RECV_F, st, a->mb, (st - 1) % pp);
        if ((a->kind == PCS_ACT_B || a->kind == PCS_ACT_I) && st + 1 < S)
            push(l, PCS_ACT_RECV_B, st, a->mb, (st + 1) % pp);
        if (!open[st]) {
            push(l, PCS_ACT_UNSHARD, st, 0, 0);
            open[st] = 1;
        }
        push(l, (pcs_act_kind_t)a->kind, st, a->mb, 0);
        if (a->kind == PCS_ACT_F && st + 1 < S)
            push(l, PCS_ACT_SEND_F, st, a->mb, (st + 1) % pp);
        if ((a->kind == PCS_ACT_B || a->kind == PCS_ACT_I) && st > 0)
            push(l, PCS_ACT_SEND_B, st, a->mb, (st - 1) % pp);
        if (last[st] == i + 1)
            push(l, PCS_ACT_REDUCE_GRAD, st, 0, 0);
        if (s->unshard_per_mb || last[st] == i + 1) {
            push(l, PCS_ACT_RESHARD, st, 0, 0);
            open[st] = 0;
        }
    }
    free(open);
    free(last);
}

pcs_status_t pcs_schedule_build(pcs_sched_kind_t kind, uint32_t pp, uint32_t v, uint32_t m,
                                int unshard_per_mb, pcs_schedule_t **out)
{
    *out = NULL;
    const char *name = pcs_sched_name(kind);
    if ((unsigned)kind > PCS_SCHED_ZERO_BUBBLE)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pipeline.schedule: unknown kind %d", kind);
    if (pp < 1 || v < 1)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "pipeline: pp and virtual_stages must be >= 1");
    if (m < 1)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "training.micro_batches: a pipeline needs >= 1");
    if (v > 1 && (kind == PCS_SCHED_GPIPE || kind == PCS_SCHED_1F1B))
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "pipeline.virtual_stages: %s runs one stage per rank", name);
    if ((uint64_t)pp * v * m > 1u << 16)
        return pcs_set_error(PCS_ERR_INVALID_ARG,
                             "pipeline: %llu stages x %u micro-batches is more than a schedule "
                             "holds (65536 stage micro-batches)",
                             (unsigned long long)pp * v, m);
    if (kind == PCS_SCHED_INTERLEAVED_1F1B || kind == PCS_SCHED_ZERO_BUBBLE) {
        uint32_t rounds = m / pp > 1 ? m / pp : 1;
        if (m % rounds)
            return pcs_set_error(PCS_ERR_INVALID_ARG,
                                 "training.micro_batches: %s needs a multiple of its %u rounds "
                                 "(micro_batches / pp), got %u",
                                 name, rounds, m);
    }
    pcs_schedule_t *s = NULL;
    PCS_CHECK(pcs_calloc(1, sizeof *s, (void **)&s));
    *s = (pcs_schedule_t){.kind = kind, .pp = pp, .v = v, .m = m, .n_stages = pp * v,
                          .unshard_per_mb = unshard_per_mb};
    pcs_status_t st = PCS_OK;
    if (pcs_calloc(pp, sizeof *s->acts, (void **)&s->acts) != PCS_OK ||
        pcs_calloc(pp, sizeof *s->n_acts, (void **)&s->n_acts) != PCS_OK) {
        st = PCS_ERR_NOMEM;
        goto fail;
    }
    for (uint32_t r = 0; r < pp; r++) {
        alist_t c = {0}, l = {0};
        compute_order(s, r, &c);
        if (!c.oom)
            full_order(s, r, &c, &l);
        free(c.v);
        if (c.oom || l.oom) {
            free(l.v);
            st = PCS_ERR_NOMEM;
            goto fail;
        }
        s->acts[r] = l.v;
        s->n_acts[r] = l.n;
    }
    st = pcs_schedule_validate(s);
    if (st != PCS_OK) {
        char why[600];
        snprintf(why, sizeof why, "%s", pcs_last_error());
        pcs_set_error(st, "pipeline.schedule: %s with pp %u, %u stages per rank, %u micro-batches "
                          "fails validation: %s",
                      name, pp, v, m, why);
        goto fail;
    }
    *out = s;
    return PCS_OK;
fail:
    pcs_schedule_free(s);
    return st == PCS_ERR_NOMEM ? pcs_set_error(st, "pipeline schedule: out of memory") : st;
}

// ---- validation: execute every rank's list ----

enum { T_NONE = UINT32_MAX };

typedef struct sent {
    uint32_t stage, mb, time;
    int32_t next;
} sent_t;

typedef struct exec {
    const pcs_schedule_t *s;
    uint32_t S, m;
    uint32_t *f, *b, *w;   /* [stage * m + mb]: finish time, T_NONE = not yet (b: B or I) */
    uint8_t *full_b;       /* 1: backward was a full B (no W to follow) */
    uint32_t *rf, *rb;     /* received activation / gradient: finish time on the owner */
    uint8_t *unsharded;    /* per stage */
    uint32_t *n_bw, *n_reduced; /* per stage: backwards whose weight gradient is done; reduces */
    int32_t *head, *tail;  /* per channel (src * pp + dst) * 2 + dir: FIFO of sends */
    sent_t *sends;
    size_t n_sends, cap_sends;
} exec_t;

static uint32_t cost(uint8_t k)
{
    return k == PCS_ACT_F ? 1 : k == PCS_ACT_B ? 2 : k == PCS_ACT_I || k == PCS_ACT_W ? 1 : 0;
}

static uint32_t max2(uint32_t a, uint32_t b)
{
    return a > b ? a : b;
}

/* Try rank r's next action a. 1 = ran (at *t_end), 0 = must wait, -1 = error (set). */
static int step(exec_t *x, uint32_t r, const pcs_action_t *a, uint32_t clock, uint32_t *start)
{
    const pcs_schedule_t *s = x->s;
    uint32_t S = x->S, m = x->m, pp = s->pp;
    char as[64];
    pcs_action_str(a, as, sizeof as);
    if (a->stage >= S || (a->mb >= m && a->kind != PCS_ACT_UNSHARD &&
                          a->kind != PCS_ACT_RESHARD && a->kind != PCS_ACT_REDUCE_GRAD)) {
        pcs_set_error(PCS_ERR_INVALID_ARG, "rank %u: %s: stage or micro-batch out of range", r,
                      as);
        return -1;
    }
    if (a->stage % pp != r) {
        pcs_set_error(PCS_ERR_INVALID_ARG, "rank %u: %s: stage %u runs on rank %u", r, as,
                      a->stage, a->stage % pp);
        return -1;
    }
    size_t k = (size_t)a->stage * m + a->mb;
    uint32_t ready = clock;
    if (is_compute(a->kind) && !x->unsharded[a->stage]) {
        pcs_set_error(PCS_ERR_INVALID_ARG, "rank %u: %s on stage %u while it is sharded", r, as,
                      a->stage);
        return -1;
    }
    switch (a->kind) {
    case PCS_ACT_F:
        if (x->f[k] != T_NONE) {
            pcs_set_error(PCS_ERR_INVALID_ARG, "rank %u: %s runs twice", r, as);
            return -1;
        }
        if (a->stage > 0) {
            uint32_t in = (a->stage - 1) % pp == r ? x->f[k - m] : x->rf[k];
            if (in == T_NONE)
                return 0;
            ready = max2(ready, in);
        }
        break;
    case PCS_ACT_B:
    case PCS_ACT_I:
        if (x->b[k] != T_NONE) {
            pcs_set_error(PCS_ERR_INVALID_ARG, "rank %u: %s: a second backward", r, as);
            return -1;
        }
        if (x->f[k] == T_NONE)
            return 0;
        ready = max2(ready, x->f[k]);
        if (a->stage + 1 < S) {
            uint32_t g = (a->stage + 1) % pp == r ? x->b[k + m] : x->rb[k];
            if (g == T_NONE)
                return 0;
            ready = max2(ready, g);
        }
        break;
    case PCS_ACT_W:
        if (x->w[k] != T_NONE || (x->b[k] != T_NONE && x->full_b[k])) {
            pcs_set_error(PCS_ERR_INVALID_ARG, "rank %u: %s: the weight gradient is done", r, as);
            return -1;
        }
        if (x->b[k] == T_NONE)
            return 0;
        ready = max2(ready, x->b[k]);
        break;
    case PCS_ACT_SEND_F:
    case PCS_ACT_SEND_B: {
        int fwd = a->kind == PCS_ACT_SEND_F;
        uint32_t want = fwd ? a->stage + 1 : a->stage - 1;
        if ((fwd && a->stage + 1 >= S) || (!fwd && a->stage == 0) || a->peer != want % pp) {
            pcs_set_error(PCS_ERR_INVALID_ARG, "rank %u: %s: stage %u is not on rank %u", r, as,
                          want, a->peer);
            return -1;
        }
        uint32_t made = fwd ? x->f[k] : x->b[k];
        if (made == T_NONE)
            return 0;
        ready = max2(ready, made);
        if (pcs_grow((void **)&x->sends, &x->cap_sends, x->n_sends + 1, sizeof *x->sends) !=
            PCS_OK) {
            pcs_set_error(PCS_ERR_NOMEM, "schedule validation: out of memory");
            return -1;
        }
        size_t ch = ((size_t)r * pp + a->peer) * 2 + (fwd ? 0 : 1);
        int32_t id = (int32_t)x->n_sends++;
        x->sends[id] = (sent_t){a->stage, a->mb, ready, -1};
        if (x->tail[ch] >= 0)
            x->sends[x->tail[ch]].next = id;
        else
            x->head[ch] = id;
        x->tail[ch] = id;
        break;
    }
    case PCS_ACT_RECV_F:
    case PCS_ACT_RECV_B: {
        int fwd = a->kind == PCS_ACT_RECV_F;
        size_t ch = ((size_t)a->peer * pp + r) * 2 + (fwd ? 0 : 1);
        if (a->peer >= pp) {
            pcs_set_error(PCS_ERR_INVALID_ARG, "rank %u: %s: no rank %u", r, as, a->peer);
            return -1;
        }
        int32_t id = x->head[ch];
        if (id < 0)
            return 0;
        const sent_t *sd = &x->sends[id];
        uint32_t from = fwd ? sd->stage + 1 : sd->stage - 1;
        if (from != a->stage || sd->mb != a->mb) {
            pcs_set_error(PCS_ERR_INVALID_ARG,
                          "rank %u: %s: the next message from rank %u on this channel is for "
                          "stage %u micro-batch %u (sends and receives out of order)",
                          r, as, a->peer, from, sd->mb);
            return -1;
        }
        ready = max2(ready, sd->time);
        x->head[ch] = sd->next;
        if (x->head[ch] < 0)
            x->tail[ch] = -1;
        (fwd ? x->rf : x->rb)[k] = ready;
        break;
    }
    case PCS_ACT_UNSHARD:
        if (x->unsharded[a->stage]) {
            pcs_set_error(PCS_ERR_INVALID_ARG, "rank %u: %s: already unsharded", r, as);
            return -1;
        }
        x->unsharded[a->stage] = 1;
        break;
    case PCS_ACT_RESHARD:
        if (!x->unsharded[a->stage]) {
            pcs_set_error(PCS_ERR_INVALID_ARG, "rank %u: %s: not unsharded", r, as);
            return -1;
        }
        x->unsharded[a->stage] = 0;
        break;
    case PCS_ACT_REDUCE_GRAD:
        if (x->n_bw[a->stage] != m || x->n_reduced[a->stage]) {
            pcs_set_error(PCS_ERR_INVALID_ARG,
                          "rank %u: %s after %u of %u backwards (gradients reduced %s)", r, as,
                          x->n_bw[a->stage], m, x->n_reduced[a->stage] ? "twice" : "early");
            return -1;
        }
        x->n_reduced[a->stage]++;
        break;
    default:
        pcs_set_error(PCS_ERR_INVALID_ARG, "rank %u: unknown action kind %u", r, a->kind);
        return -1;
    }
    uint32_t end = ready + cost(a->kind);
    if (a->kind == PCS_ACT_F)
        x->f[k] = end;
    if (a->kind == PCS_ACT_B || a->kind == PCS_ACT_I) {
        x->b[k] = end;
        x->full_b[k] = a->kind == PCS_ACT_B;
        if (a->kind == PCS_ACT_B)
            x->n_bw[a->stage]++;
    }
    if (a->kind == PCS_ACT_W) {
        x->w[k] = end;
        x->n_bw[a->stage]++;
    }
    *start = ready;
    return 1;
}

pcs_status_t pcs_schedule_validate(pcs_schedule_t *s)
{
    uint32_t pp = s->pp, S = s->n_stages, m = s->m;
    size_t sm = (size_t)S * m, nch = (size_t)pp * pp * 2;
    exec_t x = {.s = s, .S = S, .m = m};
    size_t *idx = NULL;
    uint32_t *clock = NULL;
    pcs_status_t st = PCS_ERR_NOMEM;
    if (pcs_calloc(sm, sizeof *x.f, (void **)&x.f) != PCS_OK ||
        pcs_calloc(sm, sizeof *x.b, (void **)&x.b) != PCS_OK ||
        pcs_calloc(sm, sizeof *x.w, (void **)&x.w) != PCS_OK ||
        pcs_calloc(sm, sizeof *x.rf, (void **)&x.rf) != PCS_OK ||
        pcs_calloc(sm, sizeof *x.rb, (void **)&x.rb) != PCS_OK ||
        pcs_calloc(sm, 1, (void **)&x.full_b) != PCS_OK ||
        pcs_calloc(S, 1, (void **)&x.unsharded) != PCS_OK ||
        pcs_calloc(S, sizeof *x.n_bw, (void **)&x.n_bw) != PCS_OK ||
        pcs_calloc(S, sizeof *x.n_reduced, (void **)&x.n_reduced) != PCS_OK ||
        pcs_calloc(nch, sizeof *x.head, (void **)&x.head) != PCS_OK ||
        pcs_calloc(nch, sizeof *x.tail, (void **)&x.tail) != PCS_OK ||
        pcs_calloc(pp, sizeof *idx, (void **)&idx) != PCS_OK ||
        pcs_calloc(pp, sizeof *clock, (void **)&clock) != PCS_OK)
        goto out;
    /* start times sized for the lists as they are now (a caller may have edited them) */
    for (uint32_t r = 0; s->start && r < pp; r++)
        free(s->start[r]);
    free(s->start);
    s->start = NULL;
    if (pcs_calloc(pp, sizeof *s->start, (void **)&s->start) != PCS_OK)
        goto out;
    for (uint32_t r = 0; r < pp; r++)
        if (pcs_calloc(s->n_acts[r] + 1, sizeof **s->start, (void **)&s->start[r]) != PCS_OK)
            goto out;
    for (size_t i = 0; i < sm; i++)
        x.f[i] = x.b[i] = x.w[i] = x.rf[i] = x.rb[i] = T_NONE;
    for (size_t i = 0; i < nch; i++)
        x.head[i] = x.tail[i] = -1;
    uint64_t busy = 0;
    for (int progress = 1; progress;) {
        progress = 0;
        for (uint32_t r = 0; r < pp; r++) {
            while (idx[r] < s->n_acts[r]) {
                const pcs_action_t *a = &s->acts[r][idx[r]];
                uint32_t t0 = 0;
                int rc = step(&x, r, a, clock[r], &t0);
                if (rc < 0) {
                    st = PCS_ERR_INVALID_ARG;
                    goto out;
                }
                if (rc == 0)
                    break;
                s->start[r][idx[r]] = t0;
                clock[r] = t0 + cost(a->kind);
                busy += cost(a->kind);
                idx[r]++;
                progress = 1;
            }
        }
    }
    /* blocked ranks: a deadlock (or an input that never comes) */
    char msg[512] = "";
    size_t o = 0;
    for (uint32_t r = 0; r < pp; r++)
        if (idx[r] < s->n_acts[r] && o < sizeof msg) {
            char as[64];
            pcs_action_str(&s->acts[r][idx[r]], as, sizeof as);
            o += (size_t)snprintf(msg + o, sizeof msg - o, "%srank %u waits at %s", o ? "; " : "",
                                  r, as);
        }
    if (*msg) {
        st = pcs_set_error(PCS_ERR_INVALID_ARG, "deadlock: %s", msg);
        goto out;
    }
    for (uint32_t stg = 0; stg < S; stg++) {
        for (uint32_t mb = 0; mb < m; mb++) {
            size_t k = (size_t)stg * m + mb;
            if (x.f[k] == T_NONE || x.b[k] == T_NONE || (!x.full_b[k] && x.w[k] == T_NONE)) {
                st = pcs_set_error(PCS_ERR_INVALID_ARG,
                                   "stage %u micro-batch %u: %s never runs", stg, mb,
                                   x.f[k] == T_NONE   ? "forward"
                                   : x.b[k] == T_NONE ? "backward"
                                                      : "weight gradient");
                goto out;
            }
        }
        if (x.unsharded[stg] || x.n_reduced[stg] != 1) {
            st = pcs_set_error(PCS_ERR_INVALID_ARG, "stage %u: %s at the end of the step", stg,
                               x.unsharded[stg] ? "still unsharded" : "gradients not reduced");
            goto out;
        }
    }
    for (size_t c = 0; c < nch; c++)
        if (x.head[c] >= 0) {
            const sent_t *sd = &x.sends[x.head[c]];
            st = pcs_set_error(PCS_ERR_INVALID_ARG,
                               "rank %zu sends stage %u micro-batch %u to rank %zu, which never "
                               "receives it",
                               c / 2 / pp, sd->stage, sd->mb, c / 2 % pp);
            goto out;
        }
    s->makespan = 0;
    for (uint32_t r = 0; r < pp; r++)
        s->makespan = max2(s->makespan, clock[r]);
    s->bubble = s->makespan ? 1.0 - (double)busy / ((double)pp * s->makespan) : 0;
    st = PCS_OK;
out:
    if (st == PCS_ERR_NOMEM)
        pcs_set_error(st, "schedule validation: out of memory");
    free(x.f);
    free(x.b);
    free(x.w);
    free(x.rf);
    free(x.rb);
    free(x.full_b);
    free(x.unsharded);
    free(x.n_bw);
    free(x.n_reduced);
    free(x.head);
    free(x.tail);
    free(x.sends);
    free(idx);
    free(clock);
    return st;
}
