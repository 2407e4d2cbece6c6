/*
 * Drives libnccl-profiler-railover.so the way NCCL 2.27 to 2.30 load and call it,
 * against a stand-in agent on a real unix socket.
 *
 * Loading: dlopen the library, then dlsym the newest ncclProfiler_vN the release
 * knows, falling back to older ones, as NCCL's loader does: 2.27 binds v4, 2.28 v5,
 * 2.29 and 2.30 v6 (tests/nccl_facts.h); no v7 is exported, so 2.31 binds v6 too.
 * Every call goes through NCCL's own table and descriptor shapes (nccl_facts.h),
 * with descriptors as large as NCCL's and zeroed as NCCL zeroes them; `init` gets
 * the real argument list of its version and NCCL's one process-wide activation
 * mask. Around each collective come the events NCCL sends that the plugin must
 * ignore: group, API and kernel-launch events (v5 on), proxy op/step/ctrl,
 * network-plugin and point-to-point events, KernelCh children of a p2p.
 *
 * For each of v4, v5 and v6, on a communicator of its own (16 event slots):
 *   1. ring, 2 channels, children after the collective's stop;
 *   2. tree, 2 channels, children before it;
 *   3. CollNet, nChannels 0, three children after the stop;
 *   4. NVLS, nChannels 0, two children before the stop;
 *   5. one child more than announced;
 *   6. a KernelCh start and a stop after the collective was done, then again
 *      once its slot holds a later collective: none may touch it;
 *   7. a CollNet collective whose child never stops, closed by a later
 *      collective's completion; the child's late stop, once the slot is reused;
 *   8. an NVLS collective whose children never start and a CollNet one whose
 *      child never stops: both reported stalled, neither counted, until they end.
 * ops_done is checked exactly after each step, and "not yet" is checked after a
 * flush (two collectives on a marker communicator, each seen by the agent), so a
 * count sent too early would have arrived. Last, NCCL's failed-init path: an init
 * that fails, the library dlclosed while the other communicators and the sender
 * thread live on (the library is -z nodelete), more work, finalize.
 *
 * Usage: test_nccl_loader path/to/libnccl-profiler-railover.so
 */
#define _GNU_SOURCE

#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "nccl_facts.h"
#include "railover_wire.h"
#include "check.h"
#include "nccl_driver.h"

#define SLOTS 16
#define MAX_COMMS 16
#define MAX_STALLS 16

/* ------------------------------------------------------------ fake agent */

typedef struct {
  uint64_t comm_id, ops;
} seen_comm;

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int listen_fd, stop, closed, bad_frames;
  seen_comm comms[MAX_COMMS];
  int n_comms;
  railover_wire_stall stalls[MAX_STALLS];
  int n_stalls;
} ag;

static seen_comm* find_comm(uint64_t id) {
  for (int i = 0; i < ag.n_comms; i++)
    if (ag.comms[i].comm_id == id) return &ag.comms[i];
  if (ag.n_comms == MAX_COMMS) return NULL;
  ag.comms[ag.n_comms].comm_id = id;
  return &ag.comms[ag.n_comms++];
}

static void on_frame(const railover_wire_header* h, const unsigned char* p) {
  if (h->type == RAILOVER_MSG_PROGRESS && h->payload_len == sizeof(railover_wire_progress)) {
    railover_wire_progress m;
    memcpy(&m, p, sizeof(m));
    seen_comm* c = find_comm(m.comm_id);
    if (c == NULL || m.ops_done < c->ops) ag.bad_frames++;
    else c->ops = m.ops_done;
  } else if (h->type == RAILOVER_MSG_STALL && h->payload_len == sizeof(railover_wire_stall)) {
    if (ag.n_stalls < MAX_STALLS) memcpy(&ag.stalls[ag.n_stalls], p, sizeof(railover_wire_stall));
    ag.n_stalls++;
  } else if (h->type != RAILOVER_MSG_HELLO && h->type != RAILOVER_MSG_COMMUNICATOR) {
    ag.bad_frames++;
  }
}

static int frame_ok(const railover_wire_header* h) {
  return h->magic == RAILOVER_WIRE_MAGIC && h->payload_len <= RAILOVER_WIRE_MAX_PAYLOAD;
}

