/* Unit tests of the log's JSON format (PCS_LOG_FORMAT=json): every line is one JSON object that
 * a strict parser accepts, whatever the message held (quotes, backslashes, control characters,
 * bytes that are not UTF-8, a message cut at the buffer's end), with the fields log collectors
 * index on, and the job and rank only while a job is set. The parser here is written from
 * RFC 8259 (objects of strings and integers), independent of the writer; Python's json module
 * checks the same file again where python3 is installed. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pcs/log.h"
#include "pcs/utf8.h"

static char log_path[256];

// ---- a strict reader of one flat JSON object: {"key": "string" | integer, ...} ----

typedef struct {
    char key[32][32];
    char val[32][4096];
    int is_num[32];
    int n;
} obj_t;

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* A JSON string at *p into out (decoded, UTF-8); 0 on a grammar error. */
static int read_string(const char **p, char *out, size_t n)
{
    const char *s = *p;
    size_t o = 0;
    if (*s++ != '"')
        return 0;
    for (;;) {
        unsigned char c = (unsigned char)*s++;
        if (c == '"')
            break;
        if (c < 0x20) /* raw control characters (a newline included) are not allowed */
            return 0;
        if (c == '\\') {
            char e = *s++;
            unsigned cp = 0;
            switch (e) {
            case '"': case '\\': case '/': cp = (unsigned char)e; break;
            case 'b': cp = '\b'; break;
            case 'f': cp = '\f'; break;
            case 'n': cp = '\n'; break;
            case 'r': cp = '\r'; break;
            case 't': cp = '\t'; break;
            case 'u':
                for (int i = 0; i < 4; i++) {
                    int h = hexval(*s++);
                    if (h < 0)
                        return 0;
                    cp = cp * 16 + (unsigned)h;
                }
                if (cp >= 0x80) /* the writer escapes control characters only */
                    return 0;
                break;
            default:
                return 0;
            }
            c = (unsigned char)cp;
        }
        if (o + 1 >= n)
            return 0;
        out[o++] = (char)c;
    }
    out[o] = '\0';
    *p = s;
    return pcs_utf8_check(out, o) == o; /* strings must be UTF-8 */
}

static int parse_object(const char *s, obj_t *ob)
{
    memset(ob, 0, sizeof *ob);
    if (*s++ != '{')
        return 0;
    for (;;) {
        if (ob->n == 32 || !read_string(&s, ob->key[ob->n], sizeof ob->key[0]) || *s++ != ':')
            return 0;
        if (*s == '"') {
            if (!read_string(&s, ob->val[ob->n], sizeof ob->val[0]))
                return 0;
        } else {
            const char *b = s;
            if (*s == '-')
                s++;
            if (*s < '0' || *s > '9')
                return 0;
            while (*s >= '0' && *s <= '9')
                s++;
            snprintf(ob->val[ob->n], sizeof ob->val[0], "%.*s", (int)(s - b), b);
            ob->is_num[ob->n] = 1;
        }
        ob->n++;
        if (*s == '}')
            return s[1] == '\n' && s[2] == '\0';
        if (*s++ != ',')
            return 0;
    }
}

static const char *get(const obj_t *ob, const char *key, int want_num)
{
    for (int i = 0; i < ob->n; i++)
        if (strcmp(ob->key[i], key) == 0)
            return ob->is_num[i] == want_num ? ob->val[i] : NULL;
    return NULL;
}

/* The log file's lines, each parsed; returns the count. */
static int read_lines(obj_t *obs, int max)
{
    FILE *f = fopen(log_path, "r");
    assert_non_null(f);
    static char line[16384];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        assert_true(n < max);
        if (!parse_object(line, &obs[n]))
            fail_msg("line %d is not a JSON object: %s", n + 1, line);
        n++;
    }
    fclose(f);
    return n;
}

