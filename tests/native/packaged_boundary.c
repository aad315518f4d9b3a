/* Every entry point of the packaged runtime (libort_torch_train_packaged), with NULLs, handles in the wrong state and
 * bad sizes, released, foreign and unknown handles of every kind (packaged_handles.h), then a short training run, an
 * export and its inference, everything released. Under valgrind
 * (bench/experiments/packaged_leaks.py) and under AddressSanitizer and UBSan (bench/experiments/sanitized_native.py)
 * it finds leaks, invalid accesses and undefined behaviour; tests/integration/test_packaged_boundary.py runs it
 * without.
 *   ORT_TORCH_TRAIN_PACKAGE=PACKAGE_DIR packaged_boundary PACKAGE_DIR CHECKPOINT OUT_DIR EXPORT_OUTPUT ARTIFACTS_DIR
 * The package is the mlp fixture's (input [batch, 20] float, labels [batch] int64), built from ARTIFACTS_DIR. Prints "called NAME" once for
 * each training-table member it called, "bad: N" (the bad calls that came back as statuses) and "done". */
#include <stdint.h>

#include "packaged_handles.h"
#include "packaged_shared_state.h"

#define BATCH 4

static void called(const char* name) { printf("called %s\n", name); }

/* CreateTrainingSessionFromBuffer over the artifacts' bytes ($ORT_TORCH_TRAIN_PACKAGE's package): another model in
 * a role is refused, the package's own open a session. */
static void from_buffers(OrtEnv* env, OrtSessionOptions* options, OrtCheckpointState* state, const char* artifacts) {
  const char* files[3] = {"training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"};
  void* models[3];
  size_t sizes[3];
  char path[1024];
  for (int i = 0; i < 3; i++) {
    snprintf(path, sizeof path, "%s/%s", artifacts, files[i]);
    models[i] = read_file(path, &sizes[i]);
  }
  OrtTrainingSession* session = NULL;
  refused(g_api->CreateTrainingSessionFromBuffer(env, options, state, models[0], sizes[0], models[0], sizes[0], NULL, 0,
                                                 &session), "CTSFB(training model as the eval model)");
  CHECK(g_api->CreateTrainingSessionFromBuffer(env, options, state, models[0], sizes[0], models[1], sizes[1], models[2],
                                               sizes[2], &session));
  g_api->ReleaseTrainingSession(session);
  for (int i = 0; i < 3; i++) free(models[i]);
}

static OrtTrainingSession* bad_sessions(OrtEnv* env, OrtSessionOptions* options, OrtCheckpointState* state,
                                        const char* package, const char* artifacts) {
  OrtTrainingSession* session = NULL;
  refused(g_api->CreateTrainingSession(NULL, options, state, package, NULL, NULL, &session), "CTS(NULL env)");
  refused(g_api->CreateTrainingSession(env, NULL, state, package, NULL, NULL, &session), "CTS(NULL options)");
  refused(g_api->CreateTrainingSession(env, options, NULL, package, NULL, NULL, &session), "CTS(NULL state)");
  refused(g_api->CreateTrainingSession(env, options, state, NULL, NULL, NULL, &session), "CTS(NULL path)");
  refused(g_api->CreateTrainingSession(env, options, state, package, NULL, NULL, NULL), "CTS(NULL out)");
  refused(g_api->CreateTrainingSession(env, options, state, package, "/elsewhere", NULL, &session), "CTS(eval)");
  refused(g_api->CreateTrainingSession(env, options, state, "/nonexistent/training_model.onnx", NULL, NULL, &session),
          "CTS(no package)");
  const char model[16] = "not a model";
  refused(g_api->CreateTrainingSessionFromBuffer(env, options, state, NULL, 0, NULL, 0, NULL, 0, &session), "CTSFB(NULL)");
  refused(g_api->CreateTrainingSessionFromBuffer(env, options, state, model, sizeof model, model, 0, NULL, 0, &session),
          "CTSFB(size 0)");
  refused(g_api->CreateTrainingSessionFromBuffer(env, options, state, model, sizeof model, NULL, 4, NULL, 0, &session),
          "CTSFB(NULL with size)");
  refused(g_api->CreateTrainingSessionFromBuffer(env, options, state, model, sizeof model, NULL, 0, NULL, 0, &session),
          "CTSFB(other model)");
  from_buffers(env, options, state, artifacts);
  called("CreateTrainingSessionFromBuffer");
  CHECK(g_api->CreateTrainingSession(env, options, state, package, NULL, package, &session));
  called("CreateTrainingSession");
  return session;
}

