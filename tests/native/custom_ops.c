/* A custom-op library registered through the C API and used by a training session:
 *   custom_ops train LIBRARY ARTIFACTS OUT   trains 5 steps, prints "loss STEP VALUE", the eval outputs
 *                                            ("eval K VALUES...") and trained parameters ("params VALUES..."),
 *                                            exports OUT/inference.onnx and runs it with ONNX Runtime
 *                                            ("inference VALUES..."), all on a clone of the options;
 *   custom_ops create LIBRARY ARTIFACTS      creates the session only: "status CODE MESSAGE" or "created";
 *   custom_ops register LIBRARY              registers LIBRARY: "status CODE MESSAGE" or "registered".
 * The artifacts' models read x float[4,3] and target float[4,2]; "y" is the model's output. */
#include "ott_test.h"

static float g_x[12], g_target[8];
static const int64_t g_x_dims[2] = {4, 3}, g_target_dims[2] = {4, 2};

static void print_values(const char* label, OrtValue* value) {
  const float* data = (const float*)tensor_data(value);
  printf("%s", label);
  for (size_t i = 0; i < tensor_count(value); i++) printf(" %.9g", data[i]);
  printf("\n");
}

static int report(OrtStatus* status, const char* done) {
  if (status == NULL) {
    printf("%s\n", done);
    return 0;
  }
  printf("status %d %s\n", (int)OTT_ORT(g_ort, GetErrorCode)(status), OTT_ORT(g_ort, GetErrorMessage)(status));
  OTT_ORT(g_ort, ReleaseStatus)(status);
  return 0;
}

static OrtStatus* create(OrtEnv* env, OrtSessionOptions* options, const char* artifacts, OrtCheckpointState** state,
                         OrtTrainingSession** session) {
  char checkpoint[1024], train[1024], evaluation[1024], optimizer[1024];
  snprintf(checkpoint, sizeof checkpoint, "%s/checkpoint", artifacts);
  snprintf(train, sizeof train, "%s/training_model.onnx", artifacts);
  snprintf(evaluation, sizeof evaluation, "%s/eval_model.onnx", artifacts);
  snprintf(optimizer, sizeof optimizer, "%s/optimizer_model.onnx", artifacts);
  CHECK(g_api->LoadCheckpoint(checkpoint, state));
  return g_api->CreateTrainingSession(env, options, *state, train, evaluation, optimizer, session);
}

static void train(OrtEnv* env, OrtSessionOptions* options, const char* artifacts, const char* out) {
  OrtCheckpointState* state = NULL;
  OrtTrainingSession* session = NULL;
  CHECK(create(env, options, artifacts, &state, &session));
  OrtValue* inputs[2] = {tensor_over(g_x, sizeof g_x, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, g_x_dims, 2),
                         tensor_over(g_target, sizeof g_target, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, g_target_dims, 2)};
  for (int step = 0; step < 5; step++) {
    OrtValue* outputs[2] = {NULL, NULL}; /* the loss and y */
    CHECK(g_api->TrainStep(session, NULL, 2, (const OrtValue* const*)inputs, 2, outputs));
    printf("loss %d %.9g\n", step, *(const float*)tensor_data(outputs[0]));
    for (int k = 0; k < 2; k++) OTT_ORT(g_ort, ReleaseValue)(outputs[k]);
    CHECK(g_api->OptimizerStep(session, NULL));
    CHECK(g_api->LazyResetGrad(session));
  }
  size_t count = 0;
  CHECK(g_api->TrainingSessionGetEvalModelOutputCount(session, &count));
  OrtValue* outputs[4] = {NULL, NULL, NULL, NULL};
  EXPECT(count <= 4);
  CHECK(g_api->EvalStep(session, NULL, 2, (const OrtValue* const*)inputs, count, outputs));
  for (size_t k = 0; k < count; k++) {
    char label[32];
    snprintf(label, sizeof label, "eval %zu", k);
    print_values(label, outputs[k]);
    OTT_ORT(g_ort, ReleaseValue)(outputs[k]);
  }
  size_t size = 0;
  CHECK(g_api->GetParametersSize(session, &size, true));
  float* params = (float*)calloc(size, sizeof(float));
  int64_t params_dims[1] = {(int64_t)size};
  OrtValue* buffer = tensor_over(params, size * sizeof(float), ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, params_dims, 1);
  CHECK(g_api->CopyParametersToBuffer(session, buffer, true));
  print_values("params", buffer);
  OTT_ORT(g_ort, ReleaseValue)(buffer);
  free(params);

  char model[1024];
  snprintf(model, sizeof model, "%s/inference.onnx", out);
  const char* names[1] = {"y"};
  CHECK(g_api->ExportModelForInferencing(session, model, 1, names));
  OrtSession* inference = NULL; /* ONNX Runtime's own session, with the same options: the ops registered there too */
  CHECK(OTT_ORT(g_ort, CreateSession)(env, model, options, &inference));
  const char* input_names[1] = {"x"};
  OrtValue* y = NULL;
  CHECK(OTT_ORT(g_ort, Run)(inference, NULL, input_names, (const OrtValue* const*)inputs, 1, names, 1, &y));
  print_values("inference", y);
  OTT_ORT(g_ort, ReleaseValue)(y);
  OTT_ORT(g_ort, ReleaseSession)(inference);
  for (int i = 0; i < 2; i++) OTT_ORT(g_ort, ReleaseValue)(inputs[i]);
  g_api->ReleaseTrainingSession(session);
  g_api->ReleaseCheckpointState(state);
}

int main(int argc, char** argv) {
  EXPECT(argc >= 3);
  open_apis();
  for (int i = 0; i < 12; i++) g_x[i] = (float)(i % 7) * 0.25f - 0.5f;
  for (int i = 0; i < 8; i++) g_target[i] = (float)(i % 3) * 0.5f;
  OrtEnv* env = NULL;
  CHECK(OTT_ORT(g_ort, CreateEnv)(ORT_LOGGING_LEVEL_ERROR, "custom_ops", &env));
  OrtSessionOptions* options = NULL;
  CHECK(OTT_ORT(g_ort, CreateSessionOptions)(&options));
  OrtStatus* status = OTT_ORT(g_ort, RegisterCustomOpsLibrary_V2)(options, argv[2]);
  if (strcmp(argv[1], "register") == 0) return report(status, "registered");
  CHECK(status);
  EXPECT(argc >= 4);
  if (strcmp(argv[1], "create") == 0) {
    OrtCheckpointState* state = NULL;
    OrtTrainingSession* session = NULL;
    report(create(env, options, argv[3], &state, &session), "created");
    if (session != NULL) g_api->ReleaseTrainingSession(session);
    g_api->ReleaseCheckpointState(state);
  } else { /* on a clone of the options, the original released: the clone keeps the registered ops */
    EXPECT(argc == 5 && strcmp(argv[1], "train") == 0);
    OrtSessionOptions* clone = NULL;
    CHECK(OTT_ORT(g_ort, CloneSessionOptions)(options, &clone));
    OTT_ORT(g_ort, ReleaseSessionOptions)(options);
    options = clone;
    train(env, options, argv[3], argv[4]);
  }
  OTT_ORT(g_ort, ReleaseSessionOptions)(options);
  OTT_ORT(g_ort, ReleaseEnv)(env);
  return 0;
}
