/*
 * ABI 2's command extensions in C: BALANCE + COMMAND_WEIGHTS and NVL_TRANSIT +
 * COMMAND_TRANSIT from a stand-in agent on a unix socket to one plugin handle.
 * Checks what poll_command_v2 hands out (exact weights, split, transit GPUs), what
 * an ABI 1 caller sees (a REBALANCE; NVL answered UNSUPPORTED for it), that bad
 * content (NaN, negative, zero-sum weights, counts over the capacity, a split of 1)
 * is answered FAILED and never handed out, and that a broken stream (an extension
 * with no COMMAND, a COMMAND whose extension does not follow, another command_id)
 * drops the connection. Ends with random weights frames, for the sanitizers.
 */
#define _GNU_SOURCE
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "railover_plugin.h"
#include "check.h"

#define COMM 77u
#define FUZZ_ROUNDS 300

static const railoverPlugin_v2_t* api = &railoverPlugin_v2;

/* ------------------------------------------------------ the stand-in agent */

static int listen_on(const char* path) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  CHECK(fd >= 0, "socket");
  struct sockaddr_un a;
  memset(&a, 0, sizeof(a));
  a.sun_family = AF_UNIX;
  snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
  unlink(path);
  CHECK(bind(fd, (struct sockaddr*)&a, sizeof(a)) == 0, "bind %s", path);
  CHECK(listen(fd, 4) == 0, "listen");
  return fd;
}

static void read_all(int fd, void* buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    struct pollfd p = {fd, POLLIN, 0};
    CHECK(poll(&p, 1, 5000) == 1, "nothing to read within 5 s");
    ssize_t r = read(fd, (char*)buf + got, n - got);
    CHECK(r > 0, "read: connection closed");
    got += (size_t)r;
  }
}

/* Reads one frame; returns its type, the payload in buf. */
static uint16_t read_frame(int fd, void* buf, size_t cap) {
  railover_wire_header h;
  read_all(fd, &h, sizeof(h));
  CHECK(h.magic == RAILOVER_WIRE_MAGIC && h.payload_len <= cap, "frame header");
  read_all(fd, buf, h.payload_len);
  return h.type;
}

static void send_frame(int fd, uint16_t type, const void* payload, uint32_t len) {
  unsigned char frame[RAILOVER_WIRE_HEADER_SIZE + RAILOVER_WIRE_MAX_PAYLOAD];
  railover_wire_header h = {RAILOVER_WIRE_MAGIC, RAILOVER_WIRE_VERSION, type, len, 0};
  memcpy(frame, &h, sizeof(h));
  memcpy(frame + sizeof(h), payload, len);
  CHECK(write(fd, frame, sizeof(h) + len) == (ssize_t)(sizeof(h) + len), "write");
}

static void send_command(int fd, uint64_t id, uint32_t kind, uint64_t ops, uint64_t disabled) {
  railover_wire_command c = {id, COMM, ops, disabled, kind, 3, 0};
  send_frame(fd, RAILOVER_MSG_COMMAND, &c, sizeof(c));
}

static void send_weights(int fd, const railover_wire_command_weights* w) {
  send_frame(fd, RAILOVER_MSG_COMMAND_WEIGHTS, w, sizeof(*w));
}

static railover_wire_command_weights weights_of(uint64_t id, uint32_t n, float split) {
  railover_wire_command_weights w;
  memset(&w, 0, sizeof(w));
  w.command_id = id;
  w.n_channels = n;
  w.split_ratio = split;
  for (uint32_t i = 0; i < n && i < RAILOVER_WIRE_MAX_CHANNELS; i++) w.weights[i] = 1.0f / (float)n;
  return w;
}

/* The next ACK frame: its command id and status. */
static void expect_ack(int fd, uint64_t id, int32_t status) {
  unsigned char buf[RAILOVER_WIRE_MAX_PAYLOAD];
  uint16_t type = read_frame(fd, buf, sizeof(buf));
  CHECK(type == RAILOVER_MSG_ACK || type == RAILOVER_MSG_ACK_AT, "ack type %u", type);
  railover_wire_ack a;
  memcpy(&a, buf, sizeof(a));
  CHECK(a.command_id == id && a.status == status, "ack %llu status %d, expected %llu %d",
        (unsigned long long)a.command_id, a.status, (unsigned long long)id, status);
}

