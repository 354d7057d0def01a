/* Step-report files (see io/report.h). */
#include "io/report.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RECORD (16u << 20) /* a report is a few hundred bytes; more is not a report file */

void pcs_report_file_path(const char *dir, const char *job_id, uint32_t rank, char *buf, size_t n)
{
    snprintf(buf, n, "%s/%s.rank%u.reports", dir, job_id ? job_id : "job", rank);
}

pcs_status_t pcs_report_file_append(FILE *f, const Pcs__V1__StepReport *r)
{
    size_t n = pcs__v1__step_report__get_packed_size(r);
    uint8_t *b = malloc(4 + n);
    if (!b)
        return pcs_set_error(PCS_ERR_NOMEM, "report file: out of memory");
    b[0] = (uint8_t)n;
    b[1] = (uint8_t)(n >> 8);
    b[2] = (uint8_t)(n >> 16);
    b[3] = (uint8_t)(n >> 24);
    pcs__v1__step_report__pack(r, b + 4);
    int ok = fwrite(b, 1, 4 + n, f) == 4 + n && fflush(f) == 0;
    free(b);
    if (!ok)
        return pcs_set_error(PCS_ERR_SYSTEM, "report file: write failed: %s", strerror(errno));
    return PCS_OK;
}

int pcs_report_file_next(const char *path, long *off, Pcs__V1__StepReport **out)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    int got = 0;
    uint8_t h[4];
    if (fseek(f, *off, SEEK_SET) == 0 && fread(h, 1, 4, f) == 4) {
        size_t n = (size_t)h[0] | (size_t)h[1] << 8 | (size_t)h[2] << 16 | (size_t)h[3] << 24;
        uint8_t *b = n <= MAX_RECORD ? malloc(n ? n : 1) : NULL;
        if (b && fread(b, 1, n, f) == n) {
            *out = pcs__v1__step_report__unpack(NULL, n, b);
            if (*out) {
                *off += 4 + (long)n;
                got = 1;
            }
        }
        free(b);
    }
    fclose(f);
    return got;
}
