/*
 * railover_plugin.h — the C ABI a failover-capable CCL calls to talk to the
 * Railover node agent.
 *
 * Pattern (as NCCL's net/tuner plugins): the library exports exactly one
 * symbol per ABI version, a const struct of function pointers. Load it with
 * dlopen()/dlsym("railoverPlugin_v3") and call through the struct. A later
 * ABI adds its table next to the older ones (v1, v2, v3 today); each keeps its
 * layout and meaning for as long as the library ships it. Structs and enums here are only ever
 * appended to, and only under a new ABI version for structs passed by value.
 *
 * Threading: every call except init/finalize may be made from any number of
 * threads at once on the same handle. The report_* calls and poll_command
 * never block, never allocate and never take a lock; ack_command and stats
 * neither block nor allocate either. Work that can wait (socket I/O,
 * reconnecting, logging) happens on one background thread per handle.
 *
 * Return values: every call returns an int status, RAILOVER_OK (0) on
 * success; positive values are normal outcomes the caller may ignore
 * (RAILOVER_DROPPED, RAILOVER_NO_COMMAND); negative values are errors.
 * Outputs go through pointers.
 *
 * Delivery: reports are best effort. Reports made after init and before the
 * first connection to the agent are kept in the ring (up to ring_size of
 * them) and sent once connected, so a CCL need not wait for the agent before
 * its first collective. A report that cannot be queued (ring full) or has
 * nowhere to go (the agent was connected and is gone, or finalize found no
 * agent) is dropped and counted; the counts are in railover_stats_t and a
 * summary is logged at most once per log_interval_ms. For every handle, at
 * any moment:
 *   reports accepted == sent + dropped_ring_full + dropped_no_agent + queued
 * where "accepted" counts report_* calls that returned RAILOVER_OK or
 * RAILOVER_DROPPED. "sent" means fully written to the agent's socket.
 *
 * Fork: a handle belongs to the process that created it; a forked child must
 * not use its parent's handle (the sender thread does not survive fork).
 */
#ifndef RAILOVER_PLUGIN_H
#define RAILOVER_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "railover_wire.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The newest ABI this header describes; the library exports a table for each
 * version up to it (railoverPlugin_v1, _v2, _v3) and says this one in HELLO,
 * which tells the agent which frames it may send (see railover_wire.h). */
#define RAILOVER_PLUGIN_ABI_VERSION 3

/* Status codes returned by every call. Only ever appended. */
typedef enum {
  RAILOVER_OK = 0,
  RAILOVER_DROPPED = 1,      /* report not queued: counted in stats, not an error */
  RAILOVER_NO_COMMAND = 2,   /* poll_command: nothing pending, *out untouched */
  RAILOVER_ERR_INVALID = -1, /* NULL handle/pointer or out-of-range argument */
  RAILOVER_ERR_SYSTEM = -2,  /* init: out of memory, or a thread/pipe could not be made */
  RAILOVER_ERR_CONFIG = -3,  /* init: bad config or RAILOVER_PLUGIN_* variable */
} railover_status_t;

/* Log levels passed to railover_log_fn. Only ever appended. */
typedef enum {
  RAILOVER_LOG_ERROR = 1,
  RAILOVER_LOG_WARN = 2,
  RAILOVER_LOG_INFO = 3,
  RAILOVER_LOG_DEBUG = 4,
} railover_log_level_t;

/*
 * Log sink supplied by the CCL. Called only from the plugin's background
 * thread (and from init/finalize on the caller's thread), never from a
 * report or poll call. `message` is NUL-terminated, owned by the plugin and
 * valid only for the duration of the call. Must be thread-safe with respect
 * to the CCL's own logging. May be NULL at init: nothing is logged.
 */
typedef void (*railover_log_fn)(int level, const char* message);

/*
 * Configuration read by init. The plugin copies what it needs during init;
 * the struct and the strings it points to may be freed as soon as init
 * returns. A NULL config, a NULL pointer or a 0 number means "use the
 * environment variable, else the default" as listed per field.
 */
