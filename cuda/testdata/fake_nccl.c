/*
 * A stand-in for libnccl.so.2 that the tests of package cuda build with cc
 * and load instead of the real NCCL. Its types and prototypes copy
 * nccl.h's, so the Go side is checked against the real ABI: the 128-byte
 * ncclUniqueId passed by value, the size/version-tagged ncclConfig_t, the
 * int32 enums and the eight-argument ncclReduce.
 *
 * It moves data for a world of one rank (collectives copy sendbuff to
 * recvbuff; grouped sends to self are matched with receives from self)
 * and accepts any world size at init, so a rank other than 0 can be
 * created from a unique id read from the store; with more than one rank,
 * moving data fails (inside a group, at ncclGroupEnd, as NCCL reports a
 * group's errors) after the call is logged. It checks what it is
 * given: the unique id's bytes, the config's magic, version and unused
 * fields, the data type and reduction enums, a non-NULL stream, and no
 * call on a communicator after it was aborted or destroyed (counted by
 * fake_nccl_misuse). Every call is logged for fake_nccl_log;
 * fake_nccl_inprogress_reports counts the polls that saw ncclInProgress.
 *
 * Knobs, read when the call is made:
 *   FAKE_NCCL_VERSION     what ncclGetVersion reports (default FAKE_DEFAULT_VERSION)
 *   FAKE_NCCL_INPROGRESS  on a non-blocking communicator, calls return
 *                         ncclInProgress and ncclCommGetAsyncError reports
 *                         it this many times (-1: forever, a hang)
 *   FAKE_NCCL_ASYNC_ERROR the result ncclCommGetAsyncError reports once a
 *                         call has settled (a failure found after launch)
 * A count of 0xBAD fails with ncclInvalidArgument and a last error.
 *
 * Build variants (-D): NO_SPLIT drops ncclCommSplit (NCCL < 2.18); NO_SEND
 * drops ncclSend/ncclRecv (NCCL < 2.7); LEGACY drops everything newer
 * than NCCL 2.12 (config, finalize, last error, split).
 */
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef FAKE_DEFAULT_VERSION
#ifdef LEGACY
#define FAKE_DEFAULT_VERSION 21212
#else
#define FAKE_DEFAULT_VERSION 22703
#endif
#endif
#ifdef LEGACY
#define NO_SPLIT
#endif

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct ncclComm *ncclComm_t;
typedef void *cudaStream_t;
typedef enum {
	ncclSuccess = 0,
	ncclUnhandledCudaError = 1,
	ncclSystemError = 2,
	ncclInternalError = 3,
	ncclInvalidArgument = 4,
	ncclInvalidUsage = 5,
	ncclRemoteError = 6,
	ncclInProgress = 7,
} ncclResult_t;
typedef enum { ncclNumTypes = 12 } ncclDataType_t;
typedef enum { ncclNumOps = 5 } ncclRedOp_t;
typedef struct {
	size_t size;
	unsigned int magic;
	unsigned int version;
	int blocking;
	int cgaClusterSize;
	int minCTAs;
	int maxCTAs;
	const char *netName;
	int splitShare;
} ncclConfig_t;

#define COMM_MAGIC 0xc0111c
#define NCCL_SPLIT_NOCOLOR (-1)

struct ncclComm {
	unsigned magic;
	int nranks, rank;
	int blocking;
	int dead;    /* aborted or destroyed */
	int pending; /* polls left that report ncclInProgress; -1 forever */
};

struct p2p { int send; ncclComm_t comm; void *buf; size_t count; int dtype; int peer; };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static char log_buf[1 << 16];
static size_t log_len;
static char last_error[256];
static long misuse;
static int group_depth;
static struct p2p group_ops[64];
static int group_len;
static ncclComm_t group_comm;
static ncclResult_t group_error; /* a failure inside the group, reported by ncclGroupEnd as NCCL does */
static long inprogress_reports;

static void logf_(const char *format, ...) {
	va_list ap;
	pthread_mutex_lock(&mu);
	if (log_len < sizeof log_buf - 256) {
		va_start(ap, format);
		log_len += vsnprintf(log_buf + log_len, sizeof log_buf - log_len, format, ap);
		va_end(ap);
		log_buf[log_len++] = '\n';
		log_buf[log_len] = 0;
	}
	pthread_mutex_unlock(&mu);
}

static ncclResult_t fail(ncclResult_t r, const char *format, ...) {
	va_list ap;
	va_start(ap, format);
	vsnprintf(last_error, sizeof last_error, format, ap);
	va_end(ap);
	logf_("error %d: %s", r, last_error);
	return r;
}

