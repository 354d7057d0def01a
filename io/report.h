/* Step-report files: the StepReports of one rank, appended as the steps happen, each record a
 * u32 little-endian length and the packed pcs.v1.StepReport (the bytes ReportStep sends).
 * pcs-worker --report-dir writes <dir>/<job>.rank<R>.reports; `pcsctl demo` and the end-to-end
 * tests read them while they grow. Plain file I/O: pcsctl reads them without the worker. */
#ifndef PCS_IO_REPORT_H
#define PCS_IO_REPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "pcs/status.h"
#include "pcs/v1/worker.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "<dir>/<job_id>.rank<rank>.reports" into buf (truncated to n). */
void pcs_report_file_path(const char *dir, const char *job_id, uint32_t rank, char *buf, size_t n);

/* Append one record and flush it (a reader never sees a record before its length).
 * PCS_ERR_SYSTEM on a write error, PCS_ERR_NOMEM. */
pcs_status_t pcs_report_file_append(FILE *f, const Pcs__V1__StepReport *r);

/* The record at byte *off of the file at `path`: 1 with *out (caller frees with
 * pcs__v1__step_report__free_unpacked) and *off moved past it; 0 when no complete, decodable
 * record is there (yet): a file still being written is read again from the same *off later. */
int pcs_report_file_next(const char *path, long *off, Pcs__V1__StepReport **out);

#ifdef __cplusplus
}
#endif
#endif
