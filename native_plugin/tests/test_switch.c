/*
 * The switch-point agreement of railover_plugin.h, end to end in C: four ranks
 * (threads, each with its own plugin handle and connection) run collectives in
 * lockstep and, before each, a round of the in-band agreement: an AllGather of
 * railover_switch_vote_t done with a barrier, decided by the library's agree().
 * A small agent on a unix socket plays the service:
 *   - it proposes epoch 1 at ops_done 20 to ranks 0-2 at once, and to rank 3
 *     only once rank 3 has reported progress 20 (a rank already at the switch
 *     point when the proposal reaches it);
 *   - once every rank has answered epoch 1 TOO_LATE (each with its ops_done, in
 *     ACK_AT frames), it proposes epoch 2 beyond the highest count it was told.
 * Checks: no rank applies epoch 1, every rank applies epoch 2 at the same op,
 * and the acks on the wire carry the counts. Also a table of agree() cases.
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
#include "check.h"

#define RANKS 4
#define LATE_RANK 3
#define COMM 77u
#define N1 20u           /* epoch 1's switch point */
#define PHASE1_END 30u   /* ops run before the re-proposal is awaited */
#define OFFSET2 20u      /* epoch 2 goes this far beyond the highest too-late count */
#define PHASE2_END 70u
#define CHANNELS1 0x0Fu
#define CHANNELS2 0xF0u

static const railoverPlugin_v1_t* api;

/* ------------------------------------------------------- agree(), by table */

static railover_switch_vote_t armed(uint64_t ops, uint32_t epoch, uint64_t at, uint64_t ch) {
  railover_switch_vote_t v = {ops, at, ch, epoch, RAILOVER_CMD_REBALANCE};
  return v;
}

static railover_switch_vote_t idle(uint64_t ops) {
  railover_switch_vote_t v = {ops, 0, 0, 0, 0};
  return v;
}

static void expect(const railover_switch_vote_t* votes, uint32_t n, uint32_t self,
                   uint32_t outcome, uint32_t action, const char* what) {
  railover_agreement_t out;
  CHECK(api->agree(votes, n, self, &out) == RAILOVER_OK, "%s: rc", what);
  CHECK(out.outcome == outcome && out.action == action, "%s: outcome %u action %u", what,
        out.outcome, out.action);
}

static void agree_table(void) {
  railover_switch_vote_t v[3];
  v[0] = idle(5), v[1] = idle(5), v[2] = idle(5);
  expect(v, 3, 0, RAILOVER_AGREE_NONE, RAILOVER_ACT_KEEP, "nothing armed");
  v[0] = armed(5, 1, 20, 1), v[1] = armed(5, 1, 20, 1), v[2] = armed(5, 1, 20, 1);
  expect(v, 3, 2, RAILOVER_AGREE_APPLY, RAILOVER_ACT_COMMIT, "all armed early");
  v[0].ops_done = v[1].ops_done = v[2].ops_done = 20;
  expect(v, 3, 1, RAILOVER_AGREE_APPLY, RAILOVER_ACT_COMMIT, "all armed at N");
  v[1].ops_done = 21;
  expect(v, 3, 0, RAILOVER_AGREE_REJECT, RAILOVER_ACT_TOO_LATE, "one armed rank past N");
  v[0] = armed(5, 1, 20, 1), v[1] = idle(5), v[2] = armed(5, 1, 20, 1);
  expect(v, 3, 0, RAILOVER_AGREE_WAIT, RAILOVER_ACT_KEEP, "one not yet armed, below N");
  v[1] = idle(20);
  expect(v, 3, 0, RAILOVER_AGREE_REJECT, RAILOVER_ACT_TOO_LATE, "one at N without it");
  expect(v, 3, 1, RAILOVER_AGREE_REJECT, RAILOVER_ACT_KEEP, "the one without it");
  v[1] = armed(5, 1, 20, 3);
  expect(v, 3, 2, RAILOVER_AGREE_REJECT, RAILOVER_ACT_TOO_LATE, "same epoch, other plan");
  v[1] = armed(5, 1, 24, 1);
  expect(v, 3, 2, RAILOVER_AGREE_REJECT, RAILOVER_ACT_TOO_LATE, "same epoch, other point");
  /* A newer epoch on one rank: the older one is what it supersedes. */
  v[0] = armed(5, 1, 20, 1), v[1] = armed(5, 2, 30, 2), v[2] = armed(5, 1, 20, 1);
  expect(v, 3, 1, RAILOVER_AGREE_WAIT, RAILOVER_ACT_KEEP, "newer epoch spreading");
  expect(v, 3, 0, RAILOVER_AGREE_WAIT, RAILOVER_ACT_TOO_LATE, "superseded while it spreads");
  v[0] = armed(30, 1, 20, 1), v[1] = armed(30, 2, 30, 2), v[2] = armed(30, 1, 20, 1);
  expect(v, 3, 0, RAILOVER_AGREE_REJECT, RAILOVER_ACT_TOO_LATE, "older epoch, newer not spread");
  railover_agreement_t out;
  CHECK(api->agree(v, 3, 1, &out) == RAILOVER_OK && out.epoch == 2 && out.switch_at == 30 &&
            out.max_ops_done == 30 && out.reserved == 0,
        "fields");
  CHECK(api->agree(NULL, 3, 0, &out) == RAILOVER_ERR_INVALID, "NULL votes");
  CHECK(api->agree(v, 3, 0, NULL) == RAILOVER_ERR_INVALID, "NULL out");
  CHECK(api->agree(v, 0, 0, &out) == RAILOVER_ERR_INVALID, "no votes");
  CHECK(api->agree(v, 3, 3, &out) == RAILOVER_ERR_INVALID, "self out of range");
}

