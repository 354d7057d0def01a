/* pcs-plan-bench: planning time, plan bytes and assignment bytes per rank for a Llama-70B-shaped
 * module tree (80 blocks x 9 tensors + embeddings, norm and output = 723 tensors) planned for
 * 8 ... 16,384 ranks. Baseline measured in the same run: a worker's decode (unpack) of the plan.
 * Correctness is checked in a separate untimed pass (#wrong); nccl-tests style table (B12). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pcs/clock.h"
#include "pcs/version.h"
#include "pcs/v1/worker.pb-c.h"
#include "planner/plan.h"

typedef struct opts {
    uint32_t begin, end, factor, warmup, iters, layers;
    const char *csv;
} opts_t;

// ---- the Llama-70B-shaped job, built in C (no YAML parser needed) -------------------------

typedef struct job {
    Pcs__V1__JobSpec spec;
    Pcs__V1__ModelSpec model;
    Pcs__V1__ExplicitModel em;
    Pcs__V1__WrapSpec wrap;
    Pcs__V1__ModuleClassWrap mcw;
    Pcs__V1__PrecisionSpec prec;
    Pcs__V1__MeshDim dim;
    Pcs__V1__MeshDim *dims[1];
    Pcs__V1__TrainingSpec train;
    Pcs__V1__OptimizerSpec opt;
    Pcs__V1__AdamWOptimizer adamw;
    char *classes[1];
    Pcs__V1__ModuleDecl *mods;
    Pcs__V1__ModuleDecl **modp;
    Pcs__V1__TensorDecl *tens;
    Pcs__V1__TensorDecl **tenp;
    uint64_t *shapes;
    char (*paths)[48];
    size_t nm, nt;
} job_t;

static void add_mod(job_t *j, const char *path, const char *cls)
{
    Pcs__V1__ModuleDecl *m = &j->mods[j->nm];
    pcs__v1__module_decl__init(m);
    snprintf(j->paths[j->nm], sizeof j->paths[j->nm], "%s", path);
    m->path = j->paths[j->nm];
    m->class_ = (char *)cls;
    m->params = &j->tenp[j->nt];
    j->modp[j->nm++] = m;
}

static void add_param(job_t *j, const char *name, uint64_t d0, uint64_t d1)
{
    Pcs__V1__ModuleDecl *m = &j->mods[j->nm - 1];
    Pcs__V1__TensorDecl *t = &j->tens[j->nt];
    pcs__v1__tensor_decl__init(t);
    t->name = (char *)name;
    t->shape = &j->shapes[2 * j->nt];
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->n_shape = d1 ? 2 : 1;
    j->tenp[j->nt++] = t;
    m->n_params++;
}

static int job_init(job_t *j, uint32_t layers)
{
    memset(j, 0, sizeof *j);
    size_t maxm = 8 + (size_t)layers * 12, maxt = 8 + (size_t)layers * 9;
    j->mods = calloc(maxm, sizeof *j->mods);
    j->modp = calloc(maxm, sizeof *j->modp);
    j->paths = calloc(maxm, sizeof *j->paths);
    j->tens = calloc(maxt, sizeof *j->tens);
    j->tenp = calloc(maxt, sizeof *j->tenp);
    j->shapes = calloc(2 * maxt, sizeof *j->shapes);
    if (!j->mods || !j->modp || !j->paths || !j->tens || !j->tenp || !j->shapes)
        return -1;
    const uint64_t dim = 8192, kv = 1024, ffn = 28672, vocab = 128256;
    char p[48];
    add_mod(j, "", "Transformer");
    add_mod(j, "tok_embeddings", "Embedding");
    add_param(j, "weight", vocab, dim);
    add_mod(j, "layers", "ModuleList");
    for (uint32_t i = 0; i < layers; i++) {
        snprintf(p, sizeof p, "layers.%u", i);
        add_mod(j, p, "TransformerBlock");
        snprintf(p, sizeof p, "layers.%u.attention", i);
        add_mod(j, p, "Attention");
        static const char *const attn[] = {"wq", "wk", "wv", "wo"};
        for (int k = 0; k < 4; k++) {
            snprintf(p, sizeof p, "layers.%u.attention.%s", i, attn[k]);
            add_mod(j, p, "Linear");
            add_param(j, "weight", k == 1 || k == 2 ? kv : dim, dim);
        }
        snprintf(p, sizeof p, "layers.%u.feed_forward", i);
        add_mod(j, p, "FeedForward");
        static const char *const ff[] = {"w1", "w2", "w3"};
        for (int k = 0; k < 3; k++) {
            snprintf(p, sizeof p, "layers.%u.feed_forward.%s", i, ff[k]);
            add_mod(j, p, "Linear");
            add_param(j, "weight", k == 1 ? dim : ffn, k == 1 ? ffn : dim);
        }
        snprintf(p, sizeof p, "layers.%u.attention_norm", i);
        add_mod(j, p, "RMSNorm");
        add_param(j, "weight", dim, 0);
        snprintf(p, sizeof p, "layers.%u.ffn_norm", i);
        add_mod(j, p, "RMSNorm");
        add_param(j, "weight", dim, 0);
    }
    add_mod(j, "norm", "RMSNorm");
    add_param(j, "weight", dim, 0);
    add_mod(j, "output", "Linear");
    add_param(j, "weight", vocab, dim);

    pcs__v1__job_spec__init(&j->spec);
    pcs__v1__model_spec__init(&j->model);
    pcs__v1__explicit_model__init(&j->em);
    j->em.n_modules = j->nm;
    j->em.modules = j->modp;
    j->model.kind_case = PCS__V1__MODEL_SPEC__KIND_EXPLICIT;
    j->model.explicit_ = &j->em;
    j->spec.model = &j->model;
    j->spec.name = "llama-70b-shaped";
    pcs__v1__wrap_spec__init(&j->wrap);
    pcs__v1__module_class_wrap__init(&j->mcw);
    j->classes[0] = "TransformerBlock";
    j->mcw.n_classes = 1;
    j->mcw.classes = j->classes;
    j->wrap.policy_case = PCS__V1__WRAP_SPEC__POLICY_MODULE_CLASS;
    j->wrap.module_class = &j->mcw;
    j->spec.wrap = &j->wrap;
    pcs__v1__precision_spec__init(&j->prec);
    j->prec.param_dtype = PCS__V1__DTYPE__DTYPE_BF16;
    j->prec.reduce_dtype = PCS__V1__DTYPE__DTYPE_FP32;
    j->spec.precision = &j->prec;
    j->spec.strategy = PCS__V1__STRATEGY__STRATEGY_FULL_SHARD;
    pcs__v1__mesh_dim__init(&j->dim);
    j->dim.dim = PCS__V1__MESH_DIM_NAME__MESH_DIM_DP_SHARD;
    j->dims[0] = &j->dim;
    j->spec.n_mesh = 1;
    j->spec.mesh = j->dims;
    pcs__v1__training_spec__init(&j->train);
    pcs__v1__optimizer_spec__init(&j->opt);
    pcs__v1__adam_woptimizer__init(&j->adamw);
    j->adamw.lr = 1e-4;
    j->opt.kind_case = PCS__V1__OPTIMIZER_SPEC__KIND_ADAMW;
    j->opt.adamw = &j->adamw;
    j->train.optimizer = &j->opt;
    j->train.micro_batches = 1;
    j->spec.training = &j->train;
    return 0;
}

static void job_free(job_t *j)
{
    free(j->mods);
    free(j->modp);
    free(j->paths);
    free(j->tens);
    free(j->tenp);
    free(j->shapes);
}

// ---- correctness pass (untimed) -------------------------------------------------------------

static uint64_t check_plan(const Pcs__V1__Plan *p, size_t ntensors, uint32_t ws)
{
    uint64_t wrong = 0, seen = 0;
    for (size_t k = 0; k < p->n_units; k++) {
        const Pcs__V1__Unit *u = p->units[k];
        uint64_t end = 0;
        for (size_t i = 0; i < u->n_params; i++) {
            const Pcs__V1__ParamSlot *s = u->params[i];
            wrong += s->offset < end || (i && s->offset % u->align_numel);
            end = s->offset + s->numel;
            seen++;
        }
        wrong += end != u->flat_numel;
        wrong += u->shard_group_size != ws || u->padded_numel != u->shard_numel * ws;
        wrong += u->padded_numel < u->flat_numel || u->padded_numel - u->flat_numel >= ws;
        uint64_t next = 0;
        for (uint32_t r = 0; r < ws; r++) {
            uint64_t b, e;
            pcs_plan_shard_range(u, r, &b, &e);
            wrong += b != next;
            next = e;
        }
        wrong += next != u->flat_numel;
    }
    wrong += seen != ntensors;
    wrong += pcs_plan_hash(p) != p->hash;
    return wrong;
}

static size_t assignment_bytes(const Pcs__V1__JobSpec *spec, Pcs__V1__Plan *p, uint32_t rank)
{
    Pcs__V1__MeshCoords c;
    Pcs__V1__RankEstimate e;
    if (pcs_plan_rank_coords(p, rank, &c) != PCS_OK || pcs_plan_rank_estimate(p, rank, &e))
        return 0;
    Pcs__V1__Assignment a = PCS__V1__ASSIGNMENT__INIT;
    a.job_id = "j-0123456789abcdef";
    a.generation = 1;
    a.rank = rank;
    a.world_size = p->world_size;
    a.coords = &c;
    a.spec = (Pcs__V1__JobSpec *)spec;
    a.plan = p;
    a.plan_hash = p->hash;
    a.estimate = &e;
    return protobuf_c_message_get_packed_size(&a.base);
}

static int usage(void)
{
    fprintf(stderr, "usage: pcs-plan-bench [-b min_ranks] [-e max_ranks] [-f factor] [-w warmup]"
                    " [-n iters] [-L layers] [-F out.csv]\n");
    return 2;
}

int main(int argc, char **argv)
{
    opts_t o = {8, 16384, 2, 3, 20, 80, NULL};
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc)
            return usage();
        const char *f = argv[i], *v = argv[++i];
        unsigned long x = strtoul(v, NULL, 10);
        if (!strcmp(f, "-b"))
            o.begin = (uint32_t)x;
        else if (!strcmp(f, "-e"))
            o.end = (uint32_t)x;
        else if (!strcmp(f, "-f"))
            o.factor = (uint32_t)x;
        else if (!strcmp(f, "-w"))
            o.warmup = (uint32_t)x;
        else if (!strcmp(f, "-n"))
            o.iters = (uint32_t)x;
        else if (!strcmp(f, "-L"))
            o.layers = (uint32_t)x;
        else if (!strcmp(f, "-F"))
            o.csv = v;
        else
            return usage();
    }
    if (o.begin < 1 || o.end < o.begin || o.factor < 2 || o.iters < 1 || o.layers < 1)
        return usage();
    job_t j;
    if (job_init(&j, o.layers) != 0) {
        fprintf(stderr, "pcs-plan-bench: out of memory\n");
        return 1;
    }
    uint64_t total = 0;
    for (size_t t = 0; t < j.nt; t++)
        total += j.tens[t].shape[0] * (j.tens[t].n_shape == 2 ? j.tens[t].shape[1] : 1);
    FILE *csv = o.csv ? fopen(o.csv, "w") : NULL;
    if (o.csv && !csv) {
        fprintf(stderr, "pcs-plan-bench: cannot write %s\n", o.csv);
        job_free(&j);
        return 1;
    }
    if (csv)
        fprintf(csv, "ranks,units,tensors,time_us,min_us,decode_us,plan_bytes,assign_bytes,"
                     "assign_spread,wrong\n");

    time_t now = time(NULL);
    char ts[32];
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    printf("# pcs-plan-bench  git %s  %s  cmd:", PCS_GIT_SHA, ts);
    for (int i = 0; i < argc; i++)
        printf(" %s", argv[i]);
    printf("\n# model llama-70b-shaped: %u blocks, %zu modules, %zu tensors, %.2fe9 params; wrap "
           "module_class TransformerBlock; bf16 compute / fp32 reduce; full_shard over all ranks\n",
           o.layers, j.nm, j.nt, (double)total / 1e9);
    printf("# warmup %u iters %u  time = mean of pcs_plan_build (min also shown); baseline "
           "decode = a worker's unpack of the same plan; assign = packed Assignment of the last "
           "rank (spec + plan + coords + estimate)\n",
           o.warmup, o.iters);
    printf("#    ranks  units  tensors     time      min   decode    plan    assign  #wrong\n");
    printf("#                              (us)     (us)     (us)     (B)       (B)        \n");

    uint64_t wrong_total = 0;
    double t1024 = -1;
    size_t assign_min = SIZE_MAX, assign_max = 0;
    int rc = 0;
    for (uint64_t ws = o.begin; ws <= o.end; ws *= o.factor) {
        j.dim.size = (uint32_t)ws;
        Pcs__V1__Plan *p = NULL;
        for (uint32_t w = 0; w < o.warmup; w++) {
            if (pcs_plan_build(&j.spec, (uint32_t)ws, &p) != PCS_OK) {
                fprintf(stderr, "pcs-plan-bench: %s\n", pcs_last_error());
                rc = 1;
                goto done;
            }
            pcs_plan_free(p);
        }
        double sum = 0, min = 1e30;
        for (uint32_t it = 0; it < o.iters; it++) {
            uint64_t t0 = pcs_now_us();
            pcs_status_t st = pcs_plan_build(&j.spec, (uint32_t)ws, &p);
            double dt = (double)(pcs_now_us() - t0);
            if (st != PCS_OK) {
                fprintf(stderr, "pcs-plan-bench: %s\n", pcs_last_error());
                rc = 1;
                goto done;
            }
            sum += dt;
            min = dt < min ? dt : min;
            if (it + 1 < o.iters)
                pcs_plan_free(p);
        }
        double mean = sum / o.iters;
        /* baseline: a worker decoding the plan it receives */
        size_t plen = protobuf_c_message_get_packed_size(&p->base);
        uint8_t *buf = malloc(plen);
        double dsum = 0;
        if (buf) {
            protobuf_c_message_pack(&p->base, buf);
            for (uint32_t it = 0; it < o.iters; it++) {
                uint64_t t0 = pcs_now_us();
                Pcs__V1__Plan *q = pcs__v1__plan__unpack(NULL, plen, buf);
                dsum += (double)(pcs_now_us() - t0);
                wrong_total += q == NULL || (q && pcs_plan_hash(q) != p->hash);
                pcs__v1__plan__free_unpacked(q, NULL);
            }
        }
        free(buf);
        uint64_t wrong = check_plan(p, j.nt, (uint32_t)ws);
        size_t ab = assignment_bytes(&j.spec, p, (uint32_t)ws - 1);
        wrong += ab == 0;
        assign_min = ab < assign_min ? ab : assign_min;
        assign_max = ab > assign_max ? ab : assign_max;
        wrong_total += wrong;
        if (ws == 1024)
            t1024 = mean;
        printf("  %8" PRIu64 "  %5zu  %7zu  %7.1f  %7.1f  %7.1f  %7zu  %8zu  %6" PRIu64 "\n", ws,
               p->n_units, j.nt, mean, min, dsum / o.iters, plen, ab, wrong);
        if (csv)
            fprintf(csv, "%" PRIu64 ",%zu,%zu,%.1f,%.1f,%.1f,%zu,%zu,%zu,%" PRIu64 "\n", ws,
                    p->n_units, j.nt, mean, min, dsum / o.iters, plen, ab, assign_max - assign_min,
                    wrong);
        pcs_plan_free(p);
        if (ws > UINT32_MAX / o.factor)
            break;
    }
    printf("# Out of bounds values : %" PRIu64 " %s\n", wrong_total, wrong_total ? "FAILED" : "OK");
    printf("# Assignment bytes per rank: %zu .. %zu (spread %zu B across world sizes)\n",
           assign_min, assign_max, assign_max - assign_min);
    if (t1024 >= 0)
        printf("# Verdict: plan at 1024 ranks %.2f ms (target < 10 ms): %s\n", t1024 / 1000.0,
               t1024 < 10000.0 ? "OK" : "SLOW");
    rc = wrong_total ? 1 : 0;
done:
    if (csv)
        fclose(csv);
    job_free(&j);
    return rc;
}
