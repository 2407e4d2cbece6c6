/*
 * Drives libnccl-profiler-railover.so the way NCCL does, from several threads,
 * against a stand-in agent on a real unix socket.
 *
 * Two communicators are created (one through ncclProfiler_v5, one through the v4
 * table). For each, a "host" thread starts collectives in seqNumber order. A asks
 * for collectives only (RAILOVER_NCCL_TRACK_KERNEL=0), so a "proxy" thread's stop
 * is what counts it done. On B each collective runs on two
 * channels, as NCCL reports it: the host stops the collective once enqueued, and
 * the proxy thread starts and stops one KernelCh event per channel as the kernel
 * runs, in whatever order the two threads get there. One collective of B is then
 * left with a channel unfinished (a kernel that hangs) until the agent has
 * reported it stalled; then both communicators are finalized.
 *
 * The agent checks: both communicators announced with their id, rank and nranks;
 * ops_done per (comm, rank) never going back and ending at the number of
 * collectives issued; progress rate-limited to about one frame per M ops; and
 * exactly one stall, naming the open collective. Last, a third communicator with
 * every event slot held open shows that further collectives go untracked
 * without harm and that finalize reports how many.
 *
 * Usage: test_nccl_profiler [pairs]   (collective start/stop pairs in all, default 10000)
 */
#define _GNU_SOURCE

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "railover_nccl_abi.h"
#include "railover_wire.h"
#include "check.h"
#include "nccl_driver.h"

extern const rvn_profiler_v5 ncclProfiler_v5;
extern const rvn_profiler_v4 ncclProfiler_v4;
extern const rvn_profiler_v6 ncclProfiler_v6;


#define COMM_A 0x0A11CE0000000001ULL
#define COMM_B 0x0B0B000000000002ULL
#define RANK_A 3
#define NRANKS_A 8
#define RANK_B 1
#define NRANKS_B 4
#define PROGRESS_OPS 100
#define PACE 1000 /* a multiple of PROGRESS_OPS */

/* ------------------------------------------------------------ fake agent */

typedef struct {
  uint64_t comm_id;
  uint32_t rank, nranks, n_nodes, pid;
  char host[RAILOVER_WIRE_NAME_LEN], job[RAILOVER_WIRE_NAME_LEN];
} seen_comm;

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int listen_fd;
  int stop;
  int closed;      /* the plugin's connection ended */
  int hellos;
  seen_comm comms[8];
  int n_comms;
  uint64_t last_ops[2];
  int progress_frames[2];
  int went_back;
  railover_wire_stall stalls[8];
  int n_stalls;
  int bad_frames;
} agent_state;

static agent_state agent;

static int comm_index(uint64_t comm_id) { return comm_id == COMM_A ? 0 : comm_id == COMM_B ? 1 : -1; }

static uint32_t payload_size(uint16_t type) {
  switch (type) {
    case RAILOVER_MSG_HELLO: return sizeof(railover_wire_hello);
    case RAILOVER_MSG_PROGRESS: return sizeof(railover_wire_progress);
    case RAILOVER_MSG_COMMUNICATOR: return sizeof(railover_wire_communicator);
    case RAILOVER_MSG_STALL: return sizeof(railover_wire_stall);
    default: return UINT32_MAX;
  }
}

static void on_frame(const railover_wire_header* h, const unsigned char* p) {
  uint16_t type = h->type;
  if (type == RAILOVER_MSG_HELLO) {
    railover_wire_hello m;
    memcpy(&m, p, sizeof(m));
    /* Says it is the profiler, so the agent sends it no commands. */
    if (m.abi_version != RAILOVER_WIRE_HELLO_NCCL_PROFILER || m.pid != (uint32_t)getpid())
      agent.bad_frames++;
    agent.hellos++;
  } else if (type == RAILOVER_MSG_COMMUNICATOR) {
    railover_wire_communicator m;
    memcpy(&m, p, sizeof(m));
    int i = 0;
    while (i < agent.n_comms && agent.comms[i].comm_id != m.comm_id) i++;
    if (i == agent.n_comms && i < 8) agent.n_comms++;
    if (i < 8) {
      seen_comm* s = &agent.comms[i];
      s->comm_id = m.comm_id;
      s->rank = m.rank;
      s->nranks = m.nranks;
      s->n_nodes = m.n_nodes;
      s->pid = m.pid;
      memcpy(s->host, m.host, sizeof(s->host));
      memcpy(s->job, m.job, sizeof(s->job));
    }
  } else if (type == RAILOVER_MSG_PROGRESS) {
    railover_wire_progress m;
    memcpy(&m, p, sizeof(m));
    int i = comm_index(m.comm_id);
    if (i < 0 || m.rank != (i == 0 ? RANK_A : RANK_B)) {
      agent.bad_frames++;
      return;
    }
    if (m.ops_done < agent.last_ops[i]) agent.went_back++;
    agent.last_ops[i] = m.ops_done;
    agent.progress_frames[i]++;
  } else if (type == RAILOVER_MSG_STALL) {
    if (agent.n_stalls < 8) memcpy(&agent.stalls[agent.n_stalls], p, sizeof(railover_wire_stall));
    agent.n_stalls++;
  }
}