/* ------------------------------------------------------ the stand-in agent */

typedef struct {
  int fd;
  uint32_t rank; /* from HELLO; RAILOVER_RANK_UNKNOWN before */
  uint64_t progress;
  unsigned char buf[4096];
  size_t len;
} conn_t;

typedef struct {
  uint64_t ops_done;
  int32_t status;
  int seen;
} ack_seen_t;

typedef struct {
  char path[108];
  int listen_fd;
  _Atomic int stop;
  pthread_t thread;
  conn_t conns[RANKS];
  int n_conns;
  int sent1[RANKS], sent2;
  uint64_t n2;
  ack_seen_t ack[3][RANKS]; /* [epoch][rank] */
  _Atomic int acks_seen;    /* read by main to know when all answers are in */
  int plain_acks, bad_frames;
} agent_t;

static uint64_t command_id(uint32_t epoch, uint32_t rank) { return 1000u * epoch + rank; }

static void send_command(conn_t* c, uint32_t epoch, uint64_t at, uint64_t channels) {
  unsigned char frame[RAILOVER_WIRE_HEADER_SIZE + sizeof(railover_wire_command)];
  railover_wire_header h = {RAILOVER_WIRE_MAGIC, RAILOVER_WIRE_VERSION, RAILOVER_MSG_COMMAND,
                            sizeof(railover_wire_command), 0};
  railover_wire_command cmd = {command_id(epoch, c->rank), COMM, at, channels,
                               RAILOVER_CMD_REBALANCE, epoch, 0};
  memcpy(frame, &h, sizeof(h));
  memcpy(frame + sizeof(h), &cmd, sizeof(cmd));
  CHECK(send(c->fd, frame, sizeof(frame), MSG_NOSIGNAL) == (ssize_t)sizeof(frame), "send");
}

static void on_frame(agent_t* a, conn_t* c, const railover_wire_header* h,
                     const unsigned char* payload) {
  if (h->type == RAILOVER_MSG_HELLO && h->payload_len == sizeof(railover_wire_hello)) {
    railover_wire_hello hello;
    memcpy(&hello, payload, sizeof(hello));
    c->rank = hello.rank;
  } else if (h->type == RAILOVER_MSG_PROGRESS && h->payload_len == sizeof(railover_wire_progress)) {
    railover_wire_progress pr;
    memcpy(&pr, payload, sizeof(pr));
    if (pr.ops_done > c->progress) c->progress = pr.ops_done;
  } else if (h->type == RAILOVER_MSG_ACK_AT && h->payload_len == sizeof(railover_wire_ack_at)) {
    railover_wire_ack_at ack;
    memcpy(&ack, payload, sizeof(ack));
    uint64_t epoch = ack.command_id / 1000u, rank = ack.command_id % 1000u;
    if (epoch < 1 || epoch > 2 || rank >= RANKS || rank != c->rank || a->ack[epoch][rank].seen) {
      a->bad_frames++;
      return;
    }
    a->ack[epoch][rank] = (ack_seen_t){ack.ops_done, ack.status, 1};
    atomic_fetch_add(&a->acks_seen, 1);
  } else if (h->type == RAILOVER_MSG_ACK) {
    a->plain_acks++;
  } else {
    a->bad_frames++;
  }
}

