/* Calls every OrtTrainingApi function on the MLP fixture, with good and bad arguments:
 *   api_coverage ARTIFACTS_DIR OUT_DIR
 * Prints "called NAME" once per function, and "case NAME CODE MESSAGE" for each error case; exits 1 on a
 * failed expectation. */
#include <math.h>
#include <stdint.h>

#include "ott_test.h"

static char g_called[64][64];
static int g_n_called;

static void called(const char* name) {
  for (int i = 0; i < g_n_called; i++)
    if (strcmp(g_called[i], name) == 0) return;
  strcpy(g_called[g_n_called++], name);
  printf("called %s\n", name);
}

/* An error case: the status must be set; its code and message are printed for the test to check. */
static void expect_error(const char* name, OrtStatus* status, OrtErrorCode code) {
  if (status == NULL) {
    fprintf(stderr, "case %s: expected an error, got success\n", name);
    exit(1);
  }
  OrtErrorCode got = OTT_ORT(g_ort, GetErrorCode)(status);
  const char* message = OTT_ORT(g_ort, GetErrorMessage)(status);
  printf("case %s %d %s\n", name, (int)got, message);
  if (got != code || message == NULL || message[0] == '\0') {
    fprintf(stderr, "case %s: expected code %d, got %d (%s)\n", name, (int)code, (int)got, message);
    exit(1);
  }
  OTT_ORT(g_ort, ReleaseStatus)(status);
}

static float g_x[8 * 20];
static int64_t g_y[8];
static const int64_t g_x_dims[2] = {8, 20}, g_y_dims[1] = {8};

static void batch(OrtValue** inputs) {
  inputs[0] = tensor_over(g_x, sizeof g_x, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, g_x_dims, 2);
  inputs[1] = tensor_over(g_y, sizeof g_y, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, g_y_dims, 1);
}

static void release(OrtValue** values, int n) {
  for (int i = 0; i < n; i++) OTT_ORT(g_ort, ReleaseValue)(values[i]);
}

static OrtValue* new_float_buffer(size_t n) {
  OrtAllocator* allocator = NULL;
  CHECK(OTT_ORT(g_ort, GetAllocatorWithDefaultOptions)(&allocator));
  OrtValue* value = NULL;
  int64_t dims[1] = {(int64_t)n};
  CHECK(OTT_ORT(g_ort, CreateTensorAsOrtValue)(allocator, dims, 1, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &value));
  return value;
}

static void names_and_counts(OrtTrainingSession* session, OrtAllocator* allocator) {
  size_t count = 0;
  char* name = NULL;
  CHECK(g_api->TrainingSessionGetTrainingModelInputCount(session, &count));
  EXPECT(count == 2);
  called("TrainingSessionGetTrainingModelInputCount");
  CHECK(g_api->TrainingSessionGetEvalModelInputCount(session, &count));
  EXPECT(count == 2);
  called("TrainingSessionGetEvalModelInputCount");
  CHECK(g_api->TrainingSessionGetTrainingModelOutputCount(session, &count));
  EXPECT(count == 1);
  called("TrainingSessionGetTrainingModelOutputCount");
  CHECK(g_api->TrainingSessionGetEvalModelOutputCount(session, &count));
  EXPECT(count == 1);
  called("TrainingSessionGetEvalModelOutputCount");
  CHECK(g_api->TrainingSessionGetTrainingModelInputName(session, 1, allocator, &name));
  EXPECT(strcmp(name, "labels") == 0);
  CHECK(OTT_ORT(g_ort, AllocatorFree)(allocator, name));
  called("TrainingSessionGetTrainingModelInputName");
  CHECK(g_api->TrainingSessionGetEvalModelInputName(session, 0, allocator, &name));
  EXPECT(strcmp(name, "input") == 0);
  CHECK(OTT_ORT(g_ort, AllocatorFree)(allocator, name));
  called("TrainingSessionGetEvalModelInputName");
  CHECK(g_api->TrainingSessionGetTrainingModelOutputName(session, 0, allocator, &name));
  EXPECT(strcmp(name, "onnx::loss::2") == 0);
  CHECK(OTT_ORT(g_ort, AllocatorFree)(allocator, name));
  called("TrainingSessionGetTrainingModelOutputName");
  CHECK(g_api->TrainingSessionGetEvalModelOutputName(session, 0, allocator, &name));
  EXPECT(strcmp(name, "onnx::loss::2") == 0);
  CHECK(OTT_ORT(g_ort, AllocatorFree)(allocator, name));
  called("TrainingSessionGetEvalModelOutputName");
  expect_error("input_name_out_of_range", g_api->TrainingSessionGetTrainingModelInputName(session, 5, allocator, &name),
               ORT_INVALID_ARGUMENT);
  expect_error("input_name_index_max",
               g_api->TrainingSessionGetTrainingModelInputName(session, SIZE_MAX, allocator, &name),
               ORT_INVALID_ARGUMENT);
}

