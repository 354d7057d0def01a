/* Log line formatting (STYLE.md B5):
 *   2025-06-01T12:00:00.123Z host:pid:tid role W RPC file.c:88 message
 * One fwrite per line under a mutex; WARN/ERROR also become pcs_last_error(). */
#include "pcs/log.h"
#include "pcs/status.h"
#include "pcs/utf8.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int pcs_log_level_ = PCS_LOG_WARN;
unsigned pcs_log_mask_ = PCS_SUB_INIT | PCS_SUB_CONFIG | PCS_SUB_BOOTSTRAP | PCS_SUB_COORD;

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static FILE *log_out;
static char log_role[32] = "-";
static char log_host[64] = "?";
static int log_json;       /* PCS_LOG_FORMAT=json */
static char log_job[64];   /* pcs_log_set_job ("" = none) */
static int log_rank = -1;
static pcs_log_level_t log_default_level = PCS_LOG_WARN;

static const struct {
    const char *name;
    unsigned bit;
} sub_names[] = {
    {"INIT", PCS_SUB_INIT},     {"CONFIG", PCS_SUB_CONFIG}, {"RPC", PCS_SUB_RPC},
    {"COORD", PCS_SUB_COORD},   {"WORKER", PCS_SUB_WORKER}, {"BOOTSTRAP", PCS_SUB_BOOTSTRAP},
    {"COLL", PCS_SUB_COLL},     {"KERNEL", PCS_SUB_KERNEL}, {"MEM", PCS_SUB_MEM},
    {"BENCH", PCS_SUB_BENCH},   {"PLAN", PCS_SUB_PLAN},     {"STORE", PCS_SUB_STORE},
    {"ALL", PCS_SUB_ALL},
};

int pcs_log_level_parse(const char *s)
{
    static const char *names[] = {"none", "error", "warn", "info", "debug", "trace"};
    for (int i = 0; i < 6; i++)
        if (strcasecmp(s, names[i]) == 0)
            return i;
    return -1;
}

static unsigned parse_subsys(const char *spec)
{
    unsigned mask = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int neg = tok[0] == '^';
        const char *name = neg ? tok + 1 : tok;
        for (size_t i = 0; i < sizeof sub_names / sizeof sub_names[0]; i++) {
            if (strcasecmp(name, sub_names[i].name) == 0) {
                if (neg)
                    mask = (mask ? mask : PCS_SUB_ALL) & ~sub_names[i].bit;
                else
                    mask |= sub_names[i].bit;
            }
        }
    }
    return mask;
}

static void open_log_file(const char *pattern)
{
    char path[512];
    size_t o = 0;
    for (const char *p = pattern; *p && o + 32 < sizeof path; p++) {
        if (p[0] == '%' && p[1] == 'h') {
            o += (size_t)snprintf(path + o, sizeof path - o, "%s", log_host);
            p++;
        } else if (p[0] == '%' && p[1] == 'p') {
            o += (size_t)snprintf(path + o, sizeof path - o, "%d", (int)getpid());
            p++;
        } else {
            path[o++] = *p;
        }
    }
    path[o] = '\0';
    FILE *f = fopen(path, "a");
    if (f) {
        setvbuf(f, NULL, _IOLBF, 0);
        log_out = f;
    }
}

static void log_init_once(void)
{
    gethostname(log_host, sizeof log_host - 1);
    log_out = stderr;
    const char *lvl = getenv("PCS_LOG_LEVEL");
    int l = lvl ? pcs_log_level_parse(lvl) : -1;
    pcs_log_level_ = l >= 0 ? l : (int)log_default_level;
    const char *sub = getenv("PCS_LOG_SUBSYS");
    if (sub && *sub)
        pcs_log_mask_ = parse_subsys(sub);
    const char *file = getenv("PCS_LOG_FILE");
    if (file && *file)
        open_log_file(file);
    const char *fmt = getenv("PCS_LOG_FORMAT");
    log_json = fmt && strcasecmp(fmt, "json") == 0;
}

void pcs_log_set_job(const char *job, int rank)
{
    pthread_mutex_lock(&log_mu);
    snprintf(log_job, sizeof log_job, "%s", job ? job : "");
    log_rank = job ? rank : -1;
    pthread_mutex_unlock(&log_mu);
}

