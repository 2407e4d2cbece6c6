/*
 * ABI 3 and wire version 2 in C: the job a process belongs to, in its HELLO.
 *
 * A stand-in agent on a unix socket takes each handle's first frame and checks it byte
 * for byte: a handle with a job (init_v3's job_id, else RAILOVER_JOB_ID) says HELLO at
 * version 2 with the job and incarnation; one without says exactly a version-1 HELLO, as
 * a plugin before version 2 does. Then: the handle's other frames stay version 1, it
 * takes COMMANDs of version 1 and 2 alike and drops the connection on a version it does
 * not know; a job id that does not fit, a bad RAILOVER_JOB_INCARNATION and a config_size
 * below the base config are refused at init; the older tables' init reads the job from
 * the environment. Run plain and under ASan+UBSan and TSan (make test).
 */
#define _GNU_SOURCE
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

static const railoverPlugin_v3_t* api = &railoverPlugin_v3;
static char sock_path[108];

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

/* One frame: its header in *h, its payload in buf. */
static void read_frame(int fd, railover_wire_header* h, void* buf, size_t cap) {
  read_all(fd, h, sizeof(*h));
  CHECK(h->magic == RAILOVER_WIRE_MAGIC && h->payload_len <= cap, "frame header");
  read_all(fd, buf, h->payload_len);
}

static void send_command_at(int fd, uint16_t version, uint64_t id) {
  unsigned char frame[RAILOVER_WIRE_HEADER_SIZE + sizeof(railover_wire_command)];
  railover_wire_header h = {RAILOVER_WIRE_MAGIC, version, RAILOVER_MSG_COMMAND,
                            sizeof(railover_wire_command), 0};
  railover_wire_command c = {id, 0, 0, 0, RAILOVER_CMD_ABORT, 1, 0};
  memcpy(frame, &h, sizeof(h));
  memcpy(frame + sizeof(h), &c, sizeof(c));
  CHECK(write(fd, frame, sizeof(frame)) == (ssize_t)sizeof(frame), "write");
}

static railover_config_v3_t config(const char* job, uint32_t incarnation) {
  railover_config_v3_t cfg;
  memset(&cfg, 0, sizeof(cfg));
  cfg.base.socket_path = sock_path;
  cfg.base.rank = 3;
  cfg.base.comm_id = 0;
  cfg.base.reconnect_min_ms = 5;
  cfg.base.reconnect_max_ms = 20;
  cfg.job_id = job;
  cfg.incarnation = incarnation;
  return cfg;
}

static int logged_config_error;
static void log_line(int level, const char* message) {
  if (level == RAILOVER_LOG_ERROR && strstr(message, "railover:") != NULL) logged_config_error++;
  if (getenv("TEST_JOB_LOG")) fprintf(stderr, "%s\n", message);
}

/* Accepts a handle's connection and checks its HELLO: version 2 naming `job` with
 * `incarnation`, or (job NULL) the 24-byte version-1 HELLO. Returns the agent's end. */
static int expect_hello(int lfd, const char* job, uint32_t incarnation) {
  int fd = accept(lfd, NULL, NULL);
  CHECK(fd >= 0, "accept");
  railover_wire_header h;
  unsigned char buf[RAILOVER_WIRE_MAX_PAYLOAD];
  read_frame(fd, &h, buf, sizeof(buf));
  CHECK(h.type == RAILOVER_MSG_HELLO && h.reserved == 0, "hello first");
  railover_wire_hello_v2 want;
  memset(&want, 0, sizeof(want));
  want.comm_id = 0;
  want.pid = (uint32_t)getpid();
  want.abi_version = RAILOVER_PLUGIN_ABI_VERSION;
  want.rank = 3;
  want.incarnation = incarnation;
  if (job == NULL) {
    CHECK(h.version == 1 && h.payload_len == sizeof(railover_wire_hello),
          "no job: a version-1 HELLO (version %u, %u bytes)", h.version, h.payload_len);
    CHECK(memcmp(buf, &want, sizeof(railover_wire_hello)) == 0, "version-1 HELLO bytes");
  } else {
    CHECK(h.version == 2 && h.payload_len == sizeof(railover_wire_hello_v2),
          "a job: a version-2 HELLO (version %u, %u bytes)", h.version, h.payload_len);
    snprintf(want.job, sizeof(want.job), "%s", job);
    CHECK(memcmp(buf, &want, sizeof(want)) == 0, "version-2 HELLO bytes (job \"%s\")", job);
  }
  return fd;
}

