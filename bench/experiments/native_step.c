/* The C API step against the Python API step, in one process (bench/experiments/native_overhead.py runs it):
 *   native_step ARTIFACTS_DIR PYTHON_SCRIPT BLOCKS CALLS
 * A block is CALLS steps of TrainStep + OptimizerStep + LazyResetGrad (loss released) through the C API, or
 * CALLS steps of the Python API (`python_block(CALLS)` from PYTHON_SCRIPT, run in the embedded interpreter);
 * blocks alternate C, Python, C, Python... Prints "c US" and "python US" per block: microseconds per step. */
#include <Python.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ort_torch_train_training_c_api.h"

static const OrtApi* ort;
static const OrtTrainingApi* api;

static void check(OrtStatus* status) {
  if (status == NULL) return;
  fprintf(stderr, "error: %s\n", OTT_ORT(ort, GetErrorMessage)(status));
  exit(1);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  if (argc != 5) return 2;
  int blocks = atoi(argv[3]), calls = atoi(argv[4]);
  ort = OrtGetApiBase()->GetApi(ORT_API_VERSION);
  api = OrtTorchTrainGetTrainingApi(ORT_API_VERSION);
  char ckpt[1024], train[1024], optim[1024];
  snprintf(ckpt, sizeof ckpt, "%s/checkpoint", argv[1]);
  snprintf(train, sizeof train, "%s/training_model.onnx", argv[1]);
  snprintf(optim, sizeof optim, "%s/optimizer_model.onnx", argv[1]);
  OrtEnv* env = NULL;
  OrtSessionOptions* options = NULL;
  OrtMemoryInfo* cpu = NULL;
  check(OTT_ORT(ort, CreateEnv)(ORT_LOGGING_LEVEL_WARNING, "native_step", &env));
  check(OTT_ORT(ort, CreateSessionOptions)(&options));
  check(OTT_ORT(ort, CreateCpuMemoryInfo)(OrtArenaAllocator, OrtMemTypeDefault, &cpu));
  OrtCheckpointState* state = NULL;
  OrtTrainingSession* session = NULL;
  check(api->LoadCheckpoint(ckpt, &state)); /* starts the interpreter */
  check(api->CreateTrainingSession(env, options, state, train, NULL, optim, &session));
  static float x[8 * 20];
  static int64_t y[8];
  for (int i = 0; i < 8 * 20; i++) x[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
  for (int i = 0; i < 8; i++) y[i] = i % 5;
  const int64_t x_dims[2] = {8, 20}, y_dims[1] = {8};
  OrtValue* inputs[2] = {NULL, NULL};
  check(OTT_ORT(ort, CreateTensorWithDataAsOrtValue)(cpu, x, sizeof x, x_dims, 2, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &inputs[0]));
  check(OTT_ORT(ort, CreateTensorWithDataAsOrtValue)(cpu, y, sizeof y, y_dims, 1, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, &inputs[1]));

  PyGILState_STATE gil = PyGILState_Ensure();
  FILE* script = fopen(argv[2], "r");
  if (script == NULL || PyRun_SimpleFile(script, argv[2]) != 0) return 1;
  fclose(script);
  PyObject* python_block = PyObject_GetAttrString(PyImport_AddModule("__main__"), "python_block");
  PyGILState_Release(gil);
  if (python_block == NULL) return 1;

  for (int block = -1; block < blocks; block++) { /* block -1 warms both up */
    double start = now();
    for (int call = 0; call < calls; call++) {
      OrtValue* loss = NULL;
      check(api->TrainStep(session, NULL, 2, (const OrtValue* const*)inputs, 1, &loss));
      check(api->OptimizerStep(session, NULL));
      check(api->LazyResetGrad(session));
      OTT_ORT(ort, ReleaseValue)(loss);
    }
    double c_us = (now() - start) / calls * 1e6;
    gil = PyGILState_Ensure();
    PyObject* seconds = PyObject_CallFunction(python_block, "i", calls);
    double python_us = seconds ? PyFloat_AsDouble(seconds) / calls * 1e6 : -1;
    Py_XDECREF(seconds);
    PyGILState_Release(gil);
    if (python_us < 0) return 1;
    if (block >= 0) printf("c %.3f\npython %.3f\n", c_us, python_us);
    fflush(stdout);
  }
  OTT_ORT(ort, ReleaseValue)(inputs[0]);
  OTT_ORT(ort, ReleaseValue)(inputs[1]);
  api->ReleaseTrainingSession(session);
  api->ReleaseCheckpointState(state);
  return 0;
}