static void read_conn(agent_t* a, conn_t* c) {
  ssize_t n = recv(c->fd, c->buf + c->len, sizeof(c->buf) - c->len, MSG_DONTWAIT);
  if (n <= 0) return;
  c->len += (size_t)n;
  size_t off = 0;
  while (c->len - off >= RAILOVER_WIRE_HEADER_SIZE) {
    railover_wire_header h;
    memcpy(&h, c->buf + off, sizeof(h));
    CHECK(h.magic == RAILOVER_WIRE_MAGIC && h.payload_len <= RAILOVER_WIRE_MAX_PAYLOAD, "frame");
    if (c->len - off < RAILOVER_WIRE_HEADER_SIZE + h.payload_len) break;
    on_frame(a, c, &h, c->buf + off + RAILOVER_WIRE_HEADER_SIZE);
    off += RAILOVER_WIRE_HEADER_SIZE + h.payload_len;
  }
  memmove(c->buf, c->buf + off, c->len - off);
  c->len -= off;
}

/* What the service does, given what it has heard so far. */
static void propose(agent_t* a) {
  conn_t* by_rank[RANKS] = {0};
  for (int i = 0; i < a->n_conns; i++)
    if (a->conns[i].rank < RANKS) by_rank[a->conns[i].rank] = &a->conns[i];
  for (int r = 0; r < RANKS; r++)
    if (by_rank[r] == NULL) return; /* until every rank has said HELLO */
  for (int r = 0; r < RANKS; r++) {
    int due = r != LATE_RANK || by_rank[r]->progress >= N1;
    if (!a->sent1[r] && due) {
      send_command(by_rank[r], 1, N1, CHANNELS1);
      a->sent1[r] = 1;
    }
  }
  if (a->sent2) return;
  uint64_t highest = 0;
  for (int r = 0; r < RANKS; r++) {
    if (!a->ack[1][r].seen || a->ack[1][r].status != RAILOVER_ACK_TOO_LATE) return;
    if (a->ack[1][r].ops_done > highest) highest = a->ack[1][r].ops_done;
  }
  a->n2 = highest + OFFSET2;
  for (int r = 0; r < RANKS; r++) send_command(by_rank[r], 2, a->n2, CHANNELS2);
  a->sent2 = 1;
}

static void* agent_main(void* arg) {
  agent_t* a = arg;
  while (!atomic_load(&a->stop)) {
    struct pollfd fds[RANKS + 1];
    fds[0] = (struct pollfd){a->listen_fd, POLLIN, 0};
    for (int i = 0; i < a->n_conns; i++) fds[i + 1] = (struct pollfd){a->conns[i].fd, POLLIN, 0};
    if (poll(fds, (nfds_t)a->n_conns + 1, 5) > 0) {
      if ((fds[0].revents & POLLIN) && a->n_conns < RANKS) {
        int fd = accept(a->listen_fd, NULL, NULL);
        if (fd >= 0) a->conns[a->n_conns++] = (conn_t){.fd = fd, .rank = RAILOVER_RANK_UNKNOWN};
      }
      for (int i = 0; i < a->n_conns; i++)
        if (fds[i + 1].revents & POLLIN) read_conn(a, &a->conns[i]);
    }
    propose(a);
  }
  for (int i = 0; i < a->n_conns; i++) close(a->conns[i].fd);
  return NULL;
}

/* ------------------------------------------------------------- the ranks */

