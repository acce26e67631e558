/* warpfleet's device clock: what the GPU did, whatever the program prints.
 *
 * Loaded by the CUDA driver into a candidate's process through CUDA_INJECTION64_PATH: at cuInit the
 * driver calls InitializeInjection, which enables CUPTI's activity records of kernels (concurrent:
 * the records do not serialize the kernels), memory copies and memsets, and keeps each one's
 * interval [start, end) in ns. The records go to a file (format below, read by
 * cluster/runners/device_clock.py):
 *
 *   - a process (WARPFLEET_DEVICE_RECORD names the file): the file is made at cuInit with its header
 *     only, and written whole at exit, ending with "end N"; a process that skips its exit handlers
 *     (_exit, a crash) leaves a record without "end": incomplete, never read as "no work";
 *   - a persistent host: wf_device_record_write(PATH) after each candidate (NULL: drop what was
 *     recorded so far, before one).
 *
 *   wf-device-record 1
 *   K <start_ns> <end_ns>      a kernel
 *   C <start_ns> <end_ns>      a memory copy
 *   S <start_ns> <end_ns>      a memset
 *   end <records>
 */
#include <cupti.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if CUPTI_API_VERSION >= 130000
typedef CUpti_ActivityKernel10 wf_kernel_t;
typedef CUpti_ActivityMemcpy6 wf_memcpy_t;
#else
typedef CUpti_ActivityKernel9 wf_kernel_t;
typedef CUpti_ActivityMemcpy5 wf_memcpy_t;
#endif
typedef CUpti_ActivityMemset4 wf_memset_t;

#define BUFFER_SIZE (1 << 20)
#define HEADER "wf-device-record 1\n"

typedef struct {
    char kind;
    uint64_t start, end;
} interval_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static interval_t* records;
static size_t count, capacity;
static int active;
static char exit_path[4096];

static void keep(char kind, uint64_t start, uint64_t end) {
    if (!start || end <= start) return;  /* a record CUPTI could not complete (flushed mid-flight): no interval */
    if (count == capacity) {
        size_t grown = capacity ? 2 * capacity : 4096;
        interval_t* more = realloc(records, grown * sizeof *records);
        if (!more) return;  /* a record lost: the busy time reads short, never long */
        records = more;
        capacity = grown;
    }
    records[count++] = (interval_t){kind, start, end};
}

static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = aligned_alloc(8, BUFFER_SIZE);
    *size = *buffer ? BUFFER_SIZE : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t size, size_t valid) {
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity* record = NULL;
    pthread_mutex_lock(&lock);
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        switch (record->kind) {
            case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
            case CUPTI_ACTIVITY_KIND_KERNEL: {
                wf_kernel_t* k = (wf_kernel_t*)record;
                keep('K', k->start, k->end);
                break;
            }
            case CUPTI_ACTIVITY_KIND_MEMCPY: {
                wf_memcpy_t* c = (wf_memcpy_t*)record;
                keep('C', c->start, c->end);
                break;
            }
            case CUPTI_ACTIVITY_KIND_MEMSET: {
                wf_memset_t* s = (wf_memset_t*)record;
                keep('S', s->start, s->end);
                break;
            }
            default:
                break;
        }
    }
    pthread_mutex_unlock(&lock);
    free(buffer);
}

/* Write what was recorded since the last call to PATH (NULL: drop it); the number of records. */
int wf_device_record_write(const char* path) {
    if (!active) return -1;
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    pthread_mutex_lock(&lock);
    int written = (int)count;
    FILE* out = path ? fopen(path, "w") : NULL;
    if (out) {
        fputs(HEADER, out);
        for (size_t i = 0; i < count; i++)
            fprintf(out, "%c %llu %llu\n", records[i].kind, (unsigned long long)records[i].start,
                    (unsigned long long)records[i].end);
        fprintf(out, "end %d\n", written);
        fclose(out);
    }
    count = 0;
    pthread_mutex_unlock(&lock);
    return out || !path ? written : -1;
}

int wf_device_record_active(void) { return active; }

static void at_exit(void) {
    if (exit_path[0]) wf_device_record_write(exit_path);
}

int InitializeInjection(void) {
    if (active) return 1;
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) return 0;
    if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET) != CUPTI_SUCCESS)
        return 0;
    active = 1;
    const char* path = getenv("WARPFLEET_DEVICE_RECORD");
    if (path && strlen(path) < sizeof exit_path) {
        strcpy(exit_path, path);
        FILE* begun = fopen(exit_path, "w");  /* the header alone until the exit handler writes it whole */
        if (begun) {
            fputs(HEADER, begun);
            fclose(begun);
        }
        atexit(at_exit);
    }
    return 1;
}
