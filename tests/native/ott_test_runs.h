/* What the training test programs (train_parity.c, packaged_runtime.c) share: a data folder's manifest and input
 * files read into tensors, and a trained session's eval loss and parameters written to the output folder.
 * DATA_DIR/manifest.txt: "train K TYPE RANK DIMS..." and "eval K TYPE RANK DIMS..." per input (and, where the
 * program reads them, "export NAME"); inputs are DATA_DIR/train_<step>_<K>.bin and eval_<K>.bin. */
#ifndef OTT_TEST_RUNS_H
#define OTT_TEST_RUNS_H

#include "ott_test.h"

typedef struct {
  char kind[8];
  int type, rank;
  int64_t dims[8];
} Input;

/* The manifest's inputs (at most 16); its "export NAME" lines into `exports` (at most 8), which may be NULL only
 * for a manifest without them. Returns the number of inputs. */
static inline int read_manifest(const char* dir, Input* inputs, char exports[][64], int* n_exports) {
  char path[1024], kind[8];
  snprintf(path, sizeof path, "%s/manifest.txt", dir);
  FILE* file = fopen(path, "r");
  EXPECT(file != NULL);
  int n = 0, index;
  if (n_exports != NULL) *n_exports = 0;
  while (n < 16 && fscanf(file, "%7s", kind) == 1) {
    if (strcmp(kind, "export") == 0) {
      EXPECT(exports != NULL && *n_exports < 8);
      EXPECT(fscanf(file, "%63s", exports[(*n_exports)++]) == 1);
      continue;
    }
    Input* in = &inputs[n++];
    strcpy(in->kind, kind);
    EXPECT(fscanf(file, "%d %d %d", &index, &in->type, &in->rank) == 3 && in->rank <= 8);
    for (int d = 0; d < in->rank; d++) EXPECT(fscanf(file, "%ld", &in->dims[d]) == 1);
  }
  fclose(file);
  return n;
}

/* The inputs of `kind` ("train" at `step`, or "eval" with step -1) as tensors over their files' bytes (kept in
 * `buffers`); returns how many. */
static inline int load_inputs(const char* dir, const Input* all, int n, const char* kind, int step, OrtValue** values,
                              void** buffers) {
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (strcmp(all[i].kind, kind) != 0) continue;
    char path[1024];
    if (step >= 0) snprintf(path, sizeof path, "%s/train_%d_%d.bin", dir, step, k);
    else snprintf(path, sizeof path, "%s/eval_%d.bin", dir, k);
    size_t size;
    buffers[k] = read_file(path, &size);
    values[k] = tensor_over(buffers[k], size, (ONNXTensorElementDataType)all[i].type, all[i].dims, (size_t)all[i].rank);
    k++;
  }
  return k;
}

static inline void release_inputs(OrtValue** values, void** buffers, int k) {
  for (int i = 0; i < k; i++) {
    OTT_ORT(g_ort, ReleaseValue)(values[i]);
    free(buffers[i]);
  }
}

/* EvalStep on the eval inputs; its loss written to OUT_DIR/eval.bin. */
static inline void write_eval_loss(OrtTrainingSession* session, const char* data, const Input* inputs, int n,
                                   const char* out) {
  OrtValue* values[16];
  void* buffers[16];
  int k = load_inputs(data, inputs, n, "eval", -1, values, buffers);
  OrtValue* eval_loss = NULL;
  CHECK(g_api->EvalStep(session, NULL, (size_t)k, (const OrtValue* const*)values, 1, &eval_loss));
  char path[1024];
  snprintf(path, sizeof path, "%s/eval.bin", out);
  write_file(path, tensor_data(eval_loss), sizeof(float) * tensor_count(eval_loss));
  OTT_ORT(g_ort, ReleaseValue)(eval_loss);
  release_inputs(values, buffers, k);
}

/* Every parameter (CopyParametersToBuffer) written to OUT_DIR/params.bin; returns the buffer (the caller
 * releases it). */
static inline OrtValue* write_parameters(OrtTrainingSession* session, const char* out) {
  size_t size = 0;
  CHECK(g_api->GetParametersSize(session, &size, false));
  OrtAllocator* allocator = NULL;
  CHECK(OTT_ORT(g_ort, GetAllocatorWithDefaultOptions)(&allocator));
  OrtValue* params = NULL;
  int64_t dims[1] = {(int64_t)size};
  CHECK(OTT_ORT(g_ort, CreateTensorAsOrtValue)(allocator, dims, 1, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &params));
  CHECK(g_api->CopyParametersToBuffer(session, params, false));
  char path[1024];
  snprintf(path, sizeof path, "%s/params.bin", out);
  write_file(path, tensor_data(params), size * sizeof(float));
  return params;
}

#endif
