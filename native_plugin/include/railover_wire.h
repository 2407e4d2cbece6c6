/*
 * railover_wire.h — the frame format spoken on the agent's unix socket.
 *
 * This file is the single definition of the wire format. Its Python mirror is
 * native_plugin/wire.py; tests/native_plugin/test_plugin_wire_agreement.py compiles a
 * program against this header and fails when the two disagree.
 *
 * Transport: a SOCK_STREAM unix socket. The plugin connects; the agent listens.
 * Both directions carry a sequence of frames; there is no other framing.
 *
 * Frame = 16-byte header followed by payload_len bytes of payload.
 * Every integer is little-endian, in both header and payload. The structs
 * below are laid out so that a little-endian host with natural alignment has
 * no implicit padding: sizes and offsets are pinned with static asserts, so
 * the C side can memcpy them straight onto the wire.
 *
 * Validity (a receiver drops the connection on the first invalid frame):
 *   - magic == RAILOVER_WIRE_MAGIC and RAILOVER_WIRE_VERSION_MIN <= version <=
 *     RAILOVER_WIRE_VERSION;
 *   - type is one of railover_wire_type;
 *   - payload_len <= RAILOVER_WIRE_MAX_PAYLOAD and equals the size of the
 *     payload struct for that type at that version exactly (payloads never
 *     grow within a version; a longer payload needs a new version).
 *
 * Versions. The header's version says the layout of that frame's payload.
 * Version 2 changed one payload, HELLO's (railover_wire_hello_v2: the job the
 * process belongs to); every other type has the same payload at versions 1
 * and 2. A sender writes each frame at the lowest version that holds what it
 * says, so that a receiver of an older version reads everything it can: the
 * agent writes version 1 (a plugin before version 2 accepts nothing else), a
 * plugin writes its reports and acks at version 1 and its HELLO at version 2
 * when it names a job, at version 1 when it does not. An agent before version
 * 2 drops a connection whose HELLO names a job: upgrade the agents before the
 * plugins of jobs that name themselves (a plugin that names no job works with
 * either).
 * Reserved fields are written as 0 by senders and ignored by receivers.
 * Strings (dev names, peer) are UTF-8, NUL-padded to their fixed size; a
 * sender writes at most size-1 bytes so there is always a terminating NUL.
 * Enumerated values (wc_status, ibv_event_type, reason, kind) are carried
 * as plain integers and are not validated on the wire: their sets only grow.
 */
#ifndef RAILOVER_WIRE_H
#define RAILOVER_WIRE_H

#include <stddef.h>
#include <stdint.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "railover_wire.h maps structs onto the little-endian wire format directly"
#endif

#define RAILOVER_WIRE_MAGIC 0x52564C52u /* "RLVR" as the bytes 52 4C 56 52 */
#define RAILOVER_WIRE_VERSION 2u     /* the newest version this header describes */
#define RAILOVER_WIRE_VERSION_MIN 1u /* the oldest a receiver accepts; see "Versions" */
#define RAILOVER_WIRE_HEADER_SIZE 16u
#define RAILOVER_WIRE_MAX_PAYLOAD 1024u
#define RAILOVER_WIRE_NAME_LEN 64u /* dev_name, from_dev, to_dev, peer */
#define RAILOVER_WIRE_JOB_LEN 256u /* railover_wire_hello_v2.job: a job id of up to 255 bytes */

