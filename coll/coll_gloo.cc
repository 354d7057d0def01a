// CPU collectives over Debian's libgloo (TCP transport) behind the extern "C" pcs_coll_ops_t
// vtable; the only C++ file outside kernels/*.cu. Rendezvous goes through the C pcs_kv_t store
// (coordinator KV or files). Every collective is written here as a ring over Gloo's unbound
// point-to-point buffers, so the reduction order is the documented one (coll.h), each wait knows
// which peer it waits for (errors name it), and abort() can wake every wait. Gloo's legacy
// ReduceScatterHalvingDoubling is NOT used: wrong offsets, and later ops on its context stall.
// When every rank of a communicator shares this host (same locality key, shm.h), the
// collectives run over shared memory instead (coll/shm.c, same reduction order); point-to-point
// stays on TCP. No C++ exception crosses the extern "C" boundary.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <unistd.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include "coll/coll.h"
#include "coll/shm.h"
#include "pcs/clock.h"
#include "pcs/cpu.h"
#include "pcs/log.h"

namespace
{

using ms = std::chrono::milliseconds;
using UBuf = gloo::transport::UnboundBuffer;

// Slot spaces (Gloo's own algorithms use prefixes 0x01..0x08 in the top byte).
constexpr uint64_t kCollSlot = 0xA0ull << 56;
constexpr uint64_t kP2PSlot = 0xA1ull << 56;

// The watchdog looks for failure notes of other ranks while a call has run this long.
constexpr uint64_t kWatchAfterMs = 200;
constexpr int kWatchPeriodMs = 100;

// ---- errors ----

// A failure while talking to one peer; `timeout` when no progress came in time.
struct PeerError : std::runtime_error {
    int peer;
    bool timeout;
    int reported_by; // >= 0: another rank's failure note named `peer`
    int fault;       // with reported_by: the note's PCS_COLL_FAULT_*
    PeerError(int p, bool t, const std::string &m, int by = -1, int f = PCS_COLL_FAULT_NONE)
        : std::runtime_error(m), peer(p), timeout(t), reported_by(by), fault(f)
    {
    }
};
struct Cancelled : std::runtime_error {
    Cancelled() : std::runtime_error("aborted") {}
};

bool looks_like_timeout(const char *what)
{
    return strstr(what, "Timed out") || strstr(what, "timed out") || strstr(what, "timeout");
}

// ---- the C KV store seen as a gloo::rendezvous::Store ----

class KvStore : public gloo::rendezvous::Store
{
  public:
    KvStore(pcs_kv_t *kv, std::string prefix, ms timeout)
        : kv_(kv), prefix_(std::move(prefix)), timeout_(timeout)
    {
    }

    void set(const std::string &key, const std::vector<char> &data) override
    {
        std::string k = prefix_ + key;
        if (pcs_kv_set(kv_, k.c_str(), data.data(), data.size()) != PCS_OK)
            throw std::runtime_error("rendezvous: KV set '" + k + "': " + pcs_last_error());
    }

    std::vector<char> get(const std::string &key) override
    {
        return fetch(key, timeout_);
    }

    void wait(const std::vector<std::string> &keys) override
    {
        wait(keys, timeout_);
    }

    void wait(const std::vector<std::string> &keys, const ms &timeout) override
    {
        auto deadline = std::chrono::steady_clock::now() + timeout;
        for (const auto &key : keys) {
            auto left = std::chrono::duration_cast<ms>(deadline - std::chrono::steady_clock::now());
            fetch(key, std::max(left, ms(0)));
        }
    }

  private:
    std::vector<char> fetch(const std::string &key, ms wait)
    {
        std::string k = prefix_ + key;
        void *val = nullptr;
        size_t len = 0;
        pcs_status_t rc = pcs_kv_get(kv_, k.c_str(), (int)wait.count(), &val, &len);
        if (rc != PCS_OK) {
            std::string msg = "rendezvous: KV key '" + k + "': " + pcs_last_error();
            throw PeerError(-1, rc == PCS_ERR_NOT_FOUND || rc == PCS_ERR_TIMEOUT, msg);
        }
        std::vector<char> out((char *)val, (char *)val + len);
        free(val);
        return out;
    }

    pcs_kv_t *kv_;
    std::string prefix_;
    ms timeout_;
};

// ---- the communicator ----

struct GlooComm;

// An unbound buffer registered with its communicator so that abort() can wake its waits.
class Buf
{
  public:
    Buf(GlooComm *g, void *ptr, size_t bytes);
    ~Buf();
    Buf(const Buf &) = delete;
    Buf &operator=(const Buf &) = delete;
    void send(int peer, uint64_t slot, size_t off, size_t n);
    void recv(int peer, uint64_t slot, size_t off, size_t n);
    void wait_send(int peer);
    void wait_recv(int peer);

  private:
    GlooComm *g_;
    std::unique_ptr<UBuf> b_;
};

struct QueuedOp {
    enum Kind { AG, RS, AR, BC, SEND, RECV } kind;
    const void *in;
    void *out;
    size_t count;
    pcs_dtype_t dt;
    pcs_coll_red_t red;
    int peer;
};

struct GlooComm {
    pcs_kv_t *kv = nullptr;
    std::string prefix;
    int rank = 0, size = 1;
    ms timeout{30000};
    std::shared_ptr<gloo::transport::Device> dev;
    std::shared_ptr<gloo::rendezvous::Context> ctx;
    uint64_t seq = 0; // collective sequence number: slot of the next collective
    uint32_t raw_tag = 1;

    std::mutex mu; // guards live, aborted, abort_reason, peer_*, noted, blamed*
    std::map<UBuf *, int> live; // registered buffers -> peer of their pending operation (-1: none)
    bool aborted = false;
    std::string abort_reason;
    int peer_failed = -1; // culprit named by another rank's failure note (watchdog)
    int peer_reporter = -1;
    int peer_fault = PCS_COLL_FAULT_NONE;
    std::string peer_msg;
    int blamed = -1; // the rank this communicator's failure is blamed on (pcs_coll_blame)
    int blamed_fault = PCS_COLL_FAULT_NONE;

    // Watchdog: Gloo does not fail an unbound send whose data was partly written when the peer
    // died (its TCP pair signals only bound buffers of queued writes), so such a send would wait
    // for the full timeout. While a call runs longer than kWatchAfterMs, this thread polls the
    // "fail/any" note that every failing rank leaves in the KV store and wakes the call.
    std::thread watchdog;
    std::mutex wmu;
    std::condition_variable wcv;
    bool wstop = false;
    std::atomic<uint64_t> op_start_ms{0};

    bool noted = false; // this rank already left its failure note (the first cause wins)

    bool in_group = false;
    std::vector<QueuedOp> queue;
    std::vector<char> tmp, acc; // scratch for the reductions

    pcs_shm_t *shm = nullptr; // collectives over shared memory (every rank on this host)
    std::string transport = "tcp";

    ~GlooComm()
    {
        pcs_shm_destroy(shm);
    }