static int knob(const char *name, int fallback) {
	const char *v = getenv(name);
	return v && *v ? atoi(v) : fallback;
}

static unsigned char id_byte(int i) { return (unsigned char)(0xA5 ^ (i * 7)); }

static size_t type_size(int dtype) {
	static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
	return dtype >= 0 && dtype < ncclNumTypes ? sizes[dtype] : 0;
}

static ncclResult_t check_comm(ncclComm_t comm) {
	if (comm == NULL || comm->magic != COMM_MAGIC)
		return fail(ncclInvalidArgument, "fake: invalid communicator");
	if (comm->dead) {
		__sync_fetch_and_add(&misuse, 1);
		return fail(ncclInvalidUsage, "fake: communicator used after abort or destroy");
	}
	return ncclSuccess;
}

/* check_call checks what every data-moving call is given. */
static ncclResult_t check_call(ncclComm_t comm, size_t count, int dtype, int op, cudaStream_t stream) {
	ncclResult_t r = check_comm(comm);
	if (r != ncclSuccess)
		return r;
	if (count == 0xBAD)
		return fail(ncclInvalidArgument, "fake: count 2989 is the magic bad count");
	if (type_size(dtype) == 0)
		return fail(ncclInvalidArgument, "fake: unexpected datatype %d", dtype);
	if (op < 0 || op >= ncclNumOps)
		return fail(ncclInvalidArgument, "fake: unexpected reduction %d", op);
	if (stream == NULL)
		return fail(ncclInvalidArgument, "fake: NULL stream: every communicator has its own");
	return ncclSuccess;
}

/* settle_result is what a call that was accepted returns: ncclInProgress
 * on a non-blocking communicator when FAKE_NCCL_INPROGRESS asks for it. */
static ncclResult_t settle_result(ncclComm_t comm) {
	int polls = knob("FAKE_NCCL_INPROGRESS", 0);
	if (comm->blocking || polls == 0)
		return ncclSuccess;
	comm->pending = polls;
	return ncclInProgress;
}

static ncclResult_t run(ncclComm_t comm, void *recv, const void *send, size_t bytes) {
	if (comm->nranks != 1) {
		ncclResult_t r = fail(ncclInvalidUsage, "fake: world size %d: the fake moves data for one rank only", comm->nranks);
		if (group_depth == 0)
			return r;
		group_error = r;
		return ncclSuccess;
	}
	if (send != recv)
		memmove(recv, send, bytes);
	if (group_depth > 0) {
		group_comm = comm;
		return ncclSuccess;
	}
	return settle_result(comm);
}

/* ---- test-only entry points ---- */

const char *fake_nccl_log(void) { return log_buf; }
long fake_nccl_misuse(void) { return misuse; }
long fake_nccl_inprogress_reports(void) { return inprogress_reports; }

/* ---- the NCCL API ---- */

const char *ncclGetErrorString(ncclResult_t r) {
	switch (r) {
	case ncclSuccess: return "no error";
	case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
	case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
	case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
	case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
	case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
	case ncclRemoteError: return "remote process exited or there was a network error";
	case ncclInProgress: return "NCCL operation in progress";
	}
	return "unknown result code";
}

#ifndef LEGACY
const char *ncclGetLastError(ncclComm_t comm) {
	(void)comm;
	return last_error;
}
#endif

ncclResult_t ncclGetVersion(int *version) {
	*version = knob("FAKE_NCCL_VERSION", FAKE_DEFAULT_VERSION);
	return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
	for (int i = 0; i < 128; i++)
		id->internal[i] = (char)id_byte(i);
	logf_("GetUniqueId");
	return ncclSuccess;
}

static ncclResult_t init(ncclComm_t *out, int nranks, ncclUniqueId id, int rank, int blocking) {
	for (int i = 0; i < 128; i++)
		if ((unsigned char)id.internal[i] != id_byte(i))
			return fail(ncclInvalidArgument, "fake: unique id byte %d is 0x%02x, want 0x%02x",
			            i, (unsigned char)id.internal[i], id_byte(i));
	if (nranks < 1 || rank < 0 || rank >= nranks)
		return fail(ncclInvalidArgument, "fake: rank %d of %d", rank, nranks);
	ncclComm_t c = calloc(1, sizeof *c);
	c->magic = COMM_MAGIC;
	c->nranks = nranks;
	c->rank = rank;
	c->blocking = blocking;
	*out = c;
	return settle_result(c);
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
	logf_("CommInitRank nranks=%d rank=%d", nranks, rank);
	return init(comm, nranks, id, rank, 1);
}

