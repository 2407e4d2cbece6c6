/*
 * Stand-in CCL: several "proxy threads" report at full speed and poll for
 * commands while a small in-test agent listens on a unix socket, counts every
 * frame, sends commands, and finally sends garbage to check the plugin drops
 * and re-establishes the connection. Reports made before the agent exists
 * wait in the ring (all that fit) and arrive once it does. Checks, exactly:
 *   reports made == sent + dropped_ring_full + dropped_no_agent
 *   frames the listener counted == sent
 * Usage: test_ccl [threads] [reports_per_thread]
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "railover_plugin.h"
#include "check.h"

static const railoverPlugin_v1_t* api;
static void* handle;

/* ----------------------------------------------------------- the listener */

#define N_COMMANDS 8 /* valid commands sent per connection; plus one unknown kind */

typedef struct {
  char path[108];
  int listen_fd;
  _Atomic int stop;
  _Atomic int send_garbage; /* next time: write a bad frame to the plugin */
  _Atomic uint64_t reports, hellos, acks_applied, acks_unsupported, acks_other, bad_frames;
  _Atomic uint64_t connections, commands_sent;
  _Atomic uint64_t first_progress, last_progress; /* ops_done of the first and latest
                                                   * in-order early reports (rank 99) */
  _Atomic int progress_seen;
  uint64_t next_command_id;
  pthread_t thread;
} listener_t;

static void send_all(int fd, const void* buf, size_t len) {
  const char* p = buf;
  while (len) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return;
    p += n;
    len -= (size_t)n;
  }
}

static void send_command(listener_t* l, int fd, uint32_t kind) {
  unsigned char frame[RAILOVER_WIRE_HEADER_SIZE + sizeof(railover_wire_command)];
  railover_wire_header h = {RAILOVER_WIRE_MAGIC, RAILOVER_WIRE_VERSION, RAILOVER_MSG_COMMAND,
                            sizeof(railover_wire_command), 0};
  railover_wire_command c = {++l->next_command_id, 77, 1000, 0x5, kind, 1, 0};
  memcpy(frame, &h, sizeof(h));
  memcpy(frame + sizeof(h), &c, sizeof(c));
  send_all(fd, frame, sizeof(frame));
  atomic_fetch_add(&l->commands_sent, 1);
}

static void serve(listener_t* l, int fd) {
  static unsigned char buf[1 << 16];
  size_t len = 0;
  atomic_fetch_add(&l->connections, 1);
  for (uint32_t i = 0; i < N_COMMANDS; i++) send_command(l, fd, 1 + i % 3);
  send_command(l, fd, 999); /* a kind from the future: the plugin must refuse it */
  while (!atomic_load(&l->stop)) {
    if (atomic_exchange(&l->send_garbage, 0)) {
      send_all(fd, "this is not a railover frame", 28);
    }
    struct pollfd pfd = {fd, POLLIN, 0};
    if (poll(&pfd, 1, 5) <= 0) continue;
    ssize_t n = recv(fd, buf + len, sizeof(buf) - len, 0);
    if (n <= 0) break;
    len += (size_t)n;
    size_t off = 0;
    while (len - off >= RAILOVER_WIRE_HEADER_SIZE) {
      railover_wire_header h;
      memcpy(&h, buf + off, sizeof(h));
      /* A process that names no job sends every frame at version 1 (railover_wire.h). */
      if (h.magic != RAILOVER_WIRE_MAGIC || h.version != RAILOVER_WIRE_VERSION_MIN ||
          h.payload_len > RAILOVER_WIRE_MAX_PAYLOAD) {
        atomic_fetch_add(&l->bad_frames, 1);
        close(fd);
        return;
      }
      if (len - off < RAILOVER_WIRE_HEADER_SIZE + h.payload_len) break;
      const unsigned char* payload = buf + off + RAILOVER_WIRE_HEADER_SIZE;
      switch (h.type) {
        case RAILOVER_MSG_HELLO: {
          railover_wire_hello hello;
          memcpy(&hello, payload, sizeof(hello));
          if (hello.abi_version != RAILOVER_PLUGIN_ABI_VERSION || hello.rank != 3)
            atomic_fetch_add(&l->bad_frames, 1);
          atomic_fetch_add(&l->hellos, 1);
          break;
        }
        case RAILOVER_MSG_ACK: {
          railover_wire_ack a;
          memcpy(&a, payload, sizeof(a));
          if (a.status == RAILOVER_ACK_APPLIED) atomic_fetch_add(&l->acks_applied, 1);
          else if (a.status == RAILOVER_ACK_UNSUPPORTED) atomic_fetch_add(&l->acks_unsupported, 1);
          else atomic_fetch_add(&l->acks_other, 1);
          break;
        }
        case RAILOVER_MSG_PROGRESS: {
          railover_wire_progress pr;
          memcpy(&pr, payload, sizeof(pr));
          if (pr.rank == 99) { /* the early reports */
            if (!atomic_exchange(&l->progress_seen, 1)) atomic_store(&l->first_progress, pr.ops_done);
            else if (atomic_load(&l->last_progress) + 1 == pr.ops_done)
              atomic_store(&l->last_progress, pr.ops_done);
          }
          atomic_fetch_add(&l->reports, 1);
          break;
        }
        case RAILOVER_MSG_CQE_ERROR:
        case RAILOVER_MSG_PORT_EVENT:
        case RAILOVER_MSG_PATH_SWITCH: atomic_fetch_add(&l->reports, 1); break;
        default: atomic_fetch_add(&l->bad_frames, 1); break;
      }
      off += RAILOVER_WIRE_HEADER_SIZE + h.payload_len;
    }
    memmove(buf, buf + off, len - off);
    len -= off;
  }
  close(fd);
}