static void properties(OrtCheckpointState* state, OrtAllocator* allocator) {
  int64_t epoch = 7;
  float best = 0.125f;
  CHECK(g_api->AddProperty(state, "epoch", OrtIntProperty, &epoch));
  CHECK(g_api->AddProperty(state, "best", OrtFloatProperty, &best));
  CHECK(g_api->AddProperty(state, "tag", OrtStringProperty, (void*)"native"));
  called("AddProperty");
  enum OrtPropertyType type;
  void* value = NULL;
  CHECK(g_api->GetProperty(state, "epoch", allocator, &type, &value));
  EXPECT(type == OrtIntProperty && *(int64_t*)value == 7);
  CHECK(OTT_ORT(g_ort, AllocatorFree)(allocator, value));
  CHECK(g_api->GetProperty(state, "best", allocator, &type, &value));
  EXPECT(type == OrtFloatProperty && *(float*)value == 0.125f);
  CHECK(OTT_ORT(g_ort, AllocatorFree)(allocator, value));
  CHECK(g_api->GetProperty(state, "tag", allocator, &type, &value));
  EXPECT(type == OrtStringProperty && strcmp((char*)value, "native") == 0);
  CHECK(OTT_ORT(g_ort, AllocatorFree)(allocator, value));
  called("GetProperty");
  expect_error("missing_property", g_api->GetProperty(state, "nope", allocator, &type, &value), ORT_INVALID_ARGUMENT);
  expect_error("bad_property_type", g_api->AddProperty(state, "x", (enum OrtPropertyType)9, &epoch),
               ORT_INVALID_ARGUMENT);
}

static void parameters(OrtCheckpointState* state, OrtAllocator* allocator) {
  OrtTensorTypeAndShapeInfo* info = NULL;
  CHECK(g_api->GetParameterTypeAndShape(state, "0.weight", &info));
  ONNXTensorElementDataType type;
  int64_t dims[2];
  size_t rank = 0;
  CHECK(OTT_ORT(g_ort, GetTensorElementType)(info, &type));
  CHECK(OTT_ORT(g_ort, GetDimensionsCount)(info, &rank));
  CHECK(OTT_ORT(g_ort, GetDimensions)(info, dims, 2));
  EXPECT(type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT && rank == 2 && dims[0] == 32 && dims[1] == 20);
  OTT_ORT(g_ort, ReleaseTensorTypeAndShapeInfo)(info);
  called("GetParameterTypeAndShape");
  OrtValue* bias = NULL;
  CHECK(g_api->GetParameter(state, "0.bias", allocator, &bias));
  EXPECT(tensor_count(bias) == 32);
  called("GetParameter");
  float* data = (float*)tensor_data(bias);
  for (int i = 0; i < 32; i++) data[i] = (float)i * 0.5f;
  CHECK(g_api->UpdateParameter(state, "0.bias", bias));
  called("UpdateParameter");
  OrtValue* again = NULL;
  CHECK(g_api->GetParameter(state, "0.bias", allocator, &again));
  EXPECT(memcmp(tensor_data(again), data, 32 * sizeof(float)) == 0);
  OTT_ORT(g_ort, ReleaseValue)(again);
  expect_error("missing_parameter", g_api->GetParameter(state, "nope", allocator, &again), ORT_INVALID_ARGUMENT);
  expect_error("update_parameter_wrong_shape", g_api->UpdateParameter(state, "0.weight", bias), ORT_INVALID_ARGUMENT);
  OTT_ORT(g_ort, ReleaseValue)(bias);
}

