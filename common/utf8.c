/* UTF-8 checks and boundary-safe truncation (see pcs/utf8.h). The validator follows the table
 * of well-formed byte sequences in RFC 3629 §4 / Unicode 15 table 3-7, so overlongs,
 * surrogates and code points above U+10FFFF are refused by the second byte's range. */
#include "pcs/utf8.h"

#include <string.h>

/* Length of the sequence led by `b` (1..4), 0 for a byte that cannot lead one. */
static size_t seq_len(unsigned char b)
{
    if (b < 0x80)
        return 1;
    if (b >= 0xc2 && b <= 0xdf)
        return 2;
    if (b >= 0xe0 && b <= 0xef)
        return 3;
    if (b >= 0xf0 && b <= 0xf4)
        return 4;
    return 0; /* 0x80..0xc1 (continuation, overlong lead), 0xf5..0xff */
}

size_t pcs_utf8_seq(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    if (len == 0)
        return 0;
    unsigned char b = p[0];
    if (b < 0x80)
        return 1;
    size_t n = seq_len(b);
    if (n == 0 || len < n)
        return 0;
    /* the second byte's range carries the overlong / surrogate / > U+10FFFF rules */
    unsigned char lo = 0x80, hi = 0xbf;
    if (b == 0xe0)
        lo = 0xa0; /* below: overlong 3-byte */
    else if (b == 0xed)
        hi = 0x9f; /* above: U+D800..U+DFFF surrogates */
    else if (b == 0xf0)
        lo = 0x90; /* below: overlong 4-byte */
    else if (b == 0xf4)
        hi = 0x8f; /* above: > U+10FFFF */
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (size_t k = 2; k < n; k++)
        if ((p[k] & 0xc0) != 0x80)
            return 0;
    return n;
}

size_t pcs_utf8_check(const char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        size_t n = pcs_utf8_seq(s + i, len - i);
        if (n == 0)
            return i;
        i += n;
    }
    return len;
}

int pcs_utf8_prefix(const char *s, int max)
{
    if (!s || max <= 0)
        return 0;
    size_t n = strnlen(s, (size_t)max + 1);
    if (n <= (size_t)max)
        return (int)n;
    /* s[max] is the first byte left out: if it continues a character, that character would be
     * cut, so end before its lead byte (at most 3 continuation bytes back). */
    const unsigned char *p = (const unsigned char *)s;
    int k = max;
    while (k > 0 && max - k < 4 && (p[k] & 0xc0) == 0x80)
        k--;
    return (p[k] & 0xc0) == 0x80 ? max : k; /* not UTF-8 at all: plain byte cut */
}

size_t pcs_utf8_trim_partial(char *buf)
{
    size_t len = strlen(buf);
    const unsigned char *p = (const unsigned char *)buf;
    /* find the last lead byte among the final 4 bytes */
    size_t k = len;
    while (k > 0 && len - k < 4) {
        k--;
        if ((p[k] & 0xc0) != 0x80)
            break;
    }
    if (k == len)
        return len;
    size_t n = seq_len(p[k]);
    if (n > 1 && len - k < n) {
        buf[k] = '\0';
        return k;
    }
    return len;
}

size_t pcs_utf8_sanitize(char *s)
{
    size_t len = strlen(s), i = 0, replaced = 0;
    while (i < len) {
        size_t bad = i + pcs_utf8_check(s + i, len - i);
        if (bad == len)
            break;
        s[bad] = '?';
        replaced++;
        i = bad + 1;
    }
    return replaced;
}

bool pcs_is_name_token(const char *s, size_t max)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > max)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}
