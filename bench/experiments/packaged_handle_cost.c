/* What the packaged runtime's calls cost around a step, without the step: the calls a train step loop makes on
 * handles (a value made and released, a value's data looked up, LazyResetGrad on a session), each timed over N
 * calls, the best of R rounds, in nanoseconds of the thread's CPU time per call. Built against two runtimes (before and after a change to
 * the handle checks), run alternately on the same package, it gives the change's cost per call:
 *   packaged_handle_cost PACKAGE_DIR CHECKPOINT [N [R]]
 * Prints "create_release NS", "lookup NS" and "session_lookup NS". */
#define _POSIX_C_SOURCE 199309L
#include <time.h>

#include "ott_test.h"

/* The thread's CPU time: on a shared machine, the time it was descheduled is not counted. */
static double now_ns(void) {
  struct timespec at;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &at);
  return (double)at.tv_sec * 1e9 + (double)at.tv_nsec;
}

int main(int argc, char** argv) {
  EXPECT(argc >= 3);
  long calls = argc > 3 ? atol(argv[3]) : 200000, rounds = argc > 4 ? atol(argv[4]) : 5;
  open_apis();
  OrtEnv* env = NULL;
  OrtSessionOptions* options = NULL;
  OrtAllocator* allocator = NULL;
  OrtCheckpointState* state = NULL;
  OrtTrainingSession* session = NULL;
  CHECK(OTT_ORT(g_ort, CreateEnv)(ORT_LOGGING_LEVEL_WARNING, "handle_cost", &env));
  CHECK(OTT_ORT(g_ort, CreateSessionOptions)(&options));
  CHECK(OTT_ORT(g_ort, GetAllocatorWithDefaultOptions)(&allocator));
  CHECK(g_api->LoadCheckpoint(argv[2], &state));
  CHECK(g_api->CreateTrainingSession(env, options, state, argv[1], NULL, NULL, &session));
  const int64_t dims[1] = {1};
  OrtValue* held = NULL;
  CHECK(OTT_ORT(g_ort, CreateTensorAsOrtValue)(allocator, dims, 1, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &held));
  double best[3] = {1e30, 1e30, 1e30};
  for (long round = 0; round < rounds; round++) {
    double started = now_ns();
    for (long i = 0; i < calls; i++) {
      OrtValue* value = NULL;
      CHECK(OTT_ORT(g_ort, CreateTensorAsOrtValue)(allocator, dims, 1, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &value));
      OTT_ORT(g_ort, ReleaseValue)(value);
    }
    double made = now_ns();
    void* data = NULL;
    for (long i = 0; i < calls; i++) CHECK(OTT_ORT(g_ort, GetTensorMutableData)(held, &data));
    double looked = now_ns();
    for (long i = 0; i < calls; i++) CHECK(g_api->LazyResetGrad(session));
    double ended = now_ns();
    double spans[3] = {made - started, looked - made, ended - looked};
    for (int k = 0; k < 3; k++)
      if (spans[k] / (double)calls < best[k]) best[k] = spans[k] / (double)calls;
  }
  printf("create_release %.1f\nlookup %.1f\nsession_lookup %.1f\n", best[0], best[1], best[2]);
  OTT_ORT(g_ort, ReleaseValue)(held);
  g_api->ReleaseTrainingSession(session);
  g_api->ReleaseCheckpointState(state);
  OTT_ORT(g_ort, ReleaseSessionOptions)(options);
  OTT_ORT(g_ort, ReleaseEnv)(env);
  return 0;
}