#ifndef LEGACY
/* check_config reads a config as NCCL does: no more than its size, with
 * fields newer than its version left at their defaults. */
static ncclResult_t check_config(const ncclConfig_t *config, int *blocking) {
	*blocking = 1;
	if (config == NULL)
		return ncclSuccess;
	ncclConfig_t c;
	memset(&c, 0, sizeof c);
	size_t n = config->size < sizeof c ? config->size : sizeof c;
	memcpy(&c, config, n);
	if (c.magic != 0xcafebeef)
		return fail(ncclInvalidArgument, "fake: config magic 0x%x", c.magic);
	if (c.size != sizeof c)
		return fail(ncclInvalidArgument, "fake: config size %zu, want %zu", c.size, sizeof c);
	if (c.version < 21400)
		return fail(ncclInvalidArgument, "fake: config version %u", c.version);
	const int unset[] = {c.cgaClusterSize, c.minCTAs, c.maxCTAs, c.splitShare};
	for (int i = 0; i < 4; i++)
		if (unset[i] != INT_MIN)
			return fail(ncclInvalidArgument, "fake: config int field %d is %d, want NCCL_CONFIG_UNDEF_INT", i, unset[i]);
	if (c.netName != NULL)
		return fail(ncclInvalidArgument, "fake: config netName set");
	if (c.blocking != 0 && c.blocking != 1)
		return fail(ncclInvalidArgument, "fake: config blocking %d", c.blocking);
	*blocking = c.blocking;
	return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config) {
	int blocking;
	ncclResult_t r = check_config(config, &blocking);
	logf_("CommInitRankConfig nranks=%d rank=%d blocking=%d", nranks, rank, blocking);
	if (r != ncclSuccess)
		return r;
	return init(comm, nranks, id, rank, blocking);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
	ncclResult_t r = check_comm(comm);
	logf_("CommFinalize");
	return r != ncclSuccess ? r : settle_result(comm);
}
#endif

#ifndef NO_SPLIT
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
	int blocking;
	ncclResult_t r = check_comm(comm);
	if (r == ncclSuccess)
		r = check_config(config, &blocking);
	logf_("CommSplit color=%d key=%d", color, key);
	if (r != ncclSuccess)
		return r;
	if (color == NCCL_SPLIT_NOCOLOR) {
		*newcomm = NULL;
		return settle_result(comm);
	}
	if (color < 0 || key < 0)
		return fail(ncclInvalidArgument, "fake: split color %d key %d", color, key);
	ncclComm_t c = calloc(1, sizeof *c);
	c->magic = COMM_MAGIC;
	c->nranks = 1;
	c->rank = 0;
	c->blocking = blocking;
	*newcomm = c;
	settle_result(c);
	return settle_result(comm);
}
#endif

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state) {
	ncclResult_t r = check_comm(comm);
	if (r != ncclSuccess)
		return r;
	if (comm->pending != 0) {
		if (comm->pending > 0)
			comm->pending--;
		__sync_fetch_and_add(&inprogress_reports, 1);
		*state = ncclInProgress;
		return ncclSuccess;
	}
	*state = (ncclResult_t)knob("FAKE_NCCL_ASYNC_ERROR", ncclSuccess);
	return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
	ncclResult_t r = check_comm(comm);
	logf_("CommAbort");
	if (r == ncclSuccess)
		comm->dead = 1;
	return r;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
	ncclResult_t r = check_comm(comm);
	logf_("CommDestroy");
	if (r == ncclSuccess)
		comm->dead = 1;
	return r;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int op, ncclComm_t comm, cudaStream_t stream) {
	ncclResult_t r = check_call(comm, count, dtype, op, stream);
	logf_("AllReduce count=%zu dtype=%d op=%d", count, dtype, op);
	return r != ncclSuccess ? r : run(comm, recv, send, count * type_size(dtype));
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, int dtype, int root, ncclComm_t comm, cudaStream_t stream) {
	ncclResult_t r = check_call(comm, count, dtype, 0, stream);
	logf_("Broadcast count=%zu dtype=%d root=%d", count, dtype, root);
	if (r == ncclSuccess && (root < 0 || root >= comm->nranks))
		r = fail(ncclInvalidArgument, "fake: root %d", root);
	return r != ncclSuccess ? r : run(comm, recv, send, count * type_size(dtype));
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, int dtype, int op, int root, ncclComm_t comm, cudaStream_t stream) {
	ncclResult_t r = check_call(comm, count, dtype, op, stream);
	logf_("Reduce count=%zu dtype=%d op=%d root=%d", count, dtype, op, root);
	if (r == ncclSuccess && (root < 0 || root >= comm->nranks))
		r = fail(ncclInvalidArgument, "fake: root %d", root);
	return r != ncclSuccess ? r : run(comm, recv, send, count * type_size(dtype));
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, int dtype, ncclComm_t comm, cudaStream_t stream) {
	ncclResult_t r = check_call(comm, sendcount, dtype, 0, stream);
	logf_("AllGather sendcount=%zu dtype=%d", sendcount, dtype);
	return r != ncclSuccess ? r : run(comm, recv, send, sendcount * type_size(dtype));
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, int dtype, int op, ncclComm_t comm, cudaStream_t stream) {
	ncclResult_t r = check_call(comm, recvcount, dtype, op, stream);
	logf_("ReduceScatter recvcount=%zu dtype=%d op=%d", recvcount, dtype, op);
	return r != ncclSuccess ? r : run(comm, recv, send, recvcount * type_size(dtype));
}