    bool is_aborted()
    {
        std::lock_guard<std::mutex> lk(mu);
        return aborted;
    }
    uint64_t next_slot()
    {
        return kCollSlot | (seq++ & 0x00ffffffffffffffull);
    }
};

Buf::Buf(GlooComm *g, void *ptr, size_t bytes) : g_(g)
{
    b_ = g->ctx->createUnboundBuffer(ptr, bytes);
    std::lock_guard<std::mutex> lk(g->mu);
    if (g->aborted)
        throw Cancelled();
    if (g->peer_failed >= 0)
        throw PeerError(g->peer_failed, false, g->peer_msg, g->peer_reporter, g->peer_fault);
    g->live[b_.get()] = -1;
}

// Remember which peer the buffer's pending operation involves (for the watchdog).
static void set_pending(GlooComm *g, UBuf *b, int peer)
{
    std::lock_guard<std::mutex> lk(g->mu);
    g->live[b] = peer;
}

// A wait returned false: abort() or the watchdog woke it.
[[noreturn]] static void woken(GlooComm *g)
{
    std::lock_guard<std::mutex> lk(g->mu);
    if (!g->aborted && g->peer_failed >= 0)
        throw PeerError(g->peer_failed, false, g->peer_msg, g->peer_reporter, g->peer_fault);
    throw Cancelled();
}

Buf::~Buf()
{
    std::lock_guard<std::mutex> lk(g_->mu);
    g_->live.erase(b_.get());
}

void Buf::send(int peer, uint64_t slot, size_t off, size_t n)
{
    set_pending(g_, b_.get(), peer);
    try {
        b_->send(peer, slot, off, n);
    } catch (const std::exception &e) {
        throw PeerError(peer, looks_like_timeout(e.what()), e.what());
    }
}

void Buf::recv(int peer, uint64_t slot, size_t off, size_t n)
{
    set_pending(g_, b_.get(), peer);
    try {
        b_->recv(peer, slot, off, n);
    } catch (const std::exception &e) {
        throw PeerError(peer, looks_like_timeout(e.what()), e.what());
    }
}

void Buf::wait_send(int peer)
{
    bool ok;
    try {
        ok = b_->waitSend(nullptr, g_->timeout);
    } catch (const std::exception &e) {
        throw PeerError(peer, looks_like_timeout(e.what()), e.what());
    }
    if (!ok)
        woken(g_);
    set_pending(g_, b_.get(), -1);
}

void Buf::wait_recv(int peer)
{
    bool ok;
    try {
        ok = b_->waitRecv(nullptr, g_->timeout);
    } catch (const std::exception &e) {
        throw PeerError(peer, looks_like_timeout(e.what()), e.what());
    }
    if (!ok)
        woken(g_);
    set_pending(g_, b_.get(), -1);
}

// ---- failure reporting ----

// Key under which a rank leaves the cause of its failure, so that peers that only see its
// connection drop can name the rank that really failed.
std::string note_key(const GlooComm *g, int rank)
{
    return g->prefix + "fail/" + std::to_string(rank);
}

std::string any_note_key(const GlooComm *g)
{
    return g->prefix + "fail/any";
}

// `failure`: also publish under fail/any for the other ranks' watchdogs (an abort is local and
// only explains this rank's dropped connections).
// A note starts "<culprit>:<fault>" (PCS_COLL_FAULT_*); a note without ":<fault>" has none.
void write_note(GlooComm *g, int culprit, int fault, const std::string &msg, bool failure)
{
    {
        std::lock_guard<std::mutex> lk(g->mu);
        if (!g->kv || g->noted)
            return;
        g->noted = true;
    }
    std::string who = std::to_string(culprit) + ":" + std::to_string(fault);
    std::string v = who + "\n" + msg;
    (void)pcs_kv_set(g->kv, note_key(g, g->rank).c_str(), v.data(), v.size());
    if (failure && culprit >= 0) {
        std::string a = who + "\n" + std::to_string(g->rank) + "\n" + msg;
        (void)pcs_kv_set(g->kv, any_note_key(g).c_str(), a.data(), a.size());
    }
}

// "<culprit>[:<fault>]" at the start of a note
void parse_who(const std::string &v, int *culprit, int *fault)
{
    char *end = nullptr;
    *culprit = (int)strtol(v.c_str(), &end, 10);
    long f = end && *end == ':' ? strtol(end + 1, nullptr, 10) : (long)PCS_COLL_FAULT_NONE;
    *fault = f == PCS_COLL_FAULT_DIED || f == PCS_COLL_FAULT_SILENT ? (int)f : PCS_COLL_FAULT_NONE;
}

// Peer p dropped its connection: did it die, or did it give up because of someone else?
bool read_note(GlooComm *g, int p, int *culprit, int *fault, std::string *msg)
{
    if (!g->kv || p < 0)
        return false;
    void *val = nullptr;
    size_t len = 0;
    // Short wait: a rank that timed out has its connections closed by Gloo before it can write
    // its note. A dead peer costs this wait once, on the error path only.
    if (pcs_kv_get(g->kv, note_key(g, p).c_str(), 150, &val, &len) != PCS_OK)
        return false;
    std::string v((char *)val, len);
    free(val);
    size_t nl = v.find('\n');
    parse_who(v, culprit, fault);
    *msg = nl == std::string::npos ? v : v.substr(nl + 1);
    return true;
}

// ---- watchdog ----

void watchdog_loop(GlooComm *g)
{
    pcs_thread_name("pcs-coll-watch");
    std::unique_lock<std::mutex> wl(g->wmu);
    int period_ms = kWatchPeriodMs;
    while (!g->wstop) {
        g->wcv.wait_for(wl, ms(period_ms));
        uint64_t start = g->op_start_ms.load();
        if (g->wstop || start == 0 || pcs_now_ms() - start < kWatchAfterMs)
            continue;
        {
            std::lock_guard<std::mutex> lk(g->mu);
            if (g->aborted || g->peer_failed >= 0 || g->noted)
                continue;
        }
        void *val = nullptr;
        size_t len = 0;
        pcs_status_t rc = pcs_kv_get(g->kv, any_note_key(g).c_str(), 0, &val, &len);
        // An unreachable store (coordinator restarting) must not be polled 10 times a second.
        period_ms = rc == PCS_OK || rc == PCS_ERR_NOT_FOUND ? kWatchPeriodMs
                                                            : std::min(2000, period_ms * 2);
        if (rc != PCS_OK)
            continue;
        std::string v((char *)val, len);
        free(val);
        // "<culprit>\n<reporter>\n<message>"
        size_t a = v.find('\n'), b = a == std::string::npos ? a : v.find('\n', a + 1);
        if (b == std::string::npos)
            continue;
        int culprit, fault, reporter = atoi(v.c_str() + a + 1);
        parse_who(v, &culprit, &fault);
        if (reporter == g->rank)
            continue;
        std::lock_guard<std::mutex> lk(g->mu);
        if (g->aborted || g->peer_failed >= 0)
            continue;
        g->peer_failed = culprit;
        g->peer_reporter = reporter;
        g->peer_fault = fault;
        g->peer_msg = v.substr(b + 1);
        for (const auto &kv : g->live) {
            kv.first->abortWaitRecv();
            kv.first->abortWaitSend();
        }
    }
}

// Turn a caught failure into a status + message naming the peer, leave a note for the others
// and close every connection so that ranks blocked on us fail now instead of at their timeout.
pcs_status_t fail_peer(GlooComm *g, const char *op, const PeerError &e)
{
    if (g->is_aborted()) {
        std::lock_guard<std::mutex> lk(g->mu);
        return pcs_set_error(PCS_ERR_CANCELLED, "%s: aborted: %s", op, g->abort_reason.c_str());
    }
    pcs_status_t st;
    std::string msg;
    int culprit = e.peer, fault = PCS_COLL_FAULT_NONE;
    int ncul, nfault;
    std::string nmsg;
    if (e.peer < 0) {
        st = e.timeout ? PCS_ERR_TIMEOUT : PCS_ERR_REMOTE;
        msg = e.what();
    } else if (e.reported_by >= 0) {
        st = PCS_ERR_REMOTE;
        fault = e.fault;
        msg = "peer rank " + std::to_string(e.peer) + " failed (reported by rank " +
              std::to_string(e.reported_by) + ": " + e.what() + ")";
    } else if (read_note(g, e.peer, &ncul, &nfault, &nmsg)) {
        // The peer failed first and said why; its culprit is the root cause.
        st = PCS_ERR_REMOTE;
        culprit = ncul;
        fault = nfault;
        msg = "rank " + std::to_string(e.peer) + " gave up: " + nmsg;
    } else if (e.timeout) {
        st = PCS_ERR_TIMEOUT;
        fault = PCS_COLL_FAULT_SILENT;
        msg = "peer rank " + std::to_string(e.peer) + " made no progress within " +
              std::to_string(g->timeout.count()) + " ms (" + e.what() + ")";
    } else {
        st = PCS_ERR_REMOTE;
        fault = PCS_COLL_FAULT_DIED;
        msg = "peer rank " + std::to_string(e.peer) +
              " closed the connection (process died?): " + e.what();
    }
    {
        std::lock_guard<std::mutex> lk(g->mu);
        if (g->blamed < 0 && culprit >= 0 && culprit < g->size && fault != PCS_COLL_FAULT_NONE) {
            g->blamed = culprit;
            g->blamed_fault = fault;
        }
    }
    write_note(g, culprit, fault, msg, true);
    pcs_shm_leave(g->shm, 1);
    try {
        g->ctx->closeConnections();
    } catch (...) {
    }
    PCS_WARN(PCS_SUB_COLL, "%s on %s rank %d/%d failed: %s", op, g->prefix.c_str(), g->rank,
             g->size, msg.c_str());
    return pcs_set_error(st, "%s: %s", op, msg.c_str());
}

pcs_status_t fail_cancelled(GlooComm *g, const char *op)
{
    std::lock_guard<std::mutex> lk(g->mu);
    return pcs_set_error(PCS_ERR_CANCELLED, "%s: aborted: %s", op, g->abort_reason.c_str());
}

// Run `body`, mapping every exception to a status.
// Marks the call as running for the watchdog while in scope.
struct OpScope {
    GlooComm *g;
    explicit OpScope(GlooComm *gc) : g(gc)
    {
        g->op_start_ms.store(std::max<uint64_t>(1, pcs_now_ms()));
    }
    ~OpScope()
    {
        g->op_start_ms.store(0);
    }
};

template <typename F> pcs_status_t guarded(GlooComm *g, const char *op, F body)
{
    OpScope scope(g);
    try {
        body();
        return PCS_OK;
    } catch (const PeerError &e) {
        return fail_peer(g, op, e);
    } catch (const Cancelled &) {
        return fail_cancelled(g, op);
    } catch (const std::bad_alloc &) {
        return pcs_set_error(PCS_ERR_NOMEM, "%s: out of memory", op);
    } catch (const std::exception &e) {
        if (g->is_aborted())
            return fail_cancelled(g, op);
        return fail_peer(g, op, PeerError(-1, looks_like_timeout(e.what()), e.what()));
    } catch (...) {
        return pcs_set_error(PCS_ERR_INTERNAL, "%s: unknown C++ exception", op);
    }
}

// ---- the algorithms (throwing; called inside guarded) ----

inline int mod(int a, int n)
{
    return ((a % n) + n) % n;
}

char *grow(std::vector<char> &v, size_t n)
{
    if (v.size() < n)
        v.resize(n);
    return v.data();
}

// Each ring chunk travels in up to kMaxSegs segments of >= kSegBytes so that the receiver
// reduces segment j while segment j+1 is on the wire and forwards it at once (a pipelined
// ring). Both sides derive the same boundaries from the chunk size; the element-wise reduction
// order is unchanged.
constexpr size_t kSegBytes = 256 * 1024;
constexpr size_t kMaxSegs = 16;

int n_segments(size_t n, size_t es)
{
    size_t s = (n * es + kSegBytes - 1) / kSegBytes;
    return (int)std::max<size_t>(1, std::min(s, kMaxSegs));
}

// Ring all-gather of P chunks of `data` (chunk k = elements `chunk(k)`, chunk r already in place):
// at step s a rank receives chunk r-s from the left and, segment by segment as it arrives,
// forwards it to the right (pipelined like ring_reduce). Every receive is posted up front (the
// regions are disjoint), so data never waits for a receive to be posted: Gloo's TCP transport
// would otherwise add a ready-notification round trip per message.
template <typename ChunkFn> void ring_gather(GlooComm *g, char *data, size_t es, ChunkFn chunk)
{
    const int P = g->size, r = g->rank;
    const int right = mod(r + 1, P), left = mod(r - 1, P);
    const uint64_t slot = g->next_slot();
    std::vector<std::unique_ptr<Buf>> sends, recvs;
    size_t off, n, so, sn;
    for (int s = 1; s < P; s++) {
        chunk(mod(r - s, P), &off, &n);
        for (int j = 0, ns = n ? n_segments(n, es) : 0; j < ns; j++) {
            pcs_coll_chunk(n, ns, j, &so, &sn);
            recvs.emplace_back(new Buf(g, data + (off + so) * es, sn * es));
            recvs.back()->recv(left, slot, 0, sn * es);
        }
    }
    chunk(r, &off, &n);
    for (int j = 0, ns = n ? n_segments(n, es) : 0; j < ns; j++) {
        pcs_coll_chunk(n, ns, j, &so, &sn);
        sends.emplace_back(new Buf(g, data + (off + so) * es, sn * es));
        sends.back()->send(right, slot, 0, sn * es);
    }
    size_t ri = 0;
    for (int s = 1; s < P; s++) {
        chunk(mod(r - s, P), &off, &n);
        for (int j = 0, ns = n ? n_segments(n, es) : 0; j < ns; j++) {
            pcs_coll_chunk(n, ns, j, &so, &sn);
            recvs[ri++]->wait_recv(left);
            if (s < P - 1) {
                sends.emplace_back(new Buf(g, data + (off + so) * es, sn * es));
                sends.back()->send(right, slot, 0, sn * es);
            }
        }
    }
    for (auto &b : sends)
        b->wait_send(right);
}

void ring_all_gather(GlooComm *g, const void *in, void *out, size_t count, pcs_dtype_t dt)
{
    const size_t es = pcs_dtype_size(dt), bytes = count * es;
    const int P = g->size, r = g->rank;
    char *o = (char *)out;
    if (bytes == 0)
        return;
    if (in != o + (size_t)r * bytes)
        memmove(o + (size_t)r * bytes, in, bytes);
    if (P == 1)
        return;
    ring_gather(g, o, es, [count](int k, size_t *off, size_t *n) {
        *off = (size_t)k * count;
        *n = count;
    });
}

// Ring reduce-scatter with chunk k of `data` (k = 0..P-1, element range given by `chunk`)
// reduced along r+1, r+2, ..., r and left in `data` chunk r. `data` already holds this rank's
// prepared contribution. Used by all_reduce (in place); reduce_scatter has its out-of-place twin
// (ring_reduce_scatter).
template <typename ChunkFn>
void ring_reduce(GlooComm *g, char *data, size_t max_chunk, pcs_dtype_t dt, pcs_red_op_t op,
                 ChunkFn chunk)
{
    const int P = g->size, r = g->rank;
    const size_t es = pcs_dtype_size(dt);
    const int right = mod(r + 1, P), left = mod(r - 1, P);
    const uint64_t slot = g->next_slot();
    // Two receive areas: step s+1's receives are posted into one before step s is reduced out
    // of the other (see ring_gather for why receives should be posted early).
    char *tmp = grow(g->tmp, 2 * max_chunk * es);
    std::vector<std::unique_ptr<Buf>> sends, next_sends, recvs[2];
    size_t off, n, so, sn;
    auto post_recvs = [&](int s) {
        char *area = tmp + (size_t)(s % 2) * max_chunk * es;
        recvs[s % 2].clear();
        chunk(mod(r - s - 1, P), &off, &n);
        for (int j = 0, ns = n ? n_segments(n, es) : 0; j < ns; j++) {
            pcs_coll_chunk(n, ns, j, &so, &sn);
            recvs[s % 2].emplace_back(new Buf(g, area + so * es, sn * es));
            recvs[s % 2].back()->recv(left, slot, 0, sn * es);
        }
    };
    post_recvs(1);
    chunk(mod(r - 1, P), &off, &n);
    for (int j = 0, ns = n ? n_segments(n, es) : 0; j < ns; j++) {
        pcs_coll_chunk(n, ns, j, &so, &sn);
        sends.emplace_back(new Buf(g, data + (off + so) * es, sn * es));
        sends.back()->send(right, slot, 0, sn * es);
    }
    for (int s = 1; s < P; s++) {
        if (s + 1 < P)
            post_recvs(s + 1);
        char *area = tmp + (size_t)(s % 2) * max_chunk * es;
        chunk(mod(r - s - 1, P), &off, &n);
        for (int j = 0, ns = n ? n_segments(n, es) : 0; j < ns; j++) {
            pcs_coll_chunk(n, ns, j, &so, &sn);
            recvs[s % 2][(size_t)j]->wait_recv(left);
            pcs_coll_reduce_into(data + (off + so) * es, area + so * es, sn, dt, op);
            if (s < P - 1) {
                next_sends.emplace_back(new Buf(g, data + (off + so) * es, sn * es));
                next_sends.back()->send(right, slot, 0, sn * es);
            }
        }
        // The previous step's sends read another chunk, which nothing here writes any more.
        for (auto &b : sends)
            b->wait_send(right);
        sends.clear();
        sends.swap(next_sends);
    }
    for (auto &b : sends)
        b->wait_send(right);
}

// Direct reduce-scatter: every rank sends chunk k of its prepared input (`work`, P chunks of rc)
// straight to rank k and receives its own chunk from every peer into scratch, all transfers in
// flight at once (one hop per byte instead of P-1 dependent ring steps), then reduces them in the
// ring's order and operand order (coll.h): the bits equal ring_reduce's. The result is left in
// chunk `rank` of `work`. Costs (P-1) x rc elements of receive scratch.
void direct_reduce(GlooComm *g, char *work, size_t rc, pcs_dtype_t dt, pcs_red_op_t op)
{
    const int P = g->size, r = g->rank;
    const size_t es = pcs_dtype_size(dt), bytes = rc * es;
    const uint64_t slot = g->next_slot();
    char *tmp = grow(g->tmp, (size_t)(P - 1) * bytes); // area k-1: the chunk of rank r+k
    std::vector<std::unique_ptr<Buf>> recvs, sends;
    for (int k = 1; k < P; k++) {
        recvs.emplace_back(new Buf(g, tmp + (size_t)(k - 1) * bytes, bytes));
        recvs.back()->recv(mod(r + k, P), slot, 0, bytes);
    }
    for (int k = 1; k < P; k++) { // rank r-k is the one that waits for this rank longest
        int p = mod(r - k, P);
        sends.emplace_back(new Buf(g, work + (size_t)p * bytes, bytes));
        sends.back()->send(p, slot, 0, bytes);
    }
    for (int k = 1; k < P; k++) {
        recvs[(size_t)k - 1]->wait_recv(mod(r + k, P));
        if (k > 1) // acc (area 0, from r+1) = rnd(x[r+k] op acc)
            pcs_coll_reduce_acc(tmp, tmp + (size_t)(k - 1) * bytes, rc, dt, op);
    }
    pcs_coll_reduce_into(work + (size_t)r * bytes, tmp, rc, dt, op); // rnd(x[r] op acc)
    for (int k = 1; k < P; k++)
        sends[(size_t)k - 1]->wait_send(mod(r - k, P));
}

// Which reduce-scatter algorithm over TCP: PCS_COLL_RS_ALGO=direct picks the direct exchange,
// anything else the ring; every rank must see the same value (as with NCCL_ALGO). Measured over loopback at 3 and 4 ranks, 64 KB - 64 MB
// (docs/perf/coll.md), the ring was as fast or faster at every size, so it stays the default;
// the direct exchange is there for networks where P-1 flows at once beat a chain of hops.
bool use_direct_rs(int P)
{
    static const char *env = getenv("PCS_COLL_RS_ALGO");
    return P > 1 && env && strcmp(env, "direct") == 0;
}

// Ring reduce-scatter out of place (the order and operands of ring_reduce, so its bits): no
// prepared copy of the whole input. Step 0 sends chunk r-1 of the input (prepared into a chunk
// buffer only when a factor applies); step s reduces the arriving partial sum of chunk r-s-1 with
// this rank's contribution read from `in` and prepared on the way (pcs_coll_prepare_reduce) into
// one of two chunk buffers, which step s+1 forwards; the last step (chunk r) writes `out` with
// the post-divide applied. Scratch: two receive areas and two chunk buffers (was P chunks plus
// two). `out` may be chunk `rank` of `in` (in place); otherwise they do not overlap.
void ring_reduce_scatter(GlooComm *g, const char *in, char *out, size_t rc, pcs_dtype_t dt,
                         pcs_red_op_t op, double f_pre, double f_avg, double f_post)
{
    const int P = g->size, r = g->rank;
    const size_t es = pcs_dtype_size(dt), bytes = rc * es;
    const int right = mod(r + 1, P), left = mod(r - 1, P);
    const int ns = n_segments(rc, es);
    const uint64_t slot = g->next_slot();
    char *tmp = grow(g->tmp, 2 * bytes);  // receive areas, by step parity
    char *part = grow(g->acc, 2 * bytes); // partial sums, by step parity (and step 0's send)
    std::vector<std::unique_ptr<Buf>> sends, next_sends, recvs[2];
    size_t so, sn;
    auto post_recvs = [&](int s) {
        char *area = tmp + (size_t)(s % 2) * bytes;
        recvs[s % 2].clear();
        for (int j = 0; j < ns; j++) {
            pcs_coll_chunk(rc, ns, j, &so, &sn);
            recvs[s % 2].emplace_back(new Buf(g, area + so * es, sn * es));
            recvs[s % 2].back()->recv(left, slot, 0, sn * es);
        }
    };
    post_recvs(1);
    const char *first = in + (size_t)mod(r - 1, P) * bytes;
    if (f_pre != 1.0 || f_avg != 1.0) {
        pcs_coll_prepare(part, first, rc, dt, f_pre, f_avg);
        first = part;
    }
    for (int j = 0; j < ns; j++) {
        pcs_coll_chunk(rc, ns, j, &so, &sn);
        sends.emplace_back(new Buf(g, const_cast<char *>(first) + so * es, sn * es));
        sends.back()->send(right, slot, 0, sn * es);
    }
    for (int s = 1; s < P; s++) {
        if (s + 1 < P)
            post_recvs(s + 1);
        const bool last = s == P - 1;
        char *area = tmp + (size_t)(s % 2) * bytes;
        char *dst = last ? out : part + (size_t)(s % 2) * bytes;
        const char *mine = in + (size_t)mod(r - s - 1, P) * bytes;
        for (int j = 0; j < ns; j++) {
            pcs_coll_chunk(rc, ns, j, &so, &sn);
            recvs[s % 2][(size_t)j]->wait_recv(left);
            pcs_coll_prepare_reduce(dst + so * es, mine + so * es, area + so * es, sn, dt, op,
                                    f_pre, f_avg, last ? f_post : 1.0);
            if (!last) {
                next_sends.emplace_back(new Buf(g, dst + so * es, sn * es));
                next_sends.back()->send(right, slot, 0, sn * es);
            }
        }
        // The previous step's sends read the other chunk buffer (or the input), which step s+1
        // writes next: wait for them here.
        for (auto &b : sends)
            b->wait_send(right);
        sends.clear();
        sends.swap(next_sends);
    }
    for (auto &b : sends)
        b->wait_send(right);
}

void do_reduce_scatter(GlooComm *g, const void *in, void *out, size_t rc, pcs_dtype_t dt,
                       const pcs_coll_red_t *red)
{
    if (rc == 0)
        return;
    const int P = g->size;
    const size_t es = pcs_dtype_size(dt), bytes = rc * es;
    const double f_pre = pcs_coll_div_factor(red->pre_div, dt);
    const double f_avg = red->op == PCS_RED_AVG ? pcs_coll_avg_factor(P, dt) : 1.0;
    const double f_post = pcs_coll_div_factor(red->post_div, dt);
    const pcs_red_op_t op = red->op == PCS_RED_MAX ? PCS_RED_MAX : PCS_RED_SUM;
    if (P == 1) {
        pcs_coll_prepare(out, in, rc, dt, f_pre, f_avg);
        if (f_post != 1.0)
            pcs_coll_scale(out, out, rc, dt, f_post);
        return;
    }
    if (!use_direct_rs(P)) {
        ring_reduce_scatter(g, (const char *)in, (char *)out, rc, dt, op, f_pre, f_avg, f_post);
        return;
    }
    // The direct exchange sends every chunk of a prepared copy of the whole input; the result
    // lands in chunk `rank` of the copy.
    char *work = grow(g->acc, bytes * (size_t)P);
    pcs_coll_prepare(work, in, rc * (size_t)P, dt, f_pre, f_avg);
    direct_reduce(g, work, rc, dt, op);
    const char *mine = work + (size_t)g->rank * bytes;
    if (f_post != 1.0)
        pcs_coll_scale(out, mine, rc, dt, f_post);
    else
        memcpy(out, mine, bytes);
}

void do_all_reduce(GlooComm *g, const void *in, void *out, size_t count, pcs_dtype_t dt,
                   const pcs_coll_red_t *red)
{
    if (count == 0)
        return;
    const int P = g->size, r = g->rank;
    const size_t es = pcs_dtype_size(dt);
    const double f_pre = pcs_coll_div_factor(red->pre_div, dt);
    const double f_avg = red->op == PCS_RED_AVG ? pcs_coll_avg_factor(P, dt) : 1.0;
    const double f_post = pcs_coll_div_factor(red->post_div, dt);
    const pcs_red_op_t op = red->op == PCS_RED_MAX ? PCS_RED_MAX : PCS_RED_SUM;
    char *o = (char *)out;
    pcs_coll_prepare(o, in, count, dt, f_pre, f_avg);
    if (P == 1) {
        if (f_post != 1.0)
            pcs_coll_scale(o, o, count, dt, f_post);
        return;
    }
    size_t max_chunk, dummy;
    pcs_coll_chunk(count, P, 0, &dummy, &max_chunk);
    auto chunk = [count, P](int k, size_t *off, size_t *n) { pcs_coll_chunk(count, P, k, off, n); };
    ring_reduce(g, o, max_chunk, dt, op, chunk);
    size_t off, n;
    chunk(r, &off, &n);
    if (f_post != 1.0)
        pcs_coll_scale(o + off * es, o + off * es, n, dt, f_post);
    // All-gather the owned chunks (uneven sizes) along the same ring.
    ring_gather(g, o, es, chunk);
}

void do_broadcast(GlooComm *g, void *buf, size_t count, pcs_dtype_t dt, int root)
{
    const size_t bytes = count * pcs_dtype_size(dt);
    if (bytes == 0 || g->size == 1)
        return;
    const uint64_t slot = g->next_slot();
    if (g->rank != root) {
        Buf rb(g, buf, bytes);
        rb.recv(root, slot, 0, bytes);
        rb.wait_recv(root);
        return;
    }
    std::vector<std::unique_ptr<Buf>> bufs;
    for (int p = 0; p < g->size; p++) {
        if (p == root)
            continue;
        bufs.emplace_back(new Buf(g, buf, bytes));
        bufs.back()->send(p, slot, 0, bytes);
    }
    size_t i = 0;
    for (int p = 0; p < g->size; p++)
        if (p != root)
            bufs[i++]->wait_send(p);
}

// ---- shared memory: the same operations, failures mapped to the TCP path's errors ----

int shm_cancelled(void *arg)
{
    GlooComm *g = static_cast<GlooComm *>(arg);
    std::lock_guard<std::mutex> lk(g->mu);
    return g->aborted || g->peer_failed >= 0;
}

// What Buf's constructor checks before a TCP operation.
void shm_precheck(GlooComm *g)
{
    std::lock_guard<std::mutex> lk(g->mu);
    if (g->aborted)
        throw Cancelled();
    if (g->peer_failed >= 0)
        throw PeerError(g->peer_failed, false, g->peer_msg, g->peer_reporter, g->peer_fault);
}

void shm_result(GlooComm *g, pcs_status_t st, const pcs_shm_fail_t &f)
{
    if (st == PCS_OK)
        return;
    std::string msg = pcs_last_error();
    switch (f.fault) {
    case PCS_SHM_CANCELLED:
        woken(g);
    case PCS_SHM_SILENT:
        throw PeerError(f.peer, true, msg);
    case PCS_SHM_DIED:
    case PCS_SHM_LEFT:
        throw PeerError(f.peer, false, msg);
    default:
        throw std::runtime_error(msg);
    }
}

void all_gather(GlooComm *g, const void *in, void *out, size_t count, pcs_dtype_t dt)
{
    const size_t bytes = count * pcs_dtype_size(dt);
    if (!g->shm || bytes == 0) {
        ring_all_gather(g, in, out, count, dt);
        return;
    }
    shm_precheck(g);
    pcs_shm_fail_t f;
    shm_result(g, pcs_shm_all_gather(g->shm, in, out, bytes, &f), f);
}

void reduce_scatter(GlooComm *g, const void *in, void *out, size_t rc, pcs_dtype_t dt,
                    const pcs_coll_red_t *red)
{
    if (!g->shm || rc == 0) {
        do_reduce_scatter(g, in, out, rc, dt, red);
        return;
    }
    shm_precheck(g);
    pcs_shm_fail_t f;
    shm_result(g, pcs_shm_reduce_scatter(g->shm, in, out, rc, dt, red, &f), f);
}

void all_reduce(GlooComm *g, const void *in, void *out, size_t count, pcs_dtype_t dt,
                const pcs_coll_red_t *red)
{
    if (!g->shm || count == 0) {
        do_all_reduce(g, in, out, count, dt, red);
        return;
    }
    shm_precheck(g);
    pcs_shm_fail_t f;
    shm_result(g, pcs_shm_all_reduce(g->shm, in, out, count, dt, red, &f), f);
}

void broadcast(GlooComm *g, void *buf, size_t count, pcs_dtype_t dt, int root)
{
    const size_t bytes = count * pcs_dtype_size(dt);
    if (!g->shm || bytes == 0) {
        do_broadcast(g, buf, count, dt, root);
        return;
    }
    shm_precheck(g);
    pcs_shm_fail_t f;
    shm_result(g, pcs_shm_broadcast(g->shm, buf, bytes, root, &f), f);
}

void do_barrier(GlooComm *g)
{
    std::vector<float> tokens((size_t)g->size, 0.0f);
    float mine = 1.0f;
    all_gather(g, &mine, tokens.data(), 1, PCS_DTYPE_FP32);
}

// ---- vtable ----

GlooComm *G(void *impl)
{
    return static_cast<GlooComm *>(impl);
}

pcs_status_t queue_op(GlooComm *g, QueuedOp op)
{
    try {
        g->queue.push_back(op);
    } catch (...) {
        return pcs_set_error(PCS_ERR_NOMEM, "group: out of memory");
    }
    return PCS_OK;
}

extern "C" pcs_status_t g_all_gather(void *impl, const void *in, void *out, size_t count,
                                     pcs_dtype_t dt, pcs_coll_stream_t)
{
    GlooComm *g = G(impl);
    if (g->in_group)
        return queue_op(g, {QueuedOp::AG, in, out, count, dt, {}, 0});
    return guarded(g, "all_gather", [&] { all_gather(g, in, out, count, dt); });
}

extern "C" pcs_status_t g_reduce_scatter(void *impl, const void *in, void *out, size_t rc,
                                         pcs_dtype_t dt, const pcs_coll_red_t *red,
                                         pcs_coll_stream_t)
{
    GlooComm *g = G(impl);
    if (g->in_group)
        return queue_op(g, {QueuedOp::RS, in, out, rc, dt, *red, 0});
    return guarded(g, "reduce_scatter", [&] { reduce_scatter(g, in, out, rc, dt, red); });
}

extern "C" pcs_status_t g_all_reduce(void *impl, const void *in, void *out, size_t count,
                                     pcs_dtype_t dt, const pcs_coll_red_t *red, pcs_coll_stream_t)
{
    GlooComm *g = G(impl);
    if (g->in_group)
        return queue_op(g, {QueuedOp::AR, in, out, count, dt, *red, 0});
    return guarded(g, "all_reduce", [&] { all_reduce(g, in, out, count, dt, red); });
}

extern "C" pcs_status_t g_broadcast(void *impl, void *buf, size_t count, pcs_dtype_t dt, int root,
                                    pcs_coll_stream_t)
{
    GlooComm *g = G(impl);
    if (g->in_group)
        return queue_op(g, {QueuedOp::BC, nullptr, buf, count, dt, {}, root});
    return guarded(g, "broadcast", [&] { broadcast(g, buf, count, dt, root); });
}

extern "C" pcs_status_t g_send(void *impl, const void *buf, size_t count, pcs_dtype_t dt, int peer,
                               pcs_coll_stream_t)
{
    GlooComm *g = G(impl);
    if (g->in_group)
        return queue_op(g, {QueuedOp::SEND, buf, nullptr, count, dt, {}, peer});
    size_t bytes = count * pcs_dtype_size(dt);
    if (bytes == 0)
        return PCS_OK;
    return guarded(g, "send", [&] {
        Buf b(g, const_cast<void *>(buf), bytes);
        b.send(peer, kP2PSlot, 0, bytes);
        b.wait_send(peer);
    });
}

extern "C" pcs_status_t g_recv(void *impl, void *buf, size_t count, pcs_dtype_t dt, int peer,
                               pcs_coll_stream_t)
{
    GlooComm *g = G(impl);
    if (g->in_group)
        return queue_op(g, {QueuedOp::RECV, nullptr, buf, count, dt, {}, peer});
    size_t bytes = count * pcs_dtype_size(dt);
    if (bytes == 0)
        return PCS_OK;
    return guarded(g, "recv", [&] {
        Buf b(g, buf, bytes);
        b.recv(peer, kP2PSlot, 0, bytes);
        b.wait_recv(peer);
    });
}

extern "C" pcs_status_t g_barrier(void *impl)
{
    GlooComm *g = G(impl);
    return guarded(g, "barrier", [&] { do_barrier(g); });
}

extern "C" pcs_status_t g_group_start(void *impl)
{
    G(impl)->in_group = true;
    G(impl)->queue.clear();
    return PCS_OK;
}

// Post every send/recv of the group first, then run the collectives in order, then wait for the
// point-to-point operations: a pair can exchange both ways in one group without deadlock.
extern "C" pcs_status_t g_group_end(void *impl)
{
    GlooComm *g = G(impl);
    std::vector<QueuedOp> ops;
    ops.swap(g->queue);
    g->in_group = false;
    return guarded(g, "group", [&] {
        std::vector<std::unique_ptr<Buf>> p2p;
        std::vector<const QueuedOp *> p2p_ops;
        for (const auto &op : ops) {
            size_t bytes = op.count * pcs_dtype_size(op.dt);
            if ((op.kind != QueuedOp::SEND && op.kind != QueuedOp::RECV) || bytes == 0)
                continue;
            void *ptr = op.kind == QueuedOp::SEND ? const_cast<void *>(op.in) : op.out;
            p2p.emplace_back(new Buf(g, ptr, bytes));
            p2p_ops.push_back(&op);
            if (op.kind == QueuedOp::SEND)
                p2p.back()->send(op.peer, kP2PSlot, 0, bytes);
            else
                p2p.back()->recv(op.peer, kP2PSlot, 0, bytes);
        }
        for (const auto &op : ops) {
            switch (op.kind) {
            case QueuedOp::AG:
                all_gather(g, op.in, op.out, op.count, op.dt);
                break;
            case QueuedOp::RS:
                reduce_scatter(g, op.in, op.out, op.count, op.dt, &op.red);
                break;
            case QueuedOp::AR:
                all_reduce(g, op.in, op.out, op.count, op.dt, &op.red);
                break;
            case QueuedOp::BC:
                broadcast(g, op.out, op.count, op.dt, op.peer);
                break;
            default:
                break;
            }
        }
        for (size_t i = 0; i < p2p.size(); i++) {
            if (p2p_ops[i]->kind == QueuedOp::SEND)
                p2p[i]->wait_send(p2p_ops[i]->peer);
            else
                p2p[i]->wait_recv(p2p_ops[i]->peer);
        }
    });
}

extern "C" void g_abort(void *impl, const char *reason)
{
    GlooComm *g = G(impl);
    {
        std::lock_guard<std::mutex> lk(g->mu);
        if (g->aborted)
            return;
        g->aborted = true;
        g->abort_reason = reason;
        for (const auto &kv : g->live) {
            kv.first->abortWaitRecv();
            kv.first->abortWaitSend();
        }
    }
    write_note(g, g->rank, PCS_COLL_FAULT_NONE,
               std::string("rank ") + std::to_string(g->rank) + " aborted: " + reason, false);
    pcs_shm_leave(g->shm, 1);
    try {
        if (g->ctx)
            g->ctx->closeConnections();
    } catch (...) {
    }
}

void stop_watchdog(GlooComm *g)
{
    if (!g->watchdog.joinable())
        return;
    {
        std::lock_guard<std::mutex> wl(g->wmu);
        g->wstop = true;
    }
    g->wcv.notify_all();
    g->watchdog.join();
}

extern "C" int g_blame(void *impl, int *fault)
{
    GlooComm *g = G(impl);
    std::lock_guard<std::mutex> lk(g->mu);
    *fault = g->blamed_fault;
    return g->blamed;
}

extern "C" void g_destroy(void *impl)
{
    stop_watchdog(G(impl));
    delete G(impl);
}

// Decide, with every rank alike, whether this communicator's collectives run over shared
// memory: each rank publishes its locality key and its segment's name (or that it has none),
// maps the peers' segments when all keys are equal and all have one, publishes whether that
// worked, and removes its name from /dev/shm once everyone has answered. Any "no" keeps TCP. A
// rank that does not want shared memory (PCS_COLL_SHM=0, a TCP config) still answers: its peers
// may want it, and must learn that they cannot have it.
void setup_shm(GlooComm *g, const pcs_coll_config_t *cfg)
{
    const char *env = getenv("PCS_COLL_SHM");
    const int P = g->size, r = g->rank;
    std::unique_ptr<pcs_shm_t, void (*)(pcs_shm_t *)> s(nullptr, pcs_shm_destroy);
    std::string why;
    if (cfg->transport == PCS_COLL_TRANSPORT_TCP || (env && strcmp(env, "0") == 0)) {
        why = cfg->transport == PCS_COLL_TRANSPORT_TCP ? "TCP asked for" : "PCS_COLL_SHM=0";
    } else if (P > PCS_SHM_MAX_RANKS) {
        why = std::to_string(P) + " ranks";
    } else {
        pcs_shm_t *raw = nullptr;
        if (pcs_shm_create(r, P, (int)g->timeout.count(), &raw) == PCS_OK)
            s.reset(raw);
        else
            why = pcs_last_error();
    }
    char loc[512];
    pcs_shm_locality(loc, sizeof loc);
    KvStore store(g->kv, g->prefix + "shm/", g->timeout);
    std::string mine = std::string(s ? "1" : "0") + "\n" + loc + "\n" + (s ? pcs_shm_name(s.get()) : "");
    store.set("seg/" + std::to_string(r), std::vector<char>(mine.begin(), mine.end()));
    std::vector<std::string> names((size_t)P);
    bool ok = s != nullptr;
    for (int p = 0; p < P; p++) {
        std::vector<char> v = store.get("seg/" + std::to_string(p));
        std::string rec(v.begin(), v.end());
        size_t a = rec.find('\n'), b = a == std::string::npos ? a : rec.find('\n', a + 1);
        if (b == std::string::npos || rec[0] != '1') {
            if (ok)
                why = "rank " + std::to_string(p) + " has no segment or wants TCP";
            ok = false;
            continue;
        }
        if (rec.substr(a + 1, b - a - 1) != loc) {
            if (ok)
                why = "rank " + std::to_string(p) + " is on another host or namespace";
            ok = false;
        }
        names[(size_t)p] = rec.substr(b + 1);
    }
    for (int p = 0; ok && p < P; p++) {
        if (p != r && pcs_shm_attach(s.get(), p, names[(size_t)p].c_str()) != PCS_OK) {
            why = pcs_last_error();
            ok = false;
        }
    }
    std::string mapped = ok ? "1" : "0";
    store.set("mapped/" + std::to_string(r), std::vector<char>(mapped.begin(), mapped.end()));
    for (int p = 0; p < P; p++) {
        std::vector<char> v = store.get("mapped/" + std::to_string(p));
        if (v.empty() || v[0] != '1') {
            if (ok)
                why = "rank " + std::to_string(p) + " could not map the segments";
            ok = false;
        }
    }
    if (s)
        pcs_shm_unlink(s.get());
    if (!ok) {
        if (cfg->transport == PCS_COLL_TRANSPORT_TCP) /* pipeline channels: nothing to say */
            PCS_DEBUG(PCS_SUB_COLL, "%s rank %d/%d: collectives over TCP (%s)", g->prefix.c_str(),
                      r, P, why.c_str());
        else
            PCS_INFO(PCS_SUB_COLL, "%s rank %d/%d: collectives over TCP (no shared memory: %s)",
                     g->prefix.c_str(), r, P, why.c_str());
        return;
    }
    pcs_shm_set_cancel(s.get(), shm_cancelled, g);
    g->shm = s.release();
    g->transport = "shm";
    PCS_INFO(PCS_SUB_COLL, "%s rank %d/%d: collectives over shared memory", g->prefix.c_str(), r,
             P);
}

const pcs_coll_ops_t gloo_ops = {
    "gloo", g_all_gather, g_reduce_scatter, g_all_reduce, g_broadcast, g_send,
    g_recv, g_barrier,    g_group_start,    g_group_end,  g_abort,     g_destroy,
    g_blame,
};

} // namespace

