/* The transfer plan of a resharded resume (see reshard.h). */
#include "planner/reshard.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "pcs/mem.h"
#include "pcs/strmap.h"
#include "planner/mesh.h"
#include "planner/plan.h"

pcs_status_t pcs_plan_rank_shard(const Pcs__V1__Plan *p, uint32_t unit, uint32_t rank,
                                 uint32_t *shard, uint32_t *replica)
{
    if (unit >= p->n_units || rank >= p->world_size)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "plan: unit %u / rank %u out of range", unit,
                             rank);
    const Pcs__V1__Unit *u = p->units[unit];
    pcs_mesh_group_t g;
    if (u->shard_group_size > 1) {
        PCS_CHECK(pcs_plan_group(p, PCS__V1__GROUP_KIND__GROUP_KIND_SHARD, rank, &g));
        *shard = g.index;
        PCS_CHECK(pcs_plan_group(p, PCS__V1__GROUP_KIND__GROUP_KIND_REPLICATE, rank, &g));
        *replica = g.index;
    } else { /* replicated over the whole data-parallel group (NO_SHARD, full precision) */
        PCS_CHECK(pcs_plan_group(p, PCS__V1__GROUP_KIND__GROUP_KIND_DP, rank, &g));
        *shard = 0;
        *replica = g.index;
    }
    return PCS_OK;
}

bool pcs_plan_rank_holds(const Pcs__V1__Plan *p, uint32_t unit, uint32_t rank)
{
    if (unit >= p->n_units)
        return false;
    if (p->pp_size <= 1)
        return true;
    Pcs__V1__MeshCoords c;
    /* pipeline stage s lives on pp rank s mod pp (planner/schedule.h) */
    return pcs_plan_rank_coords(p, rank, &c) == PCS_OK &&
           p->units[unit]->stage % p->pp_size == c.pp;
}

uint32_t pcs_plan_shard_holder(const Pcs__V1__Plan *p, uint32_t unit, uint32_t shard)
{
    for (uint32_t r = 0; r < p->world_size; r++) {
        uint32_t s, rep;
        if (pcs_plan_rank_holds(p, unit, r) &&
            pcs_plan_rank_shard(p, unit, r, &s, &rep) == PCS_OK && s == shard && rep == 0)
            return r;
    }
    return UINT32_MAX;
}