typedef struct {
  /* Agent's unix socket. Env RAILOVER_PLUGIN_SOCKET; default
   * "/run/railover/agent.sock". At most 107 bytes (sun_path). */
  const char* socket_path;
  /* Report ring capacity in messages; rounded up to a power of two, 16 ..
   * 1048576. Env RAILOVER_PLUGIN_RING_SIZE; default 16384. Each slot takes
   * 192 bytes, allocated once at init. */
  uint32_t ring_size;
  /* Rank and communicator announced in HELLO; they identify the process to
   * the agent, with the job (railover_config_v3_t; for init, the environment:
   * RAILOVER_JOB_ID, RAILOVER_JOB_INCARNATION). rank: RAILOVER_RANK_UNKNOWN
   * when not known (0 is a rank, so it is taken literally here, unlike the
   * other fields); comm_id: 0 when not known. */
  uint32_t rank;
  uint64_t comm_id;
  /* Reconnect back-off in milliseconds: first retry after
   * reconnect_min_ms, doubling up to reconnect_max_ms. Defaults 10 and 1000. */
  uint32_t reconnect_min_ms;
  uint32_t reconnect_max_ms;
  /* Minimum milliseconds between two drop summaries in the log. Default
   * 10000. */
  uint32_t log_interval_ms;
  /* finalize keeps sending what is queued for at most this long (ms) before
   * it discards the rest (counted as dropped_no_agent). Default 1000. */
  uint32_t drain_timeout_ms;
} railover_config_t;

/* A command from the service, copied into the caller's struct by
 * poll_command. Field meanings are those of railover_wire_command. */
typedef struct {
  uint64_t command_id;        /* echo it in ack_command */
  uint64_t comm_id;           /* communicator to act on */
  uint64_t ops_done;          /* act when this rank's ops_done reaches it; 0 = now */
  uint64_t disabled_channels; /* REBALANCE: bit i set = stop using channel i */
  uint32_t kind;              /* enum railover_wire_command_kind */
  uint32_t epoch;             /* newer epoch for the same comm_id supersedes older */
} railover_command_t;

/*
 * RAILOVER_CMD_CHECKPOINT_NOW (kind 5, appended to v1 like FAILOVER): a FlowCheck
 * checkpoint node could not rebuild an iteration, so the newest usable checkpoint is
 * older than the job thinks. Take a normal checkpoint at the next iteration. It comes
 * with ops_done 0 (now) and comm_id 0 (the process, not one communicator), and needs no
 * agreement between ranks. The CCL hands it to the training framework (a flag its loop
 * reads, a callback) and answers ack_command(command_id, RAILOVER_ACK_APPLIED) once
 * handed over; RAILOVER_ACK_UNSUPPORTED when it has no way to reach the framework. A
 * newer request supersedes an older one still unanswered; a checkpoint reported to the
 * service (POST /v1/jobs/{id}/checkpoints) of a later iteration ends the request.
 * The failed iteration travels in railover_wire_command.iteration and reaches a CCL
 * through poll_command_v2 (railover_command_v2_t.iteration); v1's railover_command_t
 * has no field for it (it is passed out by pointer and keeps its size). A CCL needs
 * none to act: the checkpoint is due at the next iteration whatever it was.
 */

/*
 * Counters since init, all monotonic except `connected` and `queued`.
 * Appended only; stats() copies min(out_size, sizeof) bytes so a caller
 * built against an older, shorter struct keeps working.
 */
typedef struct {
  uint64_t sent;              /* report frames fully written to the socket */
  uint64_t dropped_ring_full; /* reports refused because the ring was full */
  uint64_t dropped_no_agent;  /* reports refused or discarded with no agent connected */
  uint64_t queued;            /* reports in the ring now (approximate while busy) */
  uint64_t bytes_sent;        /* all bytes written to the socket, every frame type */
  uint64_t hellos_sent;       /* HELLO frames written (one per connection) */
  uint64_t acks_sent;         /* ACK frames written */
  uint64_t acks_dropped;      /* ACKs lost: ack queue full or connection lost */
  uint64_t commands_received; /* well-formed COMMAND frames read */
  uint64_t commands_dropped;  /* commands refused (queue full; auto-acked BUSY) */
  uint64_t commands_unsupported; /* unknown kind; auto-acked UNSUPPORTED */
  uint64_t malformed_received; /* bad frames from the agent (connection dropped) */
  uint64_t connects;          /* successful connections to the agent */
  uint64_t disconnects;       /* connections lost or closed */
  uint64_t connect_failures;  /* connection attempts that failed */
  uint64_t connected;         /* 1 while connected to the agent, else 0 */
  /* Appended in ABI 2. */
  uint64_t commands_invalid; /* BALANCE/NVL_TRANSIT with bad weights or transit; acked FAILED */
} railover_stats_t;

