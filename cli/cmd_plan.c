/* `pcsctl plan FILE [--world N] [--json] [--rank R]`: plan a job offline with the same planner
 * the coordinator runs (no coordinator needed) and print the unit table, groups, stages and
 * per-rank estimates; --json prints the whole Plan (or, with --rank, the rank's assignment view:
 * coordinates, estimate, plan hash). */
#include <errno.h>
#include <stdbool.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "pcs/pbtext.h"
#include "pcs/v1/worker.pb-c.h"
#include "planner/plan.h"
#include "planner/reshard.h"
#include "planner/schedule.h"
#include "io/checkpoint.h"
#include "planner/validate.h"

static const pcs_cli_opt_t plan_opts[] = {
    {"world", "N", "world size (default: the product of the job's mesh)"},
    {"rank", "R", "one rank's view: its mesh coordinates, groups, shard ranges and memory"},
    {"timeline", NULL, "pipeline jobs: each pp rank's actions in time (unit costs F 1, B 2)"},
};
const pcs_cli_spec_t pcs_cli_plan_spec = {
    "plan", "FILE", "plan a job offline (no coordinator): units, dtypes, bytes per rank",
    "With --json the plan (or the rank's view) is printed as JSON. --timeline prints the pipeline\n"
    "schedule as PyTorch's pipelining prints it: a row per time step, a column per pp rank,\n"
    "\"2F5\" = stage 2 forward of micro-batch 5 (B backward, I input gradient, W weight\n"
    "gradient), then each rank's full action list with sends, receives and FSDP actions.\n",
    plan_opts, 3, 1, 1};

/* The plan's pipeline schedule as a time grid (compute actions; a B spans two steps) and each
 * rank's whole list. */
static int print_timeline(const Pcs__V1__Plan *p)
{
    if (p->pp_size <= 1) {
        printf("# timeline: no pipeline (pp = 1)\n");
        return PCS_CLI_OK;
    }
    pcs_schedule_t *s = NULL;
    if (pcs_plan_schedule(p, &s) != PCS_OK)
        return pcs_cli_fail("plan: %s", pcs_last_error());
    printf("# timeline: %s, pp %u x %u stages per rank, %u micro-batches: makespan %u, bubble "
           "%.3f (GPipe/1F1B: %.3f)\n",
           pcs_sched_name(s->kind), s->pp, s->v, s->m, s->makespan, s->bubble,
           pcs_sched_bubble_1f1b(s->pp, s->m));
    printf("%6s", "step");
    for (uint32_t r = 0; r < s->pp; r++)
        printf("  rank %-4u", r);
    printf("\n");
    size_t *at = calloc(s->pp, sizeof *at);
    if (!at) {
        pcs_schedule_free(s);
        return pcs_cli_fail("plan: out of memory");
    }
    for (uint32_t t = 0; t < s->makespan; t++) {
        printf("%6u", t);
        for (uint32_t r = 0; r < s->pp; r++) {
            char cell[64] = "";
            /* the compute action covering [t, t + 1) on rank r */
            for (size_t i = at[r]; i < s->n_acts[r]; i++) {
                const pcs_action_t *a = &s->acts[r][i];
                if (a->kind > PCS_ACT_W)
                    continue;
                uint32_t st = s->start[r][i], len = a->kind == PCS_ACT_B ? 2 : 1;
                if (st > t)
                    break;
                if (t < st + len) {
                    if (t == st)
                        pcs_action_str(a, cell, sizeof cell);
                    else
                        snprintf(cell, sizeof cell, "  \"");
                    break;
                }
                at[r] = i + 1;
            }
            printf("  %-9s", cell);
        }
        printf("\n");
    }
    free(at);
    for (uint32_t r = 0; r < s->pp; r++) {
        printf("# rank %u:", r);
        for (size_t i = 0; i < s->n_acts[r]; i++) {
            char as[64];
            pcs_action_str(&s->acts[r][i], as, sizeof as);
            printf("%s%s", i ? ", " : " ", as);
        }
        printf("\n");
    }
    pcs_schedule_free(s);
    return PCS_CLI_OK;
}

