/* Two sessions trained on two threads at once must match the same sessions trained one after the other;
 * and RSS stays flat over many steps with released outputs.
 *   threads_rss ARTIFACTS_DIR threads STEPS     prints "same" or exits 1
 *   threads_rss ARTIFACTS_DIR rss STEPS         prints "rss STEP KIB" ten times */
#include <pthread.h>
#include <unistd.h>

#include "ott_test.h"

typedef struct {
  const char* dir;
  int seed, steps;
  float params[837];
} Job;

static OrtEnv* g_env;

static OrtTrainingSession* open_session(const char* dir, OrtCheckpointState** state) {
  char ckpt[1024], train[1024], optim[1024];
  snprintf(ckpt, sizeof ckpt, "%s/checkpoint", dir);
  snprintf(train, sizeof train, "%s/training_model.onnx", dir);
  snprintf(optim, sizeof optim, "%s/optimizer_model.onnx", dir);
  OrtSessionOptions* options = NULL;
  CHECK(OTT_ORT(g_ort, CreateSessionOptions)(&options));
  CHECK(g_api->LoadCheckpoint(ckpt, state));
  OrtTrainingSession* session = NULL;
  CHECK(g_api->CreateTrainingSession(g_env, options, *state, train, NULL, optim, &session));
  OTT_ORT(g_ort, ReleaseSessionOptions)(options);
  CHECK(g_api->SetLearningRate(session, 0.01f));
  return session;
}

static void train(OrtTrainingSession* session, int seed, int steps, int report_rss) {
  float x[8 * 20];
  int64_t y[8];
  const int64_t x_dims[2] = {8, 20}, y_dims[1] = {8};
  for (int step = 0; step < steps; step++) {
    for (int i = 0; i < 8 * 20; i++) x[i] = (float)((i * 31 + step * 7 + seed * 101) % 23) / 23.0f - 0.5f;
    for (int i = 0; i < 8; i++) y[i] = (i + step + seed) % 5;
    OrtValue* inputs[2] = {tensor_over(x, sizeof x, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, x_dims, 2),
                           tensor_over(y, sizeof y, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, y_dims, 1)};
    OrtValue* loss = NULL;
    CHECK(g_api->TrainStep(session, NULL, 2, (const OrtValue* const*)inputs, 1, &loss));
    CHECK(g_api->OptimizerStep(session, NULL));
    CHECK(g_api->LazyResetGrad(session));
    OTT_ORT(g_ort, ReleaseValue)(loss);
    OTT_ORT(g_ort, ReleaseValue)(inputs[0]);
    OTT_ORT(g_ort, ReleaseValue)(inputs[1]);
    if (report_rss && (step + 1) % (steps / 10) == 0) {
      long pages = 0, resident = 0;
      FILE* statm = fopen("/proc/self/statm", "r");
      EXPECT(statm && fscanf(statm, "%ld %ld", &pages, &resident) == 2);
      fclose(statm);
      printf("rss %d %ld\n", step + 1, resident * (sysconf(_SC_PAGESIZE) / 1024));
      fflush(stdout);
    }
  }
}

static void* run(void* argument) {
  Job* job = (Job*)argument;
  OrtCheckpointState* state = NULL;
  OrtTrainingSession* session = open_session(job->dir, &state);
  train(session, job->seed, job->steps, 0);
  OrtValue* buffer = tensor_over(job->params, sizeof job->params, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
                                 (const int64_t[]){837}, 1);
  CHECK(g_api->CopyParametersToBuffer(session, buffer, false));
  OTT_ORT(g_ort, ReleaseValue)(buffer);
  g_api->ReleaseTrainingSession(session);
  g_api->ReleaseCheckpointState(state);
  return NULL;
}

int main(int argc, char** argv) {
  EXPECT(argc == 4);
  open_apis();
  CHECK(OTT_ORT(g_ort, CreateEnv)(ORT_LOGGING_LEVEL_WARNING, "threads_rss", &g_env));
  int steps = atoi(argv[3]);
  if (strcmp(argv[2], "rss") == 0) {
    OrtCheckpointState* state = NULL;
    OrtTrainingSession* session = open_session(argv[1], &state);
    train(session, 0, steps, 1);
    g_api->ReleaseTrainingSession(session);
    g_api->ReleaseCheckpointState(state);
  } else {
    static Job serial[2], parallel[2];
    for (int i = 0; i < 2; i++) {
      serial[i] = (Job){argv[1], i + 1, steps, {0}};
      parallel[i] = serial[i];
      run(&serial[i]);
    }
    pthread_t threads[2];
    for (int i = 0; i < 2; i++) EXPECT(pthread_create(&threads[i], NULL, run, &parallel[i]) == 0);
    for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
    for (int i = 0; i < 2; i++) EXPECT(memcmp(serial[i].params, parallel[i].params, sizeof serial[i].params) == 0);
    EXPECT(memcmp(serial[0].params, serial[1].params, sizeof serial[0].params) != 0);
    printf("same\n");
  }
  OTT_ORT(g_ort, ReleaseMemoryInfo)(g_cpu);
  OTT_ORT(g_ort, ReleaseEnv)(g_env);
  return 0;
}