/* Frame types. Only ever appended; a value is never reused. */
enum railover_wire_type {
  RAILOVER_MSG_CQE_ERROR = 1,   /* plugin -> agent */
  RAILOVER_MSG_PORT_EVENT = 2,  /* plugin -> agent */
  RAILOVER_MSG_PATH_SWITCH = 3, /* plugin -> agent */
  RAILOVER_MSG_PROGRESS = 4,    /* plugin -> agent */
  RAILOVER_MSG_HELLO = 5,       /* plugin -> agent, first frame of every connection */
  RAILOVER_MSG_COMMAND = 16,    /* agent -> plugin */
  RAILOVER_MSG_ACK = 17,        /* plugin -> agent */
  RAILOVER_MSG_ACK_AT = 18,     /* plugin -> agent: an ACK with the rank's ops_done */
  RAILOVER_MSG_COMMAND_WEIGHTS = 19, /* agent -> plugin: follows a BALANCE COMMAND */
  RAILOVER_MSG_COMMAND_TRANSIT = 20, /* agent -> plugin: follows an NVL_TRANSIT COMMAND */
};

/* Command kinds carried in railover_wire_command.kind. Only ever appended. */
enum railover_wire_command_kind {
  RAILOVER_CMD_REBALANCE = 1, /* disable disabled_channels of comm_id at ops_done */
  RAILOVER_CMD_FAILBACK = 2,  /* return comm_id to its primary paths at ops_done */
  RAILOVER_CMD_ABORT = 3,     /* the service decided to restart: abort comm_id */
  RAILOVER_CMD_FAILOVER = 4,  /* move comm_id to its backup RNICs now, before this rank's
                               * own retransmission timeout fires (the service inferred a
                               * fault, e.g. a switch failure, that this rank has not seen) */
  RAILOVER_CMD_CHECKPOINT_NOW = 5, /* take a normal checkpoint at the next iteration: a
                                    * FlowCheck checkpoint node could not rebuild iteration
                                    * `iteration` (see railover_wire_command). ops_done 0
                                    * (now), comm_id 0 (the process, not one communicator) */
  RAILOVER_CMD_BALANCE = 6,     /* R2CCL-Balance at ops_done: per-channel weights and the
                                 * allreduce split in the COMMAND_WEIGHTS frame that follows;
                                 * disabled_channels is the DCR plan for a CCL without weights */
  RAILOVER_CMD_NVL_TRANSIT = 7, /* send through a peer GPU over NVLink now: each rank's transit
                                 * GPU in the COMMAND_TRANSIT frame that follows */
};
/* The newest kind this header knows; a plugin refuses kinds above it. */
#define RAILOVER_CMD_LAST RAILOVER_CMD_NVL_TRANSIT

/* Why a path switched (railover_wire_path_switch.reason). Only ever appended. */
enum railover_wire_switch_reason {
  RAILOVER_SWITCH_OTHER = 0,     /* none of the below / not known */
  RAILOVER_SWITCH_FAILOVER = 1,  /* primary failed, moved to the backup RNIC */
  RAILOVER_SWITCH_FAILBACK = 2,  /* primary recovered, moved back to it */
  RAILOVER_SWITCH_REBALANCE = 3, /* a REBALANCE command moved the channel */
  RAILOVER_SWITCH_NVL = 4,       /* routed through a transit GPU over NVLink */
};

/* 16-byte frame header. */
typedef struct railover_wire_header {
  uint32_t magic;       /* RAILOVER_WIRE_MAGIC */
  uint16_t version;     /* RAILOVER_WIRE_VERSION */
  uint16_t type;        /* enum railover_wire_type */
  uint32_t payload_len; /* bytes of payload that follow; see validity rules */
  uint32_t reserved;    /* 0 */
} railover_wire_header;

/* Type 1: a work completion came back with an error status. */
typedef struct railover_wire_cqe_error {
  uint64_t timestamp_ns; /* CLOCK_REALTIME when the plugin was called, ns since epoch */
  uint32_t port;         /* RNIC port number, 1-based as in ibverbs */
  uint32_t qp_num;       /* QP number the completion belongs to */
  uint32_t wc_status;    /* enum ibv_wc_status (5 WR_FLUSH_ERR, 12 RETRY_EXC_ERR, ...) */
  uint32_t vendor_err;   /* ibv_wc.vendor_err, vendor specific */
  uint32_t pid;          /* reporting process */
  uint32_t reserved;     /* 0 */
  char dev_name[RAILOVER_WIRE_NAME_LEN]; /* RNIC, e.g. "mlx5_0" */
  char peer[RAILOVER_WIRE_NAME_LEN];     /* free-form remote address or hostname */
} railover_wire_cqe_error;