static nd_agent agent_hooks = {&ag.mu,      &ag.cv,         &ag.listen_fd, &ag.stop,
                               &ag.closed,  &ag.bad_frames, frame_ok,      on_frame};

/* Waits until pred(arg, n) holds (under ag.mu) or the limit passes. */
static int wait_until(int (*pred)(uint64_t, uint64_t), uint64_t arg, uint64_t n) {
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += WAIT_LIMIT_S;
  pthread_mutex_lock(&ag.mu);
  int ok;
  while (!(ok = pred(arg, n)))
    if (pthread_cond_timedwait(&ag.cv, &ag.mu, &deadline) == ETIMEDOUT) {
      ok = pred(arg, n);
      break;
    }
  pthread_mutex_unlock(&ag.mu);
  return ok;
}

static int ops_at_least(uint64_t comm, uint64_t n) {
  seen_comm* c = find_comm(comm);
  return c && c->ops >= n;
}
static int stalls_at_least(uint64_t unused, uint64_t n) {
  (void)unused;
  return ag.n_stalls >= (int)n;
}
static int closed_at_least(uint64_t unused, uint64_t n) {
  (void)unused;
  return ag.closed >= (int)n;
}

static uint64_t ops_of(uint64_t comm) {
  pthread_mutex_lock(&ag.mu);
  seen_comm* c = find_comm(comm);
  uint64_t ops = c ? c->ops : 0;
  pthread_mutex_unlock(&ag.mu);
  return ops;
}

/* ------------------------------------------------------- NCCL's loader side */

static void* lib;
static int event_mask; /* NCCL's ncclProfilerEventMask: one per process, every init writes it */

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_text[8192];

static void nccl_log(int level, unsigned long flags, const char* file, int line, const char* fmt,
                     ...) {
  char msg[512];
  ND_LOGGER_FORMAT(msg, level, flags, file, line, fmt);
  pthread_mutex_lock(&log_mu);
  size_t n = strlen(log_text);
  snprintf(log_text + n, sizeof(log_text) - n, "%s\n", msg);
  pthread_mutex_unlock(&log_mu);
}

typedef struct {
  int version;
  const nf_profiler_v4* v4;
  const nf_profiler_v5* v5;
  const nf_profiler_v6* v6;
} bound;

/* NCCL's loader: the newest table the release knows, then older ones. */
static bound bind_newest(int newest) {
  bound b;
  memset(&b, 0, sizeof(b));
  for (int v = newest; v >= 4 && b.version == 0; v--) {
    char sym[32];
    snprintf(sym, sizeof(sym), "ncclProfiler_v%d", v);
    void* t = dlsym(lib, sym);
    if (t == NULL) continue;
    b.version = v;
    if (v == 4) b.v4 = t;
    if (v == 5) b.v5 = t;
    if (v == 6) b.v6 = t;
  }
  CHECK(b.version == newest, "an NCCL knowing v%d bound v%d", newest, b.version);
  return b;
}

typedef struct {
  bound b;
  void* ctx;
  uint64_t id;
  uint64_t seq[2];  /* next seqNumber of AllReduce, AllGather */
  uint64_t tickets; /* collectives started */
} comm;

static nf_result comm_init(comm* c, bound b, uint64_t id, const char* name, int n_nodes,
                           int nranks, int rank) {
  memset(c, 0, sizeof(*c));
  c->b = b;
  c->id = id;
  switch (b.version) {
    case 4: return b.v4->init(&c->ctx, &event_mask, name, id, n_nodes, nranks, rank, nccl_log);
    case 5: return b.v5->init(&c->ctx, id, &event_mask, name, n_nodes, nranks, rank, nccl_log);
    default: return b.v6->init(&c->ctx, id, &event_mask, name, n_nodes, nranks, rank, nccl_log);
  }
}

static nf_result comm_finalize(comm* c) {
  switch (c->b.version) {
    case 4: return c->b.v4->finalize(c->ctx);
    case 5: return c->b.v5->finalize(c->ctx);
    default: return c->b.v6->finalize(c->ctx);
  }
}