static void bad_steps(OrtTrainingSession* session, OrtValue** inputs, OrtValue* wrong) {
  OrtValue* out = NULL;
  const OrtValue* swapped[2] = {inputs[1], inputs[0]};
  const OrtValue* nulls[2] = {NULL, NULL};
  refused(g_api->TrainStep(NULL, NULL, 2, (const OrtValue* const*)inputs, 1, &out), "TrainStep(NULL)");
  refused(g_api->TrainStep(session, NULL, 2, NULL, 1, &out), "TrainStep(NULL inputs)");
  refused(g_api->TrainStep(session, NULL, 2, nulls, 1, &out), "TrainStep(NULL input)");
  refused(g_api->TrainStep(session, NULL, 2, swapped, 1, &out), "TrainStep(swapped)");
  refused(g_api->TrainStep(session, NULL, 1, (const OrtValue* const*)inputs, 1, &out), "TrainStep(1 input)");
  refused(g_api->TrainStep(session, NULL, 2, (const OrtValue* const*)inputs, 5, &out), "TrainStep(5 outputs)");
  refused(g_api->TrainStep(session, NULL, 2, (const OrtValue* const*)inputs, 1, NULL), "TrainStep(NULL outputs)");
  refused(g_api->EvalStep(NULL, NULL, 2, (const OrtValue* const*)inputs, 1, &out), "EvalStep(NULL)");
  refused(g_api->EvalStep(session, NULL, 2, swapped, 1, &out), "EvalStep(swapped)");
  refused(g_api->EvalStep(session, NULL, 2, (const OrtValue* const*)inputs, 0, &out), "EvalStep(0 outputs)");
  refused(g_api->SetLearningRate(NULL, 0.1f), "SetLearningRate(NULL)");
  refused(g_api->SetLearningRate(session, -1.0f), "SetLearningRate(-1)");
  refused(g_api->GetLearningRate(session, NULL), "GetLearningRate(NULL)");
  refused(g_api->OptimizerStep(NULL, NULL), "OptimizerStep(NULL)");
  refused(g_api->SchedulerStep(session), "SchedulerStep(none registered)");
  refused(g_api->RegisterLinearLRScheduler(session, 5, 2, 0.1f), "RegisterLinearLRScheduler(warmup > total)");
  refused(g_api->RegisterLinearLRScheduler(NULL, 1, 2, 0.1f), "RegisterLinearLRScheduler(NULL)");
  refused(g_api->LazyResetGrad(NULL), "LazyResetGrad(NULL)");
  refused(g_api->GetParametersSize(session, NULL, true), "GetParametersSize(NULL)");
  refused(g_api->GetParametersSize(NULL, NULL, true), "GetParametersSize(NULL session)");
  refused(g_api->CopyParametersToBuffer(session, wrong, false), "CopyParametersToBuffer(size)");
  refused(g_api->CopyParametersToBuffer(session, NULL, false), "CopyParametersToBuffer(NULL)");
  refused(g_api->CopyBufferToParameters(session, wrong, true), "CopyBufferToParameters(size)");
  refused(g_api->CopyBufferToParameters(NULL, wrong, true), "CopyBufferToParameters(NULL)");
  const char* unprepared[1] = {"no_such_output"};
  const char* holes[1] = {NULL};
  refused(g_api->ExportModelForInferencing(session, "x.onnx", 1, unprepared), "Export(unprepared)");
  refused(g_api->ExportModelForInferencing(session, "x.onnx", 1, holes), "Export(NULL name)");
  refused(g_api->ExportModelForInferencing(session, "x.onnx", 1, NULL), "Export(NULL names)");
  refused(g_api->ExportModelForInferencing(session, "x.onnx", 0, NULL), "Export(0 names)");
  refused(g_api->ExportModelForInferencing(NULL, "x.onnx", 1, unprepared), "Export(NULL session)");
  refused(g_api->ExportModelForInferencing(session, NULL, 1, unprepared), "Export(NULL path)");
}

