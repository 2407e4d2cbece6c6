/*
 * Railover native plugin, ABI v1-v3: report ring, sender thread, command queue.
 *
 * Report calls run on the CCL's proxy threads and must cost ~100 ns: they
 * format a complete wire frame straight into a ring slot and return. One
 * background thread per handle owns the socket: it batches ring frames into
 * one buffer, writes them without blocking, reads commands, reconnects, and
 * does all the logging. Everything the report path touches was allocated at
 * init.
 */
#define _GNU_SOURCE /* ppoll, pipe2, MSG_NOSIGNAL */

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "glibc_compat.h"
#include "railover_plugin.h"
#include "ring.h"

#define EXPORT __attribute__((visibility("default")))

#define DEFAULT_SOCKET "/run/railover/agent.sock"
#define DEFAULT_RING 16384u
#define MIN_RING 16u
#define MAX_RING 1048576u
#define QUEUE_SMALL 64u /* ack and command queues */
#define OUT_BUF_SIZE 65536u
#define IN_BUF_SIZE (2u * (RAILOVER_WIRE_HEADER_SIZE + RAILOVER_WIRE_MAX_PAYLOAD))
#define MAX_FRAME (RAILOVER_WIRE_HEADER_SIZE + RAILOVER_WIRE_LARGEST_V1_PAYLOAD)
/* The smallest frame (ACK) is 32 bytes, which bounds frames per batch. */
#define MAX_OUT_FRAMES (OUT_BUF_SIZE / 32u)
#define IDLE_WAIT_MIN_NS 50000L    /* sender sleep when idle, doubling ... */
#define IDLE_WAIT_MAX_NS 1000000L  /* ... up to 1 ms: the worst added latency */

/* One report ring element: a ready-to-send frame. */
typedef struct {
  uint32_t len;
  uint32_t pad_;
  unsigned char frame[MAX_FRAME];
} rv_report_slot;

typedef struct {
  uint64_t command_id;
  uint64_t ops_done;
  int32_t status;
  int32_t with_ops; /* 1: send as ACK_AT carrying ops_done */
} rv_ack_slot;

enum { FRAME_REPORT = 0, FRAME_ACK = 1, FRAME_HELLO = 2 };

/* Counters bumped by producers live on their own lines so that drops on one
 * thread do not slow reports on another. */
typedef struct {
  _Alignas(RV_CACHE_LINE) _Atomic uint64_t value;
} rv_counter;

typedef struct rv_plugin {
  rv_ring reports;  /* proxy threads -> sender */
  rv_ring acks;     /* proxy threads (and sender's auto-acks) -> sender */
  rv_ring commands; /* sender -> proxy threads */

  _Alignas(RV_CACHE_LINE) _Atomic int connected; /* read on every report call */
  /* Set once, at the first connection; until then reports wait in the ring. */
  _Atomic int ever_connected;
  uint32_t pid;

  rv_counter dropped_ring_full;
  rv_counter dropped_no_agent_call; /* refused at call time */
  rv_counter acks_dropped_call;
  rv_counter unsupported_call; /* NVL_TRANSIT answered for an ABI 1 poll_command */

  /* Written by the sender thread only; read by stats(). */
  _Alignas(RV_CACHE_LINE) _Atomic uint64_t sent;
  _Atomic uint64_t dropped_no_agent_sender; /* discarded after being queued */
  _Atomic uint64_t out_reports;             /* report frames in out_buf, not yet sent */
  _Atomic uint64_t bytes_sent, hellos_sent, acks_sent, acks_dropped_sender;
  _Atomic uint64_t commands_received, commands_dropped, commands_unsupported;
  _Atomic uint64_t malformed_received, connects, disconnects, connect_failures;
  _Atomic uint64_t commands_invalid;

  /* Configuration, fixed after init. */
  char socket_path[sizeof(((struct sockaddr_un*)0)->sun_path)];
  uint32_t rank;
  uint64_t comm_id;
  char job[RAILOVER_WIRE_JOB_LEN]; /* "" names no job: HELLO version 1 */
  uint32_t incarnation;
  uint32_t reconnect_min_ms, reconnect_max_ms, log_interval_ms, drain_timeout_ms;
  railover_log_fn log;

  pthread_t thread;
  int wake_fds[2]; /* finalize writes to [1] to cut the sender's sleep short */
  _Atomic int stop;

  /* Sender thread state. */
  int fd;
  uint32_t backoff_ms;
  int64_t next_connect_ns;
  int quiet_failures; /* log only the first failed attempt of a streak */
  unsigned char out_buf[OUT_BUF_SIZE];
  uint32_t out_len, out_off;
  uint32_t out_frame_end[MAX_OUT_FRAMES];
  unsigned char out_frame_kind[MAX_OUT_FRAMES];
  uint32_t out_frames, out_frames_done;
  unsigned char in_buf[IN_BUF_SIZE];
  uint32_t in_len;
  /* A BALANCE or NVL_TRANSIT COMMAND read, waiting for its extension frame (the
   * next frame on the connection). */
  railover_wire_command ext_cmd;
  int ext_waiting;
  int64_t last_drop_log_ns;
  uint64_t logged_drops;
} rv_plugin;

/* ---------------------------------------------------------------- helpers */

static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline uint64_t realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

__attribute__((format(printf, 3, 4))) static void plog(const rv_plugin* p, int level,
                                                       const char* fmt, ...) {
  if (p->log == NULL) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  p->log(level, msg);
}

/* Copies a name into a fixed NUL-padded wire field. Cuts at most
 * RAILOVER_WIRE_NAME_LEN-1 bytes, backing off to a UTF-8 character boundary
 * so the agent never sees half a character. */
static inline void put_name(char* dst, const char* src) {
  size_t n = src ? strnlen(src, RAILOVER_WIRE_NAME_LEN) : 0;
  if (n >= RAILOVER_WIRE_NAME_LEN) {
    n = RAILOVER_WIRE_NAME_LEN - 1;
    while (n > 0 && ((unsigned char)src[n] & 0xC0u) == 0x80u) n--;
  }
  if (n) memcpy(dst, src, n);
  memset(dst + n, 0, RAILOVER_WIRE_NAME_LEN - n);
}

static inline void put_header_at(unsigned char* frame, uint16_t version, uint16_t type,
                                 uint32_t payload_len) {
  railover_wire_header h = {RAILOVER_WIRE_MAGIC, version, type, payload_len, 0};
  memcpy(frame, &h, sizeof(h));
}

