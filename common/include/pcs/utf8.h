/* UTF-8 well-formedness (RFC 3629) and cutting text at a character boundary. proto3 `string`
 * fields must be UTF-8 and protobuf-c does not check it, so the RPC server validates every
 * request with these; anything that shortens user text to fit a buffer or a limit cuts it here
 * so it never produces a half character. Pure functions, thread-safe, no allocation. */
#ifndef PCS_UTF8_H
#define PCS_UTF8_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Length (1..4) of the well-formed UTF-8 sequence that starts `s` (len bytes available), or 0
 * when it does not start one (the rules of pcs_utf8_check). */
size_t pcs_utf8_seq(const char *s, size_t len);

/* Offset of the first byte of `s` (len bytes, NULs allowed) that is not part of a well-formed
 * UTF-8 sequence, or len when all of it is valid. Rejected: stray continuation bytes, C0/C1
 * overlong forms, surrogates (U+D800..U+DFFF), code points above U+10FFFF, sequences cut short
 * by the end of the input. */
size_t pcs_utf8_check(const char *s, size_t len);
static inline bool pcs_utf8_valid(const char *s, size_t len)
{
    return pcs_utf8_check(s, len) == len;
}

/* Precision for "%.*s" that prints at most `max` bytes of the NUL-terminated `s` without cutting
 * a multi-byte character: strlen(s) if it fits, else `max` moved back to a character start. */
int pcs_utf8_prefix(const char *s, int max);

/* After a truncating snprintf into `buf` (NUL-terminated): drop an incomplete multi-byte
 * sequence at its end. Returns the new length. Complete text is left alone. */
size_t pcs_utf8_trim_partial(char *buf);

/* Replace, in place, every byte of the NUL-terminated `s` that is not part of a well-formed
 * sequence with '?', so text of unknown origin (strerror in another locale, file names) can be
 * sent as a proto3 string. Returns the number of bytes replaced. */
size_t pcs_utf8_sanitize(char *s);

/* A name of 1..max characters of [A-Za-z0-9._-] (job names, worker program names): safe in
 * paths, labels and logs. NULL or "" is not one. */
bool pcs_is_name_token(const char *s, size_t max);

#ifdef __cplusplus
}
#endif
#endif