static int frame_ok(const railover_wire_header* h) {
  return h->magic == RAILOVER_WIRE_MAGIC && h->version == RAILOVER_WIRE_VERSION_MIN &&
         h->payload_len == payload_size(h->type) && h->reserved == 0;
}

static nd_agent agent_hooks = {&agent.mu,     &agent.cv,         &agent.listen_fd, &agent.stop,
                               &agent.closed, &agent.bad_frames, frame_ok,         on_frame};

/* Waits until pred() holds (under agent.mu) or the limit passes. */
static int wait_until(int (*pred)(void)) {
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += WAIT_LIMIT_S;
  pthread_mutex_lock(&agent.mu);
  int ok;
  while (!(ok = pred())) {
    if (pthread_cond_timedwait(&agent.cv, &agent.mu, &deadline) == ETIMEDOUT) {
      ok = pred();
      break;
    }
  }
  pthread_mutex_unlock(&agent.mu);
  return ok;
}

static uint64_t want_ops_a;
static int have_ops_a(void) { return agent.last_ops[0] >= want_ops_a; }
static int have_stall(void) { return agent.n_stalls >= 1; }
static int have_comms(void) { return agent.n_comms >= 2; }
static int connection_closed(void) { return agent.closed >= 1; }

/* ---------------------------------------------------- NCCL stand-in threads */

/* Handles from the host thread to the proxy thread, as NCCL hands its events on. */
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  void* items[256];
  unsigned head, tail;
  int done;
} handoff;

static void push(handoff* q, void* h) {
  pthread_mutex_lock(&q->mu);
  while (q->tail - q->head == 256) pthread_cond_wait(&q->cv, &q->mu);
  q->items[q->tail++ % 256] = h;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
}

static int pop(handoff* q, void** h) {
  pthread_mutex_lock(&q->mu);
  while (q->tail == q->head && !q->done) pthread_cond_wait(&q->cv, &q->mu);
  int got = q->tail != q->head;
  if (got) *h = q->items[q->head++ % 256];
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
  return got;
}

typedef struct {
  void* ctx;
  int v4; /* use the v4 table and descriptor */
  int two_funcs;
  int paced; /* every PACE collectives, wait until the agent has heard of them */
  uint8_t n_channels; /* KernelCh events per collective */
  uint64_t n;
  handoff q;
} comm_driver;

static void start_one(comm_driver* d, uint64_t seq, const char* func, void** h) {
  rvn_result rc;
  if (d->v4) {
    rvn_descr_v4 e;
    memset(&e, 0, sizeof(e));
    e.type = RVN_PROFILE_COLL;
    e.rank = RANK_B;
    e.u.coll.seq_number = seq;
    e.u.coll.func = func;
    e.u.coll.n_channels = d->n_channels;
    rc = ncclProfiler_v4.start_event(d->ctx, h, &e);
  } else {
    rvn_descr_v5 e;
    memset(&e, 0, sizeof(e));
    e.type = RVN_PROFILE_COLL;
    e.rank = RANK_A;
    e.u.coll.seq_number = seq;
    e.u.coll.func = func;
    e.u.coll.n_channels = d->n_channels;
    rc = ncclProfiler_v5.start_event(d->ctx, h, &e);
  }
  CHECK(rc == RVN_SUCCESS, "startEvent returned %d", rc);
  CHECK(*h != NULL, "no handle for seq %llu", (unsigned long long)seq);
}

static rvn_result stop(comm_driver* d, void* h) {
  return (d->v4 ? ncclProfiler_v4.stop_event : ncclProfiler_v5.stop_event)(h);
}

/* NCCL's proxy reporting one channel's kernel work starting (v4 table). */
static void* start_channel(comm_driver* d, void* parent, uint8_t channel) {
  rvn_descr_v4 e;
  memset(&e, 0, sizeof(e));
  e.type = RVN_PROFILE_KERNEL_CH;
  e.parent_obj = parent;
  e.u.align_ = channel;
  void* h = NULL;
  CHECK(ncclProfiler_v4.start_event(d->ctx, &h, &e) == RVN_SUCCESS && h != NULL,
        "KernelCh start");
  return h;
}