static const char *human(uint64_t b, char *buf, size_t n)
{
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024 && u < 5) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, n, "%" PRIu64 " B", b);
    else
        snprintf(buf, n, "%.1f %s", v, unit[u]);
    return buf;
}

static const char *dt(Pcs__V1__DType d, char *buf, size_t n)
{
    return d ? pcs_cli_enum(&pcs__v1__dtype__descriptor, (int)d, buf, n) : "-";
}

static const Pcs__V1__CollectiveSpec *find_coll(const Pcs__V1__Unit *u, Pcs__V1__CollKind k)
{
    for (size_t i = 0; i < u->n_collectives; i++)
        if (u->collectives[i]->kind == k)
            return u->collectives[i];
    return NULL;
}

/* "avg", "sum", "sum /4 /2" (pre, post), "premul 0.125" */
static const char *reduction_text(const Pcs__V1__Unit *u, char *buf, size_t n)
{
    const Pcs__V1__CollectiveSpec *rs = find_coll(u, PCS__V1__COLL_KIND__COLL_KIND_REDUCE_SCATTER);
    const Pcs__V1__CollectiveSpec *ar = find_coll(u, PCS__V1__COLL_KIND__COLL_KIND_ALL_REDUCE);
    const Pcs__V1__CollectiveSpec *first = rs ? rs : ar, *last = ar ? ar : rs;
    if (!first || !first->reduction)
        return "-";
    char op[24];
    pcs_cli_enum(&pcs__v1__reduce_op__descriptor, (int)first->reduction->op, op, sizeof op);
    double pre = first->reduction->pre_divide, post = last->reduction->post_divide;
    if (first->reduction->op == PCS__V1__REDUCE_OP__REDUCE_OP_PREMUL_SUM)
        snprintf(buf, n, "premul %g", first->reduction->premul);
    else if ((pre != 0 && pre != 1) || (post != 0 && post != 1))
        snprintf(buf, n, "%s /%g /%g", op, pre ? pre : 1, post ? post : 1);
    else
        snprintf(buf, n, "%s", op);
    return buf;
}

/* A unit's sharded state on its fullest rank: master shard, plus (if any parameter trains) the
 * flat sharded grad and optimizer state for the trainable elements only; frozen parameters have
 * neither grad nor optimizer state (pcs_plan_rank_estimate counts the same way). */
static uint64_t unit_bytes_per_rank(const Pcs__V1__Plan *p, const Pcs__V1__Unit *u)
{
    const size_t msz = 4; /* masters and optimizer state are stored in fp32 */
    bool frozen = false, trains = false;
    for (size_t i = 0; i < u->n_params; i++) {
        frozen |= u->params[i]->frozen;
        trains |= !u->params[i]->frozen;
    }
    uint64_t bytes = u->shard_numel * msz;
    if (!trains)
        return bytes;
    uint64_t opt = u->shard_numel;
    if (frozen) { /* the optimizer part differs by shard: take the fullest */
        uint32_t sg = u->shard_group_size ? u->shard_group_size : 1;
        opt = 0;
        for (uint32_t r = 0; r < sg; r++) {
            uint64_t n = pcs_plan_unfrozen_numel(u, r);
            opt = n > opt ? n : opt;
        }
    }
    return bytes + u->shard_numel * pcs_dtype_size((pcs_dtype_t)u->grad_dtype) +
           (uint64_t)p->optimizer_states * opt * msz;
}

static void print_estimate(const Pcs__V1__RankEstimate *e, const char *title)
{
    char a[32], b[32], c[32], d[32], f[32], g[32], h[32];
    printf("# %s (rank %u)\n", title, e->rank);
    printf("#   memory : params %s  grads %s  optimizer %s  peak unsharded %s  staging %s  "
           "buffers %s  total %s\n",
           human(e->param_shard_bytes, a, sizeof a), human(e->grad_shard_bytes, b, sizeof b),
           human(e->optimizer_bytes, c, sizeof c), human(e->peak_unsharded_bytes, d, sizeof d),
           human(e->staging_bytes, h, sizeof h), human(e->buffer_bytes, f, sizeof f),
           human(e->total_bytes, g, sizeof g));
    if (e->host_bytes)
        printf("#   cpu_offload: params and optimizer state in host memory (not in the device "
               "total above): host %s\n",
               human(e->host_bytes, a, sizeof a));
    printf("#   traffic per step (received per rank): all-gather %s  reduce-scatter %s  "
           "all-reduce %s\n",
           human(e->all_gather_bytes, a, sizeof a), human(e->reduce_scatter_bytes, b, sizeof b),
           human(e->all_reduce_bytes, c, sizeof c));
}

