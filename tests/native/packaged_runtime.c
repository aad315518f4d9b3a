/* Trains a package through the packaged runtime (libort_torch_train_packaged: libtorch, no Python, no onnxruntime),
 * written against ONNX Runtime's training C API as any ORT program is:
 *   packaged_runtime PACKAGE_DIR CHECKPOINT DATA_DIR OUT_DIR STEPS ACCUMULATED PARAMETER EXPORT_OUTPUTS
 * DATA_DIR/manifest.txt: "train K TYPE RANK DIMS..." and "eval K TYPE RANK DIMS..." per input; inputs are
 * DATA_DIR/train_<step>_<K>.bin and eval_<K>.bin. Each step is TrainStep, then (except the step ACCUMULATED, whose
 * gradients the next step adds to) OptimizerStep, LazyResetGrad and SchedulerStep of a linear schedule
 * (warmup 2, total STEPS + 1, initial 0.01). Prints "libpython mapped: N", the steps' names and PARAMETER's shape
 * (adding the properties epoch = 3 and note = "packaged"), "boundary: ok" once every bad call tried came back as a
 * status; writes OUT_DIR/losses.bin, first_loss_held.bin (the first TrainStep's output, read after the last step),
 * eval.bin, params.bin, checkpoint and inference.onnx (ExportModelForInferencing of EXPORT_OUTPUTS, comma-separated
 * names). */
#include "ott_test_runs.h"

static int libpython_lines(void) {
  FILE* maps = fopen("/proc/self/maps", "r");
  char line[4096];
  int found = 0;
  while (maps != NULL && fgets(line, sizeof line, maps) != NULL) found += strstr(line, "libpython") != NULL;
  if (maps != NULL) fclose(maps);
  return found;
}

/* The call must fail with a status of `code` (never crash). */
static void expect_status(OrtStatus* status, OrtErrorCode code, const char* what) {
  if (status == NULL || OTT_ORT(g_ort, GetErrorCode)(status) != code) {
    fprintf(stderr, "%s: expected status %d, got %s\n", what, (int)code,
            status ? OTT_ORT(g_ort, GetErrorMessage)(status) : "none");
    exit(1);
  }
  OTT_ORT(g_ort, ReleaseStatus)(status);
}

static void bad_calls(OrtEnv* env, OrtSessionOptions* options, OrtCheckpointState* state, OrtTrainingSession* session,
                      OrtValue** inputs, int k) {
  OrtTrainingSession* none = NULL;
  OrtValue* out = NULL;
  OrtCheckpointState* other = NULL;
  expect_status(g_api->TrainStep(NULL, NULL, (size_t)k, (const OrtValue* const*)inputs, 1, &out),
                ORT_INVALID_ARGUMENT, "TrainStep(NULL session)");
  expect_status(g_api->TrainStep(session, NULL, (size_t)k, (const OrtValue* const*)inputs, 3, &out),
                ORT_INVALID_ARGUMENT, "TrainStep(outputs_len 3)");
  expect_status(g_api->TrainStep(session, NULL, (size_t)k, NULL, 1, &out), ORT_INVALID_ARGUMENT, "TrainStep(NULL inputs)");
  expect_status(g_api->TrainStep(session, NULL, 1, (const OrtValue* const*)inputs, 1, &out), ORT_INVALID_ARGUMENT,
                "TrainStep(one input)");
  const OrtValue* swapped[2] = {inputs[1], inputs[0]};
  expect_status(g_api->TrainStep(session, NULL, 2, swapped, 1, &out), ORT_INVALID_ARGUMENT, "TrainStep(swapped)");
  expect_status(g_api->CreateTrainingSession(env, options, state, "/nonexistent", NULL, NULL, &none), ORT_NO_SUCHFILE,
                "CreateTrainingSession(no package)");
  expect_status(g_api->CreateTrainingSession(env, options, NULL, "/nonexistent", NULL, NULL, &none),
                ORT_INVALID_ARGUMENT, "CreateTrainingSession(NULL state)");
  expect_status(g_api->LoadCheckpoint("/nonexistent", &other), ORT_NO_SUCHFILE, "LoadCheckpoint(no file)");
  const char garbage[64] = "not a checkpoint at all";
  expect_status(g_api->LoadCheckpointFromBuffer(garbage, sizeof garbage, &other), ORT_INVALID_ARGUMENT,
                "LoadCheckpointFromBuffer(garbage)");
  expect_status(g_api->GetLearningRate(session, NULL), ORT_INVALID_ARGUMENT, "GetLearningRate(NULL)");
  expect_status(g_api->SetLearningRate(session, -1.0f), ORT_INVALID_ARGUMENT, "SetLearningRate(-1)");
  expect_status(g_api->CopyParametersToBuffer(session, inputs[0], false), ORT_INVALID_ARGUMENT,
                "CopyParametersToBuffer(wrong size)");
  expect_status(g_api->ExportModelForInferencing(session, "x.onnx", 0, NULL), ORT_INVALID_ARGUMENT, "Export(none)");
  const char* unprepared[1] = {"no_such_output"};
  expect_status(g_api->ExportModelForInferencing(session, "x.onnx", 1, unprepared), ORT_INVALID_ARGUMENT,
                "Export(unprepared)");
  expect_status(g_api->ExportModelForInferencing(session, NULL, 1, unprepared), ORT_INVALID_ARGUMENT, "Export(NULL)");
  OrtAllocator* allocator = NULL;
  char* name = NULL;
  CHECK(OTT_ORT(g_ort, GetAllocatorWithDefaultOptions)(&allocator));
  expect_status(g_api->TrainingSessionGetTrainingModelInputName(session, (size_t)k, allocator, &name), ORT_INVALID_ARGUMENT,
                "TrainingModelInputName(past the last)");
  expect_status(g_api->UpdateParameter(state, "0.weight", inputs[1]), ORT_INVALID_ARGUMENT, "UpdateParameter(shape)");
  expect_status(g_api->GetParameter(state, "no such", allocator, &out), ORT_INVALID_ARGUMENT, "GetParameter(name)");
  expect_status(g_api->GetProperty(state, "no such", allocator, NULL, NULL), ORT_INVALID_ARGUMENT, "GetProperty");
  printf("boundary: ok\n");
}