pcs_status_t pcs_plan_transfer(const Pcs__V1__Plan *old, const Pcs__V1__Plan *neu, uint32_t rank,
                               pcs_xfer_seg_t **segs, size_t *n)
{
    *segs = NULL;
    *n = 0;
    if (!old || !neu || rank >= neu->world_size)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "transfer: plans and a rank of the new one");
    /* the old plan comes from a checkpoint's plan.pb: its layout is checked before any shard
     * arithmetic trusts it */
    if (pcs_plan_check_layout(old) != PCS_OK)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "resume: the checkpoint's %s", pcs_last_error());
    PCS_CHECK(pcs_plan_check_layout(neu));
    pcs_mesh_t om, nm;
    if (pcs_mesh_from_plan(old, &om) != PCS_OK || pcs_mesh_from_plan(neu, &nm) != PCS_OK)
        return pcs_set_error(PCS_ERR_INVALID_ARG, "transfer: a plan without a valid mesh");
    /* Pipeline stages on either side: parameters are found by FQN, a unit's shards on the
     * ranks of its stage (pcs_plan_rank_holds), so pp may change too. */
    /* old parameters by FQN: unit index << 32 | slot */
    pcs_strmap_t by_fqn = PCS_STRMAP_BORROWED;
    uint32_t *slot_of = NULL;
    size_t n_old = 0;
    for (size_t u = 0; u < old->n_units; u++)
        n_old += old->units[u]->n_params;
    pcs_status_t st = pcs_calloc(n_old + 1, sizeof *slot_of, (void **)&slot_of);
    uint32_t *holder = NULL; /* per old unit and shard: its replica-0 rank */
    size_t *hbase = NULL;
    size_t cap = 0;
    if (st == PCS_OK)
        st = pcs_strmap_reserve(&by_fqn, n_old);
    size_t k = 0;
    for (size_t u = 0; st == PCS_OK && u < old->n_units; u++)
        for (size_t i = 0; st == PCS_OK && i < old->units[u]->n_params; i++) {
            slot_of[k] = (uint32_t)u;
            bool added = false;
            st = pcs_strmap_add(&by_fqn, old->units[u]->params[i]->fqn, (uint32_t)k, &added);
            k++;
        }
    if (st == PCS_OK)
        st = pcs_calloc(old->n_units + 1, sizeof *hbase, (void **)&hbase);
    size_t total_shards = 0;
    for (size_t u = 0; st == PCS_OK && u < old->n_units; u++) {
        hbase[u] = total_shards;
        uint32_t sg = old->units[u]->shard_group_size ? old->units[u]->shard_group_size : 1;
        total_shards += sg;
    }
    if (st == PCS_OK)
        st = pcs_calloc(total_shards + 1, sizeof *holder, (void **)&holder);
    for (size_t u = 0; st == PCS_OK && u < old->n_units; u++) {
        uint32_t sg = old->units[u]->shard_group_size ? old->units[u]->shard_group_size : 1;
        for (uint32_t s = 0; s < sg; s++)
            holder[hbase[u] + s] = UINT32_MAX;
    }
    for (uint32_t r = 0; st == PCS_OK && r < old->world_size; r++)
        for (size_t u = 0; st == PCS_OK && u < old->n_units; u++) {
            uint32_t s = 0, rep = 0;
            if (!pcs_plan_rank_holds(old, (uint32_t)u, r))
                continue; /* another stage's rank */
            st = pcs_plan_rank_shard(old, (uint32_t)u, r, &s, &rep);
            if (st == PCS_OK && rep == 0 && holder[hbase[u] + s] == UINT32_MAX)
                holder[hbase[u] + s] = r;
        }
    pcs_xfer_seg_t *out = NULL;
    size_t m = 0;
    for (size_t u = 0; st == PCS_OK && u < neu->n_units; u++) {
        const Pcs__V1__Unit *nu = neu->units[u];
        if (!pcs_plan_rank_holds(neu, (uint32_t)u, rank))
            continue; /* held by another stage's ranks */
        uint32_t s = 0, rep = 0;
        st = pcs_plan_rank_shard(neu, (uint32_t)u, rank, &s, &rep);
        if (st != PCS_OK)
            break;
        pcs_plan_piece_t *pc = NULL;
        st = pcs_calloc(nu->n_params + 1, sizeof *pc, (void **)&pc);
        size_t npc = st == PCS_OK ? pcs_plan_shard_pieces(nu, s, pc) : 0;
        for (size_t q = 0; st == PCS_OK && q < npc; q++) {
            const Pcs__V1__ParamSlot *np = nu->params[pc[q].param];
            uint32_t key = 0;
            if (!pcs_strmap_get(&by_fqn, np->fqn, &key)) {
                st = pcs_set_error(PCS_ERR_INVALID_ARG,
                                   "resume: parameter %s is not in the checkpoint", np->fqn);
                break;
            }
            const Pcs__V1__Unit *ou = old->units[slot_of[key]];
            size_t oj = ou->n_params;
            for (size_t j = 0; j < ou->n_params && oj == ou->n_params; j++)
                if (strcmp(ou->params[j]->fqn, np->fqn) == 0)
                    oj = j;
            const Pcs__V1__ParamSlot *op = oj < ou->n_params ? ou->params[oj] : NULL;
            if (!op || op->numel != np->numel) {
                st = pcs_set_error(PCS_ERR_INVALID_ARG,
                                   "resume: parameter %s has %llu elements in the checkpoint, "
                                   "%llu in this job",
                                   np->fqn, op ? (unsigned long long)op->numel : 0ull,
                                   (unsigned long long)np->numel);
                break;
            }
            /* the piece's elements of the parameter, found in the old layout (flat or
             * per_param, any shard dim) run by run */
            uint32_t osg = ou->shard_group_size ? ou->shard_group_size : 1;
            for (uint64_t j = 0; st == PCS_OK && j < pc[q].count; j++) {
                uint64_t e0 = pc[q].elem + j * pc[q].stride, e = e0, end = e0 + pc[q].len;
                uint64_t dst0 = pc[q].shard_off + j * pc[q].len;
                while (st == PCS_OK && e < end) {
                    uint32_t os = 0;
                    uint64_t within = 0, run = 0;
                    pcs_plan_locate(ou, (uint32_t)oj, e, &os, &within, &run);
                    uint64_t len = end - e < run ? end - e : run;
                    uint32_t src = os < osg ? holder[hbase[slot_of[key]] + os] : UINT32_MAX;
                    if (src == UINT32_MAX) {
                        st = pcs_set_error(PCS_ERR_INVALID_ARG,
                                           "resume: no rank of the checkpoint holds shard %u of "
                                           "its unit %u",
                                           os, slot_of[key]);
                        break;
                    }
                    if (m == cap) {
                        st = pcs_grow((void **)&out, &cap, m + 1, sizeof *out);
                        if (st != PCS_OK)
                            break;
                    }
                    out[m++] = (pcs_xfer_seg_t){(uint32_t)u, dst0 + (e - e0), src, slot_of[key],
                                                within, len};
                    e += len;
                }
            }
        }
        free(pc);
    }
    pcs_strmap_free(&by_fqn);
    free(slot_of);
    free(holder);
    free(hbase);
    if (st != PCS_OK) {
        free(out);
        return st;
    }
    *segs = out;
    *n = m;
    return PCS_OK;
}
