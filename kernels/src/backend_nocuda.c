/* Built instead of the CUDA sources when nvcc/NCCL are absent (PCS_HAVE_CUDA=OFF): asking for the
 * "cuda" backend is then PCS_ERR_UNSUPPORTED with a message, never a link error or a crash. */
#include "kernels_internal.h"

int pcs_backend_cuda_built(void)
{
    return 0;
}

pcs_status_t pcs_backend_cuda_get(const pcs_backend_ops_t **out)
{
    *out = NULL;
    return pcs_set_error(PCS_ERR_UNSUPPORTED,
                         "kernel backend 'cuda' was not built (configure with nvcc and NCCL, "
                         "PCS_WITH_CUDA=ON)");
}