/* What one startEvent says, whatever the version. */
typedef struct {
  uint64_t type;
  void* parent;       /* parentObj */
  void* parent_group; /* coll.parentGroup (v5 on; v4 passes it as parentObj) */
  uint64_t seq;
  const char* func;
  const char* algo;
  uint8_t n_channels; /* coll.nChannels, or kernelCh/proxyOp channelId */
} ev;

/* Fills the union member of descriptor d (v4's or v6's: the same names) that event e's
 * type takes, as far as v4 and v6 have it alike. */
#define FILL_EVENT(d, e)                                                  \
  do {                                                                    \
    if ((e)->type == NF_COLL) {                                           \
      (d).u.coll.seqNumber = (e)->seq;                                    \
      (d).u.coll.func = (e)->func;                                        \
      (d).u.coll.count = 1 << 20;                                         \
      (d).u.coll.datatype = "ncclFloat32";                                \
      (d).u.coll.nChannels = (e)->n_channels;                             \
      (d).u.coll.nWarps = 16;                                             \
      (d).u.coll.algo = (e)->algo;                                        \
      (d).u.coll.proto = "Simple";                                        \
    } else if ((e)->type == NF_KERNEL_CH) {                               \
      (d).u.kernelCh.channelId = (e)->n_channels;                         \
      (d).u.kernelCh.pTimer = 123456789;                                  \
    } else if ((e)->type == NF_PROXY_OP) {                                \
      (d).u.proxyOp.pid = getpid();                                       \
      (d).u.proxyOp.channelId = (e)->n_channels;                          \
      (d).u.proxyOp.nSteps = 8;                                           \
    } else if ((e)->type == NF_NET_PLUGIN) {                              \
      (d).u.netPlugin.id = 0x10001; /* NCCL_PROFILER_NET_TYPE_IB | version 1 */ \
    }                                                                     \
  } while (0)

static void* start(comm* c, const ev* e) {
  void* h = (void*)&h; /* the plugin must write the handle, NULL included */
  nf_result rc;
  if (c->b.version == 4) {
    nf_descr_v4 d;
    memset(&d, 0, sizeof(d));
    d.type = (uint8_t)e->type;
    d.parentObj = e->type == NF_COLL ? e->parent_group : e->parent;
    d.rank = 1;
    FILL_EVENT(d, e);
    rc = c->b.v4->startEvent(c->ctx, &h, &d);
  } else {
    nf_descr_v6 d; /* v5's members are v6's, at the same places */
    memset(&d, 0, sizeof(d));
    d.type = e->type;
    d.parentObj = e->parent;
    d.rank = 1;
    FILL_EVENT(d, e);
    if (e->type == NF_COLL) d.u.coll.parentGroup = e->parent_group;
    else if (e->type == NF_COLL_API) d.u.collApi.func = e->func;
    rc = c->b.version == 5 ? c->b.v5->startEvent(c->ctx, &h, (nf_descr_v5*)(void*)&d)
                           : c->b.v6->startEvent(c->ctx, &h, &d);
  }
  CHECK(rc == 0, "v%d startEvent(type %llu) returned %d", c->b.version,
        (unsigned long long)e->type, rc);
  CHECK(h != (void*)&h, "v%d startEvent(type %llu) left the handle unset", c->b.version,
        (unsigned long long)e->type);
  if (e->type == NF_COLL) c->tickets++;
  return h;
}

static void stop(comm* c, void* h) {
  nf_result rc = c->b.version == 4   ? c->b.v4->stopEvent(h)
                 : c->b.version == 5 ? c->b.v5->stopEvent(h)
                                     : c->b.v6->stopEvent(h);
  CHECK(rc == 0, "v%d stopEvent returned %d", c->b.version, rc);
}

static void record(comm* c, void* h, int state, nf_state_args* a) {
  nf_result rc = c->b.version == 4   ? c->b.v4->recordEventState(h, state, a)
                 : c->b.version == 5 ? c->b.v5->recordEventState(h, state, a)
                                     : c->b.v6->recordEventState(h, state, a);
  CHECK(rc == 0, "v%d recordEventState returned %d", c->b.version, rc);
}