static void buffers(OrtTrainingSession* session) {
  size_t trainable = 0, all = 0;
  CHECK(g_api->GetParametersSize(session, &trainable, true));
  CHECK(g_api->GetParametersSize(session, &all, false));
  EXPECT(trainable == 837 && all == 837);
  called("GetParametersSize");
  OrtValue* buffer = new_float_buffer(trainable);
  CHECK(g_api->CopyParametersToBuffer(session, buffer, true));
  called("CopyParametersToBuffer");
  float* data = (float*)tensor_data(buffer);
  for (size_t i = 0; i < trainable; i++) data[i] += 1.0f;
  CHECK(g_api->CopyBufferToParameters(session, buffer, true));
  called("CopyBufferToParameters");
  OrtValue* back = new_float_buffer(trainable);
  CHECK(g_api->CopyParametersToBuffer(session, back, true));
  EXPECT(memcmp(tensor_data(back), data, trainable * sizeof(float)) == 0);
  OTT_ORT(g_ort, ReleaseValue)(back);
  OrtValue* small = new_float_buffer(10);
  expect_error("buffer_wrong_size", g_api->CopyParametersToBuffer(session, small, true), ORT_INVALID_ARGUMENT);
  expect_error("buffer_wrong_size_in", g_api->CopyBufferToParameters(session, small, true), ORT_INVALID_ARGUMENT);
  OTT_ORT(g_ort, ReleaseValue)(small);
  OTT_ORT(g_ort, ReleaseValue)(buffer);
}

static void bad_inputs(OrtTrainingSession* session) {
  static double x64[8 * 20];
  static float x1[20];
  OrtValue* inputs[2];
  OrtValue* loss = NULL;
  inputs[0] = tensor_over(x64, sizeof x64, ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE, g_x_dims, 2);
  inputs[1] = tensor_over(g_y, sizeof g_y, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, g_y_dims, 1);
  expect_error("wrong_dtype", g_api->TrainStep(session, NULL, 2, (const OrtValue* const*)inputs, 1, &loss),
               ORT_INVALID_ARGUMENT);
  OTT_ORT(g_ort, ReleaseValue)(inputs[0]);
  int64_t rank1[1] = {20};
  inputs[0] = tensor_over(x1, sizeof x1, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, rank1, 1);
  expect_error("wrong_rank", g_api->TrainStep(session, NULL, 2, (const OrtValue* const*)inputs, 1, &loss),
               ORT_INVALID_ARGUMENT);
  OTT_ORT(g_ort, ReleaseValue)(inputs[0]);
  inputs[0] = tensor_over(g_x, sizeof g_x, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, g_x_dims, 2);
  expect_error("wrong_count", g_api->TrainStep(session, NULL, 1, (const OrtValue* const*)inputs, 1, &loss),
               ORT_INVALID_ARGUMENT);
  OrtValue* two[2] = {NULL, NULL};
  expect_error("wrong_outputs_len", g_api->TrainStep(session, NULL, 2, (const OrtValue* const*)inputs, 2, two),
               ORT_INVALID_ARGUMENT);
  EXPECT(two[0] == NULL && two[1] == NULL);
  release(inputs, 2);
}

