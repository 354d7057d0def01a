/* FNV-1a 64 (Fowler/Noll/Vo, http://www.isthe.com/chongo/tech/comp/fnv/): the one string and byte
 * hash of pcs. Used for hash-map slots (pcs/strmap.h), the plan hash, the per-tensor RNG stream id
 * (model/init.c) and the collective-sequence fingerprint. Not a cryptographic hash. Pure. */
#ifndef PCS_HASH_H
#define PCS_HASH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PCS_FNV1A64_OFFSET 0xcbf29ce484222325ull /* 14695981039346656037 */
#define PCS_FNV1A64_PRIME  0x100000001b3ull

/* h folded with n bytes at p; start a hash with h = PCS_FNV1A64_OFFSET. */
uint64_t pcs_fnv1a64(uint64_t h, const void *p, size_t n);
/* FNV-1a 64 of a NUL-terminated string (NULL hashes as ""). */
uint64_t pcs_fnv1a64_str(const char *s);
/* h folded with the 8 bytes of v, least significant first (the same on every host). */
uint64_t pcs_fnv1a64_u64(uint64_t h, uint64_t v);

#ifdef __cplusplus
}
#endif
#endif