/* An event the plugin must not track: it gets no handle. */
static void* ignored(comm* c, uint64_t type, void* parent) {
  ev e = {type, parent, NULL, 0, "AllReduce", NULL, 0};
  void* h = start(c, &e);
  CHECK(h == NULL, "v%d: event type %llu got a handle", c->b.version, (unsigned long long)type);
  return h;
}

/* A collective as NCCL starts it: its API and group events (none tracked),
 * the collective, then the proxy's events under it (none tracked). */
static void* coll_start(comm* c, int f, uint8_t n_channels, const char* algo) {
  void* api = NULL;
  void* group_api = NULL;
  if (c->b.version >= 5) {
    group_api = ignored(c, NF_GROUP_API, NULL);
    api = ignored(c, NF_COLL_API, group_api);
    ignored(c, NF_KERNEL_LAUNCH, group_api);
  }
  void* group = ignored(c, NF_GROUP, NULL);
  ev e = {NF_COLL, api, group, c->seq[f]++, f ? "AllGather" : "AllReduce", algo, n_channels};
  void* h = start(c, &e);
  CHECK(h != NULL, "v%d: a collective got no handle", c->b.version);
  void* op = ignored(c, NF_PROXY_OP, h);
  void* step = ignored(c, NF_PROXY_STEP, op);
  ignored(c, NF_NET_PLUGIN, step);
  ignored(c, NF_PROXY_CTRL, NULL);
  /* A point-to-point beside it, with its KernelCh child. */
  void* p2p = ignored(c, NF_P2P, group);
  ev k = {NF_KERNEL_CH, p2p, NULL, 0, NULL, NULL, 0};
  CHECK(start(c, &k) == NULL, "a p2p's KernelCh got a handle");
  return h;
}

static void* child_start(comm* c, void* parent, uint8_t channel) {
  ev e = {NF_KERNEL_CH, parent, NULL, 0, NULL, NULL, channel};
  return start(c, &e);
}

static void child_stop(comm* c, void* h) {
  nf_state_args a;
  memset(&a, 0, sizeof(a));
  a.kernelCh.pTimer = 987654321;
  record(c, h, NF_STATE_KERNEL_CH_STOP, &a);
  stop(c, h);
}

/* A whole collective on one channel, child after the stop: done at once. */
static void complete_one(comm* c, int f) {
  void* h = coll_start(c, f, 1, "Ring");
  stop(c, h);
  void* k = child_start(c, h, 0);
  CHECK(k != NULL, "a KernelCh child got no handle");
  child_stop(c, k);
}

/* Everything sent before this returns has reached the agent: two marker
 * collectives, each seen, one after the other on the same connection. */
static comm marker;
static void flush(void) {
  for (int i = 0; i < 2; i++) {
    void* h = coll_start(&marker, 0, 0, "Ring");
    stop(&marker, h);
    CHECK(wait_until(ops_at_least, marker.id, marker.seq[0]), "marker %llu never reported",
          (unsigned long long)marker.seq[0]);
  }
}

static void expect_ops(comm* c, uint64_t want, const char* when) {
  flush();
  uint64_t got = ops_of(c->id);
  CHECK(got == want, "v%d, %s: ops_done %llu, expected %llu", c->b.version, when,
        (unsigned long long)got, (unsigned long long)want);
}

static void await_ops(comm* c, uint64_t want, const char* when) {
  CHECK(wait_until(ops_at_least, c->id, want), "v%d, %s: ops_done %llu never reported",
        c->b.version, when, (unsigned long long)want);
  expect_ops(c, want, when);
}

#define ADDR(h) ((uintptr_t)(h) & ((UINT64_C(1) << 48) - 1))

