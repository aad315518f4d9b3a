/* Trains fixtures through the C API and writes what the Python API is compared with:
 *   train_parity JOB...   JOB = artifacts_dir:data_dir:out_dir:steps:compile[:models_dir:extension:buffers]
 * The checkpoint comes from artifacts_dir; the three models from models_dir (default artifacts_dir), named
 * <role>_model.<extension> (default onnx), from their paths or, when buffers is 1, from their bytes
 * (CreateTrainingSessionFromBuffer).
 * data_dir/manifest.txt: "train K TYPE RANK DIMS..." and "eval K TYPE RANK DIMS..." per input, "export NAME";
 * inputs are data_dir/train_<step>_<K>.bin and eval_<K>.bin. Writes out_dir/losses.bin, eval.bin, params.bin,
 * checkpoint, inference.onnx. */
#include "ott_test_runs.h"

static void run_job(char* job, OrtEnv* env) {
  char* artifacts = strtok(job, ":");
  char* data = strtok(NULL, ":");
  char* out = strtok(NULL, ":");
  int steps = atoi(strtok(NULL, ":"));
  int compile = atoi(strtok(NULL, ":"));
  char* models = strtok(NULL, ":");
  char* extension = models != NULL ? strtok(NULL, ":") : NULL;
  char* buffers_flag = extension != NULL ? strtok(NULL, ":") : NULL;
  int from_buffers = buffers_flag != NULL && atoi(buffers_flag) == 1;
  if (models == NULL || extension == NULL) {
    models = artifacts;
    extension = "onnx";
  }
  char path[1024], train[1024], eval[1024], optim[1024];
  Input inputs[16];
  char exports[8][64];
  int n_exports = 0;
  int n = read_manifest(data, inputs, exports, &n_exports);

  OrtSessionOptions* options = NULL;
  CHECK(OTT_ORT(g_ort, CreateSessionOptions)(&options));
  if (compile) CHECK(OTT_ORT(g_ort, AddSessionConfigEntry)(options, ORT_TORCH_TRAIN_COMPILE_KEY, "1"));
  OrtCheckpointState* state = NULL;
  snprintf(path, sizeof path, "%s/checkpoint", artifacts);
  CHECK(g_api->LoadCheckpoint(path, &state));
  snprintf(train, sizeof train, "%s/training_model.%s", models, extension);
  snprintf(eval, sizeof eval, "%s/eval_model.%s", models, extension);
  snprintf(optim, sizeof optim, "%s/optimizer_model.%s", models, extension);
  OrtTrainingSession* session = NULL;
  if (from_buffers) {
    size_t sizes[3];
    void* bytes[3] = {read_file(train, &sizes[0]), read_file(eval, &sizes[1]), read_file(optim, &sizes[2])};
    CHECK(g_api->CreateTrainingSessionFromBuffer(env, options, state, bytes[0], sizes[0], bytes[1], sizes[1], bytes[2],
                                                 sizes[2], &session));
    for (int i = 0; i < 3; i++) free(bytes[i]);
  } else {
    CHECK(g_api->CreateTrainingSession(env, options, state, train, eval, optim, &session));
  }
  CHECK(g_api->RegisterLinearLRScheduler(session, 3, steps, 0.01f));

  snprintf(path, sizeof path, "%s/losses.bin", out);
  FILE* losses = fopen(path, "wb");
  for (int step = 0; step < steps; step++) {
    OrtValue* values[16];
    void* buffers[16];
    int k = load_inputs(data, inputs, n, "train", step, values, buffers);
    OrtValue* loss = NULL;
    CHECK(g_api->TrainStep(session, NULL, (size_t)k, (const OrtValue* const*)values, 1, &loss));
    fwrite(tensor_data(loss), sizeof(float), tensor_count(loss), losses);
    OTT_ORT(g_ort, ReleaseValue)(loss);
    CHECK(g_api->OptimizerStep(session, NULL));
    CHECK(g_api->LazyResetGrad(session));
    CHECK(g_api->SchedulerStep(session));
    release_inputs(values, buffers, k);
  }
  fclose(losses);

  write_eval_loss(session, data, inputs, n, out);
  OrtValue* params = write_parameters(session, out);
  OTT_ORT(g_ort, ReleaseValue)(params);

  snprintf(path, sizeof path, "%s/checkpoint", out);
  CHECK(g_api->SaveCheckpoint(state, path, true));
  const char* names[8];
  for (int i = 0; i < n_exports; i++) names[i] = exports[i];
  snprintf(path, sizeof path, "%s/inference.onnx", out);
  CHECK(g_api->ExportModelForInferencing(session, path, (size_t)n_exports, names));
  g_api->ReleaseTrainingSession(session);
  g_api->ReleaseCheckpointState(state);
  OTT_ORT(g_ort, ReleaseSessionOptions)(options);
}

int main(int argc, char** argv) {
  open_apis();
  OrtEnv* env = NULL;
  CHECK(OTT_ORT(g_ort, CreateEnv)(ORT_LOGGING_LEVEL_WARNING, "train_parity", &env));
  for (int i = 1; i < argc; i++) run_job(argv[i], env);
  OTT_ORT(g_ort, ReleaseMemoryInfo)(g_cpu);
  OTT_ORT(g_ort, ReleaseEnv)(env);
  printf("done %d jobs\n", argc - 1);
  return 0;
}