/*
 * Switch points: every rank of a communicator applies epoch E at ops_done N,
 * or none does.
 *
 * A REBALANCE or FAILBACK command with ops_done N > 0 is a proposal: "once
 * your ops_done on comm_id reaches N, use this plan (from collective N+1 on)".
 * The service sends it to the node of every rank; it reaches the ranks at
 * different moments, and a rank already past N cannot take it any more. The
 * CCL makes the proposal all-or-nothing with an in-band agreement, the one
 * ReCCL performs with its periodic AllGather of RNIC state and ops_done.
 * Here ops_done counts collectives on comm_id in which every rank of comm_id
 * takes part, so no rank can complete collective N+1 while another holds at
 * N. Per communicator, a rank keeps at most one armed command (proposed,
 * not yet decided) and the decided ones until their N comes:
 *
 * 1. Arm, on taking a command with poll_command:
 *    - ops_done == 0 means now: apply it at once and ack APPLIED; there is
 *      nothing to agree on (the service sends it only where ranks may switch
 *      independently);
 *    - N <= this rank's ops_done: too late. Do not arm it; answer
 *      ack_command_at(command_id, RAILOVER_ACK_TOO_LATE, ops_done);
 *    - an epoch older than the armed one: already superseded, ignore it;
 *    - otherwise arm it, replacing an older armed command.
 *    A FAILOVER of a newer epoch than an armed FAILBACK disarms it: the service
 *    sends one when a new failure overtakes a return still on its way, and
 *    never proposes that return again. (Epochs count per communicator over
 *    every kind, so a later command always has a newer epoch.)
 * 2. Exchange, in rounds: every rank of comm_id contributes one
 *    railover_switch_vote_t describing its armed command (all zero when it
 *    has none) and receives everyone's, in rank order: an AllGather. Rounds
 *    must keep coming while a rank holds (rule 4): run them periodically
 *    beside the collectives, as ReCCL does, or fuse one into every
 *    collective, as railover_testing/simjob.py does.
 * 3. Decide: pass the gathered votes to agree(). It is a pure function of the
 *    votes, so every rank gets the same outcome for the newest epoch E voted:
 *    APPLY   every vote armed the same E, N, kind and disabled_channels, and
 *            no vote's ops_done is past N. Action COMMIT: E is decided;
 *            switch when ops_done reaches N (at once if it has), then
 *            ack_command_at(command_id, RAILOVER_ACK_APPLIED, N). A decided
 *            command is never replaced; newer ones arm beside it and are
 *            decided in later rounds.
 *    REJECT  some rank cannot apply E: its vote is past N, or it is at N
 *            without E armed, or it armed E with another N or plan. Action
 *            TOO_LATE for every rank that voted a command (E or older):
 *            disarm it and answer ack_command_at(command_id,
 *            RAILOVER_ACK_TOO_LATE, ops_done). Nobody applies E; the
 *            service proposes E+1 beyond the highest ops_done it is told.
 *    WAIT    undecided: a rank has not armed E yet but is still below N.
 *            Action KEEP: stay armed, decide in a later round. A rank that
 *            voted an epoch older than E gets TOO_LATE instead: E, on its
 *            way to it, supersedes what it armed.
 *    NONE    nothing armed anywhere. Action KEEP.
 *    Act on what this rank voted in the round (votes[self]), even if a newer
 *    command was armed while the round was in flight.
 * 4. Hold: a rank whose armed, undecided command has N == its ops_done does
 *    not start collective N+1 until a round decides it. Where a round is
 *    fused into every collective, the round at N always decides (every vote
 *    is then at N), so no rank ever waits.
 *
 * Why this suffices: APPLY needs a vote from every rank with E armed at an
 * ops_done <= N; each such rank then holds at N (rule 4) until the outcome,
 * which every rank computes alike, so all of them switch at N. A rank that
 * was too late never votes E (rule 1), so no round says APPLY and nobody
 * switches; its votes without E are at an ops_done >= N, which every rank
 * reads as REJECT, so nobody holds for ever either.
 *
 * One rank's contribution to a round. All fields are plain values, 32 bytes,
 * no padding, so a CCL can AllGather an array of them as bytes. Zero
 * everything but ops_done when nothing is armed.
 */