static void* listener_main(void* arg) {
  listener_t* l = arg;
  while (!atomic_load(&l->stop)) {
    struct pollfd pfd = {l->listen_fd, POLLIN, 0};
    if (poll(&pfd, 1, 5) <= 0) continue;
    int fd = accept(l->listen_fd, NULL, NULL);
    if (fd >= 0) serve(l, fd);
  }
  return NULL;
}

static void listener_start(listener_t* l) {
  l->listen_fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  strcpy(addr.sun_path, l->path);
  CHECK(bind(l->listen_fd, (struct sockaddr*)&addr, sizeof(addr)) == 0, "bind %s", l->path);
  CHECK(listen(l->listen_fd, 8) == 0, "listen");
  pthread_create(&l->thread, NULL, listener_main, l);
}

static void listener_stop(listener_t* l) {
  atomic_store(&l->stop, 1);
  pthread_join(l->thread, NULL);
  close(l->listen_fd);
  unlink(l->path);
}

/* ------------------------------------------------------------- producers */

static uint64_t per_thread;
static int paced; /* yield now and then so the sender keeps up and most reports arrive */
static _Atomic uint64_t made, commands_seen;

static void take_commands(void) {
  railover_command_t c;
  while (api->poll_command(handle, &c) == RAILOVER_OK) {
    CHECK(c.comm_id == 77 && c.ops_done == 1000 && c.disabled_channels == 0x5 &&
              c.kind >= 1 && c.kind <= RAILOVER_CMD_LAST,
          "command fields %llu", (unsigned long long)c.command_id);
    CHECK(api->ack_command(handle, c.command_id, RAILOVER_ACK_APPLIED) == RAILOVER_OK, "ack");
    atomic_fetch_add(&commands_seen, 1);
  }
}

static void* proxy_thread(void* arg) {
  uint32_t rank = (uint32_t)(uintptr_t)arg;
  uint64_t n = 0;
  for (uint64_t i = 0; i < per_thread; i++) {
    int rc;
    switch (i % 1024) {
      case 1: rc = api->report_cqe_error(handle, "mlx5_0", 1, 0x1234, 12, 0x81, "10.0.0.7"); break;
      case 2: rc = api->report_port_event(handle, "mlx5_0", 1, 10); break;
      case 3: rc = api->report_path_switch(handle, 77, rank, "mlx5_0", "mlx5_1", 1); break;
      default: rc = api->report_progress(handle, 77, rank, i); break;
    }
    CHECK(rc == RAILOVER_OK || rc == RAILOVER_DROPPED, "report rc %d", rc);
    n++;
    if ((i & 63) == 0) take_commands();
    if (paced && (i & 15) == 0) sched_yield();
  }
  atomic_fetch_add(&made, n);
  return NULL;
}

static railover_stats_t get_stats(void) {
  railover_stats_t s;
  CHECK(api->stats(handle, &s, sizeof(s)) == RAILOVER_OK, "stats");
  return s;
}

static _Atomic int log_lines;
static void log_fn(int level, const char* msg) {
  (void)level;
  if (atomic_fetch_add(&log_lines, 1) < 20) fprintf(stderr, "  [plugin log %d] %s\n", level, msg);
}

