/* Built instead of nn_cuda.cu when CUDA is not (PCS_HAVE_CUDA=OFF, the ASan CI build): asking for
 * the "cuda" nn implementation is then PCS_ERR_UNSUPPORTED with a message, as backend_nocuda.c
 * does for the kernels backend. */
#include "nn_internal.h"

pcs_status_t pcs_nn_cuda_get(const pcs_nn_ops_t **out)
{
    *out = NULL;
    return pcs_set_error(PCS_ERR_UNSUPPORTED,
                         "nn implementation 'cuda' was not built (configure with nvcc, "
                         "PCS_WITH_CUDA=ON)");
}
