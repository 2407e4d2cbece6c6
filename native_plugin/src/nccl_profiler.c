/*
 * Railover beside stock NCCL: a profiler plugin (libnccl-profiler-railover.so).
 *
 * NCCL calls init once per communicator and startEvent/stopEvent around every
 * collective. From those this library tells the node's agent, over the same unix
 * socket and frame format as librailover_plugin.so:
 *   - COMMUNICATOR: each communicator (commId, rank, nranks), once per connection;
 *   - PROGRESS: ops_done per communicator, at most every RAILOVER_NCCL_PROGRESS_MS
 *     or when a function's count passes another RAILOVER_NCCL_PROGRESS_OPS;
 *   - STALL: a collective open for RAILOVER_NCCL_STALL_MS, once per collective.
 *
 * A collective's own stopEvent only says NCCL enqueued it. It is finished when
 * its kernel has finished on every channel, which NCCL reports as one KernelCh
 * event per channel (parent: the collective). NCCL announces the channels in
 * the collective's nChannels, except where it does not know them when it starts
 * the event: CollNet and multi-node NVLS collectives (and symmetric kernels'
 * later tasks) come with nChannels = 0 and still get one KernelCh child per
 * channel. So a collective holds one pending stop for itself and one per child
 * announced (at least one: a kernel runs on some channel), each KernelCh start
 * beyond those announced takes another, and every stop gives one back; the
 * last makes it done. A collective announced with no channels is therefore done
 * once its own stop and those of every child started so far have come, and at
 * least one child has. RAILOVER_NCCL_TRACK_KERNEL=0 asks for collectives only
 * and counts them done when enqueued.
 *
 * Handles carry the slot's generation (its low 16 bits, in the pointer's
 * unused top bits), so a stop or a KernelCh start that comes after its
 * collective was done cannot touch a later collective that reuses the slot.
 * A communicator's kernels run in order, so when a collective finishes, every
 * collective started before it on that communicator has too: the sender
 * closes those still open (their children never came, or never stopped) and
 * counts them done. What stays open for the stall time with nothing after it
 * finishing is a stall: a kernel that never started or never finished.
 *
 * The hot path (startEvent/stopEvent, on NCCL's host and proxy threads) takes no
 * lock, makes no syscall (not even a clock read) and allocates nothing: it claims
 * a preallocated event slot with one CAS, keeps a per-function high-water mark of
 * seqNumber + 1, and at most pushes a nudge into the lock-free ring. One
 * background thread per process owns the socket and does everything else; it
 * timestamps open collectives itself when it first sees them, which is what
 * makes stall detection free for the hot path.
 *
 * ops_done: NCCL numbers collectives per function within a communicator
 * (seqNumber of AllReduce and of AllGather each count from 0), so ops_done is the
 * sum over functions of the highest seqNumber + 1 seen done. For a job that
 * issues one function it is exactly seqNumber + 1. Every rank issues the same
 * collectives in the same order, so every rank reaches the same ops_done.
 */
#define _GNU_SOURCE /* ppoll, pipe2, MSG_NOSIGNAL */

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "glibc_compat.h"
#include "railover_nccl_abi.h"
#include "railover_wire.h"
#include "ring.h"

#define EXPORT __attribute__((visibility("default")))

#define DEFAULT_SOCKET "/run/railover/agent.sock"
#define MAX_FUNCS 16u      /* distinct collective functions per communicator */
#define NUDGE_RING 1024u
#define OUT_BUF_SIZE 65536u
#define MAX_FRAME (RAILOVER_WIRE_HEADER_SIZE + RAILOVER_WIRE_LARGEST_V1_PAYLOAD)
#define CLAIM_TRIES 4 /* slots tried before a start is dropped */
#define MAX_TICK_NS 10000000LL
#define DRAIN_NS 1000000000LL /* at the last finalize, time allowed to flush */
#define RECONNECT_MIN_NS 10000000LL
#define RECONNECT_MAX_NS 1000000000LL

/* ------------------------------------------------------------------ state */

typedef struct rvn_comm rvn_comm;

/* One collective's slot. `state` packs what the hot path changes, so one CAS
 * moves it all at once:
 *   bits 63..32  gen, bumped at every claim; its low 16 bits tag the handles
 *   bit  31      open: a collective holds the slot
 *   bit  30      busy: claimed, fields still being written (not yet open)
 *   bits 29..16  KernelCh children started (saturating)
 *   bits 15..0   stops still to come
 * seq, func, expect and ticket are written by the claimer before it opens the
 * slot (release) and not again until the slot is closed and claimed anew. */
typedef struct {
  _Alignas(RV_CACHE_LINE) _Atomic uint64_t state;
  _Atomic uint64_t seq;
  _Atomic uint64_t ticket; /* claim order within the communicator */
  _Atomic uint32_t func;
  _Atomic uint32_t expect; /* children announced: stops reserved for them */
  rvn_comm* comm;          /* fixed at init */
} rvn_event;

#define ST_GEN_SHIFT 32
#define ST_OPEN (UINT64_C(1) << 31)
#define ST_BUSY (UINT64_C(1) << 30)
#define ST_KIDS_SHIFT 16
#define ST_KIDS_MAX UINT64_C(0x3fff)
#define ST_PENDING_MAX UINT64_C(0xffff)
#define ST_GEN(s) ((s) >> ST_GEN_SHIFT)
#define ST_KIDS(s) (((s) >> ST_KIDS_SHIFT) & ST_KIDS_MAX)
#define ST_PENDING(s) ((s) & ST_PENDING_MAX)

