/* pcs-rpc-bench: control-plane load on a coordinator (STYLE.md B12, DESIGN.md §11). N simulated
 * workers register at once, then each keeps one Heartbeat in flight (closed loop) for T seconds;
 * the baseline, measured first in the same run at the same concurrency, is the health Check RPC
 * (an empty handler), so the table shows what the coordinator's own work costs on top of gRPC.
 * Load comes from a few client threads, each with one channel and many asynchronous calls in
 * flight on its own completion queue (pcs_rpc_async_*). Replies are checked (#wrong): unique
 * non-empty worker ids, the lease the coordinator announced.
 *   pcs-rpc-bench [-n 1000] [-t 5] [-j 2] [--coordinator ADDR] [--unix] [-F out.csv]
 * Without --coordinator it spawns <dir of this binary>/pcs-coordinator on 127.0.0.1:0. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "grpc/health/v1/health.pb-c.h"
#include "pcs/clock.h"
#include "pcs/log.h"
#include "pcs/rpc.h"
#include "pcs/v1/worker.pb-c.h"
#include "pcs/version.h"

typedef struct opts {
    int workers;
    double seconds;
    int threads;
    int call_timeout_ms;
    const char *coordinator;
    const char *csv;
    int unix_socket; /* spawn the coordinator on a unix: socket instead of 127.0.0.1:0 */
} opts_t;

/* PH_WARMUP is a short unreported health-check run that connects the channels. */
typedef enum { PH_WARMUP, PH_HEALTH, PH_REGISTER, PH_HEARTBEAT, PH_COUNT } phase_t;
static const char *const phase_names[PH_COUNT] = {"warmup", "health-check", "register",
                                                  "heartbeat"};

typedef struct sim_worker {
    int idx;
    uint64_t start_us;
    char worker_id[64];
    char secret[160]; /* its credential: each heartbeat carries it (pcs_rpc_async_start_as) */
    uint32_t lease_ms;
} sim_worker_t;

typedef struct lat_vec {
    uint32_t *v;
    size_t n, cap;
} lat_vec_t;

typedef struct phase_result {
    lat_vec_t lat;
    uint64_t calls, errors, wrong;
    char first_error[256];
} phase_result_t;

typedef struct thread_ctx {
    int id;
    const opts_t *o;
    const char *addr;
    sim_worker_t *w; /* this thread's workers */
    int nw;
    pthread_barrier_t *bar;
    phase_result_t res[PH_COUNT];
    double t_register_done_s; /* when this thread's last registration returned */
} thread_ctx_t;

static volatile sig_atomic_t interrupted;

static double now_s(void)
{
    return (double)pcs_now_us() * 1e-6;
}

static void lat_push(lat_vec_t *l, uint64_t us)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4096;
        uint32_t *p = realloc(l->v, nc * sizeof *p);
        if (!p)
            return;
        l->v = p;
        l->cap = nc;
    }
    l->v[l->n++] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
}

static void note_error(phase_result_t *r, const char *msg)
{
    r->errors++;
    if (!r->first_error[0])
        snprintf(r->first_error, sizeof r->first_error, "%s", msg);
}

// ---- per-phase load loops (one thread, one channel, many calls in flight) ----

static pcs_status_t start_call(pcs_rpc_async_t *a, phase_t ph, sim_worker_t *w, int timeout_ms)
{
    w->start_us = pcs_now_us();
    if (ph == PH_HEALTH || ph == PH_WARMUP) {
        Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
        return pcs_rpc_async_start(a, PCS_M_HEALTH_CHECK, &req.base,
                                   &grpc__health__v1__health_check_response__descriptor, timeout_ms,
                                   w);
    }
    if (ph == PH_REGISTER) {
        char identity[64];
        snprintf(identity, sizeof identity, "bench-%d-%d", (int)getpid(), w->idx);
        Pcs__V1__RegisterRequest req = PCS__V1__REGISTER_REQUEST__INIT;
        req.identity = identity;
        req.host = "bench";
        req.pid = (uint32_t)getpid();
        char *backends[] = {"gloo"};
        req.n_backends = 1;
        req.backends = backends;
        return pcs_rpc_async_start(a, PCS_M_REGISTER, &req.base,
                                   &pcs__v1__register_response__descriptor, timeout_ms, w);
    }
    Pcs__V1__HeartbeatRequest req = PCS__V1__HEARTBEAT_REQUEST__INIT;
    req.worker_id = w->worker_id;
    return pcs_rpc_async_start_as(a, w->secret, PCS_M_HEARTBEAT, &req.base,
                                  &pcs__v1__heartbeat_response__descriptor, timeout_ms, w);
}

