/*
 * Cost of one collective's startEvent + stopEvent pair in libnccl-profiler-railover.so.
 *
 * Each pair is timed on its own with CLOCK_MONOTONIC (vDSO); the timer pair's
 * own cost is measured the same way and printed, not subtracted, so the figures
 * are upper bounds. The plugin runs with its defaults (progress every 100 ms or
 * 1000 ops, stall scan on). Scenarios:
 *   no_agent      nobody listening: the sender keeps retrying its connection
 *   agent_1t      one thread, one communicator, a listener draining the socket
 *   agent_4t      four threads, a communicator each (NCCL's usual shape)
 *   agent_4t_1c   four threads on one communicator: the slot counter is shared
 *   agent_1t_2ch  one thread, a collective on two channels as NCCL reports it:
 *                 start, two KernelCh start/stop pairs, stop (the whole set timed)
 * Output: one JSON object per line.
 * Usage: bench_nccl_profiler [pairs_per_thread]
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

#include "railover_nccl_abi.h"

extern const rvn_profiler_v5 ncclProfiler_v5;
static const rvn_profiler_v5* api = &ncclProfiler_v5;
static uint64_t pairs;

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
  printf("{\"scenario\": \"%s\", \"pairs\": %llu, \"median_ns\": %u, \"p99_ns\": %u, "
         "\"p999_ns\": %u, \"max_ns\": %u, \"mean_ns\": %.1f, \"pairs_over_10us\": %llu}\n",
         name, (unsigned long long)n, lat[n / 2], lat[n * 99 / 100], lat[n * 999 / 1000],
         lat[n - 1], mean, (unsigned long long)over);
  fflush(stdout);
}

static _Atomic int listener_stop;
static int listen_fd = -1;

static void* listener_main(void* arg) {
  (void)arg;
  static char buf[1 << 16];
  while (!atomic_load(&listener_stop)) {
    struct pollfd p = {listen_fd, POLLIN, 0};
    if (poll(&p, 1, 10) <= 0) continue;
    int fd = accept(listen_fd, NULL, NULL);
    if (fd < 0) continue;
    while (!atomic_load(&listener_stop)) {
      struct pollfd q = {fd, POLLIN, 0};
      if (poll(&q, 1, 10) <= 0) continue;
      if (recv(fd, buf, sizeof(buf), 0) <= 0) break;
    }
    close(fd);
  }
  return NULL;
}

typedef struct {
  void* ctx;
  uint32_t* lat;
  int channels;
} job;

static void* driver(void* arg) {
  job* j = arg;
  rvn_descr_v5 d;
  memset(&d, 0, sizeof(d));
  d.type = RVN_PROFILE_COLL;
  d.u.coll.func = "AllReduce";
  for (uint64_t i = 0; i < pairs; i++) {
    void* h = NULL;
    d.u.coll.seq_number = i;
    d.u.coll.n_channels = (uint8_t)j->channels;
    uint64_t t0 = now_ns();
    api->start_event(j->ctx, &h, &d);
    for (int c = 0; c < j->channels; c++) {
      rvn_descr_v5 k;
      k.type = RVN_PROFILE_KERNEL_CH;
      k.parent_obj = h;
      void* kh = NULL;
      api->start_event(j->ctx, &kh, &k);
      api->record_event_state(kh, 22, NULL);
      api->stop_event(kh);
    }
    api->stop_event(h);
    uint64_t t1 = now_ns();
    j->lat[i] = (uint32_t)(t1 - t0 > UINT32_MAX ? UINT32_MAX : t1 - t0);
  }
  return NULL;
}

static void* init_comm(uint64_t comm_id, int rank) {
  void* ctx = NULL;
  int mask = 0;
  if (api->init(&ctx, comm_id, &mask, "bench", 1, 8, rank, NULL) != RVN_SUCCESS) exit(2);
  return ctx;
}

/* threads drivers; shared = all on one communicator. */
static void run(const char* name, uint32_t threads, int shared, int channels) {
  uint32_t* lat = malloc(sizeof(uint32_t) * pairs * threads);
  pthread_t th[8];
  job jobs[8];
  void* one = shared ? init_comm(0xBE7C4, 0) : NULL;
  for (uint32_t t = 0; t < threads; t++) {
    jobs[t] = (job){shared ? one : init_comm(0xBE7C0 + t, (int)t), lat + t * pairs, channels};
    pthread_create(&th[t], NULL, driver, &jobs[t]);
  }
  for (uint32_t t = 0; t < threads; t++) pthread_join(th[t], NULL);
  summarize(name, lat, pairs * threads);
  for (uint32_t t = 0; t < (shared ? 1u : threads); t++) api->finalize(jobs[t].ctx);
  free(lat);
}

int main(int argc, char** argv) {
  pairs = argc > 1 ? (uint64_t)atoll(argv[1]) : 1000000;
  uint32_t* lat = malloc(sizeof(uint32_t) * pairs);
  for (uint64_t i = 0; i < pairs; i++) {
    uint64_t t0 = now_ns();
    uint64_t t1 = now_ns();
    lat[i] = (uint32_t)(t1 - t0);
  }
  summarize("timer_overhead", lat, pairs);
  free(lat);

  char dir[] = "/tmp/rvn-bench-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  char path[108];
  snprintf(path, sizeof(path), "%s/agent.sock", dir);
  setenv("RAILOVER_PLUGIN_SOCKET", path, 1);

  run("no_agent", 1, 0, 0);

  listen_fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un a;
  memset(&a, 0, sizeof(a));
  a.sun_family = AF_UNIX;
  memcpy(a.sun_path, path, strlen(path));
  if (bind(listen_fd, (struct sockaddr*)&a, sizeof(a)) != 0 || listen(listen_fd, 8) != 0) return 1;
  pthread_t lt;
  pthread_create(&lt, NULL, listener_main, NULL);
  run("agent_1t", 1, 0, 0);
  run("agent_4t", 4, 0, 0);
  run("agent_4t_1c", 4, 1, 0);
  run("agent_1t_2ch", 1, 0, 2);
  atomic_store(&listener_stop, 1);
  pthread_join(lt, NULL);
  close(listen_fd);
  unlink(path);
  rmdir(dir);
  return 0;
}