static void stop_channel(comm_driver* d, void* h) {
  CHECK(ncclProfiler_v4.record_event_state(h, 22 /* KernelChStop */, NULL) == RVN_SUCCESS,
        "KernelCh state");
  CHECK(stop(d, h) == RVN_SUCCESS, "KernelCh stop");
}

static void* host_main(void* arg) {
  comm_driver* d = arg;
  uint64_t seq[2] = {0, 0};
  for (uint64_t i = 0; i < d->n; i++) {
    int f = d->two_funcs ? (int)(i % 2) : 0;
    void* h = NULL;
    start_one(d, seq[f]++, f ? "AllGather" : "AllReduce", &h);
    push(&d->q, h);
    /* Enqueued: NCCL stops the collective itself; its kernel may not have run yet. */
    if (d->n_channels) CHECK(stop(d, h) == RVN_SUCCESS, "stopEvent");
    if (d->paced && (i + 1) % PACE == 0) {
      /* Progress for a multiple of PROGRESS_OPS is sent on the M-ops rule alone
       * (the time rule is set to a minute), once the proxy thread stops it. */
      pthread_mutex_lock(&agent.mu);
      want_ops_a = i + 1;
      pthread_mutex_unlock(&agent.mu);
      CHECK(wait_until(have_ops_a), "ops_done %llu never reported",
            (unsigned long long)(i + 1));
    }
  }
  pthread_mutex_lock(&d->q.mu);
  d->q.done = 1;
  pthread_cond_broadcast(&d->q.cv);
  pthread_mutex_unlock(&d->q.mu);
  return NULL;
}

static void* proxy_main(void* arg) {
  comm_driver* d = arg;
  void* h;
  while (pop(&d->q, &h)) {
    if (d->n_channels == 0) {
      CHECK(stop(d, h) == RVN_SUCCESS, "stopEvent");
      continue;
    }
    void* ch[2] = {start_channel(d, h, 0), start_channel(d, h, 1)};
    stop_channel(d, ch[1]);
    stop_channel(d, ch[0]);
  }
  return NULL;
}

/* Keeps the plugin's warnings (it logs from its own thread too). */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char warnings[4096];

static void keep_log(int level, unsigned long flags, const char* file, int line,
                     const char* fmt, ...) {
  (void)flags;
  (void)file;
  (void)line;
  if (level != RVN_LOG_WARN) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&log_mu);
  size_t n = strlen(warnings);
  snprintf(warnings + n, sizeof(warnings) - n, "%s\n", msg);
  pthread_mutex_unlock(&log_mu);
}

/* A communicator with every event slot open: the next collectives get no
 * handle, nothing breaks, and finalize says how many went untracked. */
static void full_pool(void) {
  setenv("RAILOVER_NCCL_EVENT_SLOTS", "16", 1);
  void* ctx = NULL;
  int mask = 0;
  CHECK(ncclProfiler_v5.init(&ctx, 0xC0C0, &mask, "comm-c", 1, 2, 0, keep_log) == RVN_SUCCESS,
        "init C");
  unsetenv("RAILOVER_NCCL_EVENT_SLOTS");
  comm_driver dc;
  memset(&dc, 0, sizeof(dc));
  dc.ctx = ctx;
  void* held[16];
  for (int i = 0; i < 16; i++) start_one(&dc, (uint64_t)i, "AllReduce", &held[i]);
  for (int i = 0; i < 4; i++) {
    rvn_descr_v5 e;
    memset(&e, 0, sizeof(e));
    e.type = RVN_PROFILE_COLL;
    e.u.coll.seq_number = 16 + (uint64_t)i;
    e.u.coll.func = "AllReduce";
    void* h = &e;
    CHECK(ncclProfiler_v5.start_event(ctx, &h, &e) == RVN_SUCCESS && h == NULL,
          "a collective got a handle with every slot open");
    CHECK(ncclProfiler_v5.stop_event(h) == RVN_SUCCESS, "stop(NULL)");
  }
  for (int i = 0; i < 16; i++) CHECK(stop(&dc, held[i]) == RVN_SUCCESS, "stop");
  CHECK(ncclProfiler_v5.finalize(ctx) == RVN_SUCCESS, "finalize C");
  pthread_mutex_lock(&log_mu);
  CHECK(strstr(warnings, "rank 0: 4 collectives not tracked (all 16 event slots open)") != NULL,
        "finalize logged: %s", warnings);
  pthread_mutex_unlock(&log_mu);
}