/* Checks the reply; returns 1 if it is wrong. */
static int check_reply(phase_t ph, sim_worker_t *w, const ProtobufCMessage *m)
{
    if (ph == PH_HEALTH || ph == PH_WARMUP)
        return ((const Grpc__Health__V1__HealthCheckResponse *)m)->status !=
               GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
    if (ph == PH_REGISTER) {
        const Pcs__V1__RegisterResponse *r = (const void *)m;
        snprintf(w->worker_id, sizeof w->worker_id, "%s", r->worker_id);
        snprintf(w->secret, sizeof w->secret, "%s", r->worker_secret);
        w->lease_ms = r->lease_ms;
        return r->worker_id[0] == '\0' || r->worker_secret[0] == '\0' || r->lease_ms == 0 ||
               r->heartbeat_interval_ms == 0;
    }
    const Pcs__V1__HeartbeatResponse *r = (const void *)m;
    return r->lease_ms != w->lease_ms;
}

/* Closed loop: every worker keeps one call in flight; register runs each worker once. */
static void run_phase(thread_ctx_t *t, pcs_rpc_async_t *a, phase_t ph, double t_end)
{
    phase_result_t *r = &t->res[ph];
    const int once = ph == PH_REGISTER;
    for (int i = 0; i < t->nw; i++) {
        if (ph == PH_HEARTBEAT && !t->w[i].worker_id[0])
            continue; /* its registration failed */
        if (start_call(a, ph, &t->w[i], t->o->call_timeout_ms) != PCS_OK)
            note_error(r, pcs_last_error());
    }
    while (pcs_rpc_async_in_flight(a) > 0) {
        void *user;
        pcs_status_t cst;
        ProtobufCMessage *resp = NULL;
        pcs_status_t st = pcs_rpc_async_next(a, 1000, &user, &cst, &resp, NULL);
        if (st == PCS_ERR_TIMEOUT)
            continue;
        if (st != PCS_OK)
            break;
        sim_worker_t *w = user;
        uint64_t end = pcs_now_us();
        r->calls++;
        if (cst != PCS_OK) {
            note_error(r, pcs_last_error());
        } else {
            lat_push(&r->lat, end - w->start_us);
            r->wrong += (uint64_t)check_reply(ph, w, resp);
            protobuf_c_message_free_unpacked(resp, NULL);
        }
        if (once)
            t->t_register_done_s = now_s();
        else if (!interrupted && now_s() < t_end &&
                 start_call(a, ph, w, t->o->call_timeout_ms) != PCS_OK)
            note_error(r, pcs_last_error());
    }
}

/* Each phase starts on a barrier; the main thread sets the end time between barriers. */
static double phase_end_s;

static void *load_thread(void *arg)
{
    thread_ctx_t *t = arg;
    pcs_rpc_client_t *c = NULL;
    pcs_rpc_async_t *a = NULL;
    if (pcs_rpc_client_create(t->addr, &c) != PCS_OK || pcs_rpc_async_create(c, &a) != PCS_OK) {
        note_error(&t->res[PH_HEALTH], pcs_last_error());
    }
    for (int ph = 0; ph < PH_COUNT; ph++) {
        pthread_barrier_wait(t->bar); /* main sets phase_end_s, then releases us */
        pthread_barrier_wait(t->bar);
        if (a)
            run_phase(t, a, (phase_t)ph, phase_end_s);
        pthread_barrier_wait(t->bar); /* phase done */
    }
    pcs_rpc_async_destroy(a);
    pcs_rpc_client_destroy(c);
    return NULL;
}

// ---- coordinator process ----