/* Which elements of which parameters `rank`'s shard of every unit it holds contains, in shard
 * order (pcs_plan_shard_pieces): rows of each parameter with per_param, element ranges of the flat
 * buffer otherwise. */
static void print_shards(const Pcs__V1__Plan *p, uint32_t rank)
{
    for (size_t i = 0; i < p->n_units; i++) {
        const Pcs__V1__Unit *u = p->units[i];
        uint32_t s = 0, rep = 0;
        if (!pcs_plan_rank_holds(p, (uint32_t)i, rank) ||
            pcs_plan_rank_shard(p, (uint32_t)i, rank, &s, &rep) != PCS_OK)
            continue;
        pcs_plan_piece_t *pc = calloc(u->n_params + 1, sizeof *pc);
        if (!pc)
            return;
        size_t n = pcs_plan_shard_pieces(u, s, pc);
        bool pp = u->layout == PCS__V1__SHARD_LAYOUT__SHARD_LAYOUT_PER_PARAM;
        uint32_t sg = u->shard_group_size ? u->shard_group_size : 1;
        printf("#   unit %zu (%s) shard %u of %u, replica %u, %s: %" PRIu64 " elements\n", i,
               *u->path ? u->path : "<root>", s, sg, rep, pp ? "per_param" : "flat",
               u->shard_numel);
        for (size_t k = 0; k < n; k++) {
            const Pcs__V1__ParamSlot *ps = u->params[pc[k].param];
            uint32_t d = ps->shard_dim < ps->n_shape ? ps->shard_dim : 0;
            uint64_t rows = ps->n_shape ? ps->shape[d] : 1, inner = 1;
            for (size_t j = d + 1; j < ps->n_shape; j++)
                inner *= ps->shape[j];
            if (pp && d > 0)
                printf("#     [%" PRIu64 ", +%" PRIu64 ") %s dim %u [%" PRIu64 ", %" PRIu64
                       ") of %" PRIu64 "\n",
                       pc[k].shard_off, pc[k].count * pc[k].len, ps->fqn, d, pc[k].elem / inner,
                       (pc[k].elem + pc[k].len) / inner, rows);
            else if (pp)
                printf("#     [%" PRIu64 ", +%" PRIu64 ") %s rows [%" PRIu64 ", %" PRIu64
                       ") of %" PRIu64 "\n",
                       pc[k].shard_off, pc[k].len, ps->fqn, pc[k].elem / inner,
                       (pc[k].elem + pc[k].len) / inner, rows);
            else
                printf("#     [%" PRIu64 ", +%" PRIu64 ") %s elements [%" PRIu64 ", %" PRIu64
                       ") of %" PRIu64 "\n",
                       pc[k].shard_off, pc[k].len, ps->fqn, pc[k].elem, pc[k].elem + pc[k].len,
                       ps->numel);
        }
        free(pc);
    }
}