static void finalize(void* h) { CHECK(api->finalize(h) == RAILOVER_OK, "finalize"); }

/* A handle naming a job: HELLO v2, reports v1, COMMANDs of both versions taken, a version
 * from the future drops the connection (and the handle reconnects with HELLO v2 again). */
static void named_job(int lfd) {
  unsetenv("RAILOVER_JOB_ID");
  unsetenv("RAILOVER_JOB_INCARNATION");
  railover_config_v3_t cfg = config("llm-7", 4);
  void* h = NULL;
  CHECK(api->init_v3(&cfg, sizeof(cfg), log_line, &h) == RAILOVER_OK, "init_v3");
  int fd = expect_hello(lfd, "llm-7", 4);
  CHECK(api->report_progress(h, 9, 3, 42) == RAILOVER_OK, "progress");
  railover_wire_header hdr;
  unsigned char buf[RAILOVER_WIRE_MAX_PAYLOAD];
  read_frame(fd, &hdr, buf, sizeof(buf));
  CHECK(hdr.type == RAILOVER_MSG_PROGRESS && hdr.version == RAILOVER_WIRE_VERSION_MIN,
        "a report keeps version 1 (type %u version %u)", hdr.type, hdr.version);
  send_command_at(fd, 1, 11);
  send_command_at(fd, 2, 12);
  railover_command_v2_t c;
  for (uint64_t id = 11; id <= 12; id++) {
    double deadline = now_s() + 5; /* not WAIT_UNTIL: it would poll twice */
    while (api->poll_command_v2(h, &c, sizeof(c)) != RAILOVER_OK) {
      CHECK(now_s() < deadline, "no command within 5 s");
      usleep(1000);
    }
    CHECK(c.base.command_id == id && c.base.kind == RAILOVER_CMD_ABORT, "command %llu",
          (unsigned long long)id);
  }
  send_command_at(fd, RAILOVER_WIRE_VERSION + 1, 13);
  railover_stats_t s;
  WAIT_UNTIL(api->stats(h, &s, sizeof(s)) == RAILOVER_OK && s.malformed_received == 1, 5);
  close(fd);
  fd = expect_hello(lfd, "llm-7", 4);
  CHECK(api->poll_command_v2(h, &c, sizeof(c)) == RAILOVER_NO_COMMAND, "13 never handed out");
  close(fd);
  finalize(h);
}

/* The job from the environment: for init_v3 without one, for the ABI 1 and 2 tables'
 * init; a configured job wins over the environment; none at all is a version-1 HELLO. */