static void null_arguments(OrtTrainingSession* session, OrtCheckpointState* state, OrtAllocator* allocator,
                           OrtEnv* env, OrtSessionOptions* options) {
  OrtCheckpointState* no_state = NULL;
  OrtTrainingSession* no_session = NULL;
  size_t count;
  char* name;
  void* value;
  enum OrtPropertyType type;
  OrtValue* out = NULL;
  OrtTensorTypeAndShapeInfo* info;
  int64_t one = 1;
  const ORTCHAR_T* model = "x.onnx";
  OrtStatus* cases[] = {
      g_api->LoadCheckpoint(NULL, &no_state),
      g_api->LoadCheckpoint("x", NULL),
      g_api->SaveCheckpoint(NULL, "x", false),
      g_api->SaveCheckpoint(state, NULL, false),
      g_api->CreateTrainingSession(NULL, options, state, model, NULL, NULL, &no_session),
      g_api->CreateTrainingSession(env, NULL, state, model, NULL, NULL, &no_session),
      g_api->CreateTrainingSession(env, options, NULL, model, NULL, NULL, &no_session),
      g_api->CreateTrainingSession(env, options, state, NULL, NULL, NULL, &no_session),
      g_api->CreateTrainingSession(env, options, state, model, NULL, NULL, NULL),
      g_api->CreateTrainingSessionFromBuffer(env, options, state, NULL, 0, NULL, 0, NULL, 0, &no_session),
      g_api->TrainingSessionGetTrainingModelOutputCount(NULL, &count),
      g_api->TrainingSessionGetEvalModelOutputCount(session, NULL),
      g_api->TrainingSessionGetTrainingModelOutputName(session, 0, NULL, &name),
      g_api->TrainingSessionGetEvalModelOutputName(session, 0, allocator, NULL),
      g_api->LazyResetGrad(NULL),
      g_api->TrainStep(NULL, NULL, 0, NULL, 0, NULL),
      g_api->TrainStep(session, NULL, 2, NULL, 1, &out),
      g_api->TrainStep(session, NULL, 0, NULL, 1, NULL),
      g_api->EvalStep(NULL, NULL, 0, NULL, 0, NULL),
      g_api->SetLearningRate(NULL, 0.1f),
      g_api->GetLearningRate(session, NULL),
      g_api->OptimizerStep(NULL, NULL),
      g_api->RegisterLinearLRScheduler(NULL, 1, 2, 0.1f),
      g_api->SchedulerStep(NULL),
      g_api->GetParametersSize(session, NULL, true),
      g_api->CopyParametersToBuffer(session, NULL, true),
      g_api->CopyBufferToParameters(NULL, NULL, true),
      g_api->ExportModelForInferencing(session, NULL, 0, NULL),
      g_api->ExportModelForInferencing(session, "x.onnx", 1, NULL),
      g_api->TrainingSessionGetTrainingModelInputCount(NULL, &count),
      g_api->TrainingSessionGetEvalModelInputCount(session, NULL),
      g_api->TrainingSessionGetTrainingModelInputName(NULL, 0, allocator, &name),
      g_api->TrainingSessionGetEvalModelInputName(session, 0, NULL, &name),
      g_api->AddProperty(NULL, "a", OrtIntProperty, &one),
      g_api->AddProperty(state, NULL, OrtIntProperty, &one),
      g_api->AddProperty(state, "a", OrtIntProperty, NULL),
      g_api->GetProperty(state, "epoch", NULL, &type, &value),
      g_api->GetProperty(state, "epoch", allocator, NULL, &value),
      g_api->LoadCheckpointFromBuffer(NULL, 10, &no_state),
      g_api->GetParameterTypeAndShape(state, NULL, &info),
      g_api->UpdateParameter(state, "0.bias", NULL),
      g_api->GetParameter(state, "0.bias", allocator, NULL),
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char label[32];
    snprintf(label, sizeof label, "null_%zu", i);
    expect_error(label, cases[i], ORT_INVALID_ARGUMENT);
  }
  g_api->ReleaseTrainingSession(NULL);
  g_api->ReleaseCheckpointState(NULL);
}

