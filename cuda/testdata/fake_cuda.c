/*
 * A stand-in for libcuda.so.1 (the CUDA driver API) that the tests of
 * package cuda build with cc and load instead of the real driver.
 *
 * Device memory is host memory, so copies are memcpy. Like the real
 * driver, every call that needs a context fails with
 * CUDA_ERROR_INVALID_CONTEXT on a thread that has none current, which is
 * how the tests prove that calls run on the device's own thread. Async
 * copies accept only pinned host memory (from cuMemAllocHost_v2), which
 * proves the staging. Every call is logged; fake_cuda_log and
 * fake_cuda_live let the tests read what happened.
 *
 * Knobs, read when the call is made:
 *   FAKE_CUDA_DEVICES            number of devices (default 1; 0 makes cuInit fail)
 *   FAKE_CUDA_EVENTS_NEVER_READY events never complete (a hung kernel)
 * A cuMemAlloc_v2 of 1 TiB or more fails with CUDA_ERROR_OUT_OF_MEMORY.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct fake_context *CUcontext;
typedef struct fake_stream *CUstream;
typedef struct fake_event *CUevent;

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_NOT_READY = 600,
};

#define MAX_DEVICES 8
#define STREAM_MAGIC 0x5743a11e
#define EVENT_MAGIC 0xe7e47e47

struct fake_context { int device; int retained; };
struct fake_stream { unsigned magic; };
struct fake_event { unsigned magic; int recorded; };
struct pinned { void *p; size_t n; struct pinned *next; };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static int device_count;
static struct fake_context contexts[MAX_DEVICES];
static __thread CUcontext current;
static struct pinned *pinned_list;
static long live_device, live_pinned, live_streams, live_events;
static char log_buf[1 << 16];
static size_t log_len;

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

static void count(long *counter, long delta) {
	pthread_mutex_lock(&mu);
	*counter += delta;
	pthread_mutex_unlock(&mu);
}

static int knob(const char *name, int fallback) {
	const char *v = getenv(name);
	return v && *v ? atoi(v) : fallback;
}

/* needs_context is the check every context-bound call starts with. */
static CUresult needs_context(void) {
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!current || !current->retained)
		return CUDA_ERROR_INVALID_CONTEXT;
	return CUDA_SUCCESS;
}

static int is_pinned(const void *p, size_t n) {
	int ok = 0;
	pthread_mutex_lock(&mu);
	for (struct pinned *e = pinned_list; e; e = e->next)
		if ((const char *)p >= (const char *)e->p && (const char *)p + n <= (const char *)e->p + e->n)
			ok = 1;
	pthread_mutex_unlock(&mu);
	return ok;
}

/* ---- test-only entry points ---- */

const char *fake_cuda_log(void) { return log_buf; }

long fake_cuda_live(const char *what) {
	if (!strcmp(what, "device")) return live_device;
	if (!strcmp(what, "pinned")) return live_pinned;
	if (!strcmp(what, "streams")) return live_streams;
	if (!strcmp(what, "events")) return live_events;
	if (!strcmp(what, "contexts")) {
		long n = 0;
		for (int i = 0; i < MAX_DEVICES; i++) n += contexts[i].retained;
		return n;
	}
	return -1;
}

/* ---- the driver API ---- */

