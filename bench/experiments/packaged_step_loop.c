/* The packaged native step timed in its own loop (bench/experiments/tiny_models_vs_ort.py drives it): ONNX Runtime's
 * training C API answered by libort_torch_train_packaged (libtorch only, no Python in the process).
 *
 *   packaged_step_loop PACKAGE_DIR CHECKPOINT INPUTS_DIR
 *
 * INPUTS_DIR/manifest.txt lists the train step's inputs per batch size, a line "BATCH K TYPE RANK D0 D1 ...", K the
 * input's index, TYPE its ONNX element type (1 float, 7 int64, 9 bool), with the raw bytes in INPUTS_DIR/b{BATCH}_{K}.bin.
 * It loads the checkpoint, creates the session and takes one step at the first batch listed, timing that with a
 * monotonic clock, and prints "ready SECONDS_TO_CREATE SECONDS_FOR_FIRST_STEP LIBPYTHON_LINES". Then each stdin
 * line "run BATCH N" takes N steps (TrainStep, the loss released, OptimizerStep, LazyResetGrad) and answers
 * "us MICROSECONDS_PER_STEP"; "quit" answers "peak_kb VmHWM" (/proc/self/status) and ends. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ort_torch_train_training_c_api.h"

#define MAX_BATCHES 4
#define MAX_INPUTS 8

static const OrtApi* ort;
static const OrtTrainingApi* api;

struct batch {
  long size;
  size_t count;
  OrtValue* inputs[MAX_INPUTS];
};

static void check(OrtStatus* status, const char* what) {
  if (status == NULL) return;
  fprintf(stderr, "%s: %s\n", what, OTT_ORT(ort, GetErrorMessage)(status));
  exit(1);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The number of lines of `file` (a /proc file) holding `needle`, or the value after `needle` on its first line. */
static long proc_lines(const char* file, const char* needle, int value) {
  FILE* in = fopen(file, "r");
  char line[4096];
  long found = 0;
  if (in == NULL) return -1;
  while (fgets(line, sizeof line, in)) {
    char* at = strstr(line, needle);
    if (at == NULL) continue;
    if (value) {
      found = strtol(at + strlen(needle), NULL, 10);
      break;
    }
    found++;
  }
  fclose(in);
  return found;
}

static size_t element_size(int type) { return type == 1 ? 4 : type == 7 ? 8 : 1; }

static size_t read_batches(const char* folder, OrtMemoryInfo* cpu, struct batch* batches) {
  char path[4096], line[1024];
  size_t count = 0;
  snprintf(path, sizeof path, "%s/manifest.txt", folder);
  FILE* manifest = fopen(path, "r");
  if (manifest == NULL) return 0;
  while (fgets(line, sizeof line, manifest)) {
    long size, index, type, rank;
    int64_t dims[8];
    char* cursor = line;
    size = strtol(cursor, &cursor, 10), index = strtol(cursor, &cursor, 10);
    type = strtol(cursor, &cursor, 10), rank = strtol(cursor, &cursor, 10);
    if (rank < 0 || rank > 8 || index < 0 || index >= MAX_INPUTS) exit(2);
    size_t elements = 1;
    for (long axis = 0; axis < rank; axis++) dims[axis] = strtol(cursor, &cursor, 10), elements *= (size_t)dims[axis];
    size_t which = 0;
    while (which < count && batches[which].size != size) which++;
    if (which == count) {
      if (count == MAX_BATCHES) exit(2);
      batches[count].size = size, batches[count].count = 0, count++;
    }
    size_t bytes = elements * element_size((int)type);
    void* data = malloc(bytes ? bytes : 1);
    snprintf(path, sizeof path, "%s/b%ld_%ld.bin", folder, size, index);
    FILE* raw = fopen(path, "rb");
    if (data == NULL || raw == NULL || fread(data, 1, bytes, raw) != bytes) exit(2);
    fclose(raw);
    check(OTT_ORT(ort, CreateTensorWithDataAsOrtValue)(cpu, data, bytes, dims, (size_t)rank, (ONNXTensorElementDataType)type,
                                              &batches[which].inputs[index]),
          "CreateTensorWithDataAsOrtValue");
    if ((size_t)index + 1 > batches[which].count) batches[which].count = (size_t)index + 1;
  }
  fclose(manifest);
  return count;
}

static void step(OrtTrainingSession* session, const struct batch* batch) {
  OrtValue* loss = NULL;
  check(api->TrainStep(session, NULL, batch->count, (const OrtValue* const*)batch->inputs, 1, &loss), "TrainStep");
  OTT_ORT(ort, ReleaseValue)(loss);
  check(api->OptimizerStep(session, NULL), "OptimizerStep");
  check(api->LazyResetGrad(session), "LazyResetGrad");
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: packaged_step_loop PACKAGE_DIR CHECKPOINT INPUTS_DIR\n");
    return 2;
  }
  ort = OrtGetApiBase()->GetApi(ORT_API_VERSION);
  api = OrtTorchTrainGetTrainingApi(ORT_API_VERSION);
  OrtEnv* env = NULL;
  OrtSessionOptions* options = NULL;
  OrtMemoryInfo* cpu = NULL;
  check(OTT_ORT(ort, CreateEnv)(ORT_LOGGING_LEVEL_WARNING, "packaged_step_loop", &env), "CreateEnv");
  check(OTT_ORT(ort, CreateSessionOptions)(&options), "CreateSessionOptions");
  check(OTT_ORT(ort, CreateCpuMemoryInfo)(OrtArenaAllocator, OrtMemTypeDefault, &cpu), "CreateCpuMemoryInfo");
  struct batch batches[MAX_BATCHES];
  size_t batch_count = read_batches(argv[3], cpu, batches);
  if (batch_count == 0) return 2;

  double started = now();
  OrtCheckpointState* state = NULL;
  OrtTrainingSession* session = NULL;
  check(api->LoadCheckpoint(argv[2], &state), "LoadCheckpoint");
  check(api->CreateTrainingSession(env, options, state, argv[1], NULL, NULL, &session), "CreateTrainingSession");
  check(api->SetLearningRate(session, 1e-3f), "SetLearningRate");
  double created = now();
  step(session, &batches[0]);
  double stepped = now();
  printf("ready %.6f %.6f %ld\n", created - started, stepped - created, proc_lines("/proc/self/maps", "libpython", 0));
  fflush(stdout);

  char line[256];
  while (fgets(line, sizeof line, stdin)) {
    long size = 0, calls = 0;
    if (strncmp(line, "quit", 4) == 0) break;
    if (sscanf(line, "run %ld %ld", &size, &calls) != 2 || calls < 1) return 2;
    size_t which = 0;
    while (which < batch_count && batches[which].size != size) which++;
    if (which == batch_count) return 2;
    double start = now();
    for (long call = 0; call < calls; call++) step(session, &batches[which]);
    printf("us %.4f\n", (now() - start) / (double)calls * 1e6);
    fflush(stdout);
  }
  printf("peak_kb %ld\n", proc_lines("/proc/self/status", "VmHWM:", 1));
  fflush(stdout);
  api->ReleaseTrainingSession(session);
  api->ReleaseCheckpointState(state);
  return 0;
}
