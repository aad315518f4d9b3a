/* packaged_boundary.c's handle checks: for each kind of handle the packaged runtime hands out, a released one, one
 * of another kind and an address on the caller's stack, given where that kind is expected, come back as
 * ORT_INVALID_ARGUMENT statuses naming the argument and what came; a Release* of any of them does nothing. */
#ifndef PACKAGED_HANDLES_H
#define PACKAGED_HANDLES_H

#include <pthread.h>

#include "ott_test.h"

static int bad = 0; /* the bad calls that came back as statuses */

/* A call that must fail with a status (any code), never crash: the status is released. */
static void refused(OrtStatus* status, const char* what) {
  if (status == NULL) {
    fprintf(stderr, "%s: expected a status, got none\n", what);
    exit(1);
  }
  OTT_ORT(g_ort, ReleaseStatus)(status);
  bad++;
}

/* A call that must fail with ORT_INVALID_ARGUMENT and a message holding `because`. */
static void refused_because(OrtStatus* status, const char* what, const char* because) {
  if (status != NULL) {
    const char* message = OTT_ORT(g_ort, GetErrorMessage)(status);
    if (OTT_ORT(g_ort, GetErrorCode)(status) != ORT_INVALID_ARGUMENT || strstr(message, because) == NULL) {
      fprintf(stderr, "%s: expected ORT_INVALID_ARGUMENT with '%s', got %d: %s\n", what, because,
              (int)OTT_ORT(g_ort, GetErrorCode)(status), message);
      exit(1);
    }
  }
  refused(status, what);
}

/* One live and one released handle of each kind, and an address on the stack that is none. */
typedef struct {
  OrtEnv *env, *released_env;
  OrtSessionOptions *options, *released_options;
  OrtRunOptions* released_run;
  OrtMemoryInfo* released_info;
  OrtAllocator* allocator;
  OrtValue *value, *released_value;
  OrtTensorTypeAndShapeInfo* released_shape;
  OrtCheckpointState *state, *released_state;
  OrtTrainingSession *session, *released_session;
  void* stack;
} Handles;

#define AS(type, handle) ((type*)(void*)(handle))

static void bad_core_handles(const Handles* h) {
  float data[4] = {0};
  int64_t dims[1] = {4};
  OrtValue* value = NULL;
  void* pointer = NULL;
  size_t count = 0;
  OrtMemoryInfo* infos[3] = {h->released_info, AS(OrtMemoryInfo, h->env), AS(OrtMemoryInfo, h->stack)};
  const char* why[3] = {"info is a released memory info", "info is an env, expected a memory info",
                        "info is a released or unknown handle, expected a memory info"};
  for (int i = 0; i < 3; i++)
    refused_because(OTT_ORT(g_ort, CreateTensorWithDataAsOrtValue)(infos[i], data, sizeof data, dims, 1,
                                                                   ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &value),
                    "CreateTensorWithDataAsOrtValue(bad info)", why[i]);
  refused_because(OTT_ORT(g_ort, CreateTensorAsOrtValue)(AS(OrtAllocator, h->value), dims, 1,
                                                         ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &value),
                  "CreateTensorAsOrtValue(a value as allocator)", "allocator is a value, expected an allocator");
  refused_because(OTT_ORT(g_ort, AllocatorFree)(AS(OrtAllocator, h->stack), data), "AllocatorFree(stack)",
                  "allocator is a released or unknown handle, expected an allocator");
  OrtValue* values[3] = {h->released_value, AS(OrtValue, h->state), AS(OrtValue, h->stack)};
  const char* value_why[3] = {"value is a released value", "value is a checkpoint state, expected a value",
                              "value is a released or unknown handle, expected a value"};
  for (int i = 0; i < 3; i++)
    refused_because(OTT_ORT(g_ort, GetTensorMutableData)(values[i], &pointer), "GetTensorMutableData(bad value)",
                    value_why[i]);
  OrtTensorTypeAndShapeInfo* shapes[3] = {h->released_shape, AS(OrtTensorTypeAndShapeInfo, h->value),
                                          AS(OrtTensorTypeAndShapeInfo, h->stack)};
  const char* shape_why[3] = {"info is a released tensor type and shape info",
                              "info is a value, expected a tensor type and shape info",
                              "info is a released or unknown handle, expected a tensor type and shape info"};
  for (int i = 0; i < 3; i++)
    refused_because(OTT_ORT(g_ort, GetDimensionsCount)(shapes[i], &count), "GetDimensionsCount(bad info)",
                    shape_why[i]);
}