CUresult cuGetErrorName(CUresult error, const char **p) {
	switch (error) {
	case CUDA_SUCCESS: *p = "CUDA_SUCCESS"; return CUDA_SUCCESS;
	case CUDA_ERROR_INVALID_VALUE: *p = "CUDA_ERROR_INVALID_VALUE"; return CUDA_SUCCESS;
	case CUDA_ERROR_OUT_OF_MEMORY: *p = "CUDA_ERROR_OUT_OF_MEMORY"; return CUDA_SUCCESS;
	case CUDA_ERROR_NOT_INITIALIZED: *p = "CUDA_ERROR_NOT_INITIALIZED"; return CUDA_SUCCESS;
	case CUDA_ERROR_NO_DEVICE: *p = "CUDA_ERROR_NO_DEVICE"; return CUDA_SUCCESS;
	case CUDA_ERROR_INVALID_DEVICE: *p = "CUDA_ERROR_INVALID_DEVICE"; return CUDA_SUCCESS;
	case CUDA_ERROR_INVALID_CONTEXT: *p = "CUDA_ERROR_INVALID_CONTEXT"; return CUDA_SUCCESS;
	case CUDA_ERROR_INVALID_HANDLE: *p = "CUDA_ERROR_INVALID_HANDLE"; return CUDA_SUCCESS;
	case CUDA_ERROR_NOT_READY: *p = "CUDA_ERROR_NOT_READY"; return CUDA_SUCCESS;
	}
	*p = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **p) {
	switch (error) {
	case CUDA_SUCCESS: *p = "no error"; return CUDA_SUCCESS;
	case CUDA_ERROR_INVALID_VALUE: *p = "invalid argument"; return CUDA_SUCCESS;
	case CUDA_ERROR_OUT_OF_MEMORY: *p = "out of memory"; return CUDA_SUCCESS;
	case CUDA_ERROR_NOT_INITIALIZED: *p = "initialization error"; return CUDA_SUCCESS;
	case CUDA_ERROR_NO_DEVICE: *p = "no CUDA-capable device is detected"; return CUDA_SUCCESS;
	case CUDA_ERROR_INVALID_DEVICE: *p = "invalid device ordinal"; return CUDA_SUCCESS;
	case CUDA_ERROR_INVALID_CONTEXT: *p = "invalid device context"; return CUDA_SUCCESS;
	case CUDA_ERROR_INVALID_HANDLE: *p = "invalid resource handle"; return CUDA_SUCCESS;
	case CUDA_ERROR_NOT_READY: *p = "device not ready"; return CUDA_SUCCESS;
	}
	*p = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuInit(unsigned int flags) {
	logf_("cuInit flags=%u", flags);
	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	device_count = knob("FAKE_CUDA_DEVICES", 1);
	if (device_count > MAX_DEVICES)
		device_count = MAX_DEVICES;
	if (device_count <= 0)
		return CUDA_ERROR_NO_DEVICE;
	initialized = 1;
	return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version) {
	*version = 12080;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *n) {
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	*n = device_count;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (ordinal < 0 || ordinal >= device_count)
		return CUDA_ERROR_INVALID_DEVICE;
	*dev = ordinal;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
	if (dev < 0 || dev >= device_count)
		return CUDA_ERROR_INVALID_DEVICE;
	snprintf(name, len, "Fake GPU %d", dev);
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char *id, int len, CUdevice dev) {
	if (dev < 0 || dev >= device_count)
		return CUDA_ERROR_INVALID_DEVICE;
	snprintf(id, len, "0000:%02x:00.0", 0x10 + dev);
	return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
	if (dev < 0 || dev >= device_count)
		return CUDA_ERROR_INVALID_DEVICE;
	*bytes = (size_t)80 << 30;
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
	if (dev < 0 || dev >= device_count)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	contexts[dev].device = dev;
	contexts[dev].retained++;
	pthread_mutex_unlock(&mu);
	*ctx = &contexts[dev];
	logf_("cuDevicePrimaryCtxRetain dev=%d", dev);
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
	if (dev < 0 || dev >= device_count || contexts[dev].retained == 0)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	contexts[dev].retained--;
	pthread_mutex_unlock(&mu);
	logf_("cuDevicePrimaryCtxRelease_v2 dev=%d", dev);
	return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (ctx && (ctx < &contexts[0] || ctx >= &contexts[MAX_DEVICES] || !ctx->retained))
		return CUDA_ERROR_INVALID_CONTEXT;
	current = ctx;
	return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
	CUresult r = needs_context();
	logf_("cuCtxSynchronize result=%d", r);
	return r;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	CUresult r = needs_context();
	if (r != CUDA_SUCCESS)
		return r;
	if (n == 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (n >= (size_t)1 << 40)
		return CUDA_ERROR_OUT_OF_MEMORY;
	void *m = calloc(1, n);
	if (!m)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*p = (CUdeviceptr)(uintptr_t)m;
	count(&live_device, 1);
	logf_("cuMemAlloc_v2 bytes=%zu", n);
	return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr p) {
	CUresult r = needs_context();
	if (r != CUDA_SUCCESS)
		return r;
	free((void *)(uintptr_t)p);
	count(&live_device, -1);
	logf_("cuMemFree_v2");
	return CUDA_SUCCESS;
}

CUresult cuMemAllocHost_v2(void **p, size_t n) {
	CUresult r = needs_context();
	if (r != CUDA_SUCCESS)
		return r;
	struct pinned *e = malloc(sizeof *e);
	e->p = malloc(n);
	e->n = n;
	pthread_mutex_lock(&mu);
	e->next = pinned_list;
	pinned_list = e;
	live_pinned++;
	pthread_mutex_unlock(&mu);
	*p = e->p;
	logf_("cuMemAllocHost_v2 bytes=%zu", n);
	return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void *p) {
	CUresult r = needs_context();
	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&mu);
	for (struct pinned **e = &pinned_list; *e; e = &(*e)->next) {
		if ((*e)->p == p) {
			struct pinned *gone = *e;
			*e = gone->next;
			free(gone->p);
			free(gone);
			live_pinned--;
			pthread_mutex_unlock(&mu);
			logf_("cuMemFreeHost");
			return CUDA_SUCCESS;
		}
	}
	pthread_mutex_unlock(&mu);
	return CUDA_ERROR_INVALID_VALUE;
}

static CUresult check_stream(CUstream s) {
	if (s == NULL)
		return CUDA_SUCCESS; /* the legacy default stream */
	return s->magic == STREAM_MAGIC ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
	CUresult r = needs_context();
	if (r == CUDA_SUCCESS)
		r = check_stream(s);
	if (r == CUDA_SUCCESS && !is_pinned(src, n))
		r = CUDA_ERROR_INVALID_VALUE; /* the tests want every async copy staged through pinned memory */
	if (r == CUDA_SUCCESS)
		memcpy((void *)(uintptr_t)dst, src, n);
	logf_("cuMemcpyHtoDAsync_v2 bytes=%zu stream=%s result=%d", n, s ? "own" : "default", r);
	return r;
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
	CUresult r = needs_context();
	if (r == CUDA_SUCCESS)
		r = check_stream(s);
	if (r == CUDA_SUCCESS && !is_pinned(dst, n))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS)
		memcpy(dst, (void *)(uintptr_t)src, n);
	logf_("cuMemcpyDtoHAsync_v2 bytes=%zu stream=%s result=%d", n, s ? "own" : "default", r);
	return r;
}

CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
	CUresult r = needs_context();
	if (r != CUDA_SUCCESS)
		return r;
	*s = malloc(sizeof **s);
	(*s)->magic = STREAM_MAGIC;
	count(&live_streams, 1);
	logf_("cuStreamCreate flags=%u", flags);
	return CUDA_SUCCESS;
}

CUresult cuStreamDestroy_v2(CUstream s) {
	CUresult r = needs_context();
	if (r == CUDA_SUCCESS && (s == NULL || s->magic != STREAM_MAGIC))
		r = CUDA_ERROR_INVALID_HANDLE;
	if (r != CUDA_SUCCESS)
		return r;
	s->magic = 0;
	free(s);
	count(&live_streams, -1);
	logf_("cuStreamDestroy_v2");
	return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream s) {
	CUresult r = needs_context();
	if (r == CUDA_SUCCESS)
		r = check_stream(s);
	return r;
}

CUresult cuEventCreate(CUevent *e, unsigned int flags) {
	CUresult r = needs_context();
	if (r != CUDA_SUCCESS)
		return r;
	*e = calloc(1, sizeof **e);
	(*e)->magic = EVENT_MAGIC;
	count(&live_events, 1);
	logf_("cuEventCreate flags=%u", flags);
	return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent e, CUstream s) {
	CUresult r = needs_context();
	if (r == CUDA_SUCCESS)
		r = check_stream(s);
	if (r == CUDA_SUCCESS && (e == NULL || e->magic != EVENT_MAGIC))
		r = CUDA_ERROR_INVALID_HANDLE;
	if (r == CUDA_SUCCESS)
		e->recorded = 1;
	logf_("cuEventRecord stream=%s result=%d", s ? "own" : "default", r);
	return r;
}

CUresult cuEventQuery(CUevent e) {
	CUresult r = needs_context();
	if (r != CUDA_SUCCESS)
		return r;
	if (e == NULL || e->magic != EVENT_MAGIC)
		return CUDA_ERROR_INVALID_HANDLE;
	if (e->recorded && knob("FAKE_CUDA_EVENTS_NEVER_READY", 0))
		return CUDA_ERROR_NOT_READY;
	return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent e) {
	CUresult r = needs_context();
	if (r == CUDA_SUCCESS && (e == NULL || e->magic != EVENT_MAGIC))
		r = CUDA_ERROR_INVALID_HANDLE;
	if (r != CUDA_SUCCESS)
		return r;
	e->magic = 0;
	free(e);
	count(&live_events, -1);
	logf_("cuEventDestroy_v2");
	return CUDA_SUCCESS;
}