ncclResult_t ncclGroupStart(void) {
	logf_("GroupStart");
	if (group_depth++ == 0) {
		group_len = 0;
		group_comm = NULL;
		group_error = ncclSuccess;
	}
	return ncclSuccess;
}

/* match pairs the group's sends to self with its receives from self, in
 * order, and copies the data. */
static ncclResult_t match(void) {
	int sends[64], recvs[64], ns = 0, nr = 0;
	for (int i = 0; i < group_len; i++) {
		if (group_ops[i].send)
			sends[ns++] = i;
		else
			recvs[nr++] = i;
	}
	if (ns != nr)
		return fail(ncclInvalidUsage, "fake: %d sends and %d receives in a group of one rank", ns, nr);
	for (int i = 0; i < ns; i++) {
		struct p2p *s = &group_ops[sends[i]], *d = &group_ops[recvs[i]];
		if (s->count != d->count || s->dtype != d->dtype)
			return fail(ncclInvalidUsage, "fake: a send of %zu elements of type %d met a receive of %zu of type %d",
			            s->count, s->dtype, d->count, d->dtype);
		memmove(d->buf, s->buf, s->count * type_size(s->dtype));
	}
	return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
	logf_("GroupEnd");
	if (group_depth == 0)
		return fail(ncclInvalidUsage, "fake: ncclGroupEnd without ncclGroupStart");
	if (--group_depth > 0)
		return ncclSuccess;
	ncclResult_t r = group_error != ncclSuccess ? group_error : match();
	group_len = 0;
	if (r != ncclSuccess || group_comm == NULL)
		return r;
	return settle_result(group_comm);
}

#ifndef NO_SEND
static ncclResult_t p2p(int send, void *buf, size_t count, int dtype, int peer, ncclComm_t comm, cudaStream_t stream) {
	ncclResult_t r = check_call(comm, count, dtype, 0, stream);
	logf_("%s count=%zu dtype=%d peer=%d", send ? "Send" : "Recv", count, dtype, peer);
	if (r != ncclSuccess)
		return r;
	if (peer < 0 || peer >= comm->nranks)
		return fail(ncclInvalidArgument, "fake: peer %d", peer);
	if (comm->nranks != 1) {
		ncclResult_t r = fail(ncclInvalidUsage, "fake: world size %d: the fake moves data for one rank only", comm->nranks);
		if (group_depth == 0)
			return r;
		group_error = r;
		return ncclSuccess;
	}
	if (group_depth == 0)
		return fail(ncclInvalidUsage, "fake: a %s to self outside a group never completes", send ? "send" : "receive");
	if (group_len == 64)
		return fail(ncclInternalError, "fake: too many operations in one group");
	group_ops[group_len++] = (struct p2p){send, comm, buf, count, dtype, peer};
	group_comm = comm;
	return ncclSuccess;
}

ncclResult_t ncclSend(const void *send, size_t count, int dtype, int peer, ncclComm_t comm, cudaStream_t stream) {
	return p2p(1, (void *)send, count, dtype, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recv, size_t count, int dtype, int peer, ncclComm_t comm, cudaStream_t stream) {
	return p2p(0, recv, count, dtype, peer, comm, stream);
}
#endif