/* Prints the steps' input and output names and the shape of `parameter`; gives the state two properties and sets
 * `parameter` to its own value (GetParameter, UpdateParameter). */
static void describe(OrtTrainingSession* session, OrtCheckpointState* state, const char* parameter) {
  OrtAllocator* allocator = NULL;
  CHECK(OTT_ORT(g_ort, GetAllocatorWithDefaultOptions)(&allocator));
  size_t counts[4];
  CHECK(g_api->TrainingSessionGetTrainingModelInputCount(session, &counts[0]));
  CHECK(g_api->TrainingSessionGetTrainingModelOutputCount(session, &counts[1]));
  CHECK(g_api->TrainingSessionGetEvalModelInputCount(session, &counts[2]));
  CHECK(g_api->TrainingSessionGetEvalModelOutputCount(session, &counts[3]));
  printf("names:");
  for (int kind = 0; kind < 4; kind++) {
    for (size_t i = 0; i < counts[kind]; i++) {
      char* name = NULL;
      if (kind == 0) CHECK(g_api->TrainingSessionGetTrainingModelInputName(session, i, allocator, &name));
      if (kind == 1) CHECK(g_api->TrainingSessionGetTrainingModelOutputName(session, i, allocator, &name));
      if (kind == 2) CHECK(g_api->TrainingSessionGetEvalModelInputName(session, i, allocator, &name));
      if (kind == 3) CHECK(g_api->TrainingSessionGetEvalModelOutputName(session, i, allocator, &name));
      printf(" %s", name);
      CHECK(OTT_ORT(g_ort, AllocatorFree)(allocator, name));
    }
    printf(kind == 3 ? "\n" : " |");
  }
  OrtTensorTypeAndShapeInfo* info = NULL;
  CHECK(g_api->GetParameterTypeAndShape(state, parameter, &info));
  int64_t dims[8];
  size_t rank = 0;
  CHECK(OTT_ORT(g_ort, GetDimensionsCount)(info, &rank));
  EXPECT(rank <= 8);
  CHECK(OTT_ORT(g_ort, GetDimensions)(info, dims, rank));
  printf("%s:", parameter);
  for (size_t i = 0; i < rank; i++) printf(" %ld", (long)dims[i]);
  printf("\n");
  OTT_ORT(g_ort, ReleaseTensorTypeAndShapeInfo)(info);
  int64_t epoch = 3;
  CHECK(g_api->AddProperty(state, "epoch", OrtIntProperty, &epoch));
  CHECK(g_api->AddProperty(state, "note", OrtStringProperty, (void*)"packaged"));
  enum OrtPropertyType type;
  void* value = NULL;
  CHECK(g_api->GetProperty(state, "epoch", allocator, &type, &value));
  EXPECT(type == OrtIntProperty && *(int64_t*)value == 3);
  CHECK(OTT_ORT(g_ort, AllocatorFree)(allocator, value));
  OrtValue* bias = NULL;
  CHECK(g_api->GetParameter(state, parameter, allocator, &bias));
  CHECK(g_api->UpdateParameter(state, parameter, bias));
  OTT_ORT(g_ort, ReleaseValue)(bias);
}