static void bad_names(OrtTrainingSession* session, OrtCheckpointState* state, OrtValue* wrong) {
  OrtAllocator* allocator = NULL;
  CHECK(OTT_ORT(g_ort, GetAllocatorWithDefaultOptions)(&allocator));
  char* name = NULL;
  size_t count = 0;
  OrtValue* value = NULL;
  enum OrtPropertyType type;
  void* property = NULL;
  OrtTensorTypeAndShapeInfo* info = NULL;
  refused(g_api->TrainingSessionGetTrainingModelOutputCount(NULL, &count), "TrainOutputCount(NULL)");
  refused(g_api->TrainingSessionGetEvalModelOutputCount(session, NULL), "EvalOutputCount(NULL)");
  refused(g_api->TrainingSessionGetTrainingModelInputCount(session, NULL), "TrainInputCount(NULL)");
  refused(g_api->TrainingSessionGetEvalModelInputCount(NULL, &count), "EvalInputCount(NULL)");
  refused(g_api->TrainingSessionGetTrainingModelOutputName(session, 9, allocator, &name), "TrainOutputName(9)");
  refused(g_api->TrainingSessionGetEvalModelOutputName(session, 0, NULL, &name), "EvalOutputName(NULL)");
  refused(g_api->TrainingSessionGetTrainingModelInputName(session, (size_t)-1, allocator, &name), "TrainInputName(max)");
  refused(g_api->TrainingSessionGetEvalModelInputName(session, 0, allocator, NULL), "EvalInputName(NULL)");
  refused(g_api->AddProperty(NULL, "a", OrtIntProperty, &count), "AddProperty(NULL)");
  refused(g_api->AddProperty(state, "a", (enum OrtPropertyType)7, &count), "AddProperty(type 7)");
  refused(g_api->AddProperty(state, NULL, OrtIntProperty, &count), "AddProperty(NULL name)");
  refused(g_api->GetProperty(state, "no such", allocator, &type, &property), "GetProperty(no such)");
  refused(g_api->GetProperty(state, "epoch", NULL, &type, &property), "GetProperty(NULL allocator)");
  refused(g_api->GetParameterTypeAndShape(state, "no such", &info), "GetParameterTypeAndShape(no such)");
  refused(g_api->GetParameterTypeAndShape(NULL, "0.weight", &info), "GetParameterTypeAndShape(NULL)");
  refused(g_api->UpdateParameter(state, "0.weight", wrong), "UpdateParameter(shape)");
  refused(g_api->UpdateParameter(state, "0.weight", NULL), "UpdateParameter(NULL)");
  refused(g_api->GetParameter(state, "no such", allocator, &value), "GetParameter(no such)");
  refused(g_api->GetParameter(state, "0.weight", allocator, NULL), "GetParameter(NULL)");
  refused(g_api->SaveCheckpoint(NULL, "x", true), "SaveCheckpoint(NULL)");
  refused(g_api->SaveCheckpoint(state, "/nonexistent/dir/checkpoint", true), "SaveCheckpoint(no folder)");
}

