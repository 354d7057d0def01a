# kernels: CPU twin unit tests, the exhaustive cast proof, and the CUDA differential test.
pcs_add_test(NAME test_kernels SOURCES unit/test_kernels.c LIBS pcs_kernels LABELS unit
             TIMEOUT 120)
pcs_add_test(NAME test_kernels_cast_exhaustive SOURCES unit/test_kernels_cast_exhaustive.c
             LIBS pcs_kernels LABELS exhaustive TIMEOUT 300)
pcs_add_test(NAME test_kernels_cuda SOURCES gpu/test_kernels_cuda.c LIBS pcs_kernels LABELS gpu
             TIMEOUT 300)