static railover_stats_t stats_of(void* h) {
  railover_stats_t s;
  CHECK(api->stats(h, &s, sizeof(s)) == RAILOVER_OK, "stats");
  return s;
}

/* Connects a fresh handle's first (or next) connection; returns the agent's end. */
static int accept_plugin(int lfd) {
  int fd = accept(lfd, NULL, NULL);
  CHECK(fd >= 0, "accept");
  unsigned char buf[RAILOVER_WIRE_MAX_PAYLOAD];
  CHECK(read_frame(fd, buf, sizeof(buf)) == RAILOVER_MSG_HELLO, "hello first");
  railover_wire_hello hello;
  memcpy(&hello, buf, sizeof(hello));
  CHECK(hello.abi_version == RAILOVER_PLUGIN_ABI_VERSION, "hello says ABI %u", hello.abi_version);
  return fd;
}

static void log_line(int level, const char* message) {
  if (level <= RAILOVER_LOG_WARN && getenv("TEST_BALANCE_LOG")) fprintf(stderr, "%s\n", message);
}

static int poll2(void* h, railover_command_v2_t* out) {
  memset(out, 0xAB, sizeof(*out));
  return api->poll_command_v2(h, out, sizeof(*out));
}

/* The next command, waiting for it (WAIT_UNTIL would poll twice). */
static void next2(void* h, railover_command_v2_t* out) {
  double deadline = now_s() + 5;
  while (poll2(h, out) != RAILOVER_OK) {
    CHECK(now_s() < deadline, "no command within 5 s");
    usleep(1000);
  }
}

/* ---------------------------------------------------------------- the cases */

