/*
 * Cost of the profiler events NCCL sends per collective, in libnccl-profiler-railover.so.
 *
 * NCCL sends each collective as its startEvent + stopEvent (enqueued, on the host
 * thread) and, with KernelCh events asked for (the default), one KernelCh child
 * per channel the kernel runs on: startEvent (parent: the collective), a
 * recordEventState with the stop state, stopEvent (on the proxy thread). The
 * collective is done at the last of those stops, so every collective here gets
 * its children: one without them would hold its event slot, and once every slot
 * was held the starts would go untracked, a different (cheaper) path.
 *
 * Each pair is timed on its own with CLOCK_MONOTONIC (vDSO); the timer pair's
 * own cost is measured the same way and printed, not subtracted, so the figures
 * are upper bounds. The plugin runs with its defaults (progress every 100 ms or
 * 1000 ops, stall scan on, KernelCh tracked). Scenarios, each collective on one
 * channel (nChannels = 1) unless named otherwise:
 *   no_agent      nobody listening: the sender keeps retrying its connection
 *   agent_1t      one thread, one communicator, a listener draining the socket
 *   agent_4t      four threads, a communicator each (NCCL's usual shape)
 *   agent_4t_1c   four threads on one communicator: the slot counter is shared
 *   agent_1t_2ch  one thread, a collective on two channels: start, stop, then two
 *                 KernelCh children (start, record, stop each), the whole set timed
 * For the one-channel scenarios two records: `<scenario>` times the collective's
 * start + stop, `<scenario>/kernel_ch` its child's start + record + stop (where
 * the collective is done). Each record counts the collectives the plugin did not
 * track (its finalize log; 0 unless every event slot was open).
 * Output: one JSON object per line.
 * Usage: bench_nccl_profiler [collectives_per_thread]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
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
#include "railover_wire.h"
#include "nccl_driver.h"

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

/* Collectives the plugin did not track, from its finalize log (NCCL's logger). */
static _Atomic uint64_t untracked;

static void bench_log(int level, unsigned long flags, const char* file, int line, const char* fmt,
                      ...) {
  char msg[512];
  ND_LOGGER_FORMAT(msg, level, flags, file, line, fmt);
  const char* at = strstr(msg, ": ");
  unsigned long long n = 0;
  if (strstr(msg, "collectives not tracked") && at && (at = strstr(at + 2, ": ")) &&
      sscanf(at + 2, "%llu", &n) == 1)
    atomic_fetch_add(&untracked, n);
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
         "\"p999_ns\": %u, \"max_ns\": %u, \"mean_ns\": %.1f, \"pairs_over_10us\": %llu, "
         "\"untracked\": %llu}\n",
         name, (unsigned long long)n, lat[n / 2], lat[n * 99 / 100], lat[n * 999 / 1000],
         lat[n - 1], mean, (unsigned long long)over, (unsigned long long)atomic_load(&untracked));
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
  uint32_t* lat;    /* the collective's pair, or (channels > 1) the whole set */
  uint32_t* lat_ch; /* channels == 1: its KernelCh child's start + record + stop */
  int channels;
} job;

static inline uint32_t clamp_ns(uint64_t ns) { return ns > UINT32_MAX ? UINT32_MAX : (uint32_t)ns; }

/* One KernelCh child of `parent`, as NCCL's proxy reports it (its channelId
 * and pTimer, which the plugin does not read, are left 0). */
static inline void kernel_ch(void* ctx, void* parent) {
  rvn_descr_v5 k;
  memset(&k, 0, sizeof(k));
  k.type = RVN_PROFILE_KERNEL_CH;
  k.parent_obj = parent;
  void* kh = NULL;
  api->start_event(ctx, &kh, &k);
  uint64_t p_timer = 987654321; /* ncclProfilerKernelChStop's state argument */
  api->record_event_state(kh, 22, &p_timer);
  api->stop_event(kh);
}

static void* driver(void* arg) {
  job* j = arg;
  rvn_descr_v5 d;
  memset(&d, 0, sizeof(d));
  d.type = RVN_PROFILE_COLL;
  d.u.coll.func = "AllReduce";
  d.u.coll.n_channels = (uint8_t)j->channels;
  for (uint64_t i = 0; i < pairs; i++) {
    void* h = NULL;
    d.u.coll.seq_number = i;
    uint64_t t0 = now_ns();
    api->start_event(j->ctx, &h, &d);
    api->stop_event(h);
    if (j->channels == 1) {
      uint64_t t1 = now_ns();
      kernel_ch(j->ctx, h);
      uint64_t t2 = now_ns();
      j->lat[i] = clamp_ns(t1 - t0);
      j->lat_ch[i] = clamp_ns(t2 - t1);
    } else {
      for (int c = 0; c < j->channels; c++) kernel_ch(j->ctx, h);
      j->lat[i] = clamp_ns(now_ns() - t0);
    }
  }
  return NULL;
}

static void* init_comm(uint64_t comm_id, int rank) {
  void* ctx = NULL;
  int mask = 0;
  if (api->init(&ctx, comm_id, &mask, "bench", 1, 8, rank, bench_log) != RVN_SUCCESS) exit(2);
  if (mask != (RVN_PROFILE_COLL | RVN_PROFILE_KERNEL_CH)) exit(3);
  return ctx;
}

/* threads drivers; shared = all on one communicator. */
static void run(const char* name, uint32_t threads, int shared, int channels) {
  uint32_t* lat = malloc(sizeof(uint32_t) * pairs * threads);
  uint32_t* lat_ch = malloc(sizeof(uint32_t) * pairs * threads);
  pthread_t th[8];
  job jobs[8];
  void* one = shared ? init_comm(0xBE7C4, 0) : NULL;
  for (uint32_t t = 0; t < threads; t++) {
    jobs[t] = (job){shared ? one : init_comm(0xBE7C0 + t, (int)t), lat + t * pairs,
                    lat_ch + t * pairs, channels};
    pthread_create(&th[t], NULL, driver, &jobs[t]);
  }
  for (uint32_t t = 0; t < threads; t++) pthread_join(th[t], NULL);
  atomic_store(&untracked, 0);
  for (uint32_t t = 0; t < (shared ? 1u : threads); t++) api->finalize(jobs[t].ctx);
  summarize(name, lat, pairs * threads);
  if (channels == 1) {
    char ch_name[64];
    snprintf(ch_name, sizeof(ch_name), "%s/kernel_ch", name);
    summarize(ch_name, lat_ch, pairs * threads);
  }
  free(lat);
  free(lat_ch);
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

  run("no_agent", 1, 0, 1);

  listen_fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un a;
  memset(&a, 0, sizeof(a));
  a.sun_family = AF_UNIX;
  memcpy(a.sun_path, path, strlen(path));
  if (bind(listen_fd, (struct sockaddr*)&a, sizeof(a)) != 0 || listen(listen_fd, 8) != 0) return 1;
  pthread_t lt;
  pthread_create(&lt, NULL, listener_main, NULL);
  run("agent_1t", 1, 0, 1);
  run("agent_4t", 4, 0, 1);
  run("agent_4t_1c", 4, 1, 1);
  run("agent_1t_2ch", 1, 0, 2);
  atomic_store(&listener_stop, 1);
  pthread_join(lt, NULL);
  close(listen_fd);
  unlink(path);
  rmdir(dir);
  return 0;
}