static void bad_core(OrtEnv* env, OrtSessionOptions* options, const char* checkpoint) {
  float data[4] = {0};
  int64_t dims[2] = {2, 4}, negative[1] = {-1};
  OrtValue* value = NULL;
  OrtSession* inference = NULL;
  refused(OTT_ORT(g_ort, CreateTensorWithDataAsOrtValue)(g_cpu, data, sizeof data, dims, 2,
                                                         ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &value), "tensor(short)");
  refused(OTT_ORT(g_ort, CreateTensorWithDataAsOrtValue)(g_cpu, data, sizeof data, negative, 1,
                                                         ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &value), "tensor(-1)");
  refused(OTT_ORT(g_ort, CreateTensorWithDataAsOrtValue)(g_cpu, data, sizeof data, dims, 1,
                                                         (ONNXTensorElementDataType)99, &value), "tensor(type 99)");
  refused(OTT_ORT(g_ort, CreateTensorAsOrtValue)(NULL, dims, 2, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &value), "alloc");
  OrtAllocator* allocator = NULL;
  CHECK(OTT_ORT(g_ort, GetAllocatorWithDefaultOptions)(&allocator));
  refused(OTT_ORT(g_ort, CreateTensorAsOrtValue)(allocator, dims, 2, (ONNXTensorElementDataType)99, &value),
          "alloc(type 99)");
  refused(OTT_ORT(g_ort, GetTensorMutableData)(NULL, NULL), "GetTensorMutableData(NULL)");
  refused(OTT_ORT(g_ort, CreateSession)(env, NULL, options, &inference), "CreateSession(NULL)");
  refused(OTT_ORT(g_ort, CreateSession)(env, checkpoint, options, &inference), "CreateSession(not exported)");
  refused(OTT_ORT(g_ort, Run)(NULL, NULL, NULL, NULL, 0, NULL, 0, NULL), "Run(NULL)");
  refused(g_api->LoadCheckpoint(NULL, NULL), "LoadCheckpoint(NULL)");
  OrtCheckpointState* state = NULL;
  refused(g_api->LoadCheckpoint("/nonexistent", &state), "LoadCheckpoint(no file)");
  const char garbage[64] = "not a checkpoint";
  refused(g_api->LoadCheckpointFromBuffer(garbage, sizeof garbage, &state), "LoadCheckpointFromBuffer(garbage)");
  refused(g_api->LoadCheckpointFromBuffer(NULL, 4, &state), "LoadCheckpointFromBuffer(NULL)");
}

/* The position of the first optimizer group's step in an ODTC checkpoint's bytes (FlatBuffers: the root table's
 * field 2, optimizer_groups; the group's field 1, step), as SaveCheckpoint writes it with the optimizer state. */
static size_t follow(const unsigned char* bytes, size_t at) {
  uint32_t offset;
  memcpy(&offset, bytes + at, 4);
  return at + offset;
}
static size_t field(const unsigned char* bytes, size_t table, int slot) {
  int32_t back;
  uint16_t size, offset = 0;
  memcpy(&back, bytes + table, 4);
  size_t vtable = (size_t)((int64_t)table - back);
  memcpy(&size, bytes + vtable, 2);
  if (4 + 2 * (size_t)slot + 2 <= size) memcpy(&offset, bytes + vtable + 4 + 2 * (size_t)slot, 2);
  return offset ? table + offset : 0;
}
static size_t group_step(const unsigned char* bytes) {
  size_t groups = field(bytes, follow(bytes, 0), 2);
  EXPECT(groups != 0);
  size_t step = field(bytes, follow(bytes, follow(bytes, groups) + 4), 1);
  EXPECT(step != 0);
  return step;
}

/* A checkpoint whose optimizer has counted INT64_MAX steps: OptimizerStep refuses to count past it (a status, not a
 * signed overflow feeding the bias corrections). */
static void step_count_at_its_largest(OrtEnv* env, OrtSessionOptions* options, const char* package, const char* saved) {
  size_t size = 0;
  unsigned char* bytes = read_file(saved, &size);
  const int64_t largest = INT64_MAX;
  memcpy(bytes + group_step(bytes), &largest, sizeof largest);
  OrtCheckpointState* state = NULL;
  CHECK(g_api->LoadCheckpointFromBuffer(bytes, size, &state));
  free(bytes);
  OrtTrainingSession* session = NULL;
  CHECK(g_api->CreateTrainingSession(env, options, state, package, NULL, NULL, &session));
  refused(g_api->OptimizerStep(session, NULL), "OptimizerStep(step count at INT64_MAX)");
  g_api->ReleaseTrainingSession(session);
  g_api->ReleaseCheckpointState(state);
}

