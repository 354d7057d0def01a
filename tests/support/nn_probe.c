/* nn_probe: runs one op of the CPU twin (kernels/include/pcs/nn.h) on arrays read from stdin and
 * writes the results to stdout, so that tests/python/test_nn_torch.py can compare them with
 * PyTorch. Test support, not installed. Raw float32, native byte order:
 *   nn_probe layernorm R D   in: x[R*D] dy[R*D] w[D] b[D]
 *                            out: y[R*D] dx[R*D] dw[D] db[D] save[2R] (mean, 1/std per row)
 *   nn_probe gelu N          in: x[N] dy[N]   out: y[N] dx[N]
 * Exit 2 on bad arguments or short input, 1 when the op fails. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pcs/status.h"
#include "pcs/nn.h"

static float *take(size_t n)
{
    float *p = malloc(n * sizeof *p);
    if (!p || fread(p, sizeof *p, n, stdin) != n) {
        fprintf(stderr, "nn_probe: short input (%zu floats wanted)\n", n);
        exit(2);
    }
    return p;
}

static void give(const float *p, size_t n)
{
    if (fwrite(p, sizeof *p, n, stdout) != n)
        exit(1);
}

int main(int argc, char **argv)
{
    pcs_nn_t *nn = NULL;
    if (pcs_nn_create(NULL, NULL, &nn) != PCS_OK)
        return 1;
    if (argc == 4 && strcmp(argv[1], "layernorm") == 0) {
        unsigned long R = strtoul(argv[2], NULL, 10), D = strtoul(argv[3], NULL, 10);
        if (R == 0 || D == 0 || R > (1u << 16) || D > (1u << 20))
            return 2;
        size_t n = (size_t)R * D;
        float *x = take(n), *dy = take(n), *w = take(D), *b = take(D);
        float *y = malloc(n * 4), *dx = malloc(n * 4), *g = malloc(2 * D * 4);
        float *save = malloc(2 * R * 4);
        if (!y || !dx || !g || !save)
            return 1;
        pcs_nn_norm_t p = {.kind = PCS_NN_LAYERNORM, .rows = (uint32_t)R, .dim = (uint32_t)D,
                           .dtype = PCS_DTYPE_FP32, .weight = w, .weight_dtype = PCS_DTYPE_FP32,
                           .bias = b, .bias_dtype = PCS_DTYPE_FP32, .save = save, .training = 1};
        pcs_nn_grad_t gw = {g, PCS_DTYPE_FP32, PCS_DTYPE_FP32, 0};
        pcs_nn_grad_t gb = {g + D, PCS_DTYPE_FP32, PCS_DTYPE_FP32, 0};
        if (pcs_nn_norm_fwd(nn, &p, x, y) != PCS_OK ||
            pcs_nn_norm_bwd(nn, &p, x, dy, dx, &gw, &gb) != PCS_OK) {
            fprintf(stderr, "nn_probe: %s\n", pcs_last_error());
            return 1;
        }
        give(y, n), give(dx, n), give(g, 2 * D), give(save, 2 * R);
        free(x), free(dy), free(w), free(b), free(y), free(dx), free(g), free(save);
    } else if (argc == 3 && strcmp(argv[1], "gelu") == 0) {
        unsigned long n = strtoul(argv[2], NULL, 10);
        if (n == 0 || n > (1u << 24))
            return 2;
        float *x = take(n), *dy = take(n), *y = malloc(n * 4), *dx = malloc(n * 4);
        if (!y || !dx)
            return 1;
        if (pcs_nn_act_fwd(nn, PCS_NN_GELU, y, x, n, PCS_DTYPE_FP32) != PCS_OK ||
            pcs_nn_act_bwd(nn, PCS_NN_GELU, dx, x, y, dy, n) != PCS_OK) {
            fprintf(stderr, "nn_probe: %s\n", pcs_last_error());
            return 1;
        }
        give(y, n), give(dx, n);
        free(x), free(dy), free(y), free(dx);
    } else {
        fprintf(stderr, "usage: nn_probe layernorm R D | nn_probe gelu N (arrays on stdin)\n");
        return 2;
    }
    pcs_nn_destroy(nn);
    return 0;
}