/* Every frame but a HELLO naming a job has its version-1 layout: sent as version 1,
 * which agents of every version read (railover_wire.h, "Versions"). */
static inline void put_header(unsigned char* frame, uint16_t type, uint32_t payload_len) {
  put_header_at(frame, RAILOVER_WIRE_VERSION_MIN, type, payload_len);
}

/* Claims a ring slot for a report, or counts the drop. Before the first
 * connection the ring holds reports for it; once an agent has been and gone,
 * what is made while it is away has nowhere to go. */
static inline rv_report_slot* begin_report(rv_plugin* p, uint64_t* pos) {
  if (!atomic_load_explicit(&p->connected, memory_order_relaxed) &&
      atomic_load_explicit(&p->ever_connected, memory_order_relaxed)) {
    atomic_fetch_add_explicit(&p->dropped_no_agent_call.value, 1, memory_order_relaxed);
    return NULL;
  }
  rv_report_slot* s = rv_ring_reserve(&p->reports, pos);
  if (s == NULL)
    atomic_fetch_add_explicit(&p->dropped_ring_full.value, 1, memory_order_relaxed);
  return s;
}

/* ------------------------------------------------------------ report path */

static int report_cqe_error(void* handle, const char* dev_name, uint32_t port, uint32_t qp_num,
                            uint32_t wc_status, uint32_t vendor_err, const char* peer) {
  rv_plugin* p = handle;
  if (p == NULL || dev_name == NULL) return RAILOVER_ERR_INVALID;
  uint64_t pos;
  rv_report_slot* s = begin_report(p, &pos);
  if (s == NULL) return RAILOVER_DROPPED;
  railover_wire_cqe_error* m = (railover_wire_cqe_error*)(void*)(s->frame + RAILOVER_WIRE_HEADER_SIZE);
  put_header(s->frame, RAILOVER_MSG_CQE_ERROR, sizeof(*m));
  m->timestamp_ns = realtime_ns();
  m->port = port;
  m->qp_num = qp_num;
  m->wc_status = wc_status;
  m->vendor_err = vendor_err;
  m->pid = p->pid;
  m->reserved = 0;
  put_name(m->dev_name, dev_name);
  put_name(m->peer, peer);
  s->len = RAILOVER_WIRE_HEADER_SIZE + sizeof(*m);
  rv_ring_commit(&p->reports, pos);
  return RAILOVER_OK;
}

static int report_port_event(void* handle, const char* dev_name, uint32_t port,
                             uint32_t ibv_event_type) {
  rv_plugin* p = handle;
  if (p == NULL || dev_name == NULL) return RAILOVER_ERR_INVALID;
  uint64_t pos;
  rv_report_slot* s = begin_report(p, &pos);
  if (s == NULL) return RAILOVER_DROPPED;
  railover_wire_port_event* m = (railover_wire_port_event*)(void*)(s->frame + RAILOVER_WIRE_HEADER_SIZE);
  put_header(s->frame, RAILOVER_MSG_PORT_EVENT, sizeof(*m));
  m->timestamp_ns = realtime_ns();
  m->port = port;
  m->ibv_event_type = ibv_event_type;
  m->pid = p->pid;
  m->reserved = 0;
  put_name(m->dev_name, dev_name);
  s->len = RAILOVER_WIRE_HEADER_SIZE + sizeof(*m);
  rv_ring_commit(&p->reports, pos);
  return RAILOVER_OK;
}

static int report_path_switch(void* handle, uint64_t comm_id, uint32_t channel,
                              const char* from_dev, const char* to_dev, uint32_t reason) {
  rv_plugin* p = handle;
  if (p == NULL || from_dev == NULL || to_dev == NULL) return RAILOVER_ERR_INVALID;
  uint64_t pos;
  rv_report_slot* s = begin_report(p, &pos);
  if (s == NULL) return RAILOVER_DROPPED;
  railover_wire_path_switch* m = (railover_wire_path_switch*)(void*)(s->frame + RAILOVER_WIRE_HEADER_SIZE);
  put_header(s->frame, RAILOVER_MSG_PATH_SWITCH, sizeof(*m));
  m->comm_id = comm_id;
  m->timestamp_ns = realtime_ns();
  m->channel = channel;
  m->reason = reason;
  m->pid = p->pid;
  m->reserved = 0;
  put_name(m->from_dev, from_dev);
  put_name(m->to_dev, to_dev);
  s->len = RAILOVER_WIRE_HEADER_SIZE + sizeof(*m);
  rv_ring_commit(&p->reports, pos);
  return RAILOVER_OK;
}

static int report_progress(void* handle, uint64_t comm_id, uint32_t rank, uint64_t ops_done) {
  rv_plugin* p = handle;
  if (p == NULL) return RAILOVER_ERR_INVALID;
  uint64_t pos;
  rv_report_slot* s = begin_report(p, &pos);
  if (s == NULL) return RAILOVER_DROPPED;
  railover_wire_progress* m = (railover_wire_progress*)(void*)(s->frame + RAILOVER_WIRE_HEADER_SIZE);
  put_header(s->frame, RAILOVER_MSG_PROGRESS, sizeof(*m));
  m->comm_id = comm_id;
  m->ops_done = ops_done;
  m->timestamp_ns = realtime_ns();
  m->rank = rank;
  m->pid = p->pid;
  s->len = RAILOVER_WIRE_HEADER_SIZE + sizeof(*m);
  rv_ring_commit(&p->reports, pos);
  return RAILOVER_OK;
}

static int push_ack(rv_plugin* p, uint64_t command_id, int32_t status, int with_ops,
                    uint64_t ops_done);

/* The ABI 1 view of the queue: a caller built against it knows neither BALANCE
 * nor NVL_TRANSIT. A balance runs as the DCR plan it carries; a transit it cannot
 * do is answered for it. */
static int poll_command(void* handle, railover_command_t* out) {
  rv_plugin* p = handle;
  if (p == NULL || out == NULL) return RAILOVER_ERR_INVALID;
  uint64_t pos;
  for (;;) {
    railover_command_v2_t* c = rv_ring_peek(&p->commands, &pos);
    if (c == NULL) return RAILOVER_NO_COMMAND;
    railover_command_t base = c->base;
    rv_ring_release(&p->commands, pos);
    if (base.kind == RAILOVER_CMD_NVL_TRANSIT) {
      atomic_fetch_add_explicit(&p->unsupported_call.value, 1, memory_order_relaxed);
      push_ack(p, base.command_id, RAILOVER_ACK_UNSUPPORTED, 0, 0);
      continue;
    }
    if (base.kind == RAILOVER_CMD_BALANCE) base.kind = RAILOVER_CMD_REBALANCE;
    *out = base;
    return RAILOVER_OK;
  }
}