/* A saved checkpoint cut at every length, then with each byte inverted in turn, each in a heap block of its exact
 * size (so that AddressSanitizer sees a read past it: bench/experiments/sanitized_native.py), from a buffer: one cut
 * by more than its final alignment padding (FlatBuffers aligns to 8 at most) is refused with a status; an inverted
 * byte gives a status or a state (in tensor data it is still a checkpoint), never a crash. Prints "damaged
 * checkpoints: REFUSED of TRIED refused". */
static void damaged_checkpoints(const char* saved) {
  size_t size = 0;
  unsigned char* bytes = read_file(saved, &size);
  size_t tried = 0, refused_count = 0;
  for (size_t cut = 0; cut <= 2 * size; cut++) {
    size_t length = cut < size ? cut : size;
    unsigned char* copy = (unsigned char*)malloc(length ? length : 1);
    memcpy(copy, bytes, length);
    if (cut > size) copy[cut - size - 1] ^= 0xff;
    if (cut == size) { /* the whole checkpoint, unchanged: not a damaged one */
      free(copy);
      continue;
    }
    OrtCheckpointState* state = NULL;
    OrtStatus* status = g_api->LoadCheckpointFromBuffer(copy, length, &state);
    tried++;
    if (status != NULL) {
      refused_count++;
      OTT_ORT(g_ort, ReleaseStatus)(status);
    } else {
      EXPECT(cut > size || cut + 8 > size); /* cut short of more than its final alignment padding: never whole */
      g_api->ReleaseCheckpointState(state);
    }
    free(copy);
  }
  free(bytes);
  printf("damaged checkpoints: %zu of %zu refused\n", refused_count, tried);
}

/* Runs the exported model in the runtime, with bad calls first, and bad handles where its session is expected. */
static void infer(OrtEnv* env, OrtSessionOptions* options, OrtTrainingSession* training, const char* model, OrtValue* x,
                  const char* output) {
  OrtSession* inference = NULL;
  CHECK(OTT_ORT(g_ort, CreateSession)(env, model, options, &inference));
  const char* names[1] = {"input"};
  const char* wrong_names[1] = {"no_such_input"};
  const char* outputs[1] = {output};
  const char* wrong_outputs[1] = {"no_such_output"};
  const OrtValue* inputs[1] = {x};
  OrtValue* result = NULL;
  refused(OTT_ORT(g_ort, Run)(inference, NULL, wrong_names, inputs, 1, outputs, 1, &result), "Run(input name)");
  refused(OTT_ORT(g_ort, Run)(inference, NULL, names, inputs, 2, outputs, 1, &result), "Run(2 inputs)");
  refused(OTT_ORT(g_ort, Run)(inference, NULL, names, inputs, 1, wrong_outputs, 1, &result), "Run(output name)");
  refused(OTT_ORT(g_ort, Run)(inference, NULL, names, inputs, 1, outputs, 1, NULL), "Run(NULL outputs)");
  CHECK(OTT_ORT(g_ort, Run)(inference, NULL, names, inputs, 1, outputs, 1, &result));
  EXPECT(tensor_count(result) == BATCH * 5);
  CHECK(OTT_ORT(g_ort, Run)(inference, NULL, names, inputs, 1, outputs, 1, &result)); /* filled in place */
  OTT_ORT(g_ort, ReleaseValue)(result);
  OTT_ORT(g_ort, ReleaseSession)(inference);
  bad_inference_handles(inference, training, names, inputs, outputs);
}

