/* FNV-1a 64 (see pcs/hash.h): xor the byte in, then multiply by the prime. */
#include "pcs/hash.h"

uint64_t pcs_fnv1a64(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= PCS_FNV1A64_PRIME;
    }
    return h;
}

uint64_t pcs_fnv1a64_str(const char *s)
{
    uint64_t h = PCS_FNV1A64_OFFSET;
    for (const unsigned char *p = (const unsigned char *)s; p && *p; p++) {
        h ^= *p;
        h *= PCS_FNV1A64_PRIME;
    }
    return h;
}

uint64_t pcs_fnv1a64_u64(uint64_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        h ^= (v >> (8 * i)) & 0xff;
        h *= PCS_FNV1A64_PRIME;
    }
    return h;
}