static void balance_and_transit(void* h, int fd) {
  railover_command_v2_t c;
  /* BALANCE: 4 channels, channel 0 on the failed rail. */
  send_command(fd, 10, RAILOVER_CMD_BALANCE, 500, 0x1);
  railover_wire_command_weights w = weights_of(10, 4, 0.125f);
  w.weights[0] = 0.0f, w.weights[1] = 0.25f, w.weights[2] = 0.375f, w.weights[3] = 0.375f;
  send_weights(fd, &w);
  next2(h, &c);
  CHECK(c.base.command_id == 10 && c.base.kind == RAILOVER_CMD_BALANCE && c.base.comm_id == COMM &&
            c.base.ops_done == 500 && c.base.disabled_channels == 0x1 && c.base.epoch == 3,
        "balance base");
  CHECK(c.n_channels == 4 && c.split_ratio == 0.125f && c.weights[0] == 0.0f &&
            c.weights[1] == 0.25f && c.weights[2] == 0.375f && c.weights[3] == 0.375f,
        "weights");
  for (uint32_t i = 4; i < RAILOVER_WIRE_MAX_CHANNELS; i++) CHECK(c.weights[i] == 0.0f, "pad %u", i);
  CHECK(c.n_transit == 0 && c.mb_per_channel == 0, "no transit on a balance");

  /* NVL_TRANSIT: ranks 2 and 5 through GPUs 3 and 1. */
  send_command(fd, 11, RAILOVER_CMD_NVL_TRANSIT, 0, 0);
  railover_wire_command_transit t;
  memset(&t, 0, sizeof(t));
  t.command_id = 11, t.n_ranks = 2, t.mb_per_channel = 40;
  t.ranks[0] = 2, t.transit_gpus[0] = 3, t.ranks[1] = 5, t.transit_gpus[1] = 1;
  send_frame(fd, RAILOVER_MSG_COMMAND_TRANSIT, &t, sizeof(t));
  next2(h, &c);
  CHECK(c.base.command_id == 11 && c.base.kind == RAILOVER_CMD_NVL_TRANSIT && c.n_transit == 2 &&
            c.mb_per_channel == 40 && c.transit_ranks[0] == 2 && c.transit_gpus[0] == 3 &&
            c.transit_ranks[1] == 5 && c.transit_gpus[1] == 1 && c.transit_ranks[2] == 0 &&
            c.n_channels == 0 && c.weights[0] == 0.0f,
        "transit");

  /* A short out_size gets the prefix; below the v1 struct is invalid. */
  send_command(fd, 12, RAILOVER_CMD_FAILOVER, 0, 0);
  railover_command_v2_t part;
  memset(&part, 0xAB, sizeof(part));
  CHECK(api->poll_command_v2(h, &part, sizeof(railover_command_t) - 1) == RAILOVER_ERR_INVALID,
        "short out_size");
  double deadline = now_s() + 5;
  while (api->poll_command_v2(h, &part, sizeof(railover_command_t)) != RAILOVER_OK)
    CHECK(now_s() < deadline, "no failover within 5 s");
  CHECK(part.base.command_id == 12 && part.base.kind == RAILOVER_CMD_FAILOVER, "plain kind");
  CHECK(part.n_channels == 0xABABABABu, "copied past out_size");

  /* The ABI 1 view: BALANCE as REBALANCE, NVL_TRANSIT answered UNSUPPORTED. */
  send_command(fd, 13, RAILOVER_CMD_NVL_TRANSIT, 0, 0);
  t.command_id = 13;
  send_frame(fd, RAILOVER_MSG_COMMAND_TRANSIT, &t, sizeof(t));
  send_command(fd, 14, RAILOVER_CMD_BALANCE, 600, 0x3);
  w.command_id = 14;
  send_weights(fd, &w);
  railover_command_t v1;
  deadline = now_s() + 5;
  while (railoverPlugin_v1.poll_command(h, &v1) != RAILOVER_OK)
    CHECK(now_s() < deadline, "no rebalance within 5 s");
  CHECK(v1.command_id == 14 && v1.kind == RAILOVER_CMD_REBALANCE && v1.disabled_channels == 0x3 &&
            v1.ops_done == 600,
        "v1 sees a rebalance, got %llu kind %u", (unsigned long long)v1.command_id, v1.kind);
  expect_ack(fd, 13, RAILOVER_ACK_UNSUPPORTED);
  CHECK(stats_of(h).commands_unsupported == 1, "unsupported counted");

  /* The kind after the last is not one of this library. */
  send_command(fd, 15, RAILOVER_CMD_LAST + 1, 0, 0);
  expect_ack(fd, 15, RAILOVER_ACK_UNSUPPORTED);

  /* CHECKPOINT_NOW hands its iteration out through v2 (v1 has no field for it). */
  railover_wire_command ck = {16, 0, 0, 0, RAILOVER_CMD_CHECKPOINT_NOW, 4, 4200};
  send_frame(fd, RAILOVER_MSG_COMMAND, &ck, sizeof(ck));
  railover_command_v2_t c2;
  deadline = now_s() + 5;
  while (poll2(h, &c2) != RAILOVER_OK) CHECK(now_s() < deadline, "no checkpoint_now within 5 s");
  CHECK(c2.base.command_id == 16 && c2.base.kind == RAILOVER_CMD_CHECKPOINT_NOW &&
            c2.iteration == 4200 && c2.base.comm_id == 0,
        "checkpoint_now: kind %u iteration %llu", c2.base.kind, (unsigned long long)c2.iteration);
}