static int poll_command_v2(void* handle, railover_command_v2_t* out, size_t out_size) {
  rv_plugin* p = handle;
  if (p == NULL || out == NULL || out_size < sizeof(railover_command_t))
    return RAILOVER_ERR_INVALID;
  uint64_t pos;
  railover_command_v2_t* c = rv_ring_peek(&p->commands, &pos);
  if (c == NULL) return RAILOVER_NO_COMMAND;
  memcpy(out, c, out_size < sizeof(*c) ? out_size : sizeof(*c));
  rv_ring_release(&p->commands, pos);
  return RAILOVER_OK;
}

static int push_ack(rv_plugin* p, uint64_t command_id, int32_t status, int with_ops,
                    uint64_t ops_done) {
  uint64_t pos;
  rv_ack_slot* a = rv_ring_reserve(&p->acks, &pos);
  if (a == NULL) {
    atomic_fetch_add_explicit(&p->acks_dropped_call.value, 1, memory_order_relaxed);
    return RAILOVER_DROPPED;
  }
  a->command_id = command_id;
  a->ops_done = ops_done;
  a->status = status;
  a->with_ops = with_ops;
  rv_ring_commit(&p->acks, pos);
  return RAILOVER_OK;
}

static int queue_ack(rv_plugin* p, uint64_t command_id, int32_t status, int with_ops,
                     uint64_t ops_done) {
  if (p == NULL) return RAILOVER_ERR_INVALID;
  /* Commands only come over a connection, so an answer with none is stale. */
  if (!atomic_load_explicit(&p->connected, memory_order_relaxed)) {
    atomic_fetch_add_explicit(&p->acks_dropped_call.value, 1, memory_order_relaxed);
    return RAILOVER_DROPPED;
  }
  return push_ack(p, command_id, status, with_ops, ops_done);
}

static int ack_command(void* handle, uint64_t command_id, int32_t status) {
  return queue_ack(handle, command_id, status, 0, 0);
}

static int ack_command_at(void* handle, uint64_t command_id, int32_t status, uint64_t ops_done) {
  return queue_ack(handle, command_id, status, 1, ops_done);
}

/* ------------------------------------------------------- switch agreement */

static int vote_armed(const railover_switch_vote_t* v) {
  return v->epoch != 0 && v->switch_at != 0;
}

static int same_plan(const railover_switch_vote_t* a, const railover_switch_vote_t* b) {
  return a->epoch == b->epoch && a->switch_at == b->switch_at && a->kind == b->kind &&
         a->disabled_channels == b->disabled_channels;
}

/* The rules are in railover_plugin.h ("Switch points"); this is them, in order. */
static int agree(const railover_switch_vote_t* votes, uint32_t n_votes, uint32_t self,
                 railover_agreement_t* out) {
  if (votes == NULL || out == NULL || n_votes == 0 || self >= n_votes) return RAILOVER_ERR_INVALID;
  const railover_switch_vote_t* newest = NULL;
  uint64_t max_ops = 0;
  for (uint32_t i = 0; i < n_votes; i++) {
    if (votes[i].ops_done > max_ops) max_ops = votes[i].ops_done;
    if (vote_armed(&votes[i]) && (newest == NULL || votes[i].epoch > newest->epoch))
      newest = &votes[i];
  }
  railover_agreement_t r;
  memset(&r, 0, sizeof(r));
  r.max_ops_done = max_ops;
  r.outcome = RAILOVER_AGREE_NONE;
  r.action = RAILOVER_ACT_KEEP;
  if (newest != NULL) {
    uint64_t n = newest->switch_at;
    int all_armed = 1, conflict = 0, reached_without = 0;
    for (uint32_t i = 0; i < n_votes; i++) {
      const railover_switch_vote_t* v = &votes[i];
      if (vote_armed(v) && v->epoch == newest->epoch) {
        if (!same_plan(v, newest)) conflict = 1;
      } else {
        all_armed = 0;
        if (v->ops_done >= n) reached_without = 1;
      }
    }
    r.epoch = newest->epoch;
    r.switch_at = n;
    if (conflict || max_ops > n || (!all_armed && reached_without)) {
      r.outcome = RAILOVER_AGREE_REJECT;
      if (vote_armed(&votes[self])) r.action = RAILOVER_ACT_TOO_LATE;
    } else if (all_armed) {
      r.outcome = RAILOVER_AGREE_APPLY;
      r.action = RAILOVER_ACT_COMMIT;
    } else {
      r.outcome = RAILOVER_AGREE_WAIT;
      /* A newer epoch is on its way to this rank: what it armed is superseded,
       * and holding for it could only stall everyone. */
      if (vote_armed(&votes[self]) && votes[self].epoch < newest->epoch)
        r.action = RAILOVER_ACT_TOO_LATE;
    }
  }
  *out = r;
  return RAILOVER_OK;
}

static inline uint64_t ld(_Atomic uint64_t* v) {
  return atomic_load_explicit(v, memory_order_relaxed);
}

static int stats(void* handle, railover_stats_t* out, size_t out_size) {
  rv_plugin* p = handle;
  if (p == NULL || out == NULL) return RAILOVER_ERR_INVALID;
  railover_stats_t s;
  /* `sent` is read before the queues so a report moving from queued to sent
   * between the loads is never counted twice (it may be briefly missed). */
  s.sent = ld(&p->sent);
  s.queued = ld(&p->out_reports) + rv_ring_count(&p->reports);
  s.dropped_ring_full = ld(&p->dropped_ring_full.value);
  s.dropped_no_agent = ld(&p->dropped_no_agent_call.value) + ld(&p->dropped_no_agent_sender);
  s.bytes_sent = ld(&p->bytes_sent);
  s.hellos_sent = ld(&p->hellos_sent);
  s.acks_sent = ld(&p->acks_sent);
  s.acks_dropped = ld(&p->acks_dropped_call.value) + ld(&p->acks_dropped_sender);
  s.commands_received = ld(&p->commands_received);
  s.commands_dropped = ld(&p->commands_dropped);
  s.commands_unsupported = ld(&p->commands_unsupported) + ld(&p->unsupported_call.value);
  s.malformed_received = ld(&p->malformed_received);
  s.connects = ld(&p->connects);
  s.disconnects = ld(&p->disconnects);
  s.connect_failures = ld(&p->connect_failures);
  s.connected = (uint64_t)atomic_load_explicit(&p->connected, memory_order_relaxed);
  s.commands_invalid = ld(&p->commands_invalid);
  memcpy(out, &s, out_size < sizeof(s) ? out_size : sizeof(s));
  return RAILOVER_OK;
}