int main(int argc, char** argv) {
  EXPECT(argc == 6);
  const char *package = argv[1], *out = argv[3];
  open_apis();
  OrtEnv* env = NULL;
  OrtSessionOptions* options = NULL;
  CHECK(OTT_ORT(g_ort, CreateEnv)(ORT_LOGGING_LEVEL_WARNING, "packaged_boundary", &env));
  CHECK(OTT_ORT(g_ort, CreateSessionOptions)(&options));
  CHECK(OTT_ORT(g_ort, CreateCpuMemoryInfo)(OrtArenaAllocator, OrtMemTypeDefault, &g_cpu));
  size_t size = 0;
  void* bytes = read_file(argv[2], &size);
  OrtCheckpointState* state = NULL;
  CHECK(g_api->LoadCheckpointFromBuffer(bytes, size, &state));
  g_api->ReleaseCheckpointState(state);
  free(bytes);
  called("LoadCheckpointFromBuffer");
  CHECK(g_api->LoadCheckpoint(argv[2], &state));
  called("LoadCheckpoint");
  OrtTrainingSession* session = bad_sessions(env, options, state, package, argv[5]);

  static float x[BATCH * 20];
  static int64_t y[BATCH];
  for (int i = 0; i < BATCH * 20; i++) x[i] = (float)(i % 7) / 7.0f - 0.5f;
  for (int i = 0; i < BATCH; i++) y[i] = i % 5;
  const int64_t x_dims[2] = {BATCH, 20}, y_dims[1] = {BATCH}, wrong_dims[1] = {3};
  OrtValue* inputs[2] = {tensor_over(x, sizeof x, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, x_dims, 2),
                         tensor_over(y, sizeof y, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, y_dims, 1)};
  OrtValue* wrong = tensor_over(x, 3 * sizeof(float), ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, wrong_dims, 1);
  bad_steps(session, inputs, wrong);
  bad_names(session, state, wrong);
  bad_core(env, options, argv[2]);
  bad_handles(env, options, state, session, package, argv[2], inputs);
  handles_from_threads(session);
  shared_state(env, options, package, argv[2], inputs);

  CHECK(g_api->RegisterLinearLRScheduler(session, 1, 4, 0.01f));
  for (int step = 0; step < 2; step++) {
    OrtValue* loss = NULL;
    CHECK(g_api->TrainStep(session, NULL, 2, (const OrtValue* const*)inputs, 1, &loss));
    CHECK(g_api->TrainStep(session, NULL, 2, (const OrtValue* const*)inputs, 1, &loss)); /* the slot replaced */
    OTT_ORT(g_ort, ReleaseValue)(loss);
    CHECK(g_api->OptimizerStep(session, NULL));
    CHECK(g_api->SchedulerStep(session));
    CHECK(g_api->LazyResetGrad(session));
  }
  float rate = 0;
  CHECK(g_api->GetLearningRate(session, &rate));
  CHECK(g_api->SetLearningRate(session, rate));
  OrtValue* eval_loss = NULL;
  CHECK(g_api->EvalStep(session, NULL, 2, (const OrtValue* const*)inputs, 1, &eval_loss));
  OTT_ORT(g_ort, ReleaseValue)(eval_loss);
  const char* members[] = {"RegisterLinearLRScheduler", "TrainStep", "OptimizerStep", "SchedulerStep", "LazyResetGrad",
                           "GetLearningRate", "SetLearningRate", "EvalStep"};
  for (size_t i = 0; i < sizeof members / sizeof *members; i++) called(members[i]);

  OrtAllocator* allocator = NULL;
  CHECK(OTT_ORT(g_ort, GetAllocatorWithDefaultOptions)(&allocator));
  size_t counts[4];
  char* name = NULL;
  CHECK(g_api->TrainingSessionGetTrainingModelOutputCount(session, &counts[0]));
  CHECK(g_api->TrainingSessionGetEvalModelOutputCount(session, &counts[1]));
  CHECK(g_api->TrainingSessionGetTrainingModelInputCount(session, &counts[2]));
  CHECK(g_api->TrainingSessionGetEvalModelInputCount(session, &counts[3]));
  CHECK(g_api->TrainingSessionGetTrainingModelOutputName(session, 0, allocator, &name));
  CHECK(OTT_ORT(g_ort, AllocatorFree)(allocator, name));
  CHECK(g_api->TrainingSessionGetEvalModelOutputName(session, 0, allocator, &name));
  CHECK(OTT_ORT(g_ort, AllocatorFree)(allocator, name));
  CHECK(g_api->TrainingSessionGetTrainingModelInputName(session, 1, allocator, &name));
  CHECK(OTT_ORT(g_ort, AllocatorFree)(allocator, name));
  CHECK(g_api->TrainingSessionGetEvalModelInputName(session, 1, allocator, &name));
  CHECK(OTT_ORT(g_ort, AllocatorFree)(allocator, name));
  const char* names[] = {"TrainingSessionGetTrainingModelOutputCount", "TrainingSessionGetEvalModelOutputCount",
                         "TrainingSessionGetTrainingModelInputCount", "TrainingSessionGetEvalModelInputCount",
                         "TrainingSessionGetTrainingModelOutputName", "TrainingSessionGetEvalModelOutputName",
                         "TrainingSessionGetTrainingModelInputName", "TrainingSessionGetEvalModelInputName"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) called(names[i]);

  size_t count = 0;
  CHECK(g_api->GetParametersSize(session, &count, false));
  int64_t buffer_dims[1] = {(int64_t)count};
  OrtValue* buffer = NULL;
  CHECK(OTT_ORT(g_ort, CreateTensorAsOrtValue)(allocator, buffer_dims, 1, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &buffer));
  CHECK(g_api->CopyParametersToBuffer(session, buffer, false));
  CHECK(g_api->CopyBufferToParameters(session, buffer, false));
  OTT_ORT(g_ort, ReleaseValue)(buffer);
  int64_t epoch = 2;
  CHECK(g_api->AddProperty(state, "epoch", OrtIntProperty, &epoch));
  CHECK(g_api->AddProperty(state, "note", OrtStringProperty, (void*)"boundary"));
  enum OrtPropertyType type;
  void* property = NULL;
  CHECK(g_api->GetProperty(state, "note", allocator, &type, &property));
  CHECK(OTT_ORT(g_ort, AllocatorFree)(allocator, property));
  OrtTensorTypeAndShapeInfo* info = NULL;
  CHECK(g_api->GetParameterTypeAndShape(state, "0.bias", &info));
  OTT_ORT(g_ort, ReleaseTensorTypeAndShapeInfo)(info);
  OrtValue* bias = NULL;
  CHECK(g_api->GetParameter(state, "0.bias", allocator, &bias));
  CHECK(g_api->UpdateParameter(state, "0.bias", bias));
  OTT_ORT(g_ort, ReleaseValue)(bias);
  CHECK(g_api->SetSeed(7));
  char path[1024];
  snprintf(path, sizeof path, "%s/checkpoint", out);
  CHECK(g_api->SaveCheckpoint(state, path, true));
  step_count_at_its_largest(env, options, package, path);
  damaged_checkpoints(path);
  snprintf(path, sizeof path, "%s/inference.onnx", out);
  const char* exported[1] = {argv[4]};
  CHECK(g_api->ExportModelForInferencing(session, path, 1, exported));
  infer(env, options, session, path, inputs[0], argv[4]);
  OrtValue* loss = NULL; /* the session trains on after every bad handle */
  CHECK(g_api->TrainStep(session, NULL, 2, (const OrtValue* const*)inputs, 1, &loss));
  OTT_ORT(g_ort, ReleaseValue)(loss);
  CHECK(g_api->OptimizerStep(session, NULL));
  const char* rest[] = {"GetParametersSize", "CopyParametersToBuffer", "CopyBufferToParameters", "AddProperty",
                        "GetProperty", "GetParameterTypeAndShape", "GetParameter", "UpdateParameter", "SetSeed",
                        "SaveCheckpoint", "ExportModelForInferencing", "ReleaseCheckpointState",
                        "ReleaseTrainingSession"};
  for (size_t i = 0; i < sizeof rest / sizeof *rest; i++) called(rest[i]);

  OTT_ORT(g_ort, ReleaseValue)(inputs[0]);
  OTT_ORT(g_ort, ReleaseValue)(inputs[1]);
  OTT_ORT(g_ort, ReleaseValue)(wrong);
  g_api->ReleaseCheckpointState(state); /* before the session: freed with it */
  g_api->ReleaseTrainingSession(session);
  g_api->ReleaseTrainingSession(NULL);
  g_api->ReleaseCheckpointState(NULL);
  OTT_ORT(g_ort, ReleaseMemoryInfo)(g_cpu);
  OTT_ORT(g_ort, ReleaseSessionOptions)(options);
  OTT_ORT(g_ort, ReleaseEnv)(env);
  printf("bad: %d\ndone\n", bad);
  return 0;
}