/* A handle is its slot's address, the slot's generation (low 16 bits) in the
 * top 16 bits, and bit 0 set for a KernelCh child. User-space addresses on
 * x86-64 and AArch64 Linux fit in 48 bits (init refuses a pool that does not);
 * slots are cache-line aligned, so bit 0 is free. NCCL only stores handles and
 * compares them with NULL. */
#define TAG_SHIFT 48
#define TAG_MASK UINT64_C(0xffff)
#define ADDR_MASK ((UINT64_C(1) << TAG_SHIFT) - 1)
#define CHILD_TAG UINT64_C(1)
_Static_assert(sizeof(void*) == sizeof(uint64_t), "handles need 64-bit pointers");

/* Per collective function: its name (NCCL's static string) and stopped count. */
typedef struct {
  _Alignas(RV_CACHE_LINE) _Atomic(const char*) name;
  _Atomic uint64_t done;   /* highest seqNumber + 1 stopped */
  _Atomic uint64_t nudged; /* `done` when the sender was last nudged for it */
} rvn_func;

struct rvn_comm {
  uint64_t comm_id;
  uint32_t rank, nranks, n_nodes, slot;
  uint64_t created_ns; /* CLOCK_REALTIME */
  uint64_t progress_ops;
  int track_kernel; /* count a collective done when its kernel is, not when enqueued */
  void* rep; /* the process's reporter, which outlives every communicator */
  rvn_event* events;
  uint64_t event_mask;
  _Alignas(RV_CACHE_LINE) _Atomic uint64_t next_event;
  /* Highest ticket + 1 of a collective done: everything started before it is done too. */
  _Alignas(RV_CACHE_LINE) _Atomic uint64_t done_ticket;
  _Alignas(RV_CACHE_LINE) _Atomic uint64_t dropped_events; /* pool full or no function slot */
  _Atomic uint64_t late_events;    /* stops and KernelCh starts after their collective was done */
  _Atomic uint64_t implied_done;   /* closed by the sender: a later collective was done */
  rvn_func funcs[MAX_FUNCS];
  /* Sender thread only. */
  uint64_t announced_gen, progress_gen, sent_ops;
  int64_t sent_at;
  uint64_t* seen_gen; /* per event slot: the open gen last seen, when, and if reported */
  int64_t* seen_at;
  unsigned char* stalled;
  rvn_comm* next;
};

typedef struct {
  rv_ring nudges; /* stop paths -> sender: some function passed another M ops */
  pthread_t thread;
  int wake_fds[2];
  _Atomic int stop;
  pthread_mutex_t lock; /* comms and retired: init, finalize and the sender */
  rvn_comm* comms;
  rvn_comm* retired;
  _Atomic uint64_t nudges_dropped;

  /* Configuration, fixed at creation. */
  char socket_path[sizeof(((struct sockaddr_un*)0)->sun_path)];
  char host[RAILOVER_WIRE_NAME_LEN];
  char job[RAILOVER_WIRE_NAME_LEN];
  int64_t progress_ns, stall_ns, tick_ns;
  uint32_t pid;
  rvn_logger log;

  /* Sender thread only. */
  int fd;
  uint64_t conn_gen; /* bumped on every connection: re-announce, resend progress */
  int64_t next_connect, backoff, next_progress, next_scan;
  int quiet;
  unsigned char out[OUT_BUF_SIZE];
  uint32_t out_len, out_off;
} rvn_reporter;

typedef struct {
  uint64_t progress_ms, progress_ops, stall_ms, slots, track_kernel;
} rvn_config;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static rvn_reporter* g_rep;
static uint32_t g_refs, g_next_slot;

/* ---------------------------------------------------------------- helpers */

static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static uint64_t realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