/* Type 2: an ibverbs asynchronous event on a port. */
typedef struct railover_wire_port_event {
  uint64_t timestamp_ns;   /* CLOCK_REALTIME, ns since epoch */
  uint32_t port;           /* RNIC port number, 1-based */
  uint32_t ibv_event_type; /* enum ibv_event_type (PORT_ERR, PORT_ACTIVE, ...) */
  uint32_t pid;            /* reporting process */
  uint32_t reserved;       /* 0 */
  char dev_name[RAILOVER_WIRE_NAME_LEN]; /* RNIC, e.g. "mlx5_0" */
} railover_wire_port_event;

/* Type 3: the CCL moved a channel of a communicator to another RNIC. */
typedef struct railover_wire_path_switch {
  uint64_t comm_id;      /* CCL communicator id (e.g. hash of the NCCL unique id) */
  uint64_t timestamp_ns; /* CLOCK_REALTIME, ns since epoch */
  uint32_t channel;      /* channel index within the communicator */
  uint32_t reason;       /* enum railover_wire_switch_reason */
  uint32_t pid;          /* reporting process */
  uint32_t reserved;     /* 0 */
  char from_dev[RAILOVER_WIRE_NAME_LEN]; /* RNIC the channel left */
  char to_dev[RAILOVER_WIRE_NAME_LEN];   /* RNIC the channel now uses */
} railover_wire_path_switch;

/* Type 4: collective progress of one rank of a communicator. */
typedef struct railover_wire_progress {
  uint64_t comm_id;      /* CCL communicator id */
  uint64_t ops_done;     /* collective operations completed by this rank so far */
  uint64_t timestamp_ns; /* CLOCK_REALTIME, ns since epoch */
  uint32_t rank;         /* rank within comm_id */
  uint32_t pid;          /* reporting process */
} railover_wire_progress;

/* Type 5: first frame on every (re)connection, so the agent knows who speaks.
 * Version 1: this struct (24 bytes); the process names no job. */
typedef struct railover_wire_hello {
  uint64_t comm_id;     /* communicator given at init, 0 when not known */
  uint32_t pid;         /* the plugin's process */
  uint32_t abi_version; /* RAILOVER_PLUGIN_ABI_VERSION of the library */
  uint32_t rank;        /* rank given at init, RAILOVER_RANK_UNKNOWN when not known */
  uint32_t incarnation; /* the job's incarnation, 0 when not known. This was `reserved`
                         * (always 0) before version 2: same offset and size. */
} railover_wire_hello;

/* Type 5 at version 2: HELLO naming the job the process belongs to (280 bytes).
 * The first 24 bytes are railover_wire_hello's, field for field.
 *
 * How a process is tied to its job. The service addresses every command to a
 * job and an incarnation (and, within it, a communicator and job-rank numbers,
 * which two jobs on one node may both use). The agent hands a command to:
 *   - a process that named a job (this frame, job != ""): only if job is the
 *     command's job and incarnation is 0 (not known) or the command's. Such a
 *     process never receives another job's command, whatever its comm_id and
 *     rank;
 *   - a process that named no job (a version-1 HELLO, or job ""), as every plugin
 *     before version 2 does: only where it cannot be another job's, that is
 *     when the command names its communicator (comm_id != 0 and equal to the
 *     HELLO's: a communicator id belongs to one job), or when no other job on
 *     the node holds the process's rank number (and, for a process whose rank is
 *     RAILOVER_RANK_UNKNOWN, when no other job has a rank on the node at all).
 *     Otherwise it gets nothing, and a command no process could take is answered
 *     failed after the agent's hold time, saying why.
 * The rank and communicator rules are as before: a process with comm_id 0 takes
 * any communicator's command, one with a rank takes commands naming that rank.
 * librailover_plugin.so names the job from railover_config_v3_t.job_id, else the
 * environment variable RAILOVER_JOB_ID, which the launcher sets to the job_id
 * the job was registered under; the incarnation likewise from
 * railover_config_v3_t.incarnation, else RAILOVER_JOB_INCARNATION. */