static pid_t spawn_coordinator(const char *dir, int unix_socket, char *addr, size_t n)
{
    char listen[4200] = "127.0.0.1:0";
    if (unix_socket)
        snprintf(listen, sizeof listen, "unix:%s/coord.sock", dir);
    char exe[4000], bin[4100], port_file[4200], state[4200], logf[4200];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0)
        return -1;
    exe[len] = '\0';
    char *slash = strrchr(exe, '/');
    *slash = '\0';
    snprintf(bin, sizeof bin, "%s/pcs-coordinator", exe);
    snprintf(port_file, sizeof port_file, "%s/port", dir);
    snprintf(state, sizeof state, "%s", dir);
    snprintf(logf, sizeof logf, "%s/coordinator.log", dir);
    if (access(bin, X_OK) != 0) {
        fprintf(stderr,
                "pcs-rpc-bench: %s not found (build pcs-coordinator or pass "
                "--coordinator ADDR)\n",
                bin);
        return -1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        FILE *lf = freopen(logf, "w", stderr);
        (void)lf;
        setenv("PCS_LOG_LEVEL", "warn", 0);
        execl(bin, bin, "--listen", listen, "--port-file", port_file, "--state-dir", state,
              (char *)NULL);
        _exit(127);
    }
    if (pid < 0)
        return -1;
    for (int i = 0; i < 1000; i++) { /* up to 10 s */
        FILE *f = fopen(port_file, "r");
        int port = 0;
        if (f) {
            if (fscanf(f, "%d", &port) != 1)
                port = 0;
            fclose(f);
        }
        if (port > 0) {
            if (unix_socket)
                snprintf(addr, n, "%s", listen);
            else
                snprintf(addr, n, "127.0.0.1:%d", port);
            return pid;
        }
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            fprintf(stderr, "pcs-rpc-bench: pcs-coordinator exited early (log: %s)\n", logf);
            return -1;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    fprintf(stderr, "pcs-rpc-bench: no port file from pcs-coordinator after 10 s\n");
    return -1;
}

static void stop_coordinator(pid_t pid)
{
    if (pid <= 0)
        return;
    kill(pid, SIGTERM);
    for (int i = 0; i < 500; i++) {
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static void rmtree_shallow(const char *dir)
{
    const char *names[] = {"port",
                           "coordinator.log",
                           "coordinator.db",
                           "coordinator.db-wal",
                           "coordinator.db-shm",
                           "coord.sock"};
    char p[4200];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
}

// ---- report ----

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static double pct(const lat_vec_t *l, double q)
{
    if (!l->n)
        return 0.0;
    size_t i = (size_t)(q * (double)(l->n - 1) + 0.5);
    return l->v[i];
}

static void usage(void)
{
    fprintf(stderr, "usage: pcs-rpc-bench [-n WORKERS=1000] [-t SECONDS=5] [-j THREADS=2]\n"
                    "                     [--coordinator HOST:PORT | --unix] [--timeout-ms 10000]\n"
                    "                     [-F out.csv]\n");
}

static int parse_opts(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){.workers = 1000, .seconds = 5.0, .threads = 2, .call_timeout_ms = 10000};
    for (int i = 1; i < argc; i += 2) { /* every option takes one value */
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            exit(0);
        }
        if (!strcmp(a, "--unix")) { /* the only option without a value */
            o->unix_socket = 1;
            i--;
            continue;
        }
        if (!v) {
            fprintf(stderr, "pcs-rpc-bench: %s needs a value\n", a);
            return -1;
        }
        if (!strcmp(a, "-n") || !strcmp(a, "--workers"))
            o->workers = atoi(v);
        else if (!strcmp(a, "-t") || !strcmp(a, "--seconds"))
            o->seconds = atof(v);
        else if (!strcmp(a, "-j") || !strcmp(a, "--threads"))
            o->threads = atoi(v);
        else if (!strcmp(a, "--coordinator"))
            o->coordinator = v;
        else if (!strcmp(a, "--timeout-ms"))
            o->call_timeout_ms = atoi(v);
        else if (!strcmp(a, "-F"))
            o->csv = v;
        else {
            fprintf(stderr, "pcs-rpc-bench: unknown option %s\n", a);
            return -1;
        }
    }
    if (o->workers < 1 || o->workers > 1000000 || o->threads < 1 || o->threads > 256 ||
        o->seconds <= 0 || o->call_timeout_ms < 1) {
        fprintf(stderr, "pcs-rpc-bench: -n 1..1000000, -j 1..256, -t > 0, --timeout-ms > 0\n");
        return -1;
    }
    if (o->threads > o->workers)
        o->threads = o->workers;
    return 0;
}