static void print_table(const Pcs__V1__JobSpec *spec, const Pcs__V1__Plan *p)
{
    char b1[32], b2[32], b3[32], red[96];
    printf("# plan %s  world %u  strategy %s  hash %016" PRIx64 "\n",
           spec->name && *spec->name ? spec->name : "-", p->world_size,
           pcs_cli_enum(&pcs__v1__strategy__descriptor, (int)p->strategy, b1, sizeof b1), p->hash);
    printf("# mesh");
    for (size_t i = 0; i < p->n_mesh; i++)
        printf(
            " %s=%u",
            pcs_cli_enum(&pcs__v1__mesh_dim_name__descriptor, (int)p->mesh[i]->dim, b1, sizeof b1),
            p->mesh[i]->size);
    printf("  (row-major, outer first)  dp %u  micro-batches %u  prefetch %u\n", p->dp_size,
           p->micro_batches, p->prefetch);
    printf("# reduce_dtype rule: %s\n", p->reduce_dtype_rule);
    for (size_t i = 0; i < p->n_notes; i++)
        printf("# note: %s\n", p->notes[i]);
    bool any_pp = false;
    for (size_t i = 0; i < p->n_units; i++)
        any_pp |= p->units[i]->layout == PCS__V1__SHARD_LAYOUT__SHARD_LAYOUT_PER_PARAM;
    printf("# shard layout: %s\n",
           any_pp ? "per_param (FSDP2 fully_shard: each parameter's rows chunked over the shard "
                    "group; --rank R lists a rank's rows)"
                  : "flat (FSDP1 FlatParameter: each unit's flat buffer cut into equal ranges)");
    if (pcs_job_check_runnable(spec, p) != PCS_OK)
        printf("# not run by this release (SubmitJob refuses it): %s\n", pcs_last_error());

    static const char *hdr[] = {"unit",    "path",  "class",     "stage",      "modules",
                                "#params", "numel", "padded",    "shard/rank", "AG",
                                "RS",      "AR",    "reduction", "reshard",    "bytes/rank"};
    pcs_cli_table_t *t = pcs_cli_table_new(15, hdr);
    if (!t)
        return;
    for (int col = 3; col <= 8; col++)
        pcs_cli_table_right(t, col);
    pcs_cli_table_right(t, 14);
    for (size_t i = 0; i < p->n_units; i++) {
        const Pcs__V1__Unit *u = p->units[i];
        const Pcs__V1__CollectiveSpec *ag = find_coll(u, PCS__V1__COLL_KIND__COLL_KIND_ALL_GATHER);
        const Pcs__V1__CollectiveSpec *rs =
            find_coll(u, PCS__V1__COLL_KIND__COLL_KIND_REDUCE_SCATTER);
        const Pcs__V1__CollectiveSpec *ar = find_coll(u, PCS__V1__COLL_KIND__COLL_KIND_ALL_REDUCE);
        uint64_t per_rank = unit_bytes_per_rank(p, u);
        pcs_cli_table_cell(t, "%u", u->index);
        pcs_cli_table_cell(t, "%s", *u->path ? u->path : "<root>");
        pcs_cli_table_cell(t, "%s%s", u->module_class, u->mixed_precision ? "" : " (fp)");
        pcs_cli_table_cell(t, "%u", u->stage);
        pcs_cli_table_cell(t, "%zu", u->n_modules);
        pcs_cli_table_cell(t, "%zu", u->n_params);
        pcs_cli_table_cell(t, "%" PRIu64, u->numel);
        pcs_cli_table_cell(t, "%" PRIu64, u->padded_numel);
        pcs_cli_table_cell(t, "%" PRIu64, u->shard_numel);
        pcs_cli_table_cell(t, "%s", ag ? dt(ag->dtype, b1, sizeof b1) : "-");
        pcs_cli_table_cell(t, "%s", rs ? dt(rs->dtype, b2, sizeof b2) : "-");
        pcs_cli_table_cell(t, "%s", ar ? dt(ar->dtype, b3, sizeof b3) : "-");
        pcs_cli_table_cell(t, "%s", reduction_text(u, red, sizeof red));
        if (u->reshard_group_size)
            pcs_cli_table_cell(t, "to %u", u->reshard_group_size);
        else
            pcs_cli_table_cell(t, "%s", u->reshard_after_forward ? "yes" : "no");
        pcs_cli_table_cell(t, "%s", human(per_rank, b2, sizeof b2));
    }
    pcs_cli_table_print(t, stdout);
    pcs_cli_table_free(t);

    printf("# groups:");
    for (size_t i = 0; i < p->n_groups; i++)
        printf(
            " %s %u x%u",
            pcs_cli_enum(&pcs__v1__group_kind__descriptor, (int)p->groups[i]->kind, b1, sizeof b1),
            p->groups[i]->size, p->groups[i]->count);
    printf("\n");
    if (p->pp_size > 1) {
        for (size_t i = 0; i < p->n_stages; i++) {
            const Pcs__V1__StageSpec *s = p->stages[i];
            printf("# stage %u on pp rank %u: layers [%u, %u) of '%s', %zu unit(s)\n", s->stage,
                   s->pp_rank, s->first_layer, s->last_layer, p->layer_container, s->n_units);
        }
    }
    if (p->estimate_max)
        print_estimate(p->estimate_max, "per-rank estimate, max over ranks");
}

