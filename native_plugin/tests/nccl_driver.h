/* What the programs that drive the NCCL profiler plugin share (tests/test_nccl_loader.c,
 * tests/test_nccl_profiler.c, benchmarks/bench_nccl_profiler.c): NCCL's logger
 * arguments formatted, and a stand-in agent's accept-and-read loop. Include after
 * <errno.h>, <poll.h>, <pthread.h>, <stdarg.h>, <stdio.h>, <stdlib.h>, <string.h>,
 * <sys/socket.h>, <sys/un.h>, <unistd.h> and "railover_wire.h". */
#ifndef RAILOVER_TEST_NCCL_DRIVER_H
#define RAILOVER_TEST_NCCL_DRIVER_H

/* Generous: sanitizer builds on a loaded machine. RAILOVER_TEST_WAIT_S shortens it
 * (the mutation runs, where a mutant that never reports should fail fast). */
static inline int nd_wait_limit_s(void) {
  const char* v = getenv("RAILOVER_TEST_WAIT_S");
  return v && atoi(v) > 0 ? atoi(v) : 120;
}
#define WAIT_LIMIT_S nd_wait_limit_s()

/* In a stand-in for NCCL's logger (ncclDebugLogger_t): ignores level, flags, file
 * and line, and formats the message into the char array `msg`. */
#define ND_LOGGER_FORMAT(msg, level, flags, file, line, fmt) \
  do {                                                       \
    (void)(level);                                           \
    (void)(flags);                                           \
    (void)(file);                                            \
    (void)(line);                                            \
    va_list ap_;                                             \
    va_start(ap_, fmt);                                      \
    vsnprintf(msg, sizeof(msg), fmt, ap_);                   \
    va_end(ap_);                                             \
  } while (0)

/* A stand-in agent: the test's own state, named by pointer, and what it does with a
 * frame. frame_ok says whether a header is well formed (else bad_frames counts it and
 * the rest of what was read is dropped); on_frame runs under *mu for each whole frame. */
typedef struct {
  pthread_mutex_t* mu;
  pthread_cond_t* cv;
  int* listen_fd;
  const int* stop;
  int* closed;
  int* bad_frames;
  int (*frame_ok)(const railover_wire_header* h);
  void (*on_frame)(const railover_wire_header* h, const unsigned char* payload);
} nd_agent;

/* Reads one connection's frames until the plugin closes it, or until *stop once
 * nothing more arrives. */
static inline void nd_serve(nd_agent* a, int fd) {
  unsigned char buf[16384];
  size_t len = 0;
  for (;;) {
    struct pollfd pfd = {fd, POLLIN, 0};
    int rc = poll(&pfd, 1, 50);
    pthread_mutex_lock(a->mu);
    int stop = *a->stop;
    pthread_mutex_unlock(a->mu);
    if (rc == 0) {
      if (stop) break;
      continue;
    }
    ssize_t n = recv(fd, buf + len, sizeof(buf) - len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    len += (size_t)n;
    size_t off = 0;
    pthread_mutex_lock(a->mu);
    while (len - off >= RAILOVER_WIRE_HEADER_SIZE) {
      railover_wire_header h;
      memcpy(&h, buf + off, sizeof(h));
      if (!a->frame_ok(&h)) {
        (*a->bad_frames)++;
        off = len;
        break;
      }
      if (len - off < RAILOVER_WIRE_HEADER_SIZE + h.payload_len) break;
      a->on_frame(&h, buf + off + RAILOVER_WIRE_HEADER_SIZE);
      off += RAILOVER_WIRE_HEADER_SIZE + h.payload_len;
    }
    pthread_cond_broadcast(a->cv);
    pthread_mutex_unlock(a->mu);
    memmove(buf, buf + off, len - off);
    len -= off;
  }
  close(fd);
}

/* The agent's thread (arg: an nd_agent): accepts connections one at a time and serves
 * each, counting in *closed those that ended, until *stop. */
static inline void* nd_agent_main(void* arg) {
  nd_agent* a = (nd_agent*)arg;
  for (;;) {
    struct pollfd pfd = {*a->listen_fd, POLLIN, 0};
    int rc = poll(&pfd, 1, 50);
    pthread_mutex_lock(a->mu);
    int stop = *a->stop;
    pthread_mutex_unlock(a->mu);
    if (stop) break;
    if (rc <= 0) continue;
    int fd = accept(*a->listen_fd, NULL, NULL);
    if (fd < 0) continue;
    nd_serve(a, fd);
    pthread_mutex_lock(a->mu);
    (*a->closed)++;
    pthread_cond_broadcast(a->cv);
    pthread_mutex_unlock(a->mu);
  }
  return NULL;
}

/* Inits the agent's lock and condition, listens on the unix socket `path` and starts
 * nd_agent_main on *thread: NULL, or the name of the call that failed (errno says why). */
static inline const char* nd_agent_start(nd_agent* a, const char* path, pthread_t* thread) {
  pthread_mutex_init(a->mu, NULL);
  pthread_cond_init(a->cv, NULL);
  *a->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, path, strlen(path));
  if (bind(*a->listen_fd, (struct sockaddr*)&sa, sizeof(sa)) != 0) return "bind";
  if (listen(*a->listen_fd, 4) != 0) return "listen";
  pthread_create(thread, NULL, nd_agent_main, a);
  return NULL;
}

#endif
