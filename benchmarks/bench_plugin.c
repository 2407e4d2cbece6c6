/*
 * Cost of one report call into librailover_plugin.so, and the sustained rate.
 *
 * Each call is timed on its own with CLOCK_MONOTONIC (vDSO); the cost of the
 * timer pair itself is measured the same way and printed, and not subtracted,
 * so the figures are upper bounds. Scenarios:
 *   no_agent      no listener: the drop path
 *   agent_1t      one producer, a listener draining the socket
 *   agent_4t      four producers at once, same listener
 *   sustained     one producer flat out for a while: frames/s that reach the
 *                 listener (the sender's throughput), and the drop share
 * Output: one JSON object per line.
 * Usage: bench_plugin [calls_per_scenario]
 */
#define _GNU_SOURCE
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

#include "railover_plugin.h"

static const railoverPlugin_v1_t* api = &railoverPlugin_v1;
static void* handle;
static uint64_t calls;

static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static int cmp_u32(const void* a, const void* b) {
  uint32_t x = *(const uint32_t*)a, y = *(const uint32_t*)b;
  return (x > y) - (x < y);
}

static void summarize(const char* name, uint32_t* lat, uint64_t n) {
  qsort(lat, n, sizeof(*lat), cmp_u32);
  double mean = 0;
  uint64_t over = 0;
  for (uint64_t i = 0; i < n; i++) {
    mean += lat[i];
    over += lat[i] > 10000;
  }
  mean /= (double)n;
  printf("{\"scenario\": \"%s\", \"calls\": %llu, \"median_ns\": %u, \"p99_ns\": %u, "
         "\"p999_ns\": %u, \"max_ns\": %u, \"mean_ns\": %.1f, \"calls_over_10us\": %llu}\n",
         name, (unsigned long long)n, lat[n / 2], lat[n * 99 / 100], lat[n * 999 / 1000],
         lat[n - 1], mean, (unsigned long long)over);
  fflush(stdout);
}

/* ---- listener: reads and discards, counting bytes */
static _Atomic int listener_stop;
static _Atomic uint64_t listener_bytes;
static int listen_fd;

static void* listener_main(void* arg) {
  (void)arg;
  static char buf[1 << 18];
  while (!atomic_load(&listener_stop)) {
    struct pollfd p = {listen_fd, POLLIN, 0};
    if (poll(&p, 1, 10) <= 0) continue;
    int fd = accept(listen_fd, NULL, NULL);
    if (fd < 0) continue;
    while (!atomic_load(&listener_stop)) {
      struct pollfd q = {fd, POLLIN, 0};
      if (poll(&q, 1, 10) <= 0) continue;
      ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      atomic_fetch_add_explicit(&listener_bytes, (uint64_t)n, memory_order_relaxed);
    }
    close(fd);
  }
  return NULL;
}

typedef struct {
  uint32_t* lat;
  uint64_t n;
  uint32_t rank;
} job;

static void* producer(void* arg) {
  job* j = arg;
  for (uint64_t i = 0; i < j->n; i++) {
    uint64_t t0 = now_ns();
    api->report_progress(handle, 7, j->rank, i);
    uint64_t t1 = now_ns();
    j->lat[i] = (uint32_t)(t1 - t0 > UINT32_MAX ? UINT32_MAX : t1 - t0);
  }
  return NULL;
}

static void run_threads(const char* name, uint32_t threads) {
  uint32_t* lat = malloc(sizeof(uint32_t) * calls * threads);
  pthread_t th[16];
  job jobs[16];
  for (uint32_t t = 0; t < threads; t++) {
    jobs[t] = (job){lat + t * calls, calls, t};
    pthread_create(&th[t], NULL, producer, &jobs[t]);
  }
  for (uint32_t t = 0; t < threads; t++) pthread_join(th[t], NULL);
  summarize(name, lat, calls * threads);
  free(lat);
}

static railover_stats_t get_stats(void) {
  railover_stats_t s;
  api->stats(handle, &s, sizeof(s));
  return s;
}

int main(int argc, char** argv) {
  calls = argc > 1 ? (uint64_t)atoll(argv[1]) : 1000000;

  /* Timer overhead: an empty timed region. */
  uint32_t* lat = malloc(sizeof(uint32_t) * calls);
  for (uint64_t i = 0; i < calls; i++) {
    uint64_t t0 = now_ns();
    uint64_t t1 = now_ns();
    lat[i] = (uint32_t)(t1 - t0);
  }
  summarize("timer_overhead", lat, calls);
  free(lat);

  char dir[] = "/tmp/railover-bench-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  char path[108];
  snprintf(path, sizeof(path), "%s/agent.sock", dir);
  railover_config_t cfg = {.socket_path = path, .rank = 0, .comm_id = 7,
                           .reconnect_min_ms = 5, .reconnect_max_ms = 20};
  if (api->init(&cfg, NULL, &handle) != RAILOVER_OK) return 1;

  run_threads("no_agent", 1);

  listen_fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  strcpy(addr.sun_path, path);
  if (bind(listen_fd, (struct sockaddr*)&addr, sizeof(addr)) != 0 || listen(listen_fd, 4) != 0)
    return 1;
  pthread_t lt;
  pthread_create(&lt, NULL, listener_main, NULL);
  while (!get_stats().connected) usleep(1000);

  railover_stats_t a = get_stats();
  run_threads("agent_1t", 1);
  while (get_stats().queued) usleep(1000);
  railover_stats_t b = get_stats();
  printf("{\"scenario\": \"agent_1t_delivery\", \"sent\": %llu, \"dropped_ring_full\": %llu}\n",
         (unsigned long long)(b.sent - a.sent),
         (unsigned long long)(b.dropped_ring_full - a.dropped_ring_full));

  run_threads("agent_4t", 4);
  while (get_stats().queued) usleep(1000);
  railover_stats_t c = get_stats();
  printf("{\"scenario\": \"agent_4t_delivery\", \"sent\": %llu, \"dropped_ring_full\": %llu}\n",
         (unsigned long long)(c.sent - b.sent),
         (unsigned long long)(c.dropped_ring_full - b.dropped_ring_full));

  /* Sustained: flat out for ~1 s, one producer. */
  uint64_t bytes0 = atomic_load(&listener_bytes);
  uint64_t t0 = now_ns(), n = 0;
  while (now_ns() - t0 < 1000000000ULL) {
    for (int i = 0; i < 1024; i++) api->report_progress(handle, 7, 0, n++);
  }
  uint64_t t_prod = now_ns() - t0;
  while (get_stats().queued) usleep(1000);
  railover_stats_t d = get_stats();
  double secs = (double)(now_ns() - t0) / 1e9;
  uint64_t sent = d.sent - c.sent;
  printf("{\"scenario\": \"sustained\", \"calls\": %llu, \"calls_per_s\": %.0f, "
         "\"delivered\": %llu, \"delivered_per_s\": %.0f, \"delivered_MB_per_s\": %.1f, "
         "\"dropped_ring_full\": %llu}\n",
         (unsigned long long)n, (double)n / ((double)t_prod / 1e9), (unsigned long long)sent,
         (double)sent / secs, (double)(atomic_load(&listener_bytes) - bytes0) / secs / 1e6,
         (unsigned long long)(d.dropped_ring_full - c.dropped_ring_full));

  api->finalize(handle);
  atomic_store(&listener_stop, 1);
  pthread_join(lt, NULL);
  close(listen_fd);
  unlink(path);
  rmdir(dir);
  return 0;
}