int main(int argc, char** argv) {
  uint32_t threads = argc > 1 ? (uint32_t)atoi(argv[1]) : 4;
  per_thread = argc > 2 ? (uint64_t)atoll(argv[2]) : 250000;
  /* A CCL resolves the table by name; it must be the one we linked. */
  api = dlsym(RTLD_DEFAULT, "railoverPlugin_v1");
  CHECK(api == &railoverPlugin_v1 && api->abi_version == 1, "symbol");

  char dir[] = "/tmp/railover-test-XXXXXX";
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  listener_t l;
  memset(&l, 0, sizeof(l));
  snprintf(l.path, sizeof(l.path), "%s/agent.sock", dir);

  railover_config_t cfg = {.socket_path = l.path, .ring_size = 4096, .rank = 3, .comm_id = 77,
                           .reconnect_min_ms = 5, .reconnect_max_ms = 20};
  CHECK(api->init(&cfg, log_fn, &handle) == RAILOVER_OK, "init");

  /* 1. No agent yet: reports are kept in the ring until it is full; only the
   * ones beyond that are dropped. */
  enum { EARLY = 5000, RING = 4096 };
  for (int i = 0; i < EARLY; i++)
    CHECK(api->report_progress(handle, 77, 99, (uint64_t)i) == (i < RING ? RAILOVER_OK : RAILOVER_DROPPED),
          "early report %d", i);
  railover_stats_t s0 = get_stats();
  CHECK(s0.queued == RING && s0.dropped_ring_full == EARLY - RING && s0.dropped_no_agent == 0 &&
            s0.sent == 0 && s0.connected == 0,
        "queued %llu, ring full %llu, no agent %llu", (unsigned long long)s0.queued,
        (unsigned long long)s0.dropped_ring_full, (unsigned long long)s0.dropped_no_agent);
  CHECK(api->report_progress(NULL, 0, 0, 0) == RAILOVER_ERR_INVALID, "NULL handle");
  railover_command_t none;
  CHECK(api->poll_command(handle, &none) == RAILOVER_NO_COMMAND, "no command");

  /* 2. The agent appears later: the plugin connects by itself and sends what
   * waited, in order, before anything made after. */
  listener_start(&l);
  WAIT_UNTIL(get_stats().connected == 1, 10);
  WAIT_UNTIL(atomic_load(&l.reports) == RING && get_stats().sent == RING, 10);
  CHECK(atomic_load(&l.first_progress) == 0 && atomic_load(&l.last_progress) == RING - 1,
        "early reports in order: %llu .. %llu", (unsigned long long)atomic_load(&l.first_progress),
        (unsigned long long)atomic_load(&l.last_progress));

  /* Full speed first (the ring overflows and drops are counted), then paced. */
  pthread_t th[64];
  double t0 = now_s();
  for (paced = 0; paced <= 1; paced++) {
    for (uint32_t i = 0; i < threads; i++)
      pthread_create(&th[i], NULL, proxy_thread, (void*)(uintptr_t)i);
    for (uint32_t i = 0; i < threads; i++) pthread_join(th[i], NULL);
  }
  double elapsed = now_s() - t0;
  WAIT_UNTIL((take_commands(), atomic_load(&commands_seen) == N_COMMANDS), 10);
  WAIT_UNTIL(get_stats().queued == 0, 10);
  WAIT_UNTIL(atomic_load(&l.reports) == get_stats().sent &&
                 atomic_load(&l.acks_applied) == N_COMMANDS && atomic_load(&l.acks_unsupported) == 1,
             10);

  railover_stats_t s1 = get_stats();
  made += EARLY;
  uint64_t dropped = s1.dropped_ring_full + s1.dropped_no_agent;
  CHECK(made == 2 * (uint64_t)threads * per_thread + EARLY, "made");
  CHECK(made == s1.sent + dropped, "made %llu != sent %llu + dropped %llu", (unsigned long long)made,
        (unsigned long long)s1.sent, (unsigned long long)dropped);
  CHECK(atomic_load(&l.reports) == s1.sent, "listener %llu != sent %llu",
        (unsigned long long)atomic_load(&l.reports), (unsigned long long)s1.sent);
  CHECK(s1.commands_received == N_COMMANDS + 1 && s1.commands_unsupported == 1, "commands");
  CHECK(s1.acks_sent == N_COMMANDS + 1 && s1.hellos_sent == 1 && atomic_load(&l.hellos) == 1,
        "acks/hellos");
  CHECK(atomic_load(&l.bad_frames) == 0 && atomic_load(&l.acks_other) == 0, "bad frames");
  printf("test_ccl: %u threads x 2 x %llu reports in %.2f s: sent %llu, dropped ring-full %llu, "
         "no-agent %llu\n",
         threads, (unsigned long long)per_thread, elapsed, (unsigned long long)s1.sent,
         (unsigned long long)s1.dropped_ring_full, (unsigned long long)s1.dropped_no_agent);

  /* 3. Garbage from the agent: the plugin drops the connection, reconnects,
   * says HELLO again, and reports flow on without re-init. */
  atomic_store(&l.send_garbage, 1);
  WAIT_UNTIL(get_stats().malformed_received == 1, 10);
  WAIT_UNTIL(get_stats().connected == 1 && atomic_load(&l.hellos) == 2, 10);
  uint64_t before = atomic_load(&l.reports);
  CHECK(api->report_port_event(handle, "mlx5_1", 1, 9) == RAILOVER_OK, "after reconnect");
  WAIT_UNTIL(atomic_load(&l.reports) == before + 1, 10);
  /* The second connection's commands are drained before shutting down. */
  WAIT_UNTIL((take_commands(), atomic_load(&commands_seen) == 2 * N_COMMANDS), 10);
  railover_stats_t s2 = get_stats();
  CHECK(s2.connects == 2 && s2.disconnects == 1, "connects %llu", (unsigned long long)s2.connects);

  CHECK(api->finalize(handle) == RAILOVER_OK, "finalize");
  listener_stop(&l);
  rmdir(dir);
  printf("test_ccl: ok\n");
  return 0;
}