typedef struct {
  uint64_t ops_done;          /* this rank's ops_done for the round: when it contributes,
                               * for a round run beside the collectives; k+1 for a round
                               * fused into collective k+1 (the count at which it will
                               * act on the outcome) */
  uint64_t switch_at;         /* armed command's ops_done (N); 0 = nothing armed */
  uint64_t disabled_channels; /* armed command's disabled_channels */
  uint32_t epoch;             /* armed command's epoch; 0 = nothing armed */
  uint32_t kind;              /* armed command's kind (enum railover_wire_command_kind) */
} railover_switch_vote_t;

/* What a round decided (railover_agreement_t.outcome). Only ever appended. */
typedef enum {
  RAILOVER_AGREE_NONE = 0,   /* no vote has anything armed */
  RAILOVER_AGREE_WAIT = 1,   /* not decided yet: exchange again */
  RAILOVER_AGREE_APPLY = 2,  /* every rank switches to epoch at switch_at */
  RAILOVER_AGREE_REJECT = 3, /* no rank applies epoch; each answers TOO_LATE */
} railover_agree_outcome_t;

/* What the calling rank does with the command it voted (.action). Only ever appended. */
typedef enum {
  RAILOVER_ACT_KEEP = 0,     /* nothing now: keep what is armed */
  RAILOVER_ACT_COMMIT = 1,   /* decided: switch at switch_at, then ack APPLIED */
  RAILOVER_ACT_TOO_LATE = 2, /* disarm, ack TOO_LATE with this rank's ops_done */
} railover_agree_action_t;

/* The result of agree(), written to the caller's struct. */
typedef struct {
  uint32_t outcome;      /* railover_agree_outcome_t; the same on every rank */
  uint32_t action;       /* railover_agree_action_t for votes[self] */
  uint32_t epoch;        /* the newest epoch voted, the one decided about; 0 with NONE */
  uint32_t reserved;     /* 0 */
  uint64_t switch_at;    /* that epoch's ops_done (N); 0 with NONE */
  uint64_t max_ops_done; /* the highest ops_done among the votes */
} railover_agreement_t;

/*
 * ABI version 1. Every pointer argument documented as a string is a
 * NUL-terminated UTF-8 string owned by the caller and only read during the
 * call; names longer than 63 bytes are truncated. `handle` is the value
 * written by init; it stays valid until finalize returns.
 */
