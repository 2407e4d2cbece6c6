/* What the C tests share: CHECK (fail the test, saying where and why) and a monotonic
 * clock for their deadlines. Include after <stdio.h>, <stdlib.h>, <time.h> and <unistd.h>. */
#ifndef RAILOVER_TEST_CHECK_H
#define RAILOVER_TEST_CHECK_H

#define CHECK(cond, ...)                                             \
  do {                                                               \
    if (!(cond)) {                                                   \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                  \
      fprintf(stderr, "\n");                                         \
      exit(1);                                                       \
    }                                                                \
  } while (0)

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Poll `cond` every millisecond until it holds or `seconds` pass (then fail). Needs
 * <unistd.h>. */
#define WAIT_UNTIL(cond, seconds)                                     \
  do {                                                                \
    double deadline_ = now_s() + (seconds);                           \
    while (!(cond) && now_s() < deadline_) usleep(1000);              \
    CHECK(cond, "timed out after %.0f s", (double)(seconds));         \
  } while (0)

#endif