/* Scenarios 1 to 7; returns with every collective done. */
static void scenarios(comm* c) {
  /* 1. Ring: children after the collective's stop. */
  void* h = coll_start(c, 0, 2, "Ring");
  stop(c, h);
  void* a = child_start(c, h, 0);
  void* b = child_start(c, h, 1);
  CHECK(a && b, "ring: KernelCh handles");
  CHECK(child_start(c, a, 5) == NULL, "a KernelCh whose parent is a KernelCh got a handle");
  child_stop(c, a);
  expect_ops(c, 0, "ring, one channel of two finished");
  child_stop(c, b);
  await_ops(c, 1, "ring done");

  /* 2. Tree: children before the collective's stop. */
  h = coll_start(c, 0, 2, "Tree");
  a = child_start(c, h, 0);
  b = child_start(c, h, 1);
  child_stop(c, a);
  child_stop(c, b);
  expect_ops(c, 1, "tree, kernel done but not yet stopped");
  stop(c, h);
  await_ops(c, 2, "tree done");

  /* 3. CollNet: nChannels 0, three children after the stop. */
  h = coll_start(c, 0, 0, "CollNetDirect");
  stop(c, h);
  expect_ops(c, 2, "CollNet enqueued, no child yet");
  a = child_start(c, h, 0);
  b = child_start(c, h, 1);
  void* k = child_start(c, h, 2);
  child_stop(c, a);
  child_stop(c, b);
  expect_ops(c, 2, "CollNet, two channels of three finished");
  child_stop(c, k);
  await_ops(c, 3, "CollNet done");

  /* 4. NVLS: nChannels 0, two children before the stop. */
  h = coll_start(c, 0, 0, "NVLS");
  a = child_start(c, h, 0);
  b = child_start(c, h, 1);
  stop(c, h);
  expect_ops(c, 3, "NVLS enqueued, kernel running");
  child_stop(c, a);
  expect_ops(c, 3, "NVLS, one channel of two finished");
  child_stop(c, b);
  await_ops(c, 4, "NVLS done");

  /* 5. One child more than announced. */
  void* x = coll_start(c, 0, 1, "Ring");
  uint64_t x_ticket = c->tickets - 1;
  stop(c, x);
  a = child_start(c, x, 0);
  b = child_start(c, x, 1);
  child_stop(c, a);
  expect_ops(c, 4, "ring, the announced channel finished, another still running");
  child_stop(c, b);
  await_ops(c, 5, "ring with an unannounced channel done");

  /* 6. After it is done, x's handle starts nothing and stops nothing... */
  CHECK(child_start(c, x, 2) == NULL, "a KernelCh of a collective already done got a handle");
  stop(c, x);
  /* ... and still nothing once its slot holds a later collective. */
  while (c->tickets % SLOTS != x_ticket % SLOTS) complete_one(c, 0);
  uint64_t base = c->seq[0];
  await_ops(c, base, "padding collectives done");
  void* y = coll_start(c, 0, 0, "CollNetChain");
  CHECK(ADDR(y) == ADDR(x) && y != x, "the later collective did not reuse the slot");
  stop(c, y);
  CHECK(child_start(c, x, 0) == NULL, "a stale KernelCh attached to the slot's new collective");
  stop(c, x);
  expect_ops(c, base, "a stale stop on a reused slot");
  k = child_start(c, y, 0);
  CHECK(k != NULL, "the reusing collective's child got no handle");
  child_stop(c, k);
  await_ops(c, base + 1, "the reusing collective done");

  /* 7. A CollNet AllGather whose child never stops is closed by a later
   * AllReduce's completion (a communicator's kernels run in order). */
  void* g = coll_start(c, 1, 0, "CollNetDirect");
  uint64_t g_ticket = c->tickets - 1;
  stop(c, g);
  void* stuck = child_start(c, g, 0);
  CHECK(stuck != NULL, "CollNet child");
  complete_one(c, 0);
  await_ops(c, c->seq[0] + c->seq[1], "the later collective done, the earlier closed");
  /* The stuck child's stop comes once its slot holds a later collective. */
  while (c->tickets % SLOTS != g_ticket % SLOTS) complete_one(c, 0);
  y = coll_start(c, 0, 0, "NVLS");
  CHECK(ADDR(y) == ADDR(g), "the collective after the closed one did not reuse its slot");
  stop(c, y);
  child_stop(c, stuck);
  expect_ops(c, c->seq[0] - 1 + c->seq[1], "a closed collective's child stopped late");
  k = child_start(c, y, 0);
  child_stop(c, k);
  await_ops(c, c->seq[0] + c->seq[1], "after the late stop");
}