typedef struct {
  const char* name;     /* "railover" */
  uint32_t abi_version; /* RAILOVER_PLUGIN_ABI_VERSION this table implements */

  /* Allocates the ring (the only allocation the plugin makes), starts the
   * sender thread, and writes a handle to *handle. Connects in the
   * background: reports made before the first connection wait in the ring
   * and are sent once connected. Several handles may coexist in one process.
   * The job the HELLO names comes from the environment (RAILOVER_JOB_ID,
   * RAILOVER_JOB_INCARNATION; see init_v3), so a CCL built against ABI 1 or 2
   * names its job once the launcher sets them. */
  int (*init)(const railover_config_t* config, railover_log_fn log, void** handle);

  /* Stops the sender thread after draining (see drain_timeout_ms), closes
   * the socket and frees everything. No other call on this handle may be in
   * progress or follow. */
  int (*finalize)(void* handle);

  /* A work completion failed. dev_name: RNIC ("mlx5_0"); port: 1-based;
   * qp_num; wc_status: enum ibv_wc_status; vendor_err: ibv_wc.vendor_err;
   * peer: remote address or hostname, may be NULL or "". */
  int (*report_cqe_error)(void* handle, const char* dev_name, uint32_t port, uint32_t qp_num,
                          uint32_t wc_status, uint32_t vendor_err, const char* peer);

  /* An ibverbs async event. ibv_event_type: enum ibv_event_type. */
  int (*report_port_event)(void* handle, const char* dev_name, uint32_t port,
                           uint32_t ibv_event_type);

  /* Channel `channel` of communicator comm_id moved from from_dev to to_dev.
   * reason: enum railover_wire_switch_reason. */
  int (*report_path_switch)(void* handle, uint64_t comm_id, uint32_t channel,
                            const char* from_dev, const char* to_dev, uint32_t reason);

  /* Rank `rank` of comm_id has completed ops_done collective operations.
   * Cheap enough to call once per collective. */
  int (*report_progress)(void* handle, uint64_t comm_id, uint32_t rank, uint64_t ops_done);

  /* Takes the oldest pending command into *out and returns RAILOVER_OK, or
   * returns RAILOVER_NO_COMMAND at once. Commands of kinds this plugin does
   * not know are answered UNSUPPORTED by the plugin and never returned. The
   * queue holds 64 commands; with more pending, new ones are answered BUSY. */
  int (*poll_command)(void* handle, railover_command_t* out);

  /* Answers command_id with status (enum railover_ack_status: 0 applied,
   * negative failed). Queued for the sender thread; RAILOVER_DROPPED when
   * the ack queue (64) is full or no agent is connected. */
  int (*ack_command)(void* handle, uint64_t command_id, int32_t status);

  /* Copies min(out_size, sizeof(railover_stats_t)) bytes of counters to out. */
  int (*stats)(void* handle, railover_stats_t* out, size_t out_size);

  /* Members from here on were appended to v1 for the switch-point agreement
   * (see "Switch points" above); a CCL that calls them needs a library at
   * least as new as this header, and an agent that knows frame type 18. */

  /* As ack_command, and also tells the service this rank's ops_done on the
   * command's communicator when it answered (frame RAILOVER_MSG_ACK_AT): for
   * APPLIED the op it switched at, for TOO_LATE how far it already was. Same
   * queue, cost and return values as ack_command. */
  int (*ack_command_at)(void* handle, uint64_t command_id, int32_t status, uint64_t ops_done);

  /* Decides one agreement round. votes: n_votes votes, one per rank of the
   * communicator, in rank order, owned by the caller and only read during
   * the call; self: the calling rank's index in votes. Writes the outcome and
   * this rank's action to *out and returns RAILOVER_OK, or returns
   * RAILOVER_ERR_INVALID (out untouched) for NULL pointers, n_votes == 0 or
   * self >= n_votes. Pure: no handle, no allocation, no lock, no I/O; O(n_votes);
   * callable from any thread, before init and after finalize. */
  int (*agree)(const railover_switch_vote_t* votes, uint32_t n_votes, uint32_t self,
               railover_agreement_t* out);
} railoverPlugin_v1_t;

/* The exported symbol of librailover_plugin.so for ABI version 1. Its table is
 * what a CCL built against ABI 1 has always called: poll_command never returns
 * the kinds added in ABI 2 (a BALANCE comes out as a REBALANCE of the same
 * disabled_channels, an NVL_TRANSIT is answered UNSUPPORTED by the plugin). */
extern const railoverPlugin_v1_t railoverPlugin_v1;