/* ---------------------------------------------------------- sender thread */

static void bump(_Atomic uint64_t* v, uint64_t n) {
  /* Single writer: a plain load+store is enough and cheaper than an RMW. */
  atomic_store_explicit(v, atomic_load_explicit(v, memory_order_relaxed) + n,
                        memory_order_relaxed);
}

static int out_append(rv_plugin* p, const void* frame, uint32_t len, unsigned char kind) {
  if (p->out_len + len > OUT_BUF_SIZE || p->out_frames == MAX_OUT_FRAMES) return 0;
  memcpy(p->out_buf + p->out_len, frame, len);
  p->out_len += len;
  p->out_frame_end[p->out_frames] = p->out_len;
  p->out_frame_kind[p->out_frames] = kind;
  p->out_frames++;
  if (kind == FRAME_REPORT) bump(&p->out_reports, 1);
  return 1;
}

/* Credits frames whose last byte has been written. */
static void out_credit(rv_plugin* p) {
  uint64_t reports = 0;
  while (p->out_frames_done < p->out_frames &&
         p->out_frame_end[p->out_frames_done] <= p->out_off) {
    switch (p->out_frame_kind[p->out_frames_done]) {
      case FRAME_REPORT: reports++; break;
      case FRAME_ACK: bump(&p->acks_sent, 1); break;
      default: bump(&p->hellos_sent, 1); break;
    }
    p->out_frames_done++;
  }
  if (reports) {
    /* Count as sent before leaving out_reports so stats never sees it in neither. */
    bump(&p->sent, reports);
    atomic_store_explicit(&p->out_reports, ld(&p->out_reports) - reports, memory_order_relaxed);
  }
  if (p->out_off == p->out_len) p->out_len = p->out_off = p->out_frames = p->out_frames_done = 0;
}

/* Everything in out_buf not yet written is lost with the connection. */
static void out_discard(rv_plugin* p) {
  uint64_t reports = 0;
  for (uint32_t i = p->out_frames_done; i < p->out_frames; i++) {
    if (p->out_frame_kind[i] == FRAME_REPORT) reports++;
    else if (p->out_frame_kind[i] == FRAME_ACK) bump(&p->acks_dropped_sender, 1);
  }
  bump(&p->dropped_no_agent_sender, reports);
  atomic_store_explicit(&p->out_reports, ld(&p->out_reports) - reports, memory_order_relaxed);
  p->out_len = p->out_off = p->out_frames = p->out_frames_done = 0;
}

/* Moves queued acks, then reports, into out_buf. Returns frames moved. */
static uint32_t out_fill(rv_plugin* p) {
  uint32_t moved = 0;
  uint64_t pos;
  unsigned char frame[RAILOVER_WIRE_HEADER_SIZE + sizeof(railover_wire_ack_at)];
  while (p->out_len + sizeof(frame) <= OUT_BUF_SIZE && p->out_frames < MAX_OUT_FRAMES) {
    rv_ack_slot* a = rv_ring_peek(&p->acks, &pos);
    if (a == NULL) break;
    uint32_t len;
    if (a->with_ops) {
      railover_wire_ack_at m = {a->command_id, a->status, p->pid, a->ops_done};
      put_header(frame, RAILOVER_MSG_ACK_AT, sizeof(m));
      memcpy(frame + RAILOVER_WIRE_HEADER_SIZE, &m, sizeof(m));
      len = RAILOVER_WIRE_HEADER_SIZE + sizeof(m);
    } else {
      railover_wire_ack m = {a->command_id, a->status, p->pid};
      put_header(frame, RAILOVER_MSG_ACK, sizeof(m));
      memcpy(frame + RAILOVER_WIRE_HEADER_SIZE, &m, sizeof(m));
      len = RAILOVER_WIRE_HEADER_SIZE + sizeof(m);
    }
    rv_ring_release(&p->acks, pos);
    out_append(p, frame, len, FRAME_ACK);
    moved++;
  }
  while (p->out_len + MAX_FRAME <= OUT_BUF_SIZE && p->out_frames < MAX_OUT_FRAMES) {
    rv_report_slot* s = rv_ring_peek(&p->reports, &pos);
    if (s == NULL) break;
    out_append(p, s->frame, s->len, FRAME_REPORT);
    rv_ring_release(&p->reports, pos);
    moved++;
  }
  return moved;
}

/* With no agent, queued reports and acks have nowhere to go. */
static void discard_queues(rv_plugin* p) {
  uint64_t pos, n = 0;
  while (rv_ring_peek(&p->reports, &pos) != NULL) {
    rv_ring_release(&p->reports, pos);
    n++;
  }
  if (n) bump(&p->dropped_no_agent_sender, n);
  n = 0;
  while (rv_ring_peek(&p->acks, &pos) != NULL) {
    rv_ring_release(&p->acks, pos);
    n++;
  }
  if (n) bump(&p->acks_dropped_sender, n);
}

static void disconnect(rv_plugin* p, const char* why, int err) {
  atomic_store_explicit(&p->connected, 0, memory_order_relaxed);
  close(p->fd);
  p->fd = -1;
  out_discard(p);
  p->in_len = 0;
  p->ext_waiting = 0;
  bump(&p->disconnects, 1);
  p->backoff_ms = p->reconnect_min_ms;
  p->next_connect_ns = mono_ns() + (int64_t)p->backoff_ms * 1000000LL;
  p->quiet_failures = 0;
  plog(p, RAILOVER_LOG_WARN, "railover: lost agent at %s: %s%s%s", p->socket_path, why,
       err ? ": " : "", err ? strerror(err) : "");
}