int main(int argc, char** argv) {
  EXPECT(argc == 9);
  const char *package = argv[1], *data = argv[3], *out = argv[4];
  int steps = atoi(argv[5]), accumulated = atoi(argv[6]);
  open_apis();
  printf("libpython mapped: %d\n", libpython_lines());
  OrtEnv* env = NULL;
  CHECK(OTT_ORT(g_ort, CreateEnv)(ORT_LOGGING_LEVEL_WARNING, "packaged_runtime", &env));
  OrtSessionOptions* options = NULL;
  CHECK(OTT_ORT(g_ort, CreateSessionOptions)(&options));
  OrtCheckpointState* state = NULL;
  CHECK(g_api->LoadCheckpoint(argv[2], &state));
  OrtTrainingSession* session = NULL;
  CHECK(g_api->CreateTrainingSession(env, options, state, package, NULL, package, &session));
  CHECK(g_api->RegisterLinearLRScheduler(session, 2, steps + 1, 0.01f));
  describe(session, state, argv[7]);
  Input inputs[16];
  int n = read_manifest(data, inputs, NULL, NULL);
  char path[1024];
  snprintf(path, sizeof path, "%s/losses.bin", out);
  FILE* losses = fopen(path, "wb");
  EXPECT(losses != NULL);
  OrtValue* first_loss = NULL; /* the first TrainStep's output, held by this program until every step ran */
  for (int step = 0; step < steps; step++) {
    OrtValue* values[16];
    void* buffers[16];
    int k = load_inputs(data, inputs, n, "train", step, values, buffers);
    if (step == 0) bad_calls(env, options, state, session, values, k);
    OrtValue* loss = NULL;
    CHECK(g_api->TrainStep(session, NULL, (size_t)k, (const OrtValue* const*)values, 1, &loss));
    fwrite(tensor_data(loss), sizeof(float), tensor_count(loss), losses);
    if (step == 0)
      first_loss = loss; /* the caller's: read again after the last step */
    else
      OTT_ORT(g_ort, ReleaseValue)(loss);
    if (step != accumulated) {
      CHECK(g_api->OptimizerStep(session, NULL));
      CHECK(g_api->LazyResetGrad(session));
      CHECK(g_api->SchedulerStep(session));
    }
    release_inputs(values, buffers, k);
  }
  fclose(losses);
  snprintf(path, sizeof path, "%s/first_loss_held.bin", out);
  FILE* held = fopen(path, "wb");
  EXPECT(held != NULL && first_loss != NULL);
  fwrite(tensor_data(first_loss), sizeof(float), tensor_count(first_loss), held);
  fclose(held);
  OTT_ORT(g_ort, ReleaseValue)(first_loss);

  write_eval_loss(session, data, inputs, n, out);
  OrtValue* params = write_parameters(session, out);
  CHECK(g_api->CopyBufferToParameters(session, params, false)); /* the same values back: the checkpoint is unchanged */
  OTT_ORT(g_ort, ReleaseValue)(params);

  snprintf(path, sizeof path, "%s/checkpoint", out);
  CHECK(g_api->SaveCheckpoint(state, path, true));
  char names[1024];
  const char* outputs[16];
  size_t count = 0;
  snprintf(names, sizeof names, "%s", argv[8]);
  for (char* name = strtok(names, ","); name != NULL && count < 16; name = strtok(NULL, ",")) outputs[count++] = name;
  snprintf(path, sizeof path, "%s/inference.onnx", out);
  CHECK(g_api->ExportModelForInferencing(session, path, count, outputs));
  g_api->ReleaseCheckpointState(state); /* before the session: freed with it */
  g_api->ReleaseTrainingSession(session);
  OTT_ORT(g_ort, ReleaseSessionOptions)(options);
  OTT_ORT(g_ort, ReleaseMemoryInfo)(g_cpu);
  OTT_ORT(g_ort, ReleaseEnv)(env);
  printf("done\n");
  return 0;
}