static void refused_content(void* h, int fd) {
  railover_command_v2_t c;
  railover_wire_command_weights w;
  uint64_t id = 100;
  uint64_t before = stats_of(h).commands_invalid;
  /* NaN */
  send_command(fd, id, RAILOVER_CMD_BALANCE, 700, 0);
  w = weights_of(id, 4, 0.0f);
  w.weights[2] = nanf("");
  send_weights(fd, &w);
  expect_ack(fd, id++, RAILOVER_ACK_FAILED);
  /* infinite */
  send_command(fd, id, RAILOVER_CMD_BALANCE, 700, 0);
  w = weights_of(id, 4, 0.0f);
  w.weights[0] = INFINITY;
  send_weights(fd, &w);
  expect_ack(fd, id++, RAILOVER_ACK_FAILED);
  /* negative */
  send_command(fd, id, RAILOVER_CMD_BALANCE, 700, 0);
  w = weights_of(id, 4, 0.0f);
  w.weights[3] = -0.25f;
  send_weights(fd, &w);
  expect_ack(fd, id++, RAILOVER_ACK_FAILED);
  /* all zero */
  send_command(fd, id, RAILOVER_CMD_BALANCE, 700, 0);
  w = weights_of(id, 4, 0.0f);
  memset(w.weights, 0, sizeof(w.weights));
  send_weights(fd, &w);
  expect_ack(fd, id++, RAILOVER_ACK_FAILED);
  /* a count larger than the payload holds */
  send_command(fd, id, RAILOVER_CMD_BALANCE, 700, 0);
  w = weights_of(id, 4, 0.0f);
  w.n_channels = RAILOVER_WIRE_MAX_CHANNELS + 1;
  send_weights(fd, &w);
  expect_ack(fd, id++, RAILOVER_ACK_FAILED);
  /* no channels */
  send_command(fd, id, RAILOVER_CMD_BALANCE, 700, 0);
  w = weights_of(id, 4, 0.0f);
  w.n_channels = 0;
  send_weights(fd, &w);
  expect_ack(fd, id++, RAILOVER_ACK_FAILED);
  /* split ratio 1 and NaN */
  send_command(fd, id, RAILOVER_CMD_BALANCE, 700, 0);
  w = weights_of(id, 4, 1.0f);
  send_weights(fd, &w);
  expect_ack(fd, id++, RAILOVER_ACK_FAILED);
  send_command(fd, id, RAILOVER_CMD_BALANCE, 700, 0);
  w = weights_of(id, 4, nanf(""));
  send_weights(fd, &w);
  expect_ack(fd, id++, RAILOVER_ACK_FAILED);
  /* transit: count over the capacity, and no memory */
  railover_wire_command_transit t;
  memset(&t, 0, sizeof(t));
  send_command(fd, id, RAILOVER_CMD_NVL_TRANSIT, 0, 0);
  t.command_id = id, t.n_ranks = RAILOVER_WIRE_MAX_TRANSIT + 1, t.mb_per_channel = 40;
  send_frame(fd, RAILOVER_MSG_COMMAND_TRANSIT, &t, sizeof(t));
  expect_ack(fd, id++, RAILOVER_ACK_FAILED);
  send_command(fd, id, RAILOVER_CMD_NVL_TRANSIT, 0, 0);
  t.command_id = id, t.n_ranks = 1, t.mb_per_channel = 0;
  send_frame(fd, RAILOVER_MSG_COMMAND_TRANSIT, &t, sizeof(t));
  expect_ack(fd, id++, RAILOVER_ACK_FAILED);
  railover_stats_t s = stats_of(h);
  CHECK(s.commands_invalid - before == 10, "invalid counted: %llu",
        (unsigned long long)(s.commands_invalid - before));
  CHECK(poll2(h, &c) == RAILOVER_NO_COMMAND, "a refused command reached the CCL");
  CHECK(s.connected == 1 && s.malformed_received == 0, "still connected");
}

/* Each case drops the connection; the plugin reconnects for the next. */
static void broken_streams(void* h, int lfd, int* fd) {
  railover_wire_command_weights w = weights_of(200, 4, 0.0f);
  railover_command_v2_t c;
  for (int i = 0; i < 4; i++) {
    uint64_t malformed = stats_of(h).malformed_received;
    if (i == 0) {
      send_weights(*fd, &w); /* an extension with no COMMAND */
    } else if (i == 1) {
      send_command(*fd, 200, RAILOVER_CMD_BALANCE, 800, 0); /* then not its extension */
      send_command(*fd, 201, RAILOVER_CMD_FAILOVER, 0, 0);
    } else if (i == 2) {
      send_command(*fd, 202, RAILOVER_CMD_BALANCE, 800, 0); /* another command's */
      w.command_id = 999;
      send_weights(*fd, &w);
    } else {
      send_command(*fd, 203, RAILOVER_CMD_NVL_TRANSIT, 0, 0); /* the other extension */
      w.command_id = 203;
      send_weights(*fd, &w);
    }
    WAIT_UNTIL(stats_of(h).malformed_received == malformed + 1, 5);
    close(*fd);
    *fd = accept_plugin(lfd);
    CHECK(poll2(h, &c) == RAILOVER_NO_COMMAND, "case %d queued a command", i);
  }
}