// One Gloo TCP device (one listening socket, one event-loop thread) per address for all the
// communicators of a process: a worker has up to five and the pipeline's channels, each of which
// had its own loop thread. Gloo's device serves any number of contexts (pairs find theirs by
// sequence number). Keyed by the process too: a forked child must not reuse its parent's device,
// whose loop thread it does not have.
static std::shared_ptr<gloo::transport::Device> shared_device(
    const gloo::transport::tcp::attr &attr)
{
    static std::mutex mu;
    static std::map<std::string, std::weak_ptr<gloo::transport::Device>> devs;
    std::string key = std::to_string((long)getpid()) + "|" + attr.iface + "|" + attr.hostname;
    std::lock_guard<std::mutex> lk(mu);
    std::weak_ptr<gloo::transport::Device> &w = devs[key];
    if (auto d = w.lock())
        return d;
    auto d = gloo::transport::tcp::CreateDevice(attr);
    w = d;
    return d;
}

// Gloo's TCP pairs write with writev(2), which raises SIGPIPE when a peer has died; the default
// action would kill this rank instead of letting the write fail with EPIPE. Python (hence
// PyTorch) ignores SIGPIPE at startup; do the same unless the program installed a handler.
static void ignore_sigpipe()
{
    struct sigaction cur;
    if (sigaction(SIGPIPE, nullptr, &cur) == 0 && cur.sa_handler == SIG_DFL) {
        struct sigaction ign;
        memset(&ign, 0, sizeof ign);
        ign.sa_handler = SIG_IGN;
        sigemptyset(&ign.sa_mask);
        sigaction(SIGPIPE, &ign, nullptr);
    }
}

