#define _POSIX_C_SOURCE 200809L /* posix_memalign */

#include "ring.h"

#include <stdlib.h>
#include <string.h>

static inline _Atomic uint64_t* slot_seq(const rv_ring* r, uint64_t pos) {
  return (_Atomic uint64_t*)(void*)(r->slots + (size_t)(pos & r->mask) * r->stride);
}

static inline void* slot_data(const rv_ring* r, uint64_t pos) {
  return r->slots + (size_t)(pos & r->mask) * r->stride + RV_RING_DATA_OFFSET;
}

int rv_ring_init(rv_ring* r, uint64_t capacity, size_t elem_size) {
  memset(r, 0, sizeof(*r));
  size_t stride = RV_RING_DATA_OFFSET + elem_size;
  /* Whole 64-byte slots keep two producers off each other's cache lines for
   * the common small elements. */
  stride = (stride + RV_CACHE_LINE - 1) & ~(size_t)(RV_CACHE_LINE - 1);
  void* mem = NULL;
  if (posix_memalign(&mem, RV_CACHE_LINE, (size_t)capacity * stride) != 0) return -1;
  r->slots = mem;
  r->stride = stride;
  r->mask = capacity - 1;
  for (uint64_t i = 0; i < capacity; i++) atomic_init(slot_seq(r, i), i);
  atomic_init(&r->tail, 0);
  atomic_init(&r->head, 0);
  return 0;
}

void rv_ring_destroy(rv_ring* r) {
  free(r->slots);
  r->slots = NULL;
}

void* rv_ring_reserve(rv_ring* r, uint64_t* pos_out) {
  uint64_t pos = atomic_load_explicit(&r->tail, memory_order_relaxed);
  for (;;) {
    uint64_t seq = atomic_load_explicit(slot_seq(r, pos), memory_order_acquire);
    int64_t dif = (int64_t)(seq - pos);
    if (dif == 0) {
      /* The slot is free for lap `pos`; whoever moves tail past it owns it. */
      if (atomic_compare_exchange_weak_explicit(&r->tail, &pos, pos + 1, memory_order_relaxed,
                                                memory_order_relaxed)) {
        *pos_out = pos;
        return slot_data(r, pos);
      }
      /* CAS failure reloaded pos; retry with the new tail. */
    } else if (dif < 0) {
      return NULL; /* the consumer has not freed this slot from the previous lap */
    } else {
      pos = atomic_load_explicit(&r->tail, memory_order_relaxed);
    }
  }
}

void rv_ring_commit(rv_ring* r, uint64_t pos) {
  /* Release: the element's bytes become visible before the slot reads as full. */
  atomic_store_explicit(slot_seq(r, pos), pos + 1, memory_order_release);
}

void* rv_ring_peek(rv_ring* r, uint64_t* pos_out) {
  uint64_t pos = atomic_load_explicit(&r->head, memory_order_relaxed);
  for (;;) {
    uint64_t seq = atomic_load_explicit(slot_seq(r, pos), memory_order_acquire);
    int64_t dif = (int64_t)(seq - (pos + 1));
    if (dif == 0) {
      if (atomic_compare_exchange_weak_explicit(&r->head, &pos, pos + 1, memory_order_relaxed,
                                                memory_order_relaxed)) {
        *pos_out = pos;
        return slot_data(r, pos);
      }
    } else if (dif < 0) {
      return NULL; /* empty, or the producer of `pos` has not committed yet */
    } else {
      pos = atomic_load_explicit(&r->head, memory_order_relaxed);
    }
  }
}

void rv_ring_release(rv_ring* r, uint64_t pos) {
  /* Hands the slot to the producer of the next lap. */
  atomic_store_explicit(slot_seq(r, pos), pos + r->mask + 1, memory_order_release);
}

uint64_t rv_ring_count(const rv_ring* r) {
  uint64_t head = atomic_load_explicit(&((rv_ring*)r)->head, memory_order_relaxed);
  uint64_t tail = atomic_load_explicit(&((rv_ring*)r)->tail, memory_order_relaxed);
  return tail > head ? tail - head : 0;
}