typedef struct railover_wire_hello_v2 {
  uint64_t comm_id;     /* as in railover_wire_hello */
  uint32_t pid;         /* as in railover_wire_hello */
  uint32_t abi_version; /* as in railover_wire_hello */
  uint32_t rank;        /* as in railover_wire_hello */
  uint32_t incarnation; /* as in railover_wire_hello: 0 when not known */
  char job[RAILOVER_WIRE_JOB_LEN]; /* the job_id given to the service, UTF-8, NUL-padded;
                                    * not "" (that HELLO is sent as version 1) */
} railover_wire_hello_v2;

#define RAILOVER_RANK_UNKNOWN 0xFFFFFFFFu

/* Type 16: the service, via the agent, asks the CCL to act. */
typedef struct railover_wire_command {
  uint64_t command_id;        /* unique per command; echoed in the ACK */
  uint64_t comm_id;           /* communicator the command applies to */
  uint64_t ops_done;          /* apply when the rank's ops_done reaches this; 0 = now */
  uint64_t disabled_channels; /* REBALANCE: bit i set = disable channel i */
  uint32_t kind;              /* enum railover_wire_command_kind */
  uint32_t epoch;             /* trigger epoch; a newer epoch supersedes older ones */
  uint64_t iteration;         /* CHECKPOINT_NOW: the iteration that could not be rebuilt
                               * (the checkpoint asked for is of a later one); 0 for every
                               * other kind. This was `reserved` (always 0) before kind 5:
                               * same offset and size, so the frame is unchanged. */
} railover_wire_command;

/* Type 17: the CCL's answer to a COMMAND. */
typedef struct railover_wire_ack {
  uint64_t command_id; /* the COMMAND being answered */
  int32_t status;      /* 0 applied; negative: enum railover_ack_status */
  uint32_t pid;        /* answering process */
} railover_wire_ack;

/* Type 18: an ACK that also says how far the rank was. Sent by ack_command_at;
 * the agent reads the status exactly as a type-17 ACK. ops_done is the rank's
 * count of completed collectives on the command's communicator when it
 * answered: for APPLIED, the op it switched at; for TOO_LATE, how far past the
 * switch point it already was (the service proposes the next epoch beyond it). */
typedef struct railover_wire_ack_at {
  uint64_t command_id; /* the COMMAND being answered */
  int32_t status;      /* 0 applied; negative: enum railover_ack_status */
  uint32_t pid;        /* answering process */
  uint64_t ops_done;   /* the rank's ops_done when it answered */
} railover_wire_ack_at;

/* Ack statuses. Only ever appended (more negative). */
enum railover_ack_status {
  RAILOVER_ACK_APPLIED = 0,
  RAILOVER_ACK_FAILED = -1,      /* tried and failed */
  RAILOVER_ACK_UNSUPPORTED = -2, /* kind not known to this plugin/CCL */
  RAILOVER_ACK_TOO_LATE = -3,    /* the rank was already past ops_done */
  RAILOVER_ACK_BUSY = -4,        /* the plugin's command queue was full */
};

/* C11 spells it _Static_assert, C++ static_assert; both are checked (make test).
 * railover_nccl_abi.h uses it too. */