#define LOG(rep, level, ...)                                                 \
  do {                                                                       \
    if ((rep)->log) (rep)->log((level), RVN_SUBSYS_INIT, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

static void put_name(char* dst, const char* src) {
  size_t n = src ? strnlen(src, RAILOVER_WIRE_NAME_LEN) : 0;
  if (n >= RAILOVER_WIRE_NAME_LEN) {
    n = RAILOVER_WIRE_NAME_LEN - 1;
    while (n > 0 && ((unsigned char)src[n] & 0xC0u) == 0x80u) n--; /* whole UTF-8 chars */
  }
  memset(dst, 0, RAILOVER_WIRE_NAME_LEN);
  if (n) memcpy(dst, src, n);
}

/* Reads a decimal env var into *out, within [lo, hi]; unset keeps *out. */
static int env_u64(const char* name, uint64_t lo, uint64_t hi, uint64_t* out, rvn_logger log) {
  const char* v = getenv(name);
  if (v == NULL || *v == '\0') return 0;
  char* end = NULL;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (errno != 0 || *end != '\0' || v[0] == '-' || x < lo || x > hi) {
    if (log)
      log(RVN_LOG_WARN, RVN_SUBSYS_INIT, __FILE__, __LINE__,
          "railover: %s=\"%.64s\" is not an integer in %llu..%llu; profiler plugin disabled",
          name, v, (unsigned long long)lo, (unsigned long long)hi);
    return -1;
  }
  *out = x;
  return 0;
}

static int read_config(rvn_config* cfg, rvn_logger log) {
  cfg->progress_ms = 100;
  cfg->progress_ops = 1000;
  cfg->stall_ms = 10000; /* well under NCCL's own ~30 s watchdogs */
  cfg->slots = 1024;
  cfg->track_kernel = 1;
  if (env_u64("RAILOVER_NCCL_TRACK_KERNEL", 0, 1, &cfg->track_kernel, log) ||
      env_u64("RAILOVER_NCCL_PROGRESS_MS", 1, 60000, &cfg->progress_ms, log) ||
      env_u64("RAILOVER_NCCL_PROGRESS_OPS", 0, 1ULL << 32, &cfg->progress_ops, log) ||
      env_u64("RAILOVER_NCCL_STALL_MS", 0, 600000, &cfg->stall_ms, log) ||
      env_u64("RAILOVER_NCCL_EVENT_SLOTS", 16, 65536, &cfg->slots, log))
    return -1;
  return 0;
}

/* ------------------------------------------------------------- hot path */

/* Index of `name` in the communicator's function table, claiming a free entry
 * the first time a function is seen. NCCL passes static strings, so the pointer
 * compare almost always decides; contents are compared only when it fails. */
static inline int func_slot(rvn_comm* c, const char* name) {
  for (uint32_t i = 0; i < MAX_FUNCS; i++) {
    const char* n = atomic_load_explicit(&c->funcs[i].name, memory_order_acquire);
    if (n == name) return (int)i;
    if (n != NULL) continue;
    for (uint32_t j = 0; j < i; j++)
      if (strcmp(atomic_load_explicit(&c->funcs[j].name, memory_order_acquire), name) == 0)
        return (int)j;
    const char* expected = NULL;
    if (atomic_compare_exchange_strong_explicit(&c->funcs[i].name, &expected, name,
                                                memory_order_acq_rel, memory_order_acquire))
      return (int)i;
    if (strcmp(expected, name) == 0) return (int)i;
  }
  for (uint32_t j = 0; j < MAX_FUNCS; j++)
    if (strcmp(atomic_load_explicit(&c->funcs[j].name, memory_order_acquire), name) == 0)
      return (int)j;
  return -1;
}

static inline void* make_handle(rvn_event* e, uint64_t gen, uint64_t child) {
  return (void*)(uintptr_t)((uint64_t)(uintptr_t)e | ((gen & TAG_MASK) << TAG_SHIFT) | child);
}

static inline rvn_event* handle_event(void* handle) {
  return (rvn_event*)(uintptr_t)((uint64_t)(uintptr_t)handle & ADDR_MASK & ~CHILD_TAG);
}

/* Whether `s` is the open collective `handle` was given for. */
static inline int handle_matches(uint64_t s, void* handle) {
  return (s & ST_OPEN) && (ST_GEN(s) & TAG_MASK) == ((uint64_t)(uintptr_t)handle >> TAG_SHIFT);
}

static inline uint64_t atomic_max(_Atomic uint64_t* v, uint64_t x) {
  uint64_t cur = atomic_load_explicit(v, memory_order_relaxed);
  while (cur < x && !atomic_compare_exchange_weak_explicit(v, &cur, x, memory_order_relaxed,
                                                           memory_order_relaxed)) {
  }
  return cur;
}

/* A collective is done: its function's count and the communicator's ticket
 * move up, and the sender is nudged when the count passed another M. */
static void collective_done(rvn_comm* c, uint32_t f, uint64_t seq, uint64_t ticket) {
  atomic_max(&c->done_ticket, ticket + 1);
  if (f >= MAX_FUNCS) return;
  rvn_func* fn = &c->funcs[f];
  uint64_t done = seq + 1;
  atomic_max(&fn->done, done);
  if (c->progress_ops) {
    uint64_t last = atomic_load_explicit(&fn->nudged, memory_order_relaxed);
    if (done >= last + c->progress_ops &&
        atomic_compare_exchange_strong_explicit(&fn->nudged, &last, done, memory_order_relaxed,
                                                memory_order_relaxed)) {
      rvn_reporter* rep = c->rep;
      uint64_t pos;
      uint32_t* slot = rv_ring_reserve(&rep->nudges, &pos);
      if (slot) {
        *slot = c->slot;
        rv_ring_commit(&rep->nudges, pos);
      } else {
        atomic_fetch_add_explicit(&rep->nudges_dropped, 1, memory_order_relaxed);
      }
    }
  }
}

static inline rvn_result start_coll(rvn_comm* c, void** handle, uint64_t seq, const char* func,
                                    uint8_t n_channels) {
  int f = func_slot(c, func ? func : "?");
  uint64_t ticket = atomic_fetch_add_explicit(&c->next_event, 1, memory_order_relaxed);
  /* Stops reserved for children: those announced, and at least one when
   * KernelCh events are asked for (nChannels = 0 says "not known", not "none"). */
  uint32_t expect = !c->track_kernel ? 0u : n_channels ? n_channels : 1u;
  for (int t = 0; f >= 0 && t < CLAIM_TRIES; t++) {
    rvn_event* e = &c->events[(ticket + (uint64_t)t) & c->event_mask];
    uint64_t s = atomic_load_explicit(&e->state, memory_order_relaxed);
    if (s & (ST_OPEN | ST_BUSY)) continue;
    uint64_t gen = ST_GEN(s) + 1;
    if (!atomic_compare_exchange_strong_explicit(&e->state, &s, (gen << ST_GEN_SHIFT) | ST_BUSY,
                                                 memory_order_acquire, memory_order_relaxed))
      continue;
    atomic_store_explicit(&e->seq, seq, memory_order_relaxed);
    atomic_store_explicit(&e->ticket, ticket, memory_order_relaxed);
    atomic_store_explicit(&e->func, (uint32_t)f, memory_order_relaxed);
    atomic_store_explicit(&e->expect, expect, memory_order_relaxed);
    /* NCCL hands the handle to its children only after this returns. */
    atomic_store_explicit(&e->state, (gen << ST_GEN_SHIFT) | ST_OPEN | (1u + expect),
                          memory_order_release);
    *handle = make_handle(e, gen, 0);
    return RVN_SUCCESS;
  }
  /* Every slot tried is held by a collective still open: NCCL gets no handle
   * and will not stop this one; ops_done catches up at the next stop. */
  atomic_fetch_add_explicit(&c->dropped_events, 1, memory_order_relaxed);
  return RVN_SUCCESS;
}

/* A KernelCh event takes one of its collective's stops: a reserved one while
 * children announced are still to start, else a new one. A parent already
 * done (or not ours) gets no child. */
static inline rvn_result start_child(void** handle, void* parent) {
  if (parent == NULL || ((uintptr_t)parent & CHILD_TAG)) return RVN_SUCCESS;
  rvn_event* e = handle_event(parent);
  uint64_t s = atomic_load_explicit(&e->state, memory_order_acquire);
  for (;;) {
    if (!handle_matches(s, parent) ||
        (ST_KIDS(s) >= atomic_load_explicit(&e->expect, memory_order_relaxed) &&
         ST_PENDING(s) == ST_PENDING_MAX)) {
      atomic_fetch_add_explicit(&e->comm->late_events, 1, memory_order_relaxed);
      return RVN_SUCCESS;
    }
    uint64_t next = s;
    if (ST_KIDS(s) >= atomic_load_explicit(&e->expect, memory_order_relaxed)) next += 1;
    if (ST_KIDS(s) < ST_KIDS_MAX) next += UINT64_C(1) << ST_KIDS_SHIFT;
    if (atomic_compare_exchange_weak_explicit(&e->state, &s, next, memory_order_acq_rel,
                                              memory_order_acquire))
      break;
  }
  *handle = make_handle(e, ST_GEN(s), CHILD_TAG);
  return RVN_SUCCESS;
}

static rvn_result start_event_v5(void* context, void** handle, rvn_descr_v5* d) {
  *handle = NULL;
  if (context == NULL || d == NULL) return RVN_SUCCESS;
  if (d->type == RVN_PROFILE_KERNEL_CH) return start_child(handle, d->parent_obj);
  if (d->type != RVN_PROFILE_COLL) return RVN_SUCCESS;
  return start_coll(context, handle, d->u.coll.seq_number, d->u.coll.func, d->u.coll.n_channels);
}

static rvn_result start_event_v4(void* context, void** handle, rvn_descr_v4* d) {
  *handle = NULL;
  if (context == NULL || d == NULL) return RVN_SUCCESS;
  if (d->type == RVN_PROFILE_KERNEL_CH) return start_child(handle, d->parent_obj);
  if (d->type != RVN_PROFILE_COLL) return RVN_SUCCESS;
  return start_coll(context, handle, d->u.coll.seq_number, d->u.coll.func, d->u.coll.n_channels);
}

/* Gives back one of the collective's pending stops; the last makes it done.
 * A stop for a collective already done (closed by the sender, or the slot
 * since reused) changes nothing. */
static rvn_result stop_event(void* handle) {
  if (handle == NULL) return RVN_SUCCESS;
  rvn_event* e = handle_event(handle);
  uint64_t s = atomic_load_explicit(&e->state, memory_order_acquire);
  for (;;) {
    if (!handle_matches(s, handle) || ST_PENDING(s) == 0) {
      atomic_fetch_add_explicit(&e->comm->late_events, 1, memory_order_relaxed);
      return RVN_SUCCESS;
    }
    if (ST_PENDING(s) > 1) {
      if (atomic_compare_exchange_weak_explicit(&e->state, &s, s - 1, memory_order_acq_rel,
                                                memory_order_acquire))
        return RVN_SUCCESS;
      continue;
    }
    /* The last stop: read the collective before the slot can be claimed again. */
    uint64_t seq = atomic_load_explicit(&e->seq, memory_order_relaxed);
    uint64_t ticket = atomic_load_explicit(&e->ticket, memory_order_relaxed);
    uint32_t f = atomic_load_explicit(&e->func, memory_order_relaxed);
    if (atomic_compare_exchange_weak_explicit(&e->state, &s, ST_GEN(s) << ST_GEN_SHIFT,
                                              memory_order_acq_rel, memory_order_acquire)) {
      collective_done(e->comm, f, seq, ticket);
      return RVN_SUCCESS;
    }
  }
}

static rvn_result record_event_state(void* handle, int state, void* args) {
  (void)handle;
  (void)state;
  (void)args;
  return RVN_SUCCESS; /* a KernelCh's stop state carries only a GPU timestamp */
}

/* ---------------------------------------------------------- sender thread */

static uint64_t comm_ops_done(rvn_comm* c) {
  uint64_t sum = 0;
  for (uint32_t i = 0; i < MAX_FUNCS; i++)
    sum += atomic_load_explicit(&c->funcs[i].done, memory_order_relaxed);
  return sum;
}

/* Appends one frame to the output buffer; 0 when it does not fit now. */
static int out_frame(rvn_reporter* r, uint16_t type, const void* payload, uint32_t len) {
  if (r->fd < 0 || r->out_len + RAILOVER_WIRE_HEADER_SIZE + len > OUT_BUF_SIZE) return 0;
  /* Version 1: its HELLO names no job (it takes no commands); the rest is version 1 too. */
  railover_wire_header h = {RAILOVER_WIRE_MAGIC, RAILOVER_WIRE_VERSION_MIN, type, len, 0};
  memcpy(r->out + r->out_len, &h, sizeof(h));
  memcpy(r->out + r->out_len + sizeof(h), payload, len);
  r->out_len += (uint32_t)sizeof(h) + len;
  return 1;
}

static void announce(rvn_reporter* r, rvn_comm* c) {
  if (c->announced_gen == r->conn_gen) return;
  railover_wire_communicator m;
  memset(&m, 0, sizeof(m));
  m.comm_id = c->comm_id;
  m.timestamp_ns = c->created_ns;
  m.rank = c->rank;
  m.nranks = c->nranks;
  m.n_nodes = c->n_nodes;
  m.pid = r->pid;
  put_name(m.host, r->host);
  put_name(m.job, r->job);
  if (out_frame(r, RAILOVER_MSG_COMMUNICATOR, &m, sizeof(m))) c->announced_gen = r->conn_gen;
}

static void send_progress(rvn_reporter* r, rvn_comm* c, int64_t now, int force) {
  if (c->announced_gen != r->conn_gen) return; /* the agent hears of the comm first */
  uint64_t ops = comm_ops_done(c);
  int fresh = c->progress_gen != r->conn_gen;
  if (!fresh && ops == c->sent_ops) return;
  int due = force || fresh || now - c->sent_at >= r->progress_ns ||
            (c->progress_ops && ops - c->sent_ops >= c->progress_ops);
  if (!due) return;
  railover_wire_progress m = {c->comm_id, ops, realtime_ns(), c->rank, r->pid};
  if (out_frame(r, RAILOVER_MSG_PROGRESS, &m, sizeof(m))) {
    c->progress_gen = r->conn_gen;
    c->sent_ops = ops;
    c->sent_at = now;
  }
}

/* Closes open collectives started before one that is done (they are done
 * too: a communicator's kernels run in order) and reports, once, those open
 * for the stall time with nothing after them done. The sender, not the hot
 * path, timestamps each open generation the first time it sees it, so a stall
 * is reported between stall_ns and stall_ns + tick after the start. */
static void scan_stalls(rvn_reporter* r, rvn_comm* c, int64_t now) {
  for (uint64_t i = 0; i <= c->event_mask; i++) {
    rvn_event* e = &c->events[i];
    uint64_t s = atomic_load_explicit(&e->state, memory_order_acquire);
    if (!(s & ST_OPEN)) continue;
    uint64_t seq = atomic_load_explicit(&e->seq, memory_order_relaxed);
    uint64_t ticket = atomic_load_explicit(&e->ticket, memory_order_relaxed);
    uint32_t f = atomic_load_explicit(&e->func, memory_order_relaxed);
    if (ticket < atomic_load_explicit(&c->done_ticket, memory_order_relaxed)) {
      /* Fails, harmlessly, when a stop or a child start got there first:
       * the next scan sees the slot again. */
      if (atomic_compare_exchange_strong_explicit(&e->state, &s, ST_GEN(s) << ST_GEN_SHIFT,
                                                  memory_order_acq_rel, memory_order_relaxed)) {
        atomic_fetch_add_explicit(&c->implied_done, 1, memory_order_relaxed);
        collective_done(c, f, seq, ticket);
      }
      continue;
    }
    if (r->stall_ns <= 0) continue;
    uint64_t g = ST_GEN(s);
    if (g != c->seen_gen[i]) {
      c->seen_gen[i] = g;
      c->seen_at[i] = now;
      c->stalled[i] = 0;
      continue;
    }
    if (c->stalled[i] || now - c->seen_at[i] < r->stall_ns || r->fd < 0) continue;
    if (c->announced_gen != r->conn_gen) continue;
    railover_wire_stall m;
    memset(&m, 0, sizeof(m));
    m.comm_id = c->comm_id;
    m.seq_number = seq;
    m.timestamp_ns = realtime_ns();
    m.open_ns = (uint64_t)(now - c->seen_at[i]);
    m.rank = c->rank;
    m.pid = r->pid;
    put_name(m.func, atomic_load_explicit(&c->funcs[f < MAX_FUNCS ? f : 0].name,
                                          memory_order_acquire));
    if (out_frame(r, RAILOVER_MSG_STALL, &m, sizeof(m))) {
      c->stalled[i] = 1;
      LOG(r, RVN_LOG_WARN, "railover: %s seq %llu of comm %016llx rank %u open for %lld ms",
          m.func, (unsigned long long)seq, (unsigned long long)c->comm_id, c->rank,
          (long long)(m.open_ns / 1000000u));
    }
  }
}

static void free_comm(rvn_comm* c) {
  free(c->events);
  free(c->seen_gen);
  free(c->seen_at);
  free(c->stalled);
  free(c);
}

static void drop_connection(rvn_reporter* r, const char* why, int err) {
  close(r->fd);
  r->fd = -1;
  r->out_len = r->out_off = 0;
  r->backoff = RECONNECT_MIN_NS;
  r->next_connect = mono_ns() + r->backoff;
  LOG(r, RVN_LOG_WARN, "railover: lost agent at %s: %s%s%s", r->socket_path, why,
      err ? ": " : "", err ? strerror(err) : "");
}

static void try_connect(rvn_reporter* r, int64_t now) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int err = fd < 0 ? errno : 0;
  if (fd >= 0) {
    struct sockaddr_un a;
    memset(&a, 0, sizeof(a));
    a.sun_family = AF_UNIX;
    memcpy(a.sun_path, r->socket_path, strlen(r->socket_path));
    if (connect(fd, (struct sockaddr*)&a, sizeof(a)) != 0) {
      err = errno;
      close(fd);
      fd = -1;
    }
  }
  if (fd < 0) {
    if (!r->quiet)
      LOG(r, RVN_LOG_INFO, "railover: agent not reachable at %s (%s); retrying quietly",
          r->socket_path, strerror(err));
    r->quiet = 1;
    r->next_connect = now + r->backoff;
    r->backoff = r->backoff * 2 > RECONNECT_MAX_NS ? RECONNECT_MAX_NS : r->backoff * 2;
    return;
  }
  r->fd = fd;
  r->quiet = 0;
  r->backoff = RECONNECT_MIN_NS;
  r->conn_gen++;
  railover_wire_hello h = {0, r->pid, RAILOVER_WIRE_HELLO_NCCL_PROFILER, RAILOVER_RANK_UNKNOWN, 0};
  out_frame(r, RAILOVER_MSG_HELLO, &h, sizeof(h));
  LOG(r, RVN_LOG_INFO, "railover: profiler connected to agent at %s", r->socket_path);
}

/* Writes what is pending and reads (and ignores) what the agent sends, which
 * also notices a closed connection. */
static int pump(rvn_reporter* r) {
  int progress = 0;
  while (r->fd >= 0 && r->out_off < r->out_len) {
    ssize_t n = send(r->fd, r->out + r->out_off, r->out_len - r->out_off,
                     MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      r->out_off += (uint32_t)n;
      progress = 1;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    } else {
      drop_connection(r, "write failed", n < 0 ? errno : 0);
      return progress;
    }
  }
  if (r->out_off == r->out_len) r->out_off = r->out_len = 0;
  while (r->fd >= 0) {
    char sink[512];
    ssize_t n = recv(r->fd, sink, sizeof(sink), MSG_DONTWAIT);
    if (n > 0) continue; /* the agent sends nothing this library acts on */
    if (n == 0) drop_connection(r, "agent closed the connection", 0);
    else if (errno == EINTR) continue;
    else if (errno != EAGAIN && errno != EWOULDBLOCK) drop_connection(r, "read failed", errno);
    break;
  }
  return progress;
}

static void wait_for(rvn_reporter* r, int64_t timeout_ns) {
  if (timeout_ns < 0) timeout_ns = 0;
  struct pollfd fds[2] = {{r->wake_fds[0], POLLIN, 0},
                          {r->fd, (short)(POLLIN | (r->out_off < r->out_len ? POLLOUT : 0)), 0}};
  struct timespec ts = {timeout_ns / 1000000000LL, timeout_ns % 1000000000LL};
  if (ppoll(fds, r->fd >= 0 ? 2 : 1, &ts, NULL) > 0 && (fds[0].revents & POLLIN)) {
    char drain[16];
    while (read(r->wake_fds[0], drain, sizeof(drain)) > 0) {
    }
  }
}

static void* sender_main(void* arg) {
  rvn_reporter* r = arg;
  int64_t drain_deadline = 0;
  for (;;) {
    int64_t now = mono_ns();
    int stopping = atomic_load_explicit(&r->stop, memory_order_acquire);
    if (stopping && drain_deadline == 0) drain_deadline = now + DRAIN_NS;
    if (r->fd < 0 && now >= r->next_connect) try_connect(r, now);

    uint64_t pos;
    int nudged = 0;
    while (rv_ring_peek(&r->nudges, &pos) != NULL) {
      rv_ring_release(&r->nudges, pos);
      nudged = 1;
    }
    int progress_due = now >= r->next_progress;
    int scan_due = now >= r->next_scan;

    pthread_mutex_lock(&r->lock);
    rvn_comm* retired = r->retired;
    r->retired = NULL;
    for (rvn_comm* c = r->comms; c; c = c->next) {
      if (r->fd < 0) break;
      announce(r, c);
      if (progress_due || nudged) send_progress(r, c, now, 0);
      if (scan_due) scan_stalls(r, c, now);
    }
    pthread_mutex_unlock(&r->lock);
    /* A finalized communicator leaves with its last count, then is freed. */
    while (retired) {
      rvn_comm* c = retired;
      retired = c->next;
      if (r->fd >= 0) {
        announce(r, c);
        send_progress(r, c, now, 1);
      }
      free_comm(c);
    }
    if (progress_due) r->next_progress = now + r->progress_ns;
    if (scan_due) r->next_scan = now + r->tick_ns;

    pump(r);
    if (stopping && (r->fd < 0 || r->out_len == 0 || now >= drain_deadline)) break;
    int64_t next = r->next_progress;
    if (r->next_scan < next) next = r->next_scan;
    if (r->fd < 0 && r->next_connect < next) next = r->next_connect;
    int64_t wait = next - mono_ns();
    if (wait > MAX_TICK_NS) wait = MAX_TICK_NS;
    wait_for(r, stopping ? 1000000LL : wait);
  }
  if (r->fd >= 0) close(r->fd);
  r->fd = -1;
  return NULL;
}

/* ------------------------------------------------------------- lifecycle */

static void free_reporter(rvn_reporter* r) {
  rv_ring_destroy(&r->nudges);
  if (r->wake_fds[0] >= 0) close(r->wake_fds[0]);
  if (r->wake_fds[1] >= 0) close(r->wake_fds[1]);
  pthread_mutex_destroy(&r->lock);
  free(r);
}

static rvn_reporter* new_reporter(const rvn_config* cfg, rvn_logger log) {
  const char* path = getenv("RAILOVER_PLUGIN_SOCKET");
  if (path == NULL || *path == '\0') path = DEFAULT_SOCKET;
  if (strlen(path) >= sizeof(((struct sockaddr_un*)0)->sun_path)) {
    if (log)
      log(RVN_LOG_WARN, RVN_SUBSYS_INIT, __FILE__, __LINE__,
          "railover: socket path is %zu bytes, too long; profiler plugin disabled",
          strlen(path));
    return NULL;
  }
  rvn_reporter* r = NULL;
  if (posix_memalign((void**)&r, RV_CACHE_LINE, sizeof(*r)) != 0) return NULL;
  memset(r, 0, sizeof(*r));
  r->wake_fds[0] = r->wake_fds[1] = -1;
  r->fd = -1;
  if (pthread_mutex_init(&r->lock, NULL) != 0) {
    free(r);
    return NULL;
  }
  if (rv_ring_init(&r->nudges, NUDGE_RING, sizeof(uint32_t)) != 0 ||
      pipe2(r->wake_fds, O_NONBLOCK | O_CLOEXEC) != 0) {
    free_reporter(r);
    return NULL;
  }
  memcpy(r->socket_path, path, strlen(path) + 1);
  if (gethostname(r->host, sizeof(r->host) - 1) != 0) r->host[0] = '\0';
  put_name(r->job, getenv("RAILOVER_JOB_ID"));
  r->progress_ns = (int64_t)cfg->progress_ms * 1000000LL;
  r->stall_ns = (int64_t)cfg->stall_ms * 1000000LL;
  /* Scan often enough that a stall is seen within an eighth of the stall time
   * (and, with stalls off, every 100 ms for collectives a later one closes). */
  r->tick_ns = r->stall_ns > 0 && r->stall_ns / 8 < MAX_TICK_NS * 10 ? r->stall_ns / 8
                                                                      : MAX_TICK_NS * 10;
  if (r->tick_ns < 1000000LL) r->tick_ns = 1000000LL;
  r->pid = (uint32_t)getpid();
  r->log = log;
  r->backoff = RECONNECT_MIN_NS;
  int64_t now = mono_ns();
  r->next_progress = now + r->progress_ns;
  r->next_scan = now + r->tick_ns;
  atomic_init(&r->stop, 0);
  if (pthread_create(&r->thread, NULL, sender_main, r) != 0) {
    free_reporter(r);
    return NULL;
  }
  return r;
}

static rvn_comm* new_comm(const rvn_config* cfg, uint64_t comm_id, int n_nodes, int nranks,
                          int rank) {
  uint64_t slots = 1;
  while (slots < cfg->slots) slots <<= 1;
  rvn_comm* c = NULL;
  if (posix_memalign((void**)&c, RV_CACHE_LINE, sizeof(*c)) != 0) return NULL;
  memset(c, 0, sizeof(*c));
  void* ev = NULL;
  if (posix_memalign(&ev, RV_CACHE_LINE, slots * sizeof(rvn_event)) != 0) {
    free(c);
    return NULL;
  }
  c->events = ev;
  if (((uint64_t)(uintptr_t)ev + slots * sizeof(rvn_event)) >> TAG_SHIFT) {
    /* Handles keep the generation above bit 48 (see TAG_SHIFT). */
    free(ev);
    free(c);
    return NULL;
  }
  c->seen_gen = calloc(slots, sizeof(uint64_t));
  c->seen_at = calloc(slots, sizeof(int64_t));
  c->stalled = calloc(slots, 1);
  if (!c->seen_gen || !c->seen_at || !c->stalled) {
    free_comm(c);
    return NULL;
  }
  for (uint64_t i = 0; i < slots; i++) {
    atomic_init(&c->events[i].state, 0);
    atomic_init(&c->events[i].seq, 0);
    atomic_init(&c->events[i].ticket, 0);
    atomic_init(&c->events[i].func, 0);
    atomic_init(&c->events[i].expect, 0);
    c->events[i].comm = c;
  }
  for (uint32_t i = 0; i < MAX_FUNCS; i++) {
    atomic_init(&c->funcs[i].name, NULL);
    atomic_init(&c->funcs[i].done, 0);
    atomic_init(&c->funcs[i].nudged, 0);
  }
  atomic_init(&c->next_event, 0);
  atomic_init(&c->done_ticket, 0);
  atomic_init(&c->dropped_events, 0);
  atomic_init(&c->late_events, 0);
  atomic_init(&c->implied_done, 0);
  c->event_mask = slots - 1;
  c->comm_id = comm_id;
  c->rank = rank < 0 ? RAILOVER_RANK_UNKNOWN : (uint32_t)rank;
  c->nranks = nranks < 0 ? 0 : (uint32_t)nranks;
  c->n_nodes = n_nodes < 0 ? 0 : (uint32_t)n_nodes;
  c->created_ns = realtime_ns();
  c->progress_ops = cfg->progress_ops;
  c->track_kernel = cfg->track_kernel != 0;
  return c;
}

static rvn_result init_common(void** context, int* mask, uint64_t comm_id, int n_nodes,
                              int nranks, int rank, rvn_logger log) {
  if (context == NULL || mask == NULL) return RVN_INVALID_ARGUMENT;
  *context = NULL;
  rvn_config cfg;
  if (read_config(&cfg, log) != 0) return RVN_INVALID_ARGUMENT;
  rvn_comm* c = new_comm(&cfg, comm_id, n_nodes, nranks, rank);
  if (c == NULL) return RVN_SYSTEM_ERROR;
  pthread_mutex_lock(&g_lock);
  if (g_rep == NULL) g_rep = new_reporter(&cfg, log);
  rvn_reporter* r = g_rep;
  if (r == NULL) {
    pthread_mutex_unlock(&g_lock);
    free_comm(c);
    return RVN_SYSTEM_ERROR;
  }
  g_refs++;
  c->slot = g_next_slot++;
  c->rep = r;
  pthread_mutex_lock(&r->lock);
  c->next = r->comms;
  r->comms = c;
  pthread_mutex_unlock(&r->lock);
  pthread_mutex_unlock(&g_lock);
  *mask = RVN_PROFILE_COLL | (c->track_kernel ? RVN_PROFILE_KERNEL_CH : 0);
  *context = c;
  return RVN_SUCCESS;
}

static rvn_result init_v5(void** context, uint64_t comm_id, int* mask, const char* comm_name,
                          int n_nodes, int nranks, int rank, rvn_logger log) {
  (void)comm_name;
  return init_common(context, mask, comm_id, n_nodes, nranks, rank, log);
}

static rvn_result init_v4(void** context, int* mask, const char* comm_name, uint64_t comm_hash,
                          int n_nodes, int nranks, int rank, rvn_logger log) {
  (void)comm_name;
  return init_common(context, mask, comm_hash, n_nodes, nranks, rank, log);
}

static rvn_result finalize(void* context) {
  rvn_comm* c = context;
  if (c == NULL) return RVN_SUCCESS;
  rvn_reporter* last = NULL;
  pthread_mutex_lock(&g_lock);
  rvn_reporter* r = c->rep;
  pthread_mutex_lock(&r->lock);
  for (rvn_comm** p = &r->comms; *p; p = &(*p)->next) {
    if (*p == c) {
      *p = c->next;
      break;
    }
  }
  c->next = r->retired;
  r->retired = c;
  /* Read before unlocking: from then on the sender may free c. */
  uint64_t dropped = atomic_load_explicit(&c->dropped_events, memory_order_relaxed);
  uint64_t late = atomic_load_explicit(&c->late_events, memory_order_relaxed);
  uint64_t implied = atomic_load_explicit(&c->implied_done, memory_order_relaxed);
  unsigned long long comm_id = c->comm_id, slots = c->event_mask + 1;
  uint32_t rank = c->rank;
  pthread_mutex_unlock(&r->lock);
  if (dropped)
    LOG(r, RVN_LOG_WARN, "railover: comm %016llx rank %u: %llu collectives not tracked (all %llu "
        "event slots open)", comm_id, rank, (unsigned long long)dropped, slots);
  if (late || implied)
    LOG(r, RVN_LOG_INFO, "railover: comm %016llx rank %u: %llu collectives done by a later one's "
        "completion, %llu events after their collective was done", comm_id, rank,
        (unsigned long long)implied, (unsigned long long)late);
  if (--g_refs == 0) {
    g_rep = NULL; /* the next init starts a fresh reporter */
    last = r;
  }
  pthread_mutex_unlock(&g_lock);
  if (last) {
    atomic_store_explicit(&last->stop, 1, memory_order_release);
    ssize_t ignored = write(last->wake_fds[1], "x", 1);
    (void)ignored;
    pthread_join(last->thread, NULL);
    /* Communicators finalized after the sender's last look go unannounced. */
    while (last->retired) {
      rvn_comm* x = last->retired;
      last->retired = x->next;
      free_comm(x);
    }
    free_reporter(last);
  }
  return RVN_SUCCESS;
}

EXPORT const rvn_profiler_v6 ncclProfiler_v6 = {
    .name = "railover",
    .init = init_v5,
    .start_event = start_event_v5,
    .stop_event = stop_event,
    .record_event_state = record_event_state,
    .finalize = finalize,
};

EXPORT const rvn_profiler_v5 ncclProfiler_v5 = {
    .name = "railover",
    .init = init_v5,
    .start_event = start_event_v5,
    .stop_event = stop_event,
    .record_event_state = record_event_state,
    .finalize = finalize,
};

EXPORT const rvn_profiler_v4 ncclProfiler_v4 = {
    .name = "railover",
    .init = init_v4,
    .start_event = start_event_v4,
    .stop_event = stop_event,
    .record_event_state = record_event_state,
    .finalize = finalize,
};