typedef struct {
  uint64_t command_id, switch_at, channels;
  uint32_t epoch, kind;
} plan_t;

typedef struct {
  uint32_t rank;
  void* handle;
  uint64_t ops_done;
  plan_t armed, decided; /* epoch 0: none */
  uint32_t answered[3];  /* [epoch]: 1 once acked */
  uint32_t applied_epoch[4];
  uint64_t applied_op[4];
  int n_applied;
} rank_t;

static rank_t ranks[RANKS];
static railover_switch_vote_t votes[RANKS];
static pthread_barrier_t exchange_barrier, op_barrier;
static agent_t agent;

static void answer(rank_t* r, const plan_t* p, int32_t status) {
  CHECK(api->ack_command_at(r->handle, p->command_id, status, r->ops_done) == RAILOVER_OK,
        "rank %u ack", r->rank);
  if (p->epoch < 3) r->answered[p->epoch] = 1;
}

/* Rule 1 of the header: arm, or answer too late. */
static int take_commands(rank_t* r) {
  int taken = 0;
  railover_command_t c;
  while (api->poll_command(r->handle, &c) == RAILOVER_OK) {
    CHECK(c.comm_id == COMM && c.kind == RAILOVER_CMD_REBALANCE && c.ops_done > 0, "command");
    plan_t p = {c.command_id, c.ops_done, c.disabled_channels, c.epoch, c.kind};
    taken++;
    if (c.ops_done <= r->ops_done) answer(r, &p, RAILOVER_ACK_TOO_LATE);
    else if (r->armed.epoch > c.epoch) continue;
    else r->armed = p;
  }
  return taken;
}

/* One round: AllGather of the votes, then agree() and its action (rule 3). */
static void round_and_act(rank_t* r) {
  railover_switch_vote_t mine = {r->ops_done, r->armed.switch_at, r->armed.channels,
                                 r->armed.epoch, r->armed.kind};
  votes[r->rank] = mine;
  pthread_barrier_wait(&exchange_barrier);
  railover_switch_vote_t gathered[RANKS];
  memcpy(gathered, votes, sizeof(gathered));
  railover_agreement_t out;
  CHECK(api->agree(gathered, RANKS, r->rank, &out) == RAILOVER_OK, "agree");
  if (out.action == RAILOVER_ACT_COMMIT) {
    CHECK(r->decided.epoch == 0, "rank %u: one decided command at a time", r->rank);
    r->decided = r->armed;
    r->armed = (plan_t){0};
  } else if (out.action == RAILOVER_ACT_TOO_LATE) {
    answer(r, &r->armed, RAILOVER_ACK_TOO_LATE);
    r->armed = (plan_t){0};
  }
  if (r->decided.epoch != 0 && r->decided.switch_at == r->ops_done) {
    CHECK(r->n_applied < 4, "applied too often");
    r->applied_epoch[r->n_applied] = r->decided.epoch;
    r->applied_op[r->n_applied++] = r->ops_done;
    answer(r, &r->decided, RAILOVER_ACK_APPLIED);
    r->decided = (plan_t){0};
  }
  /* Rule 4 never has to hold here: a round at every op decides by N. */
  CHECK(!(r->armed.epoch != 0 && r->armed.switch_at <= r->ops_done), "rank %u undecided at N",
        r->rank);
}

static void run_ops(rank_t* r, uint64_t until) {
  while (r->ops_done < until) {
    take_commands(r);
    round_and_act(r);
    pthread_barrier_wait(&op_barrier); /* the collective */
    r->ops_done++;
    api->report_progress(r->handle, COMM, r->rank, r->ops_done);
  }
}

static void* rank_main(void* arg) {
  rank_t* r = arg;
  /* Ranks 0-2 start only with epoch 1 armed, so it is a real proposal for them. */
  if (r->rank != LATE_RANK) WAIT_UNTIL((take_commands(r), r->armed.epoch == 1), 30);
  run_ops(r, PHASE1_END);
  /* The late rank answers epoch 1 whenever it reaches it, past the point. */
  if (r->rank == LATE_RANK) WAIT_UNTIL((take_commands(r), r->answered[1]), 30);
  /* Everyone waits for the re-proposal before going on (it is ahead of all of
   * them). It may have come, and even been decided, in the last ops above. */
  WAIT_UNTIL((take_commands(r), r->armed.epoch == 2 || r->decided.epoch == 2), 30);
  run_ops(r, PHASE2_END);
  return NULL;
}