static void bad_training_handles(const Handles* h, const char* package, OrtValue** inputs) {
  OrtTrainingSession* session = NULL;
  OrtEnv* envs[3] = {h->released_env, AS(OrtEnv, h->options), AS(OrtEnv, h->stack)};
  const char* env_why[3] = {"env is a released env", "env is a session options, expected an env",
                            "env is a released or unknown handle, expected an env"};
  OrtSessionOptions* options[3] = {h->released_options, AS(OrtSessionOptions, h->env),
                                   AS(OrtSessionOptions, h->stack)};
  const char* options_why[3] = {"options is a released session options", "options is an env, expected a session",
                                "options is a released or unknown handle, expected a session options"};
  OrtCheckpointState* states[3] = {h->released_state, AS(OrtCheckpointState, h->session),
                                   AS(OrtCheckpointState, h->stack)};
  const char* state_why[3] = {"checkpoint_state is a released checkpoint state",
                              "checkpoint_state is a training session, expected a checkpoint state",
                              "checkpoint_state is a released or unknown handle, expected a checkpoint state"};
  OrtTrainingSession* sessions[3] = {h->released_session, AS(OrtTrainingSession, h->state),
                                     AS(OrtTrainingSession, h->stack)};
  const char* session_why[3] = {"session is a released training session",
                                "session is a checkpoint state, expected a training session",
                                "session is a released or unknown handle, expected a training session"};
  OrtRunOptions* runs[3] = {h->released_run, AS(OrtRunOptions, h->value), AS(OrtRunOptions, h->stack)};
  const char* run_why[3] = {"run_options is a released run options", "run_options is a value, expected a run",
                            "run_options is a released or unknown handle, expected a run options"};
  OrtValue* loss = NULL;
  const OrtValue* const* given = (const OrtValue* const*)inputs;
  for (int i = 0; i < 3; i++) {
    refused_because(g_api->CreateTrainingSession(envs[i], h->options, h->state, package, NULL, NULL, &session),
                    "CreateTrainingSession(bad env)", env_why[i]);
    refused_because(g_api->CreateTrainingSession(h->env, options[i], h->state, package, NULL, NULL, &session),
                    "CreateTrainingSession(bad options)", options_why[i]);
    refused_because(g_api->CreateTrainingSession(h->env, h->options, states[i], package, NULL, NULL, &session),
                    "CreateTrainingSession(bad state)", state_why[i]);
    refused_because(g_api->SaveCheckpoint(states[i], "never_written", true), "SaveCheckpoint(bad state)",
                    state_why[i]);
    refused_because(g_api->TrainStep(sessions[i], NULL, 2, given, 1, &loss), "TrainStep(bad session)",
                    session_why[i]);
    refused_because(g_api->OptimizerStep(sessions[i], NULL), "OptimizerStep(bad session)", session_why[i]);
    refused_because(g_api->TrainStep(h->session, runs[i], 2, given, 1, &loss), "TrainStep(bad run options)",
                    run_why[i]);
  }
  /* a released input, a state as an input, an input and an output slot on the stack (an uninitialised slot) */
  const OrtValue* released_input[2] = {inputs[0], h->released_value};
  const OrtValue* state_input[2] = {AS(OrtValue, h->state), inputs[1]};
  const OrtValue* stack_input[2] = {inputs[0], AS(OrtValue, h->stack)};
  OrtValue* stack_slot = AS(OrtValue, h->stack);
  refused_because(g_api->TrainStep(h->session, NULL, 2, released_input, 1, &loss), "TrainStep(released input)",
                  "inputs[1] is a released value");
  refused_because(g_api->EvalStep(h->session, NULL, 2, state_input, 1, &loss), "EvalStep(state input)",
                  "inputs[0] is a checkpoint state, expected a value");
  refused_because(g_api->TrainStep(h->session, NULL, 2, stack_input, 1, &loss), "TrainStep(stack input)",
                  "inputs[1] is a released or unknown handle, expected a value");
  refused_because(g_api->TrainStep(h->session, NULL, 2, given, 1, &stack_slot), "TrainStep(stack output slot)",
                  "outputs[0] is a released or unknown handle, expected a value");
  refused_because(g_api->CopyParametersToBuffer(h->session, h->released_value, false),
                  "CopyParametersToBuffer(released buffer)", "parameters_buffer is a released value");
  refused_because(g_api->UpdateParameter(h->state, "0.bias", AS(OrtValue, h->session)),
                  "UpdateParameter(a session as value)", "parameter is a training session, expected a value");
  char* name = NULL;
  refused_because(g_api->TrainingSessionGetTrainingModelOutputName(h->session, 0, AS(OrtAllocator, h->state), &name),
                  "TrainOutputName(a state as allocator)", "allocator is a checkpoint state, expected an allocator");
  refused_because(g_api->GetParameter(h->state, "0.bias", AS(OrtAllocator, h->stack), &loss),
                  "GetParameter(stack allocator)", "allocator is a released or unknown handle, expected an allocator");
}