#ifdef __cplusplus
#define RAILOVER_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define RAILOVER_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif
#define RAILOVER_WIRE_ASSERT_SIZE(t, n) RAILOVER_STATIC_ASSERT(sizeof(t) == (n), #t " size")
RAILOVER_WIRE_ASSERT_SIZE(railover_wire_header, 16);
RAILOVER_WIRE_ASSERT_SIZE(railover_wire_cqe_error, 160);
RAILOVER_WIRE_ASSERT_SIZE(railover_wire_port_event, 88);
RAILOVER_WIRE_ASSERT_SIZE(railover_wire_path_switch, 160);
RAILOVER_WIRE_ASSERT_SIZE(railover_wire_progress, 32);
RAILOVER_WIRE_ASSERT_SIZE(railover_wire_hello, 24);
RAILOVER_WIRE_ASSERT_SIZE(railover_wire_hello_v2, 280);
RAILOVER_STATIC_ASSERT(offsetof(railover_wire_hello_v2, job) == sizeof(railover_wire_hello),
                       "railover_wire_hello_v2 begins with railover_wire_hello");
RAILOVER_WIRE_ASSERT_SIZE(railover_wire_command, 48);
RAILOVER_WIRE_ASSERT_SIZE(railover_wire_ack, 16);
RAILOVER_WIRE_ASSERT_SIZE(railover_wire_ack_at, 24);

/* Largest v1 payload plugin -> agent; the plugin's ring slots are sized from it.
 * (HELLO, of version 2 too, never goes through the ring.) */
#define RAILOVER_WIRE_LARGEST_V1_PAYLOAD 160u

/* ---- Appended for the NCCL profiler plugin (libnccl-profiler-railover.so). ----
 * Kept as a separate block so the frame types above stay untouched: the wire is
 * append-only. Both frames go plugin -> agent. */

/* Frame types of the profiler plugin. Only ever appended; values never reused. */
enum railover_wire_type_nccl {
  RAILOVER_MSG_COMMUNICATOR = 6, /* a CCL communicator this process joined */
  RAILOVER_MSG_STALL = 7,        /* a collective open far longer than expected */
};

/* Hello.abi_version sent by the NCCL profiler plugin. It reads no commands, so
 * the agent sends it none (values 1, 2, ... are railoverPlugin ABI versions). */
#define RAILOVER_WIRE_HELLO_NCCL_PROFILER 0x4E43u /* "NC" */

/* Type 6: announced once per communicator per connection, so a job learns its
 * communicators (the same comm_id on every rank) without the fleet manager. */
typedef struct railover_wire_communicator {
  uint64_t comm_id;      /* the CCL's communicator id (NCCL commId / commHash) */
  uint64_t timestamp_ns; /* CLOCK_REALTIME when the CCL created it, ns since epoch */
  uint32_t rank;         /* this process's rank within comm_id */
  uint32_t nranks;       /* ranks in comm_id */
  uint32_t n_nodes;      /* nodes comm_id spans, 0 when not known */
  uint32_t pid;          /* reporting process */
  char host[RAILOVER_WIRE_NAME_LEN]; /* gethostname() of the process */
  char job[RAILOVER_WIRE_NAME_LEN];  /* RAILOVER_JOB_ID of the process, "" when unset */
} railover_wire_communicator;

/* Type 7: a collective was started and not finished within the stall time. Sent
 * once per collective. Evidence about the ranks' node, not a fault on any RNIC. */
typedef struct railover_wire_stall {
  uint64_t comm_id;      /* communicator of the collective */
  uint64_t seq_number;   /* the CCL's sequence number of the collective */
  uint64_t timestamp_ns; /* CLOCK_REALTIME when the stall was seen, ns since epoch */
  uint64_t open_ns;      /* how long the collective had been open when reported */
  uint32_t rank;         /* rank within comm_id */
  uint32_t pid;          /* reporting process */
  char func[RAILOVER_WIRE_NAME_LEN]; /* collective, e.g. "AllReduce" */
} railover_wire_stall;