/* A job that resumes (spec.resume): which elements each rank reads from which rank file of the
 * checkpoint (planner/reshard.h), per rank, and segment by segment for --rank. */
static int print_transfer(const Pcs__V1__JobSpec *spec, const Pcs__V1__Plan *plan, int have_rank,
                          uint32_t only)
{
    pcs_ckpt_dir_t d;
    pcs_ckpt_reader_t *r = NULL;
    if (pcs_ckpt_dir_open(spec->resume->from, 0, &d) != PCS_OK ||
        pcs_ckpt_reader_open(&d, spec->resume->step, &r) != PCS_OK) {
        printf("# resume from %s: not readable here (%s); the workers resolve it beneath their "
               "checkpoint root\n",
               spec->resume->from, pcs_last_error());
        pcs_ckpt_dir_close(&d);
        return PCS_CLI_OK;
    }
    pcs_ckpt_dir_close(&d);
    const Pcs__V1__Plan *old = pcs_ckpt_reader_plan(r);
    printf("# resume from %s step %llu (written by %u ranks, plan %016" PRIx64 "):\n",
           pcs_ckpt_reader_path(r), (unsigned long long)pcs_ckpt_reader_step(r), old->world_size,
           old->hash);
    int rc = PCS_CLI_OK;
    for (uint32_t k = have_rank ? only : 0; k < plan->world_size && rc == PCS_CLI_OK; k++) {
        if (!have_rank && k == 64) {
            printf("#   ... %u more ranks (--rank R for one)\n", plan->world_size - 64);
            break;
        }
        pcs_xfer_seg_t *segs = NULL;
        size_t n = 0;
        if (pcs_plan_transfer(old, plan, k, &segs, &n) != PCS_OK) {
            rc = pcs_cli_fail("plan: resume: %s", pcs_last_error());
            break;
        }
        uint64_t *from = calloc(old->world_size, sizeof *from);
        for (size_t i = 0; from && i < n; i++)
            from[segs[i].src_rank] += segs[i].count;
        printf("#   rank %u reads", k);
        for (uint32_t o = 0; from && o < old->world_size; o++)
            if (from[o])
                printf(" %llu from rank-%05u", (unsigned long long)from[o], o);
        printf(" (elements of each of param and optimizer state; %zu segments)\n", n);
        for (size_t i = 0; have_rank && i < n; i++)
            printf("#     unit %u [%llu, +%llu) <- rank-%05u unit.%u [%llu, +%llu)\n",
                   segs[i].unit, (unsigned long long)segs[i].dst,
                   (unsigned long long)segs[i].count, segs[i].src_rank, segs[i].src_unit,
                   (unsigned long long)segs[i].src, (unsigned long long)segs[i].count);
        free(from);
        free(segs);
        if (have_rank)
            break;
    }
    pcs_ckpt_reader_close(r);
    return rc;
}