/* Random weights frames, well framed: each is queued with its weights intact or
 * refused; nothing else happens (the sanitizer builds watch the bounds). */
static void fuzz_weights(void* h, int fd) {
  uint64_t invalid = stats_of(h).commands_invalid, queued = 0;
  unsigned seed = 12345;
  for (int i = 0; i < FUZZ_ROUNDS; i++) {
    railover_wire_command_weights w;
    unsigned char* b = (unsigned char*)&w;
    for (size_t k = 0; k < sizeof(w); k++) b[k] = (unsigned char)(rand_r(&seed) >> 7);
    if (i % 3 == 0) w.n_channels %= RAILOVER_WIRE_MAX_CHANNELS + 8; /* near the bound */
    if (i % 5 == 0) w.split_ratio = 0.0f;
    if (i % 4 == 0)
      for (uint32_t k = 0; k < RAILOVER_WIRE_MAX_CHANNELS; k++)
        w.weights[k] = (float)(rand_r(&seed) % 1000) / 1000.0f;
    uint64_t id = 1000 + (uint64_t)i;
    w.command_id = id;
    send_command(fd, id, RAILOVER_CMD_BALANCE, 900, 0);
    send_weights(fd, &w);
    railover_command_v2_t c;
    double deadline = now_s() + 5;
    for (;;) {
      if (poll2(h, &c) == RAILOVER_OK) {
        CHECK(c.base.command_id == id && c.n_channels == w.n_channels &&
                  c.n_channels <= RAILOVER_WIRE_MAX_CHANNELS,
              "fuzz %d: queued wrong command", i);
        CHECK(memcmp(c.weights, w.weights, c.n_channels * sizeof(float)) == 0, "fuzz weights");
        for (uint32_t k = 0; k < c.n_channels; k++)
          CHECK(isfinite(c.weights[k]) && c.weights[k] >= 0.0f, "fuzz %d: bad weight passed", i);
        queued++;
        break;
      }
      if (stats_of(h).commands_invalid == invalid + (uint64_t)i + 1 - queued) {
        expect_ack(fd, id, RAILOVER_ACK_FAILED);
        break;
      }
      CHECK(now_s() < deadline, "fuzz %d: neither queued nor refused", i);
      usleep(200);
    }
  }
  railover_stats_t s = stats_of(h);
  CHECK(s.commands_invalid - invalid + queued == FUZZ_ROUNDS, "fuzz counts");
  CHECK(queued > 0 && queued < FUZZ_ROUNDS, "fuzz covered both outcomes: %llu queued",
        (unsigned long long)queued);
  CHECK(s.connected == 1, "fuzz dropped the connection");
}

int main(void) {
  char path[108];
  snprintf(path, sizeof(path), "/tmp/railover-balance-%d.sock", (int)getpid());
  int lfd = listen_on(path);
  CHECK(api->abi_version == 2 && railoverPlugin_v1.abi_version == 1, "table versions");
  railover_config_t cfg;
  memset(&cfg, 0, sizeof(cfg));
  cfg.socket_path = path;
  cfg.rank = 0;
  cfg.comm_id = COMM;
  void* h = NULL;
  CHECK(api->init(&cfg, log_line, &h) == RAILOVER_OK, "init");
  int fd = accept_plugin(lfd);
  balance_and_transit(h, fd);
  refused_content(h, fd);
  broken_streams(h, lfd, &fd);
  fuzz_weights(h, fd);
  CHECK(api->finalize(h) == RAILOVER_OK, "finalize");
  close(fd);
  close(lfd);
  unlink(path);
  printf("test_balance: ok\n");
  return 0;
}