int main(void) {
  api = &railoverPlugin_v1;
  agree_table();

  char dir[] = "/tmp/railover-switch-XXXXXX";
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  snprintf(agent.path, sizeof(agent.path), "%s/agent.sock", dir);
  agent.listen_fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  strcpy(addr.sun_path, agent.path);
  CHECK(bind(agent.listen_fd, (struct sockaddr*)&addr, sizeof(addr)) == 0, "bind");
  CHECK(listen(agent.listen_fd, RANKS) == 0, "listen");
  pthread_create(&agent.thread, NULL, agent_main, &agent);

  pthread_barrier_init(&exchange_barrier, NULL, RANKS);
  pthread_barrier_init(&op_barrier, NULL, RANKS);
  pthread_t th[RANKS];
  for (uint32_t i = 0; i < RANKS; i++) {
    railover_config_t cfg = {.socket_path = agent.path, .rank = i, .comm_id = COMM,
                             .reconnect_min_ms = 5, .reconnect_max_ms = 20};
    ranks[i].rank = i;
    CHECK(api->init(&cfg, NULL, &ranks[i].handle) == RAILOVER_OK, "init");
    railover_stats_t s;
    WAIT_UNTIL(api->stats(ranks[i].handle, &s, sizeof(s)) == RAILOVER_OK && s.connected, 10);
  }
  for (uint32_t i = 0; i < RANKS; i++) pthread_create(&th[i], NULL, rank_main, &ranks[i]);
  for (uint32_t i = 0; i < RANKS; i++) pthread_join(th[i], NULL);
  /* The answers to epoch 2 are on their way; wait for all of them. */
  WAIT_UNTIL(atomic_load(&agent.acks_seen) == 2 * RANKS, 10);
  atomic_store(&agent.stop, 1);
  pthread_join(agent.thread, NULL);

  for (uint32_t i = 0; i < RANKS; i++) {
    rank_t* r = &ranks[i];
    CHECK(r->n_applied == 1 && r->applied_epoch[0] == 2 && r->applied_op[0] == agent.n2,
          "rank %u applied %d plans, first epoch %u at %llu (want epoch 2 at %llu)", i,
          r->n_applied, r->applied_epoch[0], (unsigned long long)r->applied_op[0],
          (unsigned long long)agent.n2);
    ack_seen_t late = agent.ack[1][i], done = agent.ack[2][i];
    CHECK(late.seen && late.status == RAILOVER_ACK_TOO_LATE, "rank %u: epoch 1 TOO_LATE", i);
    /* Ranks 0-2 gave it up at the round at N; rank 3 never had it before N. */
    CHECK(i == LATE_RANK ? late.ops_done >= N1 : late.ops_done == N1, "rank %u too late at %llu",
          i, (unsigned long long)late.ops_done);
    CHECK(done.seen && done.status == RAILOVER_ACK_APPLIED && done.ops_done == agent.n2,
          "rank %u: epoch 2 APPLIED at %llu", i, (unsigned long long)done.ops_done);
    CHECK(api->finalize(r->handle) == RAILOVER_OK, "finalize");
  }
  CHECK(agent.n2 > PHASE1_END && agent.n2 >= N1 + OFFSET2, "epoch 2 at %llu",
        (unsigned long long)agent.n2);
  CHECK(agent.plain_acks == 0 && agent.bad_frames == 0, "plain acks %d, bad frames %d",
        agent.plain_acks, agent.bad_frames);
  close(agent.listen_fd);
  unlink(agent.path);
  rmdir(dir);
  pthread_barrier_destroy(&exchange_barrier);
  pthread_barrier_destroy(&op_barrier);
  printf("test_switch: rank %d past N=%u: nobody applied epoch 1; all %d applied epoch 2 at %llu\n",
         LATE_RANK, N1, RANKS, (unsigned long long)agent.n2);
  printf("test_switch: ok\n");
  return 0;
}
