/* Helpers shared by the test programs: status checks, files, tensors over the program's own memory. */
#ifndef OTT_TEST_H
#define OTT_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ort_torch_train_training_c_api.h"

static const OrtApi* g_ort;
static const OrtTrainingApi* g_api;

static inline void fail_status(OrtStatus* status, const char* what, const char* file, int line) {
  fprintf(stderr, "%s:%d: %s failed: %s\n", file, line, what, OTT_ORT(g_ort, GetErrorMessage)(status));
  OTT_ORT(g_ort, ReleaseStatus)(status);
  exit(1);
}
#define CHECK(expr)                                        \
  do {                                                     \
    OrtStatus* check_status_ = (expr);                     \
    if (check_status_) fail_status(check_status_, #expr, __FILE__, __LINE__); \
  } while (0)
#define EXPECT(cond)                                                          \
  do {                                                                        \
    if (!(cond)) {                                                            \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);     \
      exit(1);                                                                \
    }                                                                         \
  } while (0)

static inline void* read_file(const char* path, size_t* size) {
  FILE* file = fopen(path, "rb");
  if (file == NULL) {
    fprintf(stderr, "cannot open %s\n", path);
    exit(1);
  }
  fseek(file, 0, SEEK_END);
  long length = ftell(file);
  fseek(file, 0, SEEK_SET);
  void* data = malloc(length > 0 ? (size_t)length : 1);
  if (fread(data, 1, (size_t)length, file) != (size_t)length) exit(1);
  fclose(file);
  *size = (size_t)length;
  return data;
}

static inline void write_file(const char* path, const void* data, size_t size) {
  FILE* file = fopen(path, "wb");
  if (file == NULL || fwrite(data, 1, size, file) != size) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(1);
  }
  fclose(file);
}

static OrtMemoryInfo* g_cpu;

/* An OrtValue over `data` (not copied: the program keeps it alive). */
static inline OrtValue* tensor_over(void* data, size_t bytes, ONNXTensorElementDataType type, const int64_t* dims, size_t rank) {
  if (g_cpu == NULL) CHECK(OTT_ORT(g_ort, CreateCpuMemoryInfo)(OrtArenaAllocator, OrtMemTypeDefault, &g_cpu));
  OrtValue* value = NULL;
  CHECK(OTT_ORT(g_ort, CreateTensorWithDataAsOrtValue)(g_cpu, data, bytes, dims, rank, type, &value));
  return value;
}

static inline void* tensor_data(OrtValue* value) {
  void* data = NULL;
  CHECK(OTT_ORT(g_ort, GetTensorMutableData)(value, &data));
  return data;
}

static inline size_t tensor_count(const OrtValue* value) {
  OrtTensorTypeAndShapeInfo* info = NULL;
  size_t count = 0;
  CHECK(OTT_ORT(g_ort, GetTensorTypeAndShape)(value, &info));
  CHECK(OTT_ORT(g_ort, GetTensorShapeElementCount)(info, &count));
  OTT_ORT(g_ort, ReleaseTensorTypeAndShapeInfo)(info);
  return count;
}

/* The explicit way in: ORT's table and the training table from libort_torch_train. */
static inline void open_apis(void) {
  g_ort = OrtGetApiBase()->GetApi(ORT_API_VERSION);
  EXPECT(g_ort != NULL);
  g_api = OrtTorchTrainGetTrainingApi(ORT_API_VERSION);
  EXPECT(g_api != NULL);
}

#endif