extern "C" pcs_status_t pcs_coll_gloo_create(const pcs_coll_config_t *cfg, const char *key_prefix,
                                             const pcs_coll_ops_t **ops, void **impl)
{
    GlooComm *g = nullptr;
    ignore_sigpipe();
    try {
        g = new GlooComm();
        g->kv = cfg->kv;
        g->prefix = key_prefix;
        g->rank = cfg->rank;
        g->size = cfg->size;
        g->timeout = ms(cfg->timeout_ms);
        gloo::transport::tcp::attr attr;
        if (cfg->iface && cfg->iface[0])
            attr.iface = cfg->iface;
        else
            attr.hostname = cfg->hostname && cfg->hostname[0] ? cfg->hostname : "127.0.0.1";
        g->dev = shared_device(attr);
        g->ctx = std::make_shared<gloo::rendezvous::Context>(cfg->rank, cfg->size);
        g->ctx->setTimeout(g->timeout);
        // A single rank never creates a buffer (every algorithm returns before), so it needs
        // no rendezvous and no store.
        if (cfg->size > 1) {
            KvStore store(cfg->kv, g->prefix + "gloo/", g->timeout);
            g->ctx->connectFullMesh(store, g->dev);
            setup_shm(g, cfg);
            g->watchdog = std::thread(watchdog_loop, g);
        }
    } catch (const PeerError &e) {
        delete g;
        return pcs_set_error(e.timeout ? PCS_ERR_TIMEOUT : PCS_ERR_REMOTE,
                             "gloo rendezvous of %s rank %d/%d: %s", key_prefix, cfg->rank,
                             cfg->size, e.what());
    } catch (const std::exception &e) {
        delete g;
        return pcs_set_error(looks_like_timeout(e.what()) ? PCS_ERR_TIMEOUT : PCS_ERR_REMOTE,
                             "gloo setup of %s rank %d/%d: %s", key_prefix, cfg->rank, cfg->size,
                             e.what());
    } catch (...) {
        delete g;
        return pcs_set_error(PCS_ERR_INTERNAL, "gloo setup: unknown C++ exception");
    }
    *ops = &gloo_ops;
    *impl = g;
    return PCS_OK;
}