/* ---- ABI version 2: R2CCL balance and NVL transit. ----
 *
 * A command as poll_command_v2 hands it out: the v1 fields (in `base`), then the
 * payload of the extension frame that came with it. `base.kind` may be any kind,
 * RAILOVER_CMD_BALANCE and RAILOVER_CMD_NVL_TRANSIT included; the arrays are
 * zero for the other kinds.
 *
 *  BALANCE (a switch point, agreed like REBALANCE): from ops_done on, send each
 *    channel i of comm_id weights[i] of the traffic (R2CCL-Balance) and, when
 *    split_ratio > 0, run an allreduce as an allreduce plus a broadcast with the
 *    degraded node handing split_ratio of it to the others (R2CCL-AllReduce).
 *    base.disabled_channels is the DCR plan for the same failure (the channels
 *    of the failed rails); it is what a v1 caller runs, and what the vote
 *    carries. An epoch
 *    names one plan: the service never sends two plans under one epoch, so the
 *    votes need not carry the weights.
 *  NVL_TRANSIT (now, ops_done 0; no agreement): ranks[i] of comm_id sends through
 *    node-local GPU transit_gpus[i] over NVLink, giving it at most
 *    mb_per_channel MB per channel. A rank that is not listed keeps its path.
 *  FAILBACK ends both: every channel back to even weights, no transit.
 */
typedef struct {
  railover_command_t base;
  uint32_t n_channels; /* BALANCE: weights used; else 0 */
  float split_ratio;   /* BALANCE: R2CCL-AllReduce hand-off, [0, 1); 0 = no split */
  float weights[RAILOVER_WIRE_MAX_CHANNELS]; /* BALANCE: share of channel i, summing to 1 */
  uint32_t n_transit;      /* NVL_TRANSIT: entries used; else 0 */
  uint32_t mb_per_channel; /* NVL_TRANSIT: transit memory per channel, MB */
  uint32_t transit_ranks[RAILOVER_WIRE_MAX_TRANSIT]; /* NVL_TRANSIT: rank within comm_id */
  uint32_t transit_gpus[RAILOVER_WIRE_MAX_TRANSIT];  /* NVL_TRANSIT: its transit GPU */
  uint64_t iteration; /* CHECKPOINT_NOW: the iteration that could not be rebuilt; else 0 */
} railover_command_v2_t;
RAILOVER_STATIC_ASSERT(sizeof(railover_command_t) == 40, "railover_command_t size");
RAILOVER_STATIC_ASSERT(sizeof(railover_command_v2_t) == 448, "railover_command_v2_t size");
RAILOVER_STATIC_ASSERT(offsetof(railover_command_v2_t, weights) == 48, "weights offset");

/*
 * ABI version 2: every member of v1, same order, same meaning, then the new ones.
 * A CCL built against this header uses railoverPlugin_v2; one built against ABI 1
 * keeps using railoverPlugin_v1, which the library still exports.
 */
typedef struct {
  const char* name;     /* "railover" */
  uint32_t abi_version; /* 2 */
  int (*init)(const railover_config_t* config, railover_log_fn log, void** handle);
  int (*finalize)(void* handle);
  int (*report_cqe_error)(void* handle, const char* dev_name, uint32_t port, uint32_t qp_num,
                          uint32_t wc_status, uint32_t vendor_err, const char* peer);
  int (*report_port_event)(void* handle, const char* dev_name, uint32_t port,
                           uint32_t ibv_event_type);
  int (*report_path_switch)(void* handle, uint64_t comm_id, uint32_t channel,
                            const char* from_dev, const char* to_dev, uint32_t reason);
  int (*report_progress)(void* handle, uint64_t comm_id, uint32_t rank, uint64_t ops_done);
  /* The v1 call: never returns BALANCE or NVL_TRANSIT (see railoverPlugin_v1). */
  int (*poll_command)(void* handle, railover_command_t* out);
  int (*ack_command)(void* handle, uint64_t command_id, int32_t status);
  int (*stats)(void* handle, railover_stats_t* out, size_t out_size);
  int (*ack_command_at)(void* handle, uint64_t command_id, int32_t status, uint64_t ops_done);
  int (*agree)(const railover_switch_vote_t* votes, uint32_t n_votes, uint32_t self,
               railover_agreement_t* out);

  /* Members from here on are new in ABI 2. */

  /* As poll_command, for every kind: takes the oldest pending command into *out
   * and returns RAILOVER_OK, or RAILOVER_NO_COMMAND at once (out untouched).
   * Copies min(out_size, sizeof(railover_command_v2_t)) bytes, so a caller built
   * against a later, longer struct keeps working; out_size below
   * sizeof(railover_command_t) is RAILOVER_ERR_INVALID. Same queue, cost and
   * threading as poll_command; use one of the two per handle. */
  int (*poll_command_v2)(void* handle, railover_command_v2_t* out, size_t out_size);
} railoverPlugin_v2_t;

