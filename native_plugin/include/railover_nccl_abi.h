/*
 * railover_nccl_abi.h — the part of NCCL's profiler plugin ABI Railover uses.
 *
 * Declared here from the layout NCCL documents for profiler plugins (ext-profiler:
 * ncclProfiler_v4, _v5 and _v6); NCCL's own headers are not copied. Only what a
 * plugin must match is pinned: the function table NCCL looks up by symbol name,
 * and the leading fields of the event descriptor up to the collective's `func`.
 * NCCL owns the descriptor memory, so the rest of each union member (buffers,
 * algorithm, protocol, ...) is neither declared nor read.
 *
 * Facts this relies on (all from the documented interface):
 *   - NCCL dlopens libnccl-profiler-${NCCL_PROFILER_PLUGIN}.so (or the path given)
 *     and looks for the newest ncclProfiler_vN symbol it knows.
 *   - init is called once per communicator and returns a per-communicator context;
 *     v4 passes (commName, commHash), v5 and v6 pass commId first.
 *   - the descriptor starts {type, parentObj, rank, union{...}}; `type` is a
 *     uint8_t in v4 and a uint64_t from v5; a collective (ncclProfileColl = 1<<1)
 *     carries {seqNumber, func, ...} at the start of the union in v4, v5 and v6.
 *   - seqNumber counts collectives of one function (AllReduce, AllGather, ...)
 *     within the communicator, from 0.
 *   - a collective's stopEvent marks that it was enqueued, not that it finished;
 *     with ncclProfileKernelCh (1<<6) enabled, NCCL's proxy starts and stops one
 *     KernelCh event per channel the collective runs on (parentObj = the
 *     collective's handle) as the kernel starts and finishes that channel's work,
 *     which is what tells a finished collective from an enqueued one.
 *   - every call returns ncclSuccess (0) except init, whose failure disables the
 *     plugin.
 */
#ifndef RAILOVER_NCCL_ABI_H
#define RAILOVER_NCCL_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "railover_wire.h" /* RAILOVER_STATIC_ASSERT, C11 and C++ alike */

/* ncclResult_t: an int-sized enum. */
typedef int rvn_result;
#define RVN_SUCCESS 0
#define RVN_SYSTEM_ERROR 2
#define RVN_INVALID_ARGUMENT 4

/* Event type bits (eActivationMask and descriptor `type`). */
#define RVN_PROFILE_COLL (1 << 1)
#define RVN_PROFILE_KERNEL_CH (1 << 6)

/* NCCL's log levels as its logger takes them. */
#define RVN_LOG_WARN 2
#define RVN_LOG_INFO 3
/* NCCL's INIT subsystem flag: NCCL_DEBUG=INFO shows INFO lines of this subsystem. */
#define RVN_SUBSYS_INIT 1UL

/* ncclDebugLogger_t: printf-like, with level, subsystem flags, file and line. */
typedef void (*rvn_logger)(int level, unsigned long flags, const char* file, int line,
                           const char* fmt, ...);

/* The leading fields of a collective's descriptor member (v4, v5 and v6 alike),
 * up to nChannels. */
typedef struct rvn_coll_head {
  uint64_t seq_number;
  const char* func;
  const void* send_buff;
  void* recv_buff;
  size_t count;
  int root;
  const char* datatype;
  uint8_t n_channels;
} rvn_coll_head;

/* ncclProfilerEventDescr_v4_t, as far as Railover reads it. */
typedef struct rvn_descr_v4 {
  uint8_t type;
  void* parent_obj;
  int rank;
  union {
    rvn_coll_head coll;
    /* NCCL's union is larger; NCCL allocates it, Railover only reads `coll`. */
    uint64_t align_;
  } u;
} rvn_descr_v4;

/* ncclProfilerEventDescr_v5_t and _v6_t, as far as Railover reads them. */
typedef struct rvn_descr_v5 {
  uint64_t type;
  void* parent_obj;
  int rank;
  union {
    rvn_coll_head coll;
    uint64_t align_;
  } u;
} rvn_descr_v5;

#if defined(__x86_64__) || defined(__aarch64__)
/* LP64 offsets of the documented layout: a mismatch here is an ABI break. */
RAILOVER_STATIC_ASSERT(offsetof(rvn_descr_v4, rank) == 16, "v4 rank offset");
RAILOVER_STATIC_ASSERT(offsetof(rvn_descr_v4, u.coll.seq_number) == 24, "v4 seqNumber offset");
RAILOVER_STATIC_ASSERT(offsetof(rvn_descr_v4, u.coll.func) == 32, "v4 func offset");
RAILOVER_STATIC_ASSERT(offsetof(rvn_descr_v5, rank) == 16, "v5 rank offset");
RAILOVER_STATIC_ASSERT(offsetof(rvn_descr_v5, u.coll.seq_number) == 24, "v5 seqNumber offset");
RAILOVER_STATIC_ASSERT(offsetof(rvn_descr_v5, u.coll.func) == 32, "v5 func offset");
RAILOVER_STATIC_ASSERT(offsetof(rvn_descr_v4, u.coll.n_channels) == 80, "v4 nChannels offset");
RAILOVER_STATIC_ASSERT(offsetof(rvn_descr_v5, u.coll.n_channels) == 80, "v5 nChannels offset");
#endif

/* ncclProfiler_v4_t. */
typedef struct rvn_profiler_v4 {
  const char* name;
  rvn_result (*init)(void** context, int* activation_mask, const char* comm_name,
                     uint64_t comm_hash, int n_nodes, int nranks, int rank, rvn_logger log);
  rvn_result (*start_event)(void* context, void** handle, rvn_descr_v4* descr);
  rvn_result (*stop_event)(void* handle);
  rvn_result (*record_event_state)(void* handle, int state, void* state_args);
  rvn_result (*finalize)(void* context);
} rvn_profiler_v4;

/* ncclProfiler_v5_t; ncclProfiler_v6_t has the same shape (its descriptor only
 * appends union members Railover does not read). */
typedef struct rvn_profiler_v5 {
  const char* name;
  rvn_result (*init)(void** context, uint64_t comm_id, int* activation_mask,
                     const char* comm_name, int n_nodes, int nranks, int rank, rvn_logger log);
  rvn_result (*start_event)(void* context, void** handle, rvn_descr_v5* descr);
  rvn_result (*stop_event)(void* handle);
  rvn_result (*record_event_state)(void* handle, int state, void* state_args);
  rvn_result (*finalize)(void* context);
} rvn_profiler_v5;

typedef rvn_profiler_v5 rvn_profiler_v6;

#endif /* RAILOVER_NCCL_ABI_H */