// ---- raw Gloo calls for the benchmark's baseline (same context, no shim work) ----

static pcs_status_t raw_check(pcs_coll_t *c)
{
    if (!c || strcmp(pcs_coll_backend_name(c), "gloo") != 0 || pcs_coll_size(c) < 2)
        return pcs_set_error(PCS_ERR_UNSUPPORTED, "raw gloo calls need a gloo communicator of 2+ "
                                                  "ranks");
    return PCS_OK;
}

extern "C" pcs_status_t pcs_coll_gloo_raw_all_gather(pcs_coll_t *c, const void *in, void *out,
                                                     size_t bytes)
{
    PCS_CHECK(raw_check(c));
    GlooComm *g = G(pcs_coll_backend_impl(c));
    return guarded(g, "raw allgather", [&] {
        gloo::AllgatherOptions o(g->ctx);
        o.setInput(const_cast<uint8_t *>((const uint8_t *)in), bytes);
        o.setOutput((uint8_t *)out, bytes * (size_t)g->size);
        o.setTag(g->raw_tag++);
        o.setTimeout(g->timeout);
        gloo::allgather(o);
    });
}

extern "C" pcs_status_t pcs_coll_gloo_raw_all_reduce_f32(pcs_coll_t *c, float *buf, size_t count)
{
    PCS_CHECK(raw_check(c));
    GlooComm *g = G(pcs_coll_backend_impl(c));
    return guarded(g, "raw allreduce", [&] {
        gloo::AllreduceOptions o(g->ctx);
        o.setOutput(buf, count);
        o.setReduceFunction(
            static_cast<void (*)(void *, const void *, const void *, size_t)>(&gloo::sum<float>));
        o.setTag(g->raw_tag++);
        o.setTimeout(g->timeout);
        gloo::allreduce(o);
    });
}

extern "C" const char *pcs_coll_gloo_transport(const pcs_coll_t *c)
{
    if (!c || strcmp(pcs_coll_backend_name(c), "gloo") != 0)
        return nullptr;
    return G(pcs_coll_backend_impl(c))->transport.c_str();
}