/* The exported symbol of librailover_plugin.so for ABI version 2. */
extern const railoverPlugin_v2_t railoverPlugin_v2;

/* ---- ABI version 3: the job a process belongs to. ----
 *
 * Two jobs can share a node and, within it, the rank numbers and communicator 0.
 * HELLO names the job (railover_wire_hello_v2) so that the agent sends this
 * process only its own job's commands; "How a process is tied to its job" in
 * railover_wire.h has the agent's rule, for processes that name a job and for
 * those that do not.
 *
 * Configuration for init_v3: railover_config_t, then the job. Like the base
 * fields, a NULL or "" job_id and a 0 incarnation mean "the environment
 * variable, else none".
 */
typedef struct {
  railover_config_t base;
  /* The job_id the job was registered under (POST /v1/jobs), at most 255 bytes of
   * UTF-8; copied during init. Env RAILOVER_JOB_ID; unset: the process names no
   * job (HELLO version 1). Longer than 255 bytes: RAILOVER_ERR_CONFIG. */
  const char* job_id;
  /* The job's incarnation (1 when first posted, one more each time the fleet
   * manager posts it again after a restart), when the launcher knows it. Env
   * RAILOVER_JOB_INCARNATION (a decimal u32); 0 or unset: not known, and the
   * process takes its job's commands of any incarnation. */
  uint32_t incarnation;
  uint32_t reserved; /* 0 */
} railover_config_v3_t;

/*
 * ABI version 3: every member of v2, same order, same meaning, then init_v3.
 * A CCL built against this header uses railoverPlugin_v3; one built against ABI 1
 * or 2 keeps its table, which the library still exports, and names its job through
 * the environment.
 */
typedef struct {
  const char* name;     /* "railover" */
  uint32_t abi_version; /* 3 */
  /* init: the job from the environment only (see railoverPlugin_v1_t.init). */
  int (*init)(const railover_config_t* config, railover_log_fn log, void** handle);
  int (*finalize)(void* handle);
  int (*report_cqe_error)(void* handle, const char* dev_name, uint32_t port, uint32_t qp_num,
                          uint32_t wc_status, uint32_t vendor_err, const char* peer);
  int (*report_port_event)(void* handle, const char* dev_name, uint32_t port,
                           uint32_t ibv_event_type);
  int (*report_path_switch)(void* handle, uint64_t comm_id, uint32_t channel,
                            const char* from_dev, const char* to_dev, uint32_t reason);
  int (*report_progress)(void* handle, uint64_t comm_id, uint32_t rank, uint64_t ops_done);
  int (*poll_command)(void* handle, railover_command_t* out);
  int (*ack_command)(void* handle, uint64_t command_id, int32_t status);
  int (*stats)(void* handle, railover_stats_t* out, size_t out_size);
  int (*ack_command_at)(void* handle, uint64_t command_id, int32_t status, uint64_t ops_done);
  int (*agree)(const railover_switch_vote_t* votes, uint32_t n_votes, uint32_t self,
               railover_agreement_t* out);
  int (*poll_command_v2)(void* handle, railover_command_v2_t* out, size_t out_size);

  /* Members from here on are new in ABI 3. */

  /* As init, with the job: reads min(config_size, sizeof(railover_config_v3_t))
   * bytes of *config, so a caller built against a later, longer struct keeps
   * working, and one passing only the base (config_size ==
   * sizeof(railover_config_t)) gets init's behaviour; a NULL config is init(NULL).
   * config_size below sizeof(railover_config_t) is RAILOVER_ERR_INVALID. */
  int (*init_v3)(const railover_config_v3_t* config, size_t config_size, railover_log_fn log,
                 void** handle);
} railoverPlugin_v3_t;

/* The exported symbol of librailover_plugin.so for ABI version 3. */
extern const railoverPlugin_v3_t railoverPlugin_v3;

#ifdef __cplusplus
}
#endif

#endif /* RAILOVER_PLUGIN_H */