/* A Release* of a released, foreign or unknown handle leaves it (one line on stderr each): no double free. */
static void bad_releases(const Handles* h) {
  OTT_ORT(g_ort, ReleaseEnv)(h->released_env);
  OTT_ORT(g_ort, ReleaseSessionOptions)(AS(OrtSessionOptions, h->env));
  OTT_ORT(g_ort, ReleaseRunOptions)(AS(OrtRunOptions, h->stack));
  OTT_ORT(g_ort, ReleaseMemoryInfo)(h->released_info);
  OTT_ORT(g_ort, ReleaseValue)(h->released_value);
  OTT_ORT(g_ort, ReleaseValue)(AS(OrtValue, h->state));
  OTT_ORT(g_ort, ReleaseTensorTypeAndShapeInfo)(h->released_shape);
  g_api->ReleaseCheckpointState(h->released_state);
  g_api->ReleaseCheckpointState(AS(OrtCheckpointState, h->session));
  g_api->ReleaseTrainingSession(h->released_session);
  g_api->ReleaseTrainingSession(AS(OrtTrainingSession, h->stack));
  OTT_ORT(g_ort, ReleaseSession)(AS(OrtSession, h->session));
}

/* Released, foreign and stack handles of every kind at the entry points that take them (state and session live:
 * they are untouched), then the releases of such handles. */