/* 8. Left open until the agent has reported them stalled. */
typedef struct {
  void* nvls;     /* children never started */
  void* collnet;  /* a child never stopped ... */
  void* child;    /* ... this one */
  uint64_t nvls_seq, collnet_seq;
} withheld;

static withheld withhold(comm* c) {
  withheld w;
  w.nvls_seq = c->seq[1];
  w.nvls = coll_start(c, 1, 0, "NVLS");
  stop(c, w.nvls);
  w.collnet_seq = c->seq[0];
  w.collnet = coll_start(c, 0, 0, "CollNetDirect");
  stop(c, w.collnet);
  w.child = child_start(c, w.collnet, 0);
  CHECK(w.child != NULL, "withheld child");
  return w;
}

int main(int argc, char** argv) {
  CHECK(argc == 2, "usage: %s path/to/libnccl-profiler-railover.so", argv[0]);
  const char* path = argv[1];

  char dir[] = "/tmp/rvl-XXXXXX";
  CHECK(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
  char sock[128];
  snprintf(sock, sizeof(sock), "%s/agent.sock", dir);
  setenv("RAILOVER_PLUGIN_SOCKET", sock, 1);
  setenv("RAILOVER_NCCL_STALL_MS", "1000", 1);
  setenv("RAILOVER_NCCL_PROGRESS_MS", "60000", 1); /* only the every-op rule sends progress */
  setenv("RAILOVER_NCCL_PROGRESS_OPS", "1", 1);

  pthread_t agent_thread;
  const char* start_failed = nd_agent_start(&agent_hooks, sock, &agent_thread);
  CHECK(start_failed == NULL, "%s: %s", start_failed, strerror(errno));

  /* NCCL's ncclOpenProfilerPluginLib: one dlopen, held while any communicator lives. */
  lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  CHECK(lib != NULL, "dlopen: %s", dlerror());
  CHECK(dlsym(lib, "ncclProfiler_v7") == NULL, "a v7 table: its layout is not declared here");
  bound v6 = bind_newest(6), v5 = bind_newest(5), v4 = bind_newest(4);
  CHECK(strcmp(v6.v6->name, "railover") == 0 && strcmp(v4.v4->name, "railover") == 0,
        "plugin name");

  /* The marker: collectives only, counted at their stop. */
  setenv("RAILOVER_NCCL_TRACK_KERNEL", "0", 1);
  CHECK(comm_init(&marker, v5, 0x3A3A3A3A00000001ULL, "marker", 1, 2, 0) == 0, "init marker");
  unsetenv("RAILOVER_NCCL_TRACK_KERNEL");
  CHECK(event_mask == NF_COLL, "marker's activation mask %#x", event_mask);

  setenv("RAILOVER_NCCL_EVENT_SLOTS", "16", 1);
  comm comms[3];
  bound binds[3] = {v4, v5, v6};
  for (int i = 0; i < 3; i++) {
    char name[16];
    snprintf(name, sizeof(name), "comm-v%d", binds[i].version);
    event_mask = 0;
    CHECK(comm_init(&comms[i], binds[i], 0xC0DE000000000000ULL + (uint64_t)binds[i].version,
                    name, 2, 16, 1 + i) == 0, "init through v%d", binds[i].version);
    CHECK(event_mask == (NF_COLL | NF_KERNEL_CH), "v%d activation mask %#x", binds[i].version,
          event_mask);
    CHECK(comms[i].ctx != NULL, "v%d: no context", binds[i].version);
  }
  unsetenv("RAILOVER_NCCL_EVENT_SLOTS");
  CHECK(ignored(&comms[2], NF_CE_COLL, NULL) == NULL, "a copy-engine collective got a handle");

  for (int i = 0; i < 3; i++) scenarios(&comms[i]);
  pthread_mutex_lock(&ag.mu);
  CHECK(ag.n_stalls == 0, "%d stalls while every collective ended", ag.n_stalls);
  pthread_mutex_unlock(&ag.mu);

  /* 8. Stalls: children that never start, a child that never stops. */
  withheld w[3];
  for (int i = 0; i < 3; i++) w[i] = withhold(&comms[i]);
  CHECK(wait_until(stalls_at_least, 0, 6), "stalls never reported");
  flush();
  pthread_mutex_lock(&ag.mu);
  CHECK(ag.n_stalls == 6, "%d stalls, expected 6", ag.n_stalls);
  for (int i = 0; i < 3; i++) {
    int nvls = 0, collnet = 0;
    for (int s = 0; s < ag.n_stalls; s++) {
      railover_wire_stall* st = &ag.stalls[s];
      if (st->comm_id != comms[i].id) continue;
      nvls += strcmp(st->func, "AllGather") == 0 && st->seq_number == w[i].nvls_seq;
      collnet += strcmp(st->func, "AllReduce") == 0 && st->seq_number == w[i].collnet_seq;
    }
    CHECK(nvls == 1 && collnet == 1, "v%d: stalls for NVLS %d, CollNet %d", comms[i].b.version,
          nvls, collnet);
  }
  pthread_mutex_unlock(&ag.mu);
  for (int i = 0; i < 3; i++)
    expect_ops(&comms[i], comms[i].seq[0] - 1 + comms[i].seq[1] - 1, "stalled, not counted");
  /* The CollNet child ends: the AllReduce is done, and with it the earlier AllGather. */
  for (int i = 0; i < 3; i++) child_stop(&comms[i], w[i].child);
  for (int i = 0; i < 3; i++)
    await_ops(&comms[i], comms[i].seq[0] + comms[i].seq[1], "stalls over");

  /* NCCL 2.27-2.30 on a failed init: dlclose, though communicators still use it. */
  setenv("RAILOVER_NCCL_PROGRESS_MS", "0", 1);
  comm failed;
  CHECK(comm_init(&failed, v6, 0xFA11ULL, "comm-failing", 1, 2, 0) != 0,
        "init with a bad setting succeeded");
  unsetenv("RAILOVER_NCCL_PROGRESS_MS");
  CHECK(dlclose(lib) == 0, "dlclose: %s", dlerror());
  void* again = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  CHECK(again != NULL, "the library was unloaded while its sender thread ran");
  dlclose(again);
  /* The sender thread and the tables NCCL still holds go on working. */
  for (int i = 0; i < 3; i++) complete_one(&comms[i], 0);
  for (int i = 0; i < 3; i++)
    await_ops(&comms[i], comms[i].seq[0] + comms[i].seq[1], "after dlclose");
  for (int i = 0; i < 3; i++)
    CHECK(comm_finalize(&comms[i]) == 0, "finalize v%d", comms[i].b.version);
  CHECK(comm_finalize(&marker) == 0, "finalize marker");
  CHECK(wait_until(closed_at_least, 0, 1), "the plugin did not close its connection");

  pthread_mutex_lock(&ag.mu);
  ag.stop = 1;
  int bad = ag.bad_frames;
  pthread_mutex_unlock(&ag.mu);
  pthread_join(agent_thread, NULL);
  close(ag.listen_fd);
  unlink(sock);
  rmdir(dir);
  CHECK(bad == 0, "%d malformed frames or ops_done going back", bad);
  /* Each communicator's finalize says what was closed by a later collective (7's
   * AllGather and 8's NVLS) and how many events came late (6: a child start and a
   * stop after done, again on the reused slot; 7: the stuck child's stop). */
  pthread_mutex_lock(&log_mu);
  for (int i = 0; i < 3; i++) {
    char want[160];
    snprintf(want, sizeof(want), "comm %016llx rank %d: 2 collectives done by a later one's "
             "completion, 5 events after their collective was done",
             (unsigned long long)comms[i].id, 1 + i);
    CHECK(strstr(log_text, want) != NULL, "v%d: finalize did not log \"%s\":\n%s",
          comms[i].b.version, want, log_text);
  }
  pthread_mutex_unlock(&log_mu);
  printf("nccl loader: v4, v5 and v6 bound as NCCL 2.27, 2.28 and 2.29-2.30 do; ring, tree, "
         "CollNet, NVLS; 6 stalls; dlclose with live communicators: ok\n");
  return 0;
}