static void try_connect(rv_plugin* p) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int err = 0;
  if (fd < 0) {
    err = errno;
  } else {
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof(addr));
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, p->socket_path, strlen(p->socket_path));
    /* A unix-socket connect completes or fails at once (EAGAIN: backlog full). */
    if (connect(fd, (struct sockaddr*)&addr, sizeof(addr)) != 0) {
      err = errno;
      close(fd);
      fd = -1;
    }
  }
  if (fd < 0) {
    bump(&p->connect_failures, 1);
    if (!p->quiet_failures) {
      plog(p, RAILOVER_LOG_INFO, "railover: agent not reachable at %s (%s); retrying quietly",
           p->socket_path, strerror(err));
      p->quiet_failures = 1;
    }
    p->next_connect_ns = mono_ns() + (int64_t)p->backoff_ms * 1000000LL;
    p->backoff_ms = p->backoff_ms * 2 > p->reconnect_max_ms ? p->reconnect_max_ms
                                                            : p->backoff_ms * 2;
    return;
  }
  p->fd = fd;
  p->backoff_ms = p->reconnect_min_ms;
  p->quiet_failures = 0;
  /* Reports made before the first connection waited for it; after a later
   * disconnect, anything left from a race with it is stale. */
  if (atomic_load_explicit(&p->ever_connected, memory_order_relaxed)) discard_queues(p);
  atomic_store_explicit(&p->ever_connected, 1, memory_order_relaxed);
  unsigned char frame[RAILOVER_WIRE_HEADER_SIZE + sizeof(railover_wire_hello_v2)];
  railover_wire_hello_v2 h;
  memset(&h, 0, sizeof(h));
  h.comm_id = p->comm_id;
  h.pid = p->pid;
  h.abi_version = RAILOVER_PLUGIN_ABI_VERSION;
  h.rank = p->rank;
  h.incarnation = p->incarnation;
  /* A process that names no job says exactly what a plugin before version 2 says. */
  uint32_t len = sizeof(railover_wire_hello);
  if (p->job[0] != '\0') {
    memcpy(h.job, p->job, sizeof(h.job));
    len = sizeof(h);
  }
  put_header_at(frame, p->job[0] != '\0' ? 2 : 1, RAILOVER_MSG_HELLO, len);
  memcpy(frame + RAILOVER_WIRE_HEADER_SIZE, &h, len);
  out_append(p, frame, RAILOVER_WIRE_HEADER_SIZE + len, FRAME_HELLO);
  bump(&p->connects, 1);
  atomic_store_explicit(&p->connected, 1, memory_order_relaxed);
  plog(p, RAILOVER_LOG_INFO, "railover: connected to agent at %s", p->socket_path);
}

/* The payload size of `type` at `version`; UINT32_MAX for a type or version not known. */
static uint32_t expected_payload(uint16_t type, uint16_t version) {
  if (version < RAILOVER_WIRE_VERSION_MIN || version > RAILOVER_WIRE_VERSION) return UINT32_MAX;
  if (type == RAILOVER_MSG_HELLO && version >= 2) return sizeof(railover_wire_hello_v2);
  switch (type) {
    case RAILOVER_MSG_CQE_ERROR: return sizeof(railover_wire_cqe_error);
    case RAILOVER_MSG_PORT_EVENT: return sizeof(railover_wire_port_event);
    case RAILOVER_MSG_PATH_SWITCH: return sizeof(railover_wire_path_switch);
    case RAILOVER_MSG_PROGRESS: return sizeof(railover_wire_progress);
    case RAILOVER_MSG_HELLO: return sizeof(railover_wire_hello);
    case RAILOVER_MSG_COMMAND: return sizeof(railover_wire_command);
    case RAILOVER_MSG_ACK: return sizeof(railover_wire_ack);
    case RAILOVER_MSG_ACK_AT: return sizeof(railover_wire_ack_at);
    case RAILOVER_MSG_COMMAND_WEIGHTS: return sizeof(railover_wire_command_weights);
    case RAILOVER_MSG_COMMAND_TRANSIT: return sizeof(railover_wire_command_transit);
    default: return UINT32_MAX;
  }
}

/* Kinds this library hands to a CCL. 5 is another change's kind, not known here. */
static int known_kind(uint32_t kind) {
  switch (kind) {
    case RAILOVER_CMD_REBALANCE:
    case RAILOVER_CMD_FAILBACK:
    case RAILOVER_CMD_ABORT:
    case RAILOVER_CMD_FAILOVER:
    case RAILOVER_CMD_CHECKPOINT_NOW:
    case RAILOVER_CMD_BALANCE:
    case RAILOVER_CMD_NVL_TRANSIT: return 1;
    default: return 0;
  }
}

static int has_extension(uint32_t kind) {
  return kind == RAILOVER_CMD_BALANCE || kind == RAILOVER_CMD_NVL_TRANSIT;
}

/* Queues a command for poll_command; c's base says which. */
static void enqueue_command(rv_plugin* p, const railover_command_v2_t* c) {
  uint64_t pos;
  railover_command_v2_t* slot = rv_ring_reserve(&p->commands, &pos);
  if (slot == NULL) {
    bump(&p->commands_dropped, 1);
    plog(p, RAILOVER_LOG_WARN, "railover: command queue full; command %llu answered BUSY",
         (unsigned long long)c->base.command_id);
    push_ack(p, c->base.command_id, RAILOVER_ACK_BUSY, 0, 0);
    return;
  }
  *slot = *c;
  rv_ring_commit(&p->commands, pos);
}

static void command_base(railover_command_v2_t* c, const railover_wire_command* w) {
  memset(c, 0, sizeof(*c));
  c->base.command_id = w->command_id;
  c->base.comm_id = w->comm_id;
  c->base.ops_done = w->ops_done;
  c->base.disabled_channels = w->disabled_channels;
  c->base.kind = w->kind;
  c->base.epoch = w->epoch;
  c->iteration = w->iteration;
}

static void refuse_invalid(rv_plugin* p, uint64_t command_id, const char* why) {
  bump(&p->commands_invalid, 1);
  plog(p, RAILOVER_LOG_WARN, "railover: command %llu refused: %s; answered FAILED",
       (unsigned long long)command_id, why);
  push_ack(p, command_id, RAILOVER_ACK_FAILED, 0, 0);
}

static void on_command(rv_plugin* p, const railover_wire_command* w) {
  bump(&p->commands_received, 1);
  if (!known_kind(w->kind)) {
    bump(&p->commands_unsupported, 1);
    plog(p, RAILOVER_LOG_WARN, "railover: command %llu has unknown kind %u; answered UNSUPPORTED",
         (unsigned long long)w->command_id, w->kind);
    push_ack(p, w->command_id, RAILOVER_ACK_UNSUPPORTED, 0, 0);
    return;
  }
  if (has_extension(w->kind)) {
    /* Queued once its extension, the next frame, has been read and checked. */
    p->ext_cmd = *w;
    p->ext_waiting = 1;
    return;
  }
  railover_command_v2_t c;
  command_base(&c, w);
  enqueue_command(p, &c);
}