static void bad_handles(OrtEnv* env, OrtSessionOptions* options, OrtCheckpointState* state, OrtTrainingSession* session,
                        const char* package, const char* checkpoint, OrtValue** inputs) {
  char stack[64] = "not a handle of any kind";
  Handles h = {.env = env, .options = options, .state = state, .session = session, .value = inputs[0], .stack = stack};
  CHECK(OTT_ORT(g_ort, GetAllocatorWithDefaultOptions)(&h.allocator));
  CHECK(OTT_ORT(g_ort, CreateEnv)(ORT_LOGGING_LEVEL_WARNING, "released", &h.released_env));
  CHECK(OTT_ORT(g_ort, CreateSessionOptions)(&h.released_options));
  CHECK(OTT_ORT(g_ort, CreateRunOptions)(&h.released_run));
  CHECK(OTT_ORT(g_ort, CreateCpuMemoryInfo)(OrtArenaAllocator, OrtMemTypeDefault, &h.released_info));
  CHECK(OTT_ORT(g_ort, CreateTensorAsOrtValue)(h.allocator, (int64_t[1]){3}, 1, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
                                               &h.released_value));
  CHECK(OTT_ORT(g_ort, GetTensorTypeAndShape)(inputs[0], &h.released_shape));
  CHECK(g_api->LoadCheckpoint(checkpoint, &h.released_state));
  CHECK(g_api->CreateTrainingSession(env, options, h.released_state, package, NULL, NULL, &h.released_session));
  OTT_ORT(g_ort, ReleaseEnv)(h.released_env);
  OTT_ORT(g_ort, ReleaseSessionOptions)(h.released_options);
  OTT_ORT(g_ort, ReleaseRunOptions)(h.released_run);
  OTT_ORT(g_ort, ReleaseMemoryInfo)(h.released_info);
  OTT_ORT(g_ort, ReleaseValue)(h.released_value);
  OTT_ORT(g_ort, ReleaseTensorTypeAndShapeInfo)(h.released_shape);
  g_api->ReleaseTrainingSession(h.released_session);
  g_api->ReleaseCheckpointState(h.released_state);
  bad_core_handles(&h);
  bad_training_handles(&h, package, inputs);
  bad_releases(&h);
}

/* An inference session released, a training session and a stack address where one is expected. */
static void bad_inference_handles(OrtSession* released, OrtTrainingSession* session, const char* const* names,
                                  const OrtValue* const* inputs, const char* const* outputs) {
  char stack[64] = "not a handle of any kind";
  OrtSession* sessions[3] = {released, AS(OrtSession, session), AS(OrtSession, stack)};
  const char* why[3] = {"session is a released inference session",
                        "session is a training session, expected an inference session",
                        "session is a released or unknown handle, expected an inference session"};
  OrtValue* result = NULL;
  for (int i = 0; i < 3; i++)
    refused_because(OTT_ORT(g_ort, Run)(sessions[i], NULL, names, inputs, 1, outputs, 1, &result), "Run(bad session)",
                    why[i]);
  OTT_ORT(g_ort, ReleaseSession)(released);
}

/* Threads making, looking up and releasing handles at once (the table is shared): each value is its own. */
typedef struct {
  OrtTrainingSession* session;
  OrtAllocator* allocator;
  int made;
} HandleChurn;

static void* churn_handles(void* argument) {
  HandleChurn* churn = (HandleChurn*)argument;
  const int64_t dims[1] = {4};
  for (int i = 0; i < 200; i++) {
    OrtValue* value = NULL;
    void* data = NULL;
    size_t count = 0;
    CHECK(OTT_ORT(g_ort, CreateTensorAsOrtValue)(churn->allocator, dims, 1, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
                                                 &value));
    CHECK(OTT_ORT(g_ort, GetTensorMutableData)(value, &data));
    CHECK(g_api->TrainingSessionGetTrainingModelOutputCount(churn->session, &count));
    OTT_ORT(g_ort, ReleaseValue)(value);
    churn->made += count == 1;
  }
  return NULL;
}

static void handles_from_threads(OrtTrainingSession* session) {
  HandleChurn churns[3] = {{session, NULL, 0}, {session, NULL, 0}, {session, NULL, 0}};
  pthread_t threads[3];
  for (int i = 0; i < 3; i++) {
    CHECK(OTT_ORT(g_ort, GetAllocatorWithDefaultOptions)(&churns[i].allocator));
    EXPECT(pthread_create(&threads[i], NULL, churn_handles, &churns[i]) == 0);
  }
  for (int i = 0; i < 3; i++) {
    EXPECT(pthread_join(threads[i], NULL) == 0);
    EXPECT(churns[i].made == 200);
  }
}

#endif