int pcs_cli_plan(int argc, char **argv)
{
    pcs_cli_args_t args;
    int prc = pcs_cli_parse(&pcs_cli_plan_spec, argc, argv, &args);
    if (prc != PCS_CLI_OK)
        return prc == PCS_CLI_HELP ? PCS_CLI_OK : prc;
    const char *file = args.pos[0];
    uint32_t world = 0, rank = 0;
    int have_rank = args.val[1] != NULL;
    if (args.val[0] && pcs_cli_u32_opt(&pcs_cli_plan_spec, "world", args.val[0], 1, 1u << 24,
                                       &world) != PCS_CLI_OK)
        return PCS_CLI_USAGE;
    if (have_rank && pcs_cli_u32_opt(&pcs_cli_plan_spec, "rank", args.val[1], 0, 1u << 24,
                                     &rank) != PCS_CLI_OK)
        return PCS_CLI_USAGE;

    ProtobufCMessage *msg = NULL;
    if (pcs_pb_from_yaml_file(file, &pcs__v1__job_spec__descriptor, &msg) != PCS_OK)
        return pcs_cli_fail("plan: %s", pcs_last_error());
    Pcs__V1__JobSpec *spec = (Pcs__V1__JobSpec *)msg;
    int rc = PCS_CLI_FAIL;
    Pcs__V1__Plan *plan = NULL;
    char err[1024];
    if (pcs_job_validate(spec, err, sizeof err) != PCS_OK) {
        pcs_cli_fail("plan: %s: %s", file, err);
        goto out;
    }
    if (pcs_plan_build(spec, world, &plan) != PCS_OK) {
        pcs_cli_fail("plan: %s: %s", file, pcs_last_error());
        goto out;
    }
    if (have_rank && rank >= plan->world_size) {
        rc = pcs_cli_bad_value(&pcs_cli_plan_spec, "--rank %u: must be < world size %u", rank,
                               plan->world_size);
        goto out;
    }
    Pcs__V1__MeshCoords coords;
    Pcs__V1__RankEstimate est;
    if (have_rank && (pcs_plan_rank_coords(plan, rank, &coords) != PCS_OK ||
                      pcs_plan_rank_estimate(plan, rank, &est) != PCS_OK)) {
        pcs_cli_fail("plan: %s", pcs_last_error());
        goto out;
    }
    if (pcs_cli()->json) {
        if (have_rank) {
            /* the rank's view of its assignment, without the shared spec and plan */
            Pcs__V1__Assignment as = PCS__V1__ASSIGNMENT__INIT;
            as.rank = rank;
            as.world_size = plan->world_size;
            as.coords = &coords;
            as.plan_hash = plan->hash;
            as.estimate = &est;
            rc = pcs_cli_print_json(&as.base);
        } else {
            rc = pcs_cli_print_json(&plan->base);
        }
        goto out;
    }
    print_table(spec, plan);
    if (have_rank) {
        printf("# rank %u: pp %u  dp_replicate %u  dp_shard %u\n", rank, coords.pp,
               coords.dp_replicate, coords.dp_shard);
        static const Pcs__V1__GroupKind kinds[] = {
            PCS__V1__GROUP_KIND__GROUP_KIND_SHARD, PCS__V1__GROUP_KIND__GROUP_KIND_REPLICATE,
            PCS__V1__GROUP_KIND__GROUP_KIND_DP, PCS__V1__GROUP_KIND__GROUP_KIND_PP};
        for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
            uint32_t n = 0, me = 0;
            char name[32];
            pcs_cli_enum(&pcs__v1__group_kind__descriptor, (int)kinds[k], name, sizeof name);
            if (pcs_plan_group_ranks(plan, kinds[k], rank, NULL, &n, &me) != PCS_OK)
                continue;
            uint32_t *r = calloc(n ? n : 1, sizeof *r);
            if (!r)
                continue;
            uint32_t cap = n;
            if (pcs_plan_group_ranks(plan, kinds[k], rank, r, &cap, &me) == PCS_OK) {
                printf("#   %s group (index %u of %u):", name, me, n);
                for (uint32_t i = 0; i < n && i < 16; i++)
                    printf(" %u", r[i]);
                printf("%s\n", n > 16 ? " ..." : "");
            }
            free(r);
        }
        print_shards(plan, rank);
        print_estimate(&est, "estimate");
    }
    rc = spec->resume && spec->resume->from && spec->resume->from[0]
             ? print_transfer(spec, plan, have_rank, rank)
             : PCS_CLI_OK;
    if (rc == PCS_CLI_OK && args.val[2])
        rc = print_timeline(plan);
out:
    pcs_plan_free(plan);
    protobuf_c_message_free_unpacked(msg, NULL);
    return rc;
}