static void from_environment(int lfd) {
  setenv("RAILOVER_JOB_ID", "env-job", 1);
  setenv("RAILOVER_JOB_INCARNATION", "7", 1);
  railover_config_v3_t cfg = config(NULL, 0);
  void* h = NULL;
  CHECK(railoverPlugin_v2.init(&cfg.base, log_line, &h) == RAILOVER_OK, "init (ABI 2)");
  close(expect_hello(lfd, "env-job", 7));
  finalize(h);
  CHECK(railoverPlugin_v1.init(&cfg.base, log_line, &h) == RAILOVER_OK, "init (ABI 1)");
  close(expect_hello(lfd, "env-job", 7));
  finalize(h);
  /* Only the base config (a caller that knows no job field): the environment. */
  CHECK(api->init_v3(&cfg, sizeof(railover_config_t), log_line, &h) == RAILOVER_OK, "base");
  close(expect_hello(lfd, "env-job", 7));
  finalize(h);
  cfg = config("given", 0);
  CHECK(api->init_v3(&cfg, sizeof(cfg), log_line, &h) == RAILOVER_OK, "init_v3 given");
  close(expect_hello(lfd, "given", 7));
  finalize(h);
  unsetenv("RAILOVER_JOB_ID");
  unsetenv("RAILOVER_JOB_INCARNATION");
  cfg = config("", 0);
  CHECK(api->init_v3(&cfg, sizeof(cfg), log_line, &h) == RAILOVER_OK, "init_v3 no job");
  close(expect_hello(lfd, NULL, 0));
  finalize(h);
  /* A caller built against a later, longer config: the known part is read. */
  struct {
    railover_config_v3_t v3;
    uint64_t later_field;
  } longer;
  memset(&longer, 0, sizeof(longer));
  longer.v3 = config("later", 5);
  longer.later_field = 0xFFFFFFFFFFFFFFFFull;
  CHECK(api->init_v3(&longer.v3, sizeof(longer), log_line, &h) == RAILOVER_OK, "longer config");
  close(expect_hello(lfd, "later", 5));
  finalize(h);
}

/* What init refuses, with nothing started (no connection is made). */
static void refused(void) {
  char job[RAILOVER_WIRE_JOB_LEN + 1];
  memset(job, 'j', sizeof(job));
  job[RAILOVER_WIRE_JOB_LEN] = '\0'; /* 256 bytes: one too many */
  railover_config_v3_t cfg = config(job, 0);
  void* h = (void*)&cfg;
  logged_config_error = 0;
  CHECK(api->init_v3(&cfg, sizeof(cfg), log_line, &h) == RAILOVER_ERR_CONFIG && h == NULL,
        "a job id of 256 bytes");
  CHECK(logged_config_error == 1, "the refusal is logged");
  setenv("RAILOVER_JOB_ID", job, 1);
  CHECK(railoverPlugin_v2.init(&cfg.base, log_line, &h) == RAILOVER_ERR_CONFIG, "env too long");
  unsetenv("RAILOVER_JOB_ID");
  setenv("RAILOVER_JOB_INCARNATION", "second", 1);
  cfg = config("j", 0);
  CHECK(api->init_v3(&cfg, sizeof(cfg), log_line, &h) == RAILOVER_ERR_CONFIG, "bad incarnation");
  unsetenv("RAILOVER_JOB_INCARNATION");
  CHECK(api->init_v3(&cfg, sizeof(railover_config_t) - 1, log_line, &h) == RAILOVER_ERR_INVALID,
        "config_size below the base config");
  CHECK(api->init_v3(&cfg, sizeof(cfg), log_line, NULL) == RAILOVER_ERR_INVALID, "no handle");
}

/* 255 bytes fit, and reach the agent whole. */
static void longest_job(int lfd) {
  char job[RAILOVER_WIRE_JOB_LEN];
  memset(job, 'k', sizeof(job) - 1);
  job[sizeof(job) - 1] = '\0';
  railover_config_v3_t cfg = config(job, 0);
  void* h = NULL;
  CHECK(api->init_v3(&cfg, sizeof(cfg), log_line, &h) == RAILOVER_OK, "255 bytes");
  close(expect_hello(lfd, job, 0));
  finalize(h);
}

int main(void) {
  snprintf(sock_path, sizeof(sock_path), "/tmp/railover-job-%d.sock", (int)getpid());
  int lfd = listen_on(sock_path);
  CHECK(api->abi_version == 3 && railoverPlugin_v2.abi_version == 2 &&
            railoverPlugin_v1.abi_version == 1,
        "table versions");
  CHECK(api->poll_command_v2 == railoverPlugin_v2.poll_command_v2, "one implementation");
  named_job(lfd);
  from_environment(lfd);
  refused();
  longest_job(lfd);
  close(lfd);
  unlink(sock_path);
  printf("test_job: ok\n");
  return 0;
}
