/* Stress test of the lock-free ring: P producers, one consumer; every element
 * arrives exactly once and each producer's elements arrive in order. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include "ring.h"

typedef struct {
  uint32_t producer;
  uint32_t pad;
  uint64_t seq;
} item;

static rv_ring ring;
static uint64_t per_producer;
static _Atomic uint64_t full_retries;

static void* produce(void* arg) {
  uint32_t id = (uint32_t)(uintptr_t)arg;
  for (uint64_t i = 0; i < per_producer; i++) {
    uint64_t pos;
    item* it;
    /* Retrying instead of dropping lets the test check exact delivery. */
    while ((it = rv_ring_reserve(&ring, &pos)) == NULL) {
      atomic_fetch_add_explicit(&full_retries, 1, memory_order_relaxed);
      sched_yield();
    }
    it->producer = id;
    it->seq = i;
    rv_ring_commit(&ring, pos);
  }
  return NULL;
}

int main(int argc, char** argv) {
  uint32_t producers = argc > 1 ? (uint32_t)atoi(argv[1]) : 4;
  per_producer = argc > 2 ? (uint64_t)atoll(argv[2]) : 100000;
  if (rv_ring_init(&ring, 256, sizeof(item)) != 0) return 2;
  pthread_t th[64];
  uint64_t next[64] = {0};
  for (uint32_t i = 0; i < producers; i++)
    pthread_create(&th[i], NULL, produce, (void*)(uintptr_t)i);
  uint64_t total = (uint64_t)producers * per_producer;
  for (uint64_t got = 0; got < total;) {
    uint64_t pos;
    item* it = rv_ring_peek(&ring, &pos);
    if (it == NULL) {
      sched_yield();
      continue;
    }
    if (it->producer >= producers || it->seq != next[it->producer]) {
      fprintf(stderr, "FAIL: producer %u item %llu, expected %llu\n", it->producer,
              (unsigned long long)it->seq, (unsigned long long)next[it->producer]);
      return 1;
    }
    next[it->producer]++;
    rv_ring_release(&ring, pos);
    got++;
  }
  for (uint32_t i = 0; i < producers; i++) pthread_join(th[i], NULL);
  if (rv_ring_count(&ring) != 0) {
    fprintf(stderr, "FAIL: ring not empty\n");
    return 1;
  }
  rv_ring_destroy(&ring);
  printf("test_ring: %u producers x %llu items in order (%llu full retries)\n", producers,
         (unsigned long long)per_producer, (unsigned long long)full_retries);
  return 0;
}
