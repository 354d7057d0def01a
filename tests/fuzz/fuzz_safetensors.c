/* Fuzz target for the file decoders the worker exposes to user files: the safetensors reader
 * (header JSON, offsets, dtype/shape checks, data reads) and the .npy header parser. Built as a
 * libFuzzer binary when the compiler is clang (tests/cmake/compute.cmake); the unit test
 * test_safetensors replays it over deterministic mutations of valid files under gcc and ASan. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "io/npy.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pcs_st_file_t *f = NULL;
    if (pcs_st_open_mem(data, size, &f) == PCS_OK) {
        /* a file that validated must be fully readable within its declared bounds */
        for (size_t i = 0; i < pcs_st_count(f); i++) {
            const pcs_st_tensor_t *t = pcs_st_tensor(f, i);
            uint8_t buf[64];
            uint64_t bytes = t->end - t->begin;
            uint64_t k = bytes < sizeof buf ? bytes : sizeof buf;
            if (pcs_st_read_raw(f, t, bytes - k, k, buf) != PCS_OK)
                __builtin_trap();
            if (pcs_dtype_is_float(t->dtype) && t->numel) {
                float v[4];
                uint64_t n = t->numel < 4 ? t->numel : 4;
                if (pcs_st_read_f32(f, t, t->numel - n, n, v) != PCS_OK)
                    __builtin_trap();
            }
            if (pcs_st_find(f, t->name) == NULL)
                __builtin_trap();
        }
        (void)pcs_st_metadata(f, "format");
        pcs_st_close(f);
    }
    pcs_npy_t a;
    (void)pcs_npy_parse(data, size, size, &a);
    return 0;
}