static void test_json_lines(void **state)
{
    (void)state;
    pcs_log_set_role("w\"3");
    PCS_WARN(PCS_SUB_WORKER, "plain message %d", 7);
    PCS_INFO(PCS_SUB_COLL, "quote \" backslash \\ tab \t newline \n bell \a end");
    PCS_ERROR(PCS_SUB_COORD, "not UTF-8: \xff\xfe and a lone \xc3 then text");
    pcs_log_set_job("job-7", 3);
    PCS_INFO(PCS_SUB_WORKER, "with a job");
    char big[1200];
    memset(big, 'a', sizeof big);
    memcpy(big + 1020, "\xc3\xa9\xc3\xa9", 4); /* the second character across the 1023 cut */
    big[sizeof big - 1] = '\0';
    PCS_INFO(PCS_SUB_WORKER, "%s", big);
    char quotes[1100];
    memset(quotes, '"', sizeof quotes); /* every byte escaped: the escaped text is cut */
    quotes[sizeof quotes - 1] = '\0';
    PCS_INFO(PCS_SUB_WORKER, "%s", quotes);
    pcs_log_set_job(NULL, -1);
    PCS_DEBUG(PCS_SUB_WORKER, "below the level: not written");
    PCS_INFO(PCS_SUB_WORKER, "job cleared");

    static obj_t obs[8];
    int n = read_lines(obs, 8);
    assert_int_equal(n, 7);
    char pid[16];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    for (int i = 0; i < n; i++) {
        const char *ts = get(&obs[i], "ts", 0);
        assert_non_null(ts);
        assert_int_equal(strlen(ts), 24); /* 2026-11-27T05:29:05.123Z */
        assert_int_equal(ts[10], 'T');
        assert_int_equal(ts[23], 'Z');
        assert_non_null(get(&obs[i], "host", 0));
        assert_string_equal(get(&obs[i], "pid", 1), pid);
        assert_non_null(get(&obs[i], "tid", 1));
        assert_string_equal(get(&obs[i], "role", 0), "w\"3");
        assert_string_equal(get(&obs[i], "file", 0), "test_log.c");
        assert_non_null(get(&obs[i], "line", 1));
        assert_non_null(get(&obs[i], "msg", 0));
    }
    assert_string_equal(get(&obs[0], "level", 0), "warn");
    assert_string_equal(get(&obs[0], "subsys", 0), "WORKER");
    assert_string_equal(get(&obs[0], "msg", 0), "plain message 7");
    assert_string_equal(get(&obs[1], "level", 0), "info");
    assert_string_equal(get(&obs[1], "subsys", 0), "COLL");
    assert_string_equal(get(&obs[1], "msg", 0),
                        "quote \" backslash \\ tab \t newline \n bell \a end");
    assert_string_equal(get(&obs[2], "level", 0), "error");
    const char *bad = get(&obs[2], "msg", 0);
    assert_non_null(strstr(bad, "not UTF-8: "));
    assert_non_null(strstr(bad, " then text"));
    assert_null(get(&obs[1], "job", 0));
    assert_string_equal(get(&obs[3], "job", 0), "job-7");
    assert_string_equal(get(&obs[3], "rank", 1), "3");
    /* cut at 1023 bytes through the character: the partial character is dropped */
    const char *cut = get(&obs[4], "msg", 0);
    assert_int_equal(strlen(cut), 1020 + 2);
    assert_memory_equal(cut + 1020, "\xc3\xa9", 2);
    const char *q = get(&obs[5], "msg", 0);
    assert_true(strlen(q) > 100);
    for (const char *c = q; *c; c++)
        assert_int_equal(*c, '"');
    assert_string_equal(get(&obs[6], "msg", 0), "job cleared");
    assert_null(get(&obs[6], "job", 0));
    assert_null(get(&obs[6], "rank", 1));

    /* the same file through Python's json module (an independent parser), where installed */
    if (system("command -v python3 >/dev/null 2>&1") == 0) {
        char cmd[512];
        snprintf(cmd, sizeof cmd,
                 "python3 -c 'import json,sys\n"
                 "n=0\n"
                 "for l in open(sys.argv[1],encoding=\"utf-8\",errors=\"strict\"):\n"
                 "  o=json.loads(l); n+=1\n"
                 "  assert isinstance(o[\"msg\"],str) and o[\"role\"]==\"w\\\"3\"\n"
                 "assert n==7' %s",
                 log_path);
        assert_int_equal(system(cmd), 0);
    }
}

int main(void)
{
    snprintf(log_path, sizeof log_path, "/tmp/pcs-test-log-%d.jsonl", (int)getpid());
    setenv("PCS_LOG_FORMAT", "json", 1);
    setenv("PCS_LOG_FILE", log_path, 1);
    setenv("PCS_LOG_LEVEL", "info", 1);
    setenv("PCS_LOG_SUBSYS", "ALL", 1);
    pcs_log_init(PCS_LOG_INFO);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_lines),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    unlink(log_path);
    return rc;
}