/* The weights frame after a BALANCE: each weight finite and >= 0, some > 0. */
static void on_weights(rv_plugin* p, const railover_wire_command_weights* x) {
  const char* bad = NULL;
  double sum = 0.0;
  if (x->n_channels == 0 || x->n_channels > RAILOVER_WIRE_MAX_CHANNELS) {
    bad = "channel count outside 1..64";
  } else if (!isfinite(x->split_ratio) || x->split_ratio < 0.0f || x->split_ratio >= 1.0f) {
    bad = "split ratio outside [0, 1)";
  } else {
    for (uint32_t i = 0; i < x->n_channels && bad == NULL; i++) {
      if (!isfinite(x->weights[i]) || x->weights[i] < 0.0f) bad = "a weight is not a finite number >= 0";
      else sum += x->weights[i];
    }
    if (bad == NULL && !(sum > 0.0)) bad = "the weights sum to 0";
  }
  if (bad != NULL) {
    refuse_invalid(p, x->command_id, bad);
    return;
  }
  railover_command_v2_t c;
  command_base(&c, &p->ext_cmd);
  c.n_channels = x->n_channels;
  c.split_ratio = x->split_ratio;
  memcpy(c.weights, x->weights, x->n_channels * sizeof(float));
  enqueue_command(p, &c);
}

/* The transit frame after an NVL_TRANSIT: a bounded count and some memory to use. */
static void on_transit(rv_plugin* p, const railover_wire_command_transit* x) {
  if (x->n_ranks == 0 || x->n_ranks > RAILOVER_WIRE_MAX_TRANSIT) {
    refuse_invalid(p, x->command_id, "transit count outside 1..16");
    return;
  }
  if (x->mb_per_channel == 0) {
    refuse_invalid(p, x->command_id, "no transit memory per channel");
    return;
  }
  railover_command_v2_t c;
  command_base(&c, &p->ext_cmd);
  c.n_transit = x->n_ranks;
  c.mb_per_channel = x->mb_per_channel;
  memcpy(c.transit_ranks, x->ranks, x->n_ranks * sizeof(uint32_t));
  memcpy(c.transit_gpus, x->transit_gpus, x->n_ranks * sizeof(uint32_t));
  enqueue_command(p, &c);
}

static int malformed(rv_plugin* p, const char* why) {
  bump(&p->malformed_received, 1);
  disconnect(p, why, 0);
  return -1;
}

/* Parses complete frames in in_buf. Returns 0, or -1 after dropping the
 * connection for a malformed frame. */
static int parse_input(rv_plugin* p) {
  uint32_t off = 0;
  while (p->in_len - off >= RAILOVER_WIRE_HEADER_SIZE) {
    railover_wire_header h;
    memcpy(&h, p->in_buf + off, sizeof(h));
    uint32_t want = expected_payload(h.type, h.version);
    if (h.magic != RAILOVER_WIRE_MAGIC || h.payload_len > RAILOVER_WIRE_MAX_PAYLOAD ||
        h.payload_len != want) {
      bump(&p->malformed_received, 1);
      char why[160];
      snprintf(why, sizeof(why), "malformed frame (magic 0x%08x version %u type %u length %u)",
               h.magic, h.version, h.type, h.payload_len);
      disconnect(p, why, 0);
      return -1;
    }
    if (p->in_len - off < RAILOVER_WIRE_HEADER_SIZE + h.payload_len) break;
    const unsigned char* payload = p->in_buf + off + RAILOVER_WIRE_HEADER_SIZE;
    int is_ext = h.type == RAILOVER_MSG_COMMAND_WEIGHTS || h.type == RAILOVER_MSG_COMMAND_TRANSIT;
    if (p->ext_waiting || is_ext) {
      /* An extension and its COMMAND are one unit: each needs the other, next to it. */
      uint16_t want_type = p->ext_cmd.kind == RAILOVER_CMD_BALANCE ? RAILOVER_MSG_COMMAND_WEIGHTS
                                                                  : RAILOVER_MSG_COMMAND_TRANSIT;
      uint64_t ext_id;
      memcpy(&ext_id, payload, sizeof(ext_id)); /* command_id leads both extensions */
      if (!p->ext_waiting || h.type != want_type || ext_id != p->ext_cmd.command_id) {
        char why[160];
        snprintf(why, sizeof(why),
                 "malformed stream (frame type %u where %s expected)", h.type,
                 p->ext_waiting ? "a COMMAND's extension" : "no extension");
        return malformed(p, why);
      }
      p->ext_waiting = 0;
      if (h.type == RAILOVER_MSG_COMMAND_WEIGHTS) {
        railover_wire_command_weights x;
        memcpy(&x, payload, sizeof(x));
        on_weights(p, &x);
      } else {
        railover_wire_command_transit x;
        memcpy(&x, payload, sizeof(x));
        on_transit(p, &x);
      }
    } else if (h.type == RAILOVER_MSG_COMMAND) {
      railover_wire_command w;
      memcpy(&w, payload, sizeof(w));
      on_command(p, &w);
    }
    /* Other well-formed types mean nothing in this direction; skip them. */
    off += RAILOVER_WIRE_HEADER_SIZE + h.payload_len;
  }
  memmove(p->in_buf, p->in_buf + off, p->in_len - off);
  p->in_len -= off;
  return 0;
}