static void quiet_log(int level, unsigned long flags, const char* file, int line,
                      const char* fmt, ...) {
  (void)level;
  (void)flags;
  (void)file;
  (void)line;
  (void)fmt;
}

int main(int argc, char** argv) {
  uint64_t pairs = argc > 1 ? strtoull(argv[1], NULL, 10) : 10000;
  CHECK(pairs >= 4, "pairs %llu too small", (unsigned long long)pairs);

  char dir[] = "/tmp/rvn-XXXXXX";
  CHECK(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
  char path[128];
  snprintf(path, sizeof(path), "%s/agent.sock", dir);
  setenv("RAILOVER_PLUGIN_SOCKET", path, 1);
  setenv("RAILOVER_NCCL_STALL_MS", "1000", 1); /* above any scheduling hiccup here */
  /* Only the every-M-ops rule (and the first and last report) sends progress,
   * so the number of frames is known whatever the machine's speed. */
  setenv("RAILOVER_NCCL_PROGRESS_MS", "60000", 1);
  setenv("RAILOVER_NCCL_PROGRESS_OPS", "100", 1);
  setenv("RAILOVER_JOB_ID", "harness-job", 1);

  pthread_t agent_thread;
  const char* start_failed = nd_agent_start(&agent_hooks, path, &agent_thread);
  CHECK(start_failed == NULL, "%s: %s", start_failed, strerror(errno));

  /* The exported tables. */
  CHECK(strcmp(ncclProfiler_v5.name, "railover") == 0, "v5 name %s", ncclProfiler_v5.name);
  CHECK(ncclProfiler_v6.start_event == ncclProfiler_v5.start_event, "v6 is the v5 code");

  comm_driver da, db;
  memset(&da, 0, sizeof(da));
  memset(&db, 0, sizeof(db));
  da.n = pairs / 2;
  db.n = pairs - da.n;
  da.paced = 1;
  db.v4 = 1;
  db.two_funcs = 1;
  db.n_channels = 2;
  int mask = 0;
  setenv("RAILOVER_NCCL_TRACK_KERNEL", "0", 1);
  CHECK(ncclProfiler_v5.init(&da.ctx, COMM_A, &mask, "comm-a", 2, NRANKS_A, RANK_A,
                             quiet_log) == RVN_SUCCESS, "init v5");
  unsetenv("RAILOVER_NCCL_TRACK_KERNEL");
  CHECK(mask == RVN_PROFILE_COLL, "activation mask %d without kernel tracking", mask);
  mask = 0;
  CHECK(ncclProfiler_v4.init(&db.ctx, &mask, "comm-b", COMM_B, 1, NRANKS_B, RANK_B, NULL) ==
            RVN_SUCCESS, "init v4");
  CHECK(mask == (RVN_PROFILE_COLL | RVN_PROFILE_KERNEL_CH), "v4 activation mask %d", mask);

  /* Events other than collectives get no handle, and a NULL handle is accepted. */
  rvn_descr_v5 other;
  memset(&other, 0, sizeof(other));
  other.type = 1u << 9; /* a collective's API event: not asked for */
  void* none = &other;
  CHECK(ncclProfiler_v5.start_event(da.ctx, &none, &other) == RVN_SUCCESS && none == NULL,
        "non-collective event got a handle");
  CHECK(ncclProfiler_v5.stop_event(NULL) == RVN_SUCCESS, "stop(NULL)");
  CHECK(ncclProfiler_v5.record_event_state(NULL, 0, NULL) == RVN_SUCCESS, "recordEventState");

  for (comm_driver* d = &da; d; d = d == &da ? &db : NULL) {
    pthread_mutex_init(&d->q.mu, NULL);
    pthread_cond_init(&d->q.cv, NULL);
  }
  pthread_t th[4];
  pthread_create(&th[0], NULL, host_main, &da);
  pthread_create(&th[1], NULL, proxy_main, &da);
  pthread_create(&th[2], NULL, host_main, &db);
  pthread_create(&th[3], NULL, proxy_main, &db);
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);

  /* Every collective so far has stopped: no stall may have been reported. */
  CHECK(wait_until(have_comms), "the agent did not hear of both communicators");
  pthread_mutex_lock(&agent.mu);
  CHECK(agent.n_stalls == 0, "%d stalls before any collective was left open", agent.n_stalls);
  pthread_mutex_unlock(&agent.mu);

  /* One collective of B is enqueued and its kernel never finishes channel 0. */
  uint64_t open_seq = (db.n + 1) / 2; /* AllReduces so far */
  void* open = NULL;
  start_one(&db, open_seq, "AllReduce", &open);
  CHECK(stop(&db, open) == RVN_SUCCESS, "enqueued");
  void* hung = start_channel(&db, open, 0);
  stop_channel(&db, start_channel(&db, open, 1));
  CHECK(wait_until(have_stall), "no stall reported within %d s", WAIT_LIMIT_S);
  stop_channel(&db, hung); /* it finishes after all */

  CHECK(ncclProfiler_v5.finalize(da.ctx) == RVN_SUCCESS, "finalize A");
  CHECK(ncclProfiler_v4.finalize(db.ctx) == RVN_SUCCESS, "finalize B");
  /* The last finalize flushed and closed the connection. */
  CHECK(wait_until(connection_closed), "the plugin did not close its connection");

  pthread_mutex_lock(&agent.mu);
  agent.stop = 1;
  pthread_mutex_unlock(&agent.mu);
  pthread_join(agent_thread, NULL);
  close(agent.listen_fd);
  unlink(path);
  rmdir(dir);

  CHECK(agent.bad_frames == 0, "%d malformed or unexpected frames", agent.bad_frames);
  CHECK(agent.hellos >= 1, "no HELLO");
  CHECK(agent.n_comms == 2, "%d communicators announced", agent.n_comms);
  char host[RAILOVER_WIRE_NAME_LEN] = {0};
  gethostname(host, sizeof(host) - 1);
  for (int i = 0; i < 2; i++) {
    seen_comm* s = &agent.comms[i];
    int is_a = s->comm_id == COMM_A;
    CHECK(is_a || s->comm_id == COMM_B, "unknown comm %llx", (unsigned long long)s->comm_id);
    CHECK(s->rank == (uint32_t)(is_a ? RANK_A : RANK_B), "rank %u", s->rank);
    CHECK(s->nranks == (uint32_t)(is_a ? NRANKS_A : NRANKS_B), "nranks %u", s->nranks);
    CHECK(s->n_nodes == (uint32_t)(is_a ? 2 : 1), "n_nodes %u", s->n_nodes);
    CHECK(s->pid == (uint32_t)getpid(), "pid %u", s->pid);
    CHECK(strcmp(s->job, "harness-job") == 0, "job \"%s\"", s->job);
    CHECK(strcmp(s->host, host) == 0, "host \"%s\"", s->host);
  }
  CHECK(agent.went_back == 0, "ops_done went back %d times", agent.went_back);
  CHECK(agent.last_ops[0] == da.n, "comm A ends at ops_done %llu, issued %llu",
        (unsigned long long)agent.last_ops[0], (unsigned long long)da.n);
  CHECK(agent.last_ops[1] == db.n + 1, "comm B ends at ops_done %llu, issued %llu",
        (unsigned long long)agent.last_ops[1], (unsigned long long)(db.n + 1));
  /* At most one frame per PROGRESS_OPS collectives, plus the first and the
   * last: rate-limited, never one per collective. A was paced, so it must also
   * have had a frame at every PACE. */
  for (int i = 0; i < 2; i++) {
    uint64_t n = i ? db.n + 1 : da.n;
    int least = i ? 1 : (int)(da.n / PACE);
    int most = (int)(n / PROGRESS_OPS) + 4;
    CHECK(agent.progress_frames[i] >= least && agent.progress_frames[i] <= most,
          "comm %d: %d progress frames for %llu collectives (expected %d..%d)", i,
          agent.progress_frames[i], (unsigned long long)n, least, most);
  }
  CHECK(agent.n_stalls == 1, "%d stalls reported, expected exactly 1", agent.n_stalls);
  railover_wire_stall* st = &agent.stalls[0];
  CHECK(st->comm_id == COMM_B && st->rank == RANK_B && st->seq_number == open_seq,
        "stall names comm %llx rank %u seq %llu", (unsigned long long)st->comm_id, st->rank,
        (unsigned long long)st->seq_number);
  CHECK(strcmp(st->func, "AllReduce") == 0, "stall func \"%s\"", st->func);
  CHECK(st->open_ns >= 1000000000ULL, "stall after only %llu ns", (unsigned long long)st->open_ns);
  full_pool();
  printf("nccl profiler: %llu pairs on 2 communicators, ops_done %llu/%llu, %d+%d progress "
         "frames, 1 stall: ok\n",
         (unsigned long long)pairs, (unsigned long long)agent.last_ops[0],
         (unsigned long long)agent.last_ops[1], agent.progress_frames[0],
         agent.progress_frames[1]);
  return 0;
}
