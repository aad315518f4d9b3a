/* An unmodified ONNX Runtime training program: it asks ONNX Runtime for the training API and links only
 * libonnxruntime. With libort_torch_train preloaded it trains; without, GetTrainingApi answers NULL (exit 3).
 *   transparent ARTIFACTS_DIR [cuda]
 * With "cuda" it appends the CUDA execution provider first and prints the device the session options record. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ort_torch_train_training_c_api.h"

static const OrtApi* ort;

static int check(OrtStatus* status, const char* what) {
  if (status == NULL) return 0;
  printf("error %s %d %s\n", what, (int)OTT_ORT(ort, GetErrorCode)(status), OTT_ORT(ort, GetErrorMessage)(status));
  OTT_ORT(ort, ReleaseStatus)(status);
  return 1;
}

int main(int argc, char** argv) {
  ort = OrtGetApiBase()->GetApi(ORT_API_VERSION);
  const OrtTrainingApi* training = OTT_ORT(ort, GetTrainingApi)(ORT_API_VERSION);
  if (training == NULL) {
    printf("GetTrainingApi answered NULL\n");
    return 3;
  }
  char ckpt[1024], train[1024], optim[1024];
  snprintf(ckpt, sizeof ckpt, "%s/checkpoint", argv[1]);
  snprintf(train, sizeof train, "%s/training_model.onnx", argv[1]);
  snprintf(optim, sizeof optim, "%s/optimizer_model.onnx", argv[1]);
  OrtEnv* env = NULL;
  OrtSessionOptions* options = NULL;
  if (check(OTT_ORT(ort, CreateEnv)(ORT_LOGGING_LEVEL_WARNING, "transparent", &env), "CreateEnv")) return 1;
  if (check(OTT_ORT(ort, CreateSessionOptions)(&options), "CreateSessionOptions")) return 1;
  if (argc > 2 && strcmp(argv[2], "cuda") == 0) {
    int cuda_options[32] = {0}; /* OrtCUDAProviderOptions: device_id (first member) = 0, the rest zero */
    if (check(OTT_ORT(ort, SessionOptionsAppendExecutionProvider_CUDA)(options, (const OrtCUDAProviderOptions*)cuda_options),
              "AppendCUDA"))
      return 1;
    char device[64];
    size_t size = sizeof device;
    if (check(OTT_ORT(ort, GetSessionConfigEntry)(options, ORT_TORCH_TRAIN_DEVICE_KEY, device, &size), "config"))
      return 1;
    printf("device %s\n", device);
  }
  OrtCheckpointState* state = NULL;
  OrtTrainingSession* session = NULL;
  if (check(training->LoadCheckpoint(ckpt, &state), "LoadCheckpoint")) return 1;
  if (check(training->CreateTrainingSession(env, options, state, train, NULL, optim, &session), "CreateTrainingSession"))
    return 2;
  OrtMemoryInfo* cpu = NULL;
  check(OTT_ORT(ort, CreateCpuMemoryInfo)(OrtArenaAllocator, OrtMemTypeDefault, &cpu), "memory");
  static float x[8 * 20];
  static int64_t y[8];
  for (int i = 0; i < 8 * 20; i++) x[i] = (float)(i % 13) / 13.0f;
  for (int i = 0; i < 8; i++) y[i] = i % 5;
  int64_t x_dims[2] = {8, 20}, y_dims[1] = {8};
  OrtValue* inputs[2] = {NULL, NULL};
  check(OTT_ORT(ort, CreateTensorWithDataAsOrtValue)(cpu, x, sizeof x, x_dims, 2, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &inputs[0]), "x");
  check(OTT_ORT(ort, CreateTensorWithDataAsOrtValue)(cpu, y, sizeof y, y_dims, 1, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, &inputs[1]), "y");
  if (check(training->SetLearningRate(session, 0.01f), "SetLearningRate")) return 1;
  for (int step = 0; step < 5; step++) {
    OrtValue* loss = NULL;
    if (check(training->TrainStep(session, NULL, 2, (const OrtValue* const*)inputs, 1, &loss), "TrainStep")) return 1;
    float* value = NULL;
    check(OTT_ORT(ort, GetTensorMutableData)(loss, (void**)&value), "data");
    printf("loss %d %.9g\n", step, (double)*value);
    OTT_ORT(ort, ReleaseValue)(loss);
    if (check(training->OptimizerStep(session, NULL), "OptimizerStep")) return 1;
    if (check(training->LazyResetGrad(session), "LazyResetGrad")) return 1;
  }
  OTT_ORT(ort, ReleaseValue)(inputs[0]);
  OTT_ORT(ort, ReleaseValue)(inputs[1]);
  OTT_ORT(ort, ReleaseMemoryInfo)(cpu);
  training->ReleaseTrainingSession(session);
  training->ReleaseCheckpointState(state);
  OTT_ORT(ort, ReleaseSessionOptions)(options);
  OTT_ORT(ort, ReleaseEnv)(env);
  return 0;
}