static void on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

int main(int argc, char **argv)
{
    opts_t o;
    if (parse_opts(argc, argv, &o) != 0) {
        usage();
        return 2;
    }
    pcs_log_init(PCS_LOG_WARN);
    signal(SIGINT, on_signal);
    signal(SIGPIPE, SIG_IGN);

    char addr[256] = "";
    char dir[4096] = "";
    pid_t coord = -1;
    if (o.coordinator) {
        snprintf(addr, sizeof addr, "%s", o.coordinator);
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/pcs-rpc-bench-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(dir)) {
            perror("mkdtemp");
            return 1;
        }
        coord = spawn_coordinator(dir, o.unix_socket, addr, sizeof addr);
        if (coord < 0) {
            rmtree_shallow(dir);
            return 1;
        }
    }

    char cmd[1024] = "";
    for (int i = 0; i < argc; i++) {
        if (i)
            strncat(cmd, " ", sizeof cmd - strlen(cmd) - 1);
        strncat(cmd, argv[i], sizeof cmd - strlen(cmd) - 1);
    }
    char when[64], cpu[256];
    time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    pcs_bench_cpu_model(cpu, sizeof cpu);
    printf("# pcs-rpc-bench  git %s  %s  cmd: %s\n", PCS_GIT_SHA, when, cmd);
    printf("# machine: nproc %ld  cpu %s\n", sysconf(_SC_NPROCESSORS_ONLN), cpu);
    printf("# coordinator %s (%s)  transport %s insecure\n", addr,
           o.coordinator ? "given" : "spawned", strncmp(addr, "unix:", 5) == 0 ? "unix" : "tcp");
    printf("# workers %d  client threads %d (one channel each)  concurrency %d calls in flight  "
           "call timeout %d ms\n",
           o.workers, o.threads, o.workers, o.call_timeout_ms);
    printf("# payload: RegisterRequest ~50 B, HeartbeatRequest ~20 B, HealthCheckRequest 0 B; "
           "baseline = health Check (empty handler) at the same concurrency\n");

    int nt = o.threads;
    sim_worker_t *w = calloc((size_t)o.workers, sizeof *w);
    thread_ctx_t *t = calloc((size_t)nt, sizeof *t);
    pthread_t *th = calloc((size_t)nt, sizeof *th);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)nt + 1);
    for (int i = 0; i < o.workers; i++)
        w[i].idx = i;
    int per = o.workers / nt, extra = o.workers % nt, at = 0;
    for (int i = 0; i < nt; i++) {
        t[i].id = i;
        t[i].o = &o;
        t[i].addr = addr;
        t[i].bar = &bar;
        t[i].w = &w[at];
        t[i].nw = per + (i < extra);
        at += t[i].nw;
        pthread_create(&th[i], NULL, load_thread, &t[i]);
    }

    double phase_s[PH_COUNT] = {0};
    double register_all_s = 0;
    for (int ph = 0; ph < PH_COUNT; ph++) {
        pthread_barrier_wait(&bar);
        double t0 = now_s();
        phase_end_s = t0 + (ph == PH_REGISTER ? 0 : ph == PH_WARMUP ? 0.5 : o.seconds);
        pthread_barrier_wait(&bar);
        pthread_barrier_wait(&bar);
        phase_s[ph] = now_s() - t0;
        if (ph == PH_REGISTER) {
            double last = 0;
            for (int i = 0; i < nt; i++)
                if (t[i].t_register_done_s > last)
                    last = t[i].t_register_done_s;
            register_all_s = last > t0 ? last - t0 : phase_s[ph];
        }
    }
    for (int i = 0; i < nt; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);

    /* merge per-thread results */
    phase_result_t tot[PH_COUNT];
    memset(tot, 0, sizeof tot);
    for (int ph = 0; ph < PH_COUNT; ph++) {
        for (int i = 0; i < nt; i++) {
            phase_result_t *r = &t[i].res[ph];
            tot[ph].calls += r->calls;
            tot[ph].errors += r->errors;
            tot[ph].wrong += r->wrong;
            if (!tot[ph].first_error[0] && r->first_error[0])
                snprintf(tot[ph].first_error, sizeof tot[ph].first_error, "%s", r->first_error);
            for (size_t k = 0; k < r->lat.n; k++)
                lat_push(&tot[ph].lat, r->lat.v[k]);
            free(r->lat.v);
        }
        qsort(tot[ph].lat.v, tot[ph].lat.n, sizeof(uint32_t), cmp_u32);
    }
    /* registration ids must be unique */
    uint64_t dup = 0;
    {
        char **ids = calloc((size_t)o.workers, sizeof *ids);
        int n = 0;
        for (int i = 0; i < o.workers; i++)
            if (w[i].worker_id[0])
                ids[n++] = w[i].worker_id;
        qsort(ids, (size_t)n, sizeof *ids, (int (*)(const void *, const void *))strcmp);
        for (int i = 1; i < n; i++)
            dup += strcmp(ids[i - 1], ids[i]) == 0;
        free(ids);
    }
    tot[PH_REGISTER].wrong += dup;

    FILE *csv = o.csv ? fopen(o.csv, "w") : NULL;
    if (csv)
        fprintf(csv, "phase,calls,errors,wrong,time_s,qps,p50_us,p99_us,p999_us,max_us\n");
    printf("#        phase      calls   errors  #wrong     time        QPS      p50      p99     "
           "p999      max\n");
    printf("#                                              (s)      (1/s)     (us)     (us)     "
           "(us)     (us)\n");
    uint64_t bad = 0;
    double qps[PH_COUNT] = {0};
    for (int ph = PH_HEALTH; ph < PH_COUNT; ph++) {
        phase_result_t *r = &tot[ph];
        double secs = ph == PH_REGISTER ? register_all_s : phase_s[ph];
        qps[ph] = secs > 0 ? (double)(r->calls - r->errors) / secs : 0;
        double mx = r->lat.n ? r->lat.v[r->lat.n - 1] : 0;
        printf("  %12s %10llu %8llu %7llu %8.3f %10.0f %8.0f %8.0f %8.0f %8.0f\n", phase_names[ph],
               (unsigned long long)r->calls, (unsigned long long)r->errors,
               (unsigned long long)r->wrong, secs, qps[ph], pct(&r->lat, 0.50), pct(&r->lat, 0.99),
               pct(&r->lat, 0.999), mx);
        if (csv)
            fprintf(csv, "%s,%llu,%llu,%llu,%.6f,%.1f,%.0f,%.0f,%.0f,%.0f\n", phase_names[ph],
                    (unsigned long long)r->calls, (unsigned long long)r->errors,
                    (unsigned long long)r->wrong, secs, qps[ph], pct(&r->lat, 0.50),
                    pct(&r->lat, 0.99), pct(&r->lat, 0.999), mx);
        bad += r->errors + r->wrong;
        if (r->first_error[0])
            printf("# %s first error: %s\n", phase_names[ph], r->first_error);
    }
    if (csv)
        fclose(csv);
    uint64_t registered = tot[PH_REGISTER].calls - tot[PH_REGISTER].errors;
    printf("# registration: %llu of %d workers registered in %.1f ms (%.0f registrations/s)\n",
           (unsigned long long)registered, o.workers, register_all_s * 1e3, qps[PH_REGISTER]);
    printf("# heartbeats/s %.0f = %.2f x the health-check baseline (%.0f/s)\n", qps[PH_HEARTBEAT],
           qps[PH_HEALTH] > 0 ? qps[PH_HEARTBEAT] / qps[PH_HEALTH] : 0.0, qps[PH_HEALTH]);
    printf("# Errors and wrong replies : %llu %s\n", (unsigned long long)bad,
           bad == 0 && registered == (uint64_t)o.workers ? "OK" : "FAIL");

    for (int ph = 0; ph < PH_COUNT; ph++)
        free(tot[ph].lat.v);
    free(th);
    free(t);
    free(w);
    stop_coordinator(coord);
    if (coord > 0)
        rmtree_shallow(dir);
    return bad == 0 && registered == (uint64_t)o.workers ? 0 : 1;
}