RAILOVER_WIRE_ASSERT_SIZE(railover_wire_communicator, 160);
RAILOVER_WIRE_ASSERT_SIZE(railover_wire_stall, 104);
#undef RAILOVER_WIRE_ASSERT_SIZE
/* Both fit RAILOVER_WIRE_LARGEST_V1_PAYLOAD, so that bound still holds. */

/* ---- Appended for R2CCL balance and NVL transit: command extension frames. ----
 * Both go agent -> plugin, and each follows, as the very next frame on the
 * connection, the COMMAND (type 16) it extends, with the same command_id:
 * BALANCE is COMMAND + COMMAND_WEIGHTS, NVL_TRANSIT is COMMAND + COMMAND_TRANSIT.
 * Anything else in that place (another frame, another command_id, an extension
 * with no COMMAND before it) is a malformed stream: the plugin drops the
 * connection. The agent sends these kinds only to a plugin whose HELLO says
 * abi_version >= 2; an older plugin gets BALANCE as a plain REBALANCE of the same
 * disabled_channels and NVL_TRANSIT not at all. Payloads are fixed-size like every
 * v1 payload: arrays have a fixed capacity and a count of the entries used. A
 * well-framed extension whose content is invalid (a count over the capacity, a
 * weight that is NaN, infinite or negative, weights summing to 0, a split ratio
 * outside [0, 1), no transit memory) is refused: the plugin answers the command FAILED and never
 * hands it to the CCL. Floats are IEEE-754 binary32, little-endian. */

#define RAILOVER_WIRE_MAX_CHANNELS 64u /* as many as disabled_channels has bits */
#define RAILOVER_WIRE_MAX_TRANSIT 16u  /* ranks of one node in one TRANSIT frame */

/* Type 19: R2CCL-Balance for the BALANCE command before it. */
typedef struct railover_wire_command_weights {
  uint64_t command_id; /* the BALANCE COMMAND this extends */
  uint32_t n_channels; /* weights used, 1..RAILOVER_WIRE_MAX_CHANNELS (channel i = weights[i]) */
  float split_ratio;   /* R2CCL-AllReduce: share of each allreduce the degraded node hands to
                        * the others (an allreduce plus a broadcast); 0 = no split */
  float weights[RAILOVER_WIRE_MAX_CHANNELS]; /* each channel's share of the traffic, >= 0,
                                               * summing to 1; unused entries 0 */
} railover_wire_command_weights;

/* Type 20: NVL transit for the NVL_TRANSIT command before it. */
typedef struct railover_wire_command_transit {
  uint64_t command_id;     /* the NVL_TRANSIT COMMAND this extends */
  uint32_t n_ranks;        /* entries used, 1..RAILOVER_WIRE_MAX_TRANSIT */
  uint32_t mb_per_channel; /* GPU memory a transit GPU gives one channel, MB (30-40 MB is
                            * typical; the service refuses NVL over the job's cap), >= 1 */
  uint32_t ranks[RAILOVER_WIRE_MAX_TRANSIT];        /* rank within comm_id */
  uint32_t transit_gpus[RAILOVER_WIRE_MAX_TRANSIT]; /* node-local index of the GPU ranks[i]
                                                     * sends through over NVLink */
} railover_wire_command_transit;

RAILOVER_STATIC_ASSERT(sizeof(railover_wire_command_weights) == 272,
                       "railover_wire_command_weights size");
RAILOVER_STATIC_ASSERT(sizeof(railover_wire_command_transit) == 144,
                       "railover_wire_command_transit size");
RAILOVER_STATIC_ASSERT(sizeof(float) == 4, "float is binary32");

/* Largest v1 payload agent -> plugin (COMMAND_WEIGHTS). The plugin's input buffer
 * holds two frames of RAILOVER_WIRE_MAX_PAYLOAD, so it fits; the ring is not involved. */
#define RAILOVER_WIRE_LARGEST_V1_COMMAND_PAYLOAD 272u

#endif /* RAILOVER_WIRE_H */