/* Reads whatever the agent sent. Returns bytes read, or -1 if disconnected. */
static int read_input(rv_plugin* p) {
  int total = 0;
  for (;;) {
    ssize_t n = recv(p->fd, p->in_buf + p->in_len, IN_BUF_SIZE - p->in_len, MSG_DONTWAIT);
    if (n > 0) {
      p->in_len += (uint32_t)n;
      total += (int)n;
      if (parse_input(p) < 0) return -1;
      continue;
    }
    if (n == 0) {
      disconnect(p, "agent closed the connection", 0);
      return -1;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return total;
    disconnect(p, "read failed", errno);
    return -1;
  }
}

/* Writes pending output. Returns bytes written, or -1 if disconnected. */
static int write_output(rv_plugin* p) {
  int total = 0;
  while (p->out_off < p->out_len) {
    ssize_t n = send(p->fd, p->out_buf + p->out_off, p->out_len - p->out_off,
                     MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      p->out_off += (uint32_t)n;
      bump(&p->bytes_sent, (uint64_t)n);
      total += (int)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    out_credit(p);
    disconnect(p, "write failed", n < 0 ? errno : 0);
    return -1;
  }
  out_credit(p);
  return total;
}

static void maybe_log_drops(rv_plugin* p, int64_t now) {
  if (now - p->last_drop_log_ns < (int64_t)p->log_interval_ms * 1000000LL) return;
  uint64_t full = ld(&p->dropped_ring_full.value);
  uint64_t absent = ld(&p->dropped_no_agent_call.value) + ld(&p->dropped_no_agent_sender);
  if (full + absent == p->logged_drops) return;
  plog(p, RAILOVER_LOG_WARN,
       "railover: dropped %llu reports since the last notice (total: %llu ring full, %llu no "
       "agent)",
       (unsigned long long)(full + absent - p->logged_drops), (unsigned long long)full,
       (unsigned long long)absent);
  p->logged_drops = full + absent;
  p->last_drop_log_ns = now;
}

static void wait_for(rv_plugin* p, short events, int64_t timeout_ns) {
  struct pollfd fds[2] = {{p->wake_fds[0], POLLIN, 0}, {p->fd, events, 0}};
  struct timespec ts = {timeout_ns / 1000000000LL, timeout_ns % 1000000000LL};
  if (ppoll(fds, p->fd >= 0 ? 2 : 1, &ts, NULL) > 0 && (fds[0].revents & POLLIN)) {
    char drain[16];
    while (read(p->wake_fds[0], drain, sizeof(drain)) > 0) {
    }
  }
}

static int work_left(rv_plugin* p) {
  return p->out_len > p->out_off || rv_ring_count(&p->reports) || rv_ring_count(&p->acks);
}

static void* sender_main(void* arg) {
  rv_plugin* p = arg;
  int64_t idle_ns = IDLE_WAIT_MIN_NS;
  int64_t drain_deadline = 0;
  for (;;) {
    int64_t now = mono_ns();
    if (atomic_load_explicit(&p->stop, memory_order_acquire)) {
      if (drain_deadline == 0) drain_deadline = now + (int64_t)p->drain_timeout_ms * 1000000LL;
      if (p->fd < 0 || !work_left(p) || now >= drain_deadline) break;
    }
    if (p->fd < 0) {
      if (atomic_load_explicit(&p->ever_connected, memory_order_relaxed)) discard_queues(p);
      maybe_log_drops(p, now);
      if (now >= p->next_connect_ns) try_connect(p);
      if (p->fd < 0) {
        wait_for(p, 0, p->next_connect_ns - mono_ns() > 0 ? p->next_connect_ns - mono_ns() : 0);
        continue;
      }
    }
    int progress = 0;
    if (p->out_off == p->out_len) progress += (int)out_fill(p);
    int w = write_output(p);
    if (w < 0) continue;
    progress += w;
    int r = read_input(p);
    if (r < 0) continue;
    progress += r;
    maybe_log_drops(p, now);
    if (progress) {
      idle_ns = IDLE_WAIT_MIN_NS;
      continue;
    }
    /* Producers never signal (a syscall per report would cost more than the
     * report), so an idle sender naps briefly; the socket wakes it for
     * commands and for buffer space. */
    wait_for(p, (short)(POLLIN | (p->out_off < p->out_len ? POLLOUT : 0)), idle_ns);
    idle_ns = idle_ns * 2 > IDLE_WAIT_MAX_NS ? IDLE_WAIT_MAX_NS : idle_ns * 2;
  }
  if (p->fd >= 0) {
    out_discard(p);
    close(p->fd);
    p->fd = -1;
    atomic_store_explicit(&p->connected, 0, memory_order_relaxed);
    bump(&p->disconnects, 1);
  }
  discard_queues(p);
  maybe_log_drops(p, INT64_MAX / 2);
  return NULL;
}

/* ------------------------------------------------------------- lifecycle */

static int read_env_u32(const char* name, uint32_t* out, railover_log_fn log) {
  const char* v = getenv(name);
  if (v == NULL || *v == '\0') return 0;
  char* end = NULL;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (errno != 0 || *end != '\0' || x > UINT32_MAX || v[0] == '-') {
    if (log) {
      char msg[256];
      snprintf(msg, sizeof(msg), "railover: %s=\"%.64s\" is not a 32-bit unsigned integer",
               name, v);
      log(RAILOVER_LOG_ERROR, msg);
    }
    return -1;
  }
  *out = (uint32_t)x;
  return 0;
}

static uint32_t pick(uint32_t configured, uint32_t fallback) {
  return configured ? configured : fallback;
}

static void free_plugin(rv_plugin* p) {
  rv_ring_destroy(&p->reports);
  rv_ring_destroy(&p->acks);
  rv_ring_destroy(&p->commands);
  if (p->wake_fds[0] >= 0) close(p->wake_fds[0]);
  if (p->wake_fds[1] >= 0) close(p->wake_fds[1]);
  free(p);
}

/* The job HELLO names: the configured one, else RAILOVER_JOB_ID, else none (""). */
static int pick_job(const char* configured, char* out, railover_log_fn log) {
  const char* job = configured;
  if (job == NULL || *job == '\0') job = getenv("RAILOVER_JOB_ID");
  if (job == NULL) job = "";
  size_t n = strlen(job);
  if (n >= RAILOVER_WIRE_JOB_LEN) {
    if (log) {
      char msg[256];
      snprintf(msg, sizeof(msg), "railover: the job id \"%.32s...\" is %zu bytes; at most %u fit",
               job, n, RAILOVER_WIRE_JOB_LEN - 1);
      log(RAILOVER_LOG_ERROR, msg);
    }
    return -1;
  }
  memset(out, 0, RAILOVER_WIRE_JOB_LEN);
  memcpy(out, job, n);
  return 0;
}

static int init_with(const railover_config_v3_t* config, railover_log_fn log, void** handle) {
  if (handle == NULL) return RAILOVER_ERR_INVALID;
  *handle = NULL;
  railover_config_t cfg;
  memset(&cfg, 0, sizeof(cfg));
  cfg.rank = RAILOVER_RANK_UNKNOWN;
  if (config) cfg = config->base;
  char job[RAILOVER_WIRE_JOB_LEN];
  if (pick_job(config ? config->job_id : NULL, job, log) != 0) return RAILOVER_ERR_CONFIG;
  uint32_t incarnation = config ? config->incarnation : 0;
  if (incarnation == 0 && read_env_u32("RAILOVER_JOB_INCARNATION", &incarnation, log) != 0)
    return RAILOVER_ERR_CONFIG;

  const char* path = cfg.socket_path;
  if (path == NULL || *path == '\0') path = getenv("RAILOVER_PLUGIN_SOCKET");
  if (path == NULL || *path == '\0') path = DEFAULT_SOCKET;
  uint32_t ring = cfg.ring_size;
  if (ring == 0 && read_env_u32("RAILOVER_PLUGIN_RING_SIZE", &ring, log) != 0)
    return RAILOVER_ERR_CONFIG;
  ring = pick(ring, DEFAULT_RING);

  char msg[256];
  if (strlen(path) >= sizeof(((struct sockaddr_un*)0)->sun_path)) {
    snprintf(msg, sizeof(msg), "railover: socket path is %zu bytes; at most %zu fit",
             strlen(path), sizeof(((struct sockaddr_un*)0)->sun_path) - 1);
    if (log) log(RAILOVER_LOG_ERROR, msg);
    return RAILOVER_ERR_CONFIG;
  }
  if (ring < MIN_RING || ring > MAX_RING) {
    snprintf(msg, sizeof(msg), "railover: ring size %u outside %u..%u", ring, MIN_RING, MAX_RING);
    if (log) log(RAILOVER_LOG_ERROR, msg);
    return RAILOVER_ERR_CONFIG;
  }
  uint64_t cap = 1;
  while (cap < ring) cap <<= 1;

  rv_plugin* p = NULL;
  if (posix_memalign((void**)&p, RV_CACHE_LINE, sizeof(*p)) != 0) return RAILOVER_ERR_SYSTEM;
  memset(p, 0, sizeof(*p));
  p->wake_fds[0] = p->wake_fds[1] = -1;
  p->fd = -1;
  if (rv_ring_init(&p->reports, cap, sizeof(rv_report_slot)) != 0 ||
      rv_ring_init(&p->acks, QUEUE_SMALL, sizeof(rv_ack_slot)) != 0 ||
      rv_ring_init(&p->commands, QUEUE_SMALL, sizeof(railover_command_v2_t)) != 0 ||
      pipe2(p->wake_fds, O_NONBLOCK | O_CLOEXEC) != 0) {
    free_plugin(p);
    return RAILOVER_ERR_SYSTEM;
  }
  memcpy(p->socket_path, path, strlen(path) + 1);
  p->pid = (uint32_t)getpid();
  p->rank = cfg.rank;
  p->comm_id = cfg.comm_id;
  memcpy(p->job, job, sizeof(p->job));
  p->incarnation = incarnation;
  p->reconnect_min_ms = pick(cfg.reconnect_min_ms, 10);
  p->reconnect_max_ms = pick(cfg.reconnect_max_ms, 1000);
  if (p->reconnect_max_ms < p->reconnect_min_ms) p->reconnect_max_ms = p->reconnect_min_ms;
  p->log_interval_ms = pick(cfg.log_interval_ms, 10000);
  p->drain_timeout_ms = pick(cfg.drain_timeout_ms, 1000);
  p->log = log;
  p->backoff_ms = p->reconnect_min_ms;
  p->last_drop_log_ns = mono_ns();
  atomic_init(&p->connected, 0);
  atomic_init(&p->ever_connected, 0);
  atomic_init(&p->stop, 0);
  if (pthread_create(&p->thread, NULL, sender_main, p) != 0) {
    free_plugin(p);
    return RAILOVER_ERR_SYSTEM;
  }
  *handle = p;
  return RAILOVER_OK;
}

static int init(const railover_config_t* config, railover_log_fn log, void** handle) {
  if (config == NULL) return init_with(NULL, log, handle);
  railover_config_v3_t v3;
  memset(&v3, 0, sizeof(v3));
  v3.base = *config;
  return init_with(&v3, log, handle);
}

static int init_v3(const railover_config_v3_t* config, size_t config_size, railover_log_fn log,
                   void** handle) {
  if (config == NULL) return init_with(NULL, log, handle);
  if (config_size < sizeof(railover_config_t)) {
    if (handle) *handle = NULL;
    return RAILOVER_ERR_INVALID;
  }
  railover_config_v3_t v3;
  memset(&v3, 0, sizeof(v3));
  memcpy(&v3, config, config_size < sizeof(v3) ? config_size : sizeof(v3));
  return init_with(&v3, log, handle);
}

static int finalize(void* handle) {
  rv_plugin* p = handle;
  if (p == NULL) return RAILOVER_ERR_INVALID;
  atomic_store_explicit(&p->stop, 1, memory_order_release);
  ssize_t ignored = write(p->wake_fds[1], "x", 1); /* full pipe: sender is awake anyway */
  (void)ignored;
  pthread_join(p->thread, NULL);
  free_plugin(p);
  return RAILOVER_OK;
}

EXPORT const railoverPlugin_v1_t railoverPlugin_v1 = {
    .name = "railover",
    .abi_version = 1,
    .init = init,
    .finalize = finalize,
    .report_cqe_error = report_cqe_error,
    .report_port_event = report_port_event,
    .report_path_switch = report_path_switch,
    .report_progress = report_progress,
    .poll_command = poll_command,
    .ack_command = ack_command,
    .stats = stats,
    .ack_command_at = ack_command_at,
    .agree = agree,
};

EXPORT const railoverPlugin_v2_t railoverPlugin_v2 = {
    .name = "railover",
    .abi_version = 2,
    .init = init,
    .finalize = finalize,
    .report_cqe_error = report_cqe_error,
    .report_port_event = report_port_event,
    .report_path_switch = report_path_switch,
    .report_progress = report_progress,
    .poll_command = poll_command,
    .ack_command = ack_command,
    .stats = stats,
    .ack_command_at = ack_command_at,
    .agree = agree,
    .poll_command_v2 = poll_command_v2,
};

EXPORT const railoverPlugin_v3_t railoverPlugin_v3 = {
    .name = "railover",
    .abi_version = 3,
    .init = init,
    .finalize = finalize,
    .report_cqe_error = report_cqe_error,
    .report_port_event = report_port_event,
    .report_path_switch = report_path_switch,
    .report_progress = report_progress,
    .poll_command = poll_command,
    .ack_command = ack_command,
    .stats = stats,
    .ack_command_at = ack_command_at,
    .agree = agree,
    .poll_command_v2 = poll_command_v2,
    .init_v3 = init_v3,
};