/* `s` as the body of a JSON string into out (n bytes): quotes, backslashes and control
 * characters escaped; s is valid UTF-8 (sanitized by the caller). */
static size_t json_escape(const char *s, char *out, size_t n)
{
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && o + 7 < n; p++) {
        if (*p == '"' || *p == '\\') {
            out[o++] = '\\';
            out[o++] = (char)*p;
        } else if (*p < 0x20) {
            o += (size_t)snprintf(out + o, n - o, "\\u%04x", *p);
        } else {
            out[o++] = (char)*p;
        }
    }
    out[o] = '\0';
    return o;
}

/* A short identifier (role, host, job) as a JSON string body: sanitized, then escaped. */
static void json_short(const char *s, char *out, size_t n)
{
    char tmp[128];
    snprintf(tmp, sizeof tmp, "%s", s);
    pcs_utf8_sanitize(tmp);
    json_escape(tmp, out, n);
}

void pcs_log_init(pcs_log_level_t default_level)
{
    log_default_level = default_level;
    pthread_once(&log_once, log_init_once);
}

void pcs_log_set_role(const char *role)
{
    pthread_mutex_lock(&log_mu);
    snprintf(log_role, sizeof log_role, "%s", role);
    pthread_mutex_unlock(&log_mu);
}

void pcs_log_set_level(pcs_log_level_t level)
{
    pthread_once(&log_once, log_init_once);
    pcs_log_level_ = (int)level;
}

static const char *sub_name(unsigned sub)
{
    for (size_t i = 0; i < sizeof sub_names / sizeof sub_names[0]; i++)
        if (sub == sub_names[i].bit)
            return sub_names[i].name;
    return "ALL";
}

void pcs_log_write(pcs_log_level_t level, unsigned sub, const char *file, int line, const char *fmt,
                   ...)
{
    pthread_once(&log_once, log_init_once);
    static const char letters[] = "NEWIDT";
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (level <= PCS_LOG_WARN)
        pcs_set_error(PCS_ERR_INTERNAL, "%s", msg); /* status value unused: text only */
    if (pcs_log_level_ < (int)level)
        return;

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    char out[3200];
    int n;
    pthread_mutex_lock(&log_mu);
    if (log_json) {
        static const char *const names[] = {"none", "error", "warn", "info", "debug", "trace"};
        char esc[2200], role[160], host[160], job[160];
        pcs_utf8_trim_partial(msg); /* vsnprintf may have cut through a character */
        pcs_utf8_sanitize(msg);     /* a line a JSON parser accepts, whatever the message held */
        json_escape(msg, esc, sizeof esc);
        pcs_utf8_trim_partial(esc); /* a cut through a character when the message was cut */
        json_short(log_role, role, sizeof role);
        json_short(log_host, host, sizeof host);
        json_short(log_job, job, sizeof job);
        n = snprintf(out, sizeof out,
                     "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"level\":\"%s\","
                     "\"subsys\":\"%s\",\"host\":\"%s\",\"pid\":%d,\"tid\":%ld,\"role\":\"%s\","
                     "\"file\":\"%s\",\"line\":%d,\"msg\":\"%s\"",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, names[level], sub_name(sub), host,
                     (int)getpid(), (long)syscall(SYS_gettid), role, base, line, esc);
        if (n > 0 && (size_t)n < sizeof out - 200 && log_job[0])
            n += snprintf(out + n, sizeof out - (size_t)n, ",\"job\":\"%s\",\"rank\":%d", job,
                          log_rank);
        if (n > 0 && (size_t)n < sizeof out - 3)
            n += snprintf(out + n, sizeof out - (size_t)n, "}\n");
    } else if (level <= PCS_LOG_WARN)
        n = snprintf(out, sizeof out,
                     "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s:%d:%ld %s %c %s %s:%d %s\n",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, log_host, (int)getpid(),
                     (long)syscall(SYS_gettid), log_role, letters[level], sub_name(sub), base,
                     line, msg);
    else
        n = snprintf(out, sizeof out, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s:%d:%ld %s %c %s %s\n",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, log_host, (int)getpid(),
                     (long)syscall(SYS_gettid), log_role, letters[level], sub_name(sub), msg);
    if (n > (int)sizeof out - 1)
        n = (int)sizeof out - 1;
    fwrite(out, 1, (size_t)n, log_out);
    fflush(log_out);
    pthread_mutex_unlock(&log_mu);
}