int main(int argc, char** argv) {
  EXPECT(argc == 3);
  const char* dir = argv[1];
  const char* out = argv[2];
  open_apis();
  char ckpt[1024], nominal[1024], train[1024], eval[1024], optim[1024], path[1024];
  snprintf(ckpt, sizeof ckpt, "%s/checkpoint", dir);
  snprintf(nominal, sizeof nominal, "%s/nominal_checkpoint", dir);
  snprintf(train, sizeof train, "%s/training_model.onnx", dir);
  snprintf(eval, sizeof eval, "%s/eval_model.onnx", dir);
  snprintf(optim, sizeof optim, "%s/optimizer_model.onnx", dir);
  for (int i = 0; i < 8 * 20; i++) g_x[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
  for (int i = 0; i < 8; i++) g_y[i] = i % 5;

  OrtEnv* env = NULL;
  OrtSessionOptions* options = NULL;
  OrtAllocator* allocator = NULL;
  CHECK(OTT_ORT(g_ort, CreateEnv)(ORT_LOGGING_LEVEL_WARNING, "api_coverage", &env));
  CHECK(OTT_ORT(g_ort, CreateSessionOptions)(&options));
  CHECK(OTT_ORT(g_ort, GetAllocatorWithDefaultOptions)(&allocator));

  CHECK(g_api->SetSeed(7));
  called("SetSeed");
  OrtCheckpointState* state = NULL;
  CHECK(g_api->LoadCheckpoint(ckpt, &state));
  called("LoadCheckpoint");
  OrtTrainingSession* session = NULL;
  CHECK(g_api->CreateTrainingSession(env, options, state, train, eval, optim, &session));
  called("CreateTrainingSession");
  names_and_counts(session, allocator);

  CHECK(g_api->SetLearningRate(session, 0.05f));
  called("SetLearningRate");
  float lr = 0;
  CHECK(g_api->GetLearningRate(session, &lr));
  EXPECT(fabsf(lr - 0.05f) < 1e-7f);
  called("GetLearningRate");
  CHECK(g_api->RegisterLinearLRScheduler(session, 2, 10, 0.01f));
  called("RegisterLinearLRScheduler");

  OrtValue* inputs[2];
  batch(inputs);
  OrtValue* loss = NULL;
  CHECK(g_api->TrainStep(session, NULL, 2, (const OrtValue* const*)inputs, 1, &loss));
  called("TrainStep");
  float first = *(float*)tensor_data(loss);
  EXPECT(isfinite(first));
  CHECK(g_api->OptimizerStep(session, NULL));
  called("OptimizerStep");
  CHECK(g_api->LazyResetGrad(session));
  called("LazyResetGrad");
  CHECK(g_api->SchedulerStep(session));
  called("SchedulerStep");
  CHECK(g_api->GetLearningRate(session, &lr));
  EXPECT(fabsf(lr - 0.005f) < 1e-7f); /* warmup: step 1 of 2 */
  /* a preallocated output is filled in place; the scheduler's first step ran with learning rate 0 */
  *(float*)tensor_data(loss) = NAN;
  OrtValue* kept = loss;
  CHECK(g_api->TrainStep(session, NULL, 2, (const OrtValue* const*)inputs, 1, &loss));
  EXPECT(loss == kept && *(float*)tensor_data(loss) == first);
  CHECK(g_api->EvalStep(session, NULL, 2, (const OrtValue* const*)inputs, 1, &loss));
  called("EvalStep");
  OTT_ORT(g_ort, ReleaseValue)(loss);
  loss = NULL;

  buffers(session);
  properties(state, allocator);
  parameters(state, allocator);
  bad_inputs(session);

  snprintf(path, sizeof path, "%s/inference.onnx", out);
  const char* outputs[1] = {"logits"};
  CHECK(g_api->ExportModelForInferencing(session, path, 1, outputs));
  called("ExportModelForInferencing");
  expect_error("export_unknown_output", g_api->ExportModelForInferencing(session, path, 1, (const char* const[]){"nope"}),
               ORT_FAIL);
  /* a name that is not UTF-8 (no ONNX name is) is refused, not handed to Python as a list with a hole in it */
  expect_error("export_output_not_utf8",
               g_api->ExportModelForInferencing(session, path, 1, (const char* const[]){"logits\xff"}),
               ORT_INVALID_ARGUMENT);
  /* the exported model runs in ONNX Runtime */
  OrtSession* inference = NULL;
  CHECK(OTT_ORT(g_ort, CreateSession)(env, path, options, &inference));
  const char* input_names[1] = {"input"};
  OrtValue* logits = NULL;
  CHECK(OTT_ORT(g_ort, Run)(inference, NULL, input_names, (const OrtValue* const*)inputs, 1, outputs, 1, &logits));
  EXPECT(tensor_count(logits) == 8 * 5);
  OTT_ORT(g_ort, ReleaseValue)(logits);
  OTT_ORT(g_ort, ReleaseSession)(inference);

  snprintf(path, sizeof path, "%s/checkpoint", out);
  CHECK(g_api->SaveCheckpoint(state, path, true));
  called("SaveCheckpoint");

  /* the saved checkpoint, from a buffer, into a session made from buffers; the properties came along */
  size_t ckpt_size = 0, train_size = 0, eval_size = 0, optim_size = 0;
  void* ckpt_bytes = read_file(path, &ckpt_size);
  void* train_bytes = read_file(train, &train_size);
  void* eval_bytes = read_file(eval, &eval_size);
  void* optim_bytes = read_file(optim, &optim_size);
  OrtCheckpointState* from_buffer = NULL;
  CHECK(g_api->LoadCheckpointFromBuffer(ckpt_bytes, ckpt_size, &from_buffer));
  called("LoadCheckpointFromBuffer");
  free(ckpt_bytes);
  enum OrtPropertyType type;
  void* value = NULL;
  CHECK(g_api->GetProperty(from_buffer, "epoch", allocator, &type, &value));
  EXPECT(type == OrtIntProperty && *(int64_t*)value == 7);
  CHECK(OTT_ORT(g_ort, AllocatorFree)(allocator, value));
  OrtTrainingSession* buffered = NULL;
  CHECK(g_api->CreateTrainingSessionFromBuffer(env, options, from_buffer, train_bytes, train_size, eval_bytes,
                                               eval_size, optim_bytes, optim_size, &buffered));
  called("CreateTrainingSessionFromBuffer");
  CHECK(g_api->TrainStep(buffered, NULL, 2, (const OrtValue* const*)inputs, 1, &loss));
  OTT_ORT(g_ort, ReleaseValue)(loss);
  loss = NULL;

  /* no eval model: EvalStep answers a status */
  OrtTrainingSession* no_eval = NULL;
  CHECK(g_api->CreateTrainingSessionFromBuffer(env, options, from_buffer, train_bytes, train_size, NULL, 0,
                                               optim_bytes, optim_size, &no_eval));
  expect_error("missing_eval_model", g_api->EvalStep(no_eval, NULL, 2, (const OrtValue* const*)inputs, 1, &loss),
               ORT_FAIL);
  g_api->ReleaseTrainingSession(no_eval);
  g_api->ReleaseTrainingSession(buffered);
  free(train_bytes);
  free(eval_bytes);
  free(optim_bytes);

  /* a nominal checkpoint is completed by CopyBufferToParameters with the full parameters */
  OrtCheckpointState* nominal_state = NULL;
  CHECK(g_api->LoadCheckpoint(nominal, &nominal_state));
  OrtTrainingSession* nominal_session = NULL;
  CHECK(g_api->CreateTrainingSession(env, options, nominal_state, train, eval, optim, &nominal_session));
  expect_error("nominal_train_step",
               g_api->TrainStep(nominal_session, NULL, 2, (const OrtValue* const*)inputs, 1, &loss), ORT_FAIL);
  OrtValue* full = new_float_buffer(837);
  CHECK(g_api->CopyParametersToBuffer(session, full, false));
  CHECK(g_api->CopyBufferToParameters(nominal_session, full, false));
  CHECK(g_api->TrainStep(nominal_session, NULL, 2, (const OrtValue* const*)inputs, 1, &loss));
  OTT_ORT(g_ort, ReleaseValue)(loss);
  loss = NULL;
  OTT_ORT(g_ort, ReleaseValue)(full);
  g_api->ReleaseTrainingSession(nominal_session);
  g_api->ReleaseCheckpointState(nominal_state);

  /* corrupted and missing checkpoints */
  snprintf(path, sizeof path, "%s/corrupted", out);
  write_file(path, "not a checkpoint at all, just bytes", 35);
  OrtCheckpointState* bad = NULL;
  expect_error("corrupted_checkpoint", g_api->LoadCheckpoint(path, &bad), ORT_FAIL);
  expect_error("corrupted_checkpoint_buffer", g_api->LoadCheckpointFromBuffer("garbage!", 8, &bad), ORT_FAIL);
  expect_error("buffer_num_bytes_over_ssize", g_api->LoadCheckpointFromBuffer("garbage!", (size_t)1 << 63, &bad),
               ORT_INVALID_ARGUMENT);
  snprintf(path, sizeof path, "%s/missing/checkpoint", out);
  expect_error("missing_checkpoint", g_api->LoadCheckpoint(path, &bad), ORT_NO_SUCHFILE);
  expect_error("missing_model", g_api->CreateTrainingSession(env, options, state, "missing.onnx", NULL, NULL, &no_eval),
               ORT_NO_SUCHFILE);

  null_arguments(session, state, allocator, env, options);
  release(inputs, 2);
  g_api->ReleaseTrainingSession(session);
  called("ReleaseTrainingSession");
  g_api->ReleaseCheckpointState(from_buffer);
  g_api->ReleaseCheckpointState(state);
  called("ReleaseCheckpointState");
  OTT_ORT(g_ort, ReleaseMemoryInfo)(g_cpu);
  OTT_ORT(g_ort, ReleaseSessionOptions)(options);
  OTT_ORT(g_ort, ReleaseEnv)(env);
  printf("done\n");
  return 0;
}
