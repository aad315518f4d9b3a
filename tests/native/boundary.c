/* The C boundary's checks, on the MLP fixture:
 *   boundary ARTIFACTS_DIR tensors   a NULL-data tensor, a too-short one and one in memory the library cannot
 *                                    use, at every entry point that takes or fills a tensor; each must answer
 *                                    ORT_INVALID_ARGUMENT and leave the parameters as they were
 *   boundary ARTIFACTS_DIR handles   a released session and state used again and released again
 *   boundary ARTIFACTS_DIR fork      a train step in a child made by fork() after the parent trained
 *   boundary ARTIFACTS_DIR badmodel MODEL TEXT [MODEL TEXT ...]
 *                                    each damaged model file as the training model, from its path and its bytes:
 *                                    refused (ORT_FAIL) with a message holding its TEXT
 *   boundary ARTIFACTS_DIR finalize SITE_DIR
 *                                    a host that embeds Python (SITE_DIR: where its packages are), loads a
 *                                    checkpoint, finalizes Python, calls again
 * (tensors,handles,fork,badmodel ...: several, in that order, in one process.) Prints "case NAME CODE MESSAGE" for each refused call and "done" at the end; exits 1 on a failed expectation. */
#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ott_test.h"

static void expect_refused(const char* name, OrtStatus* status, OrtErrorCode code, const char* names) {
  if (status == NULL) {
    fprintf(stderr, "case %s: expected an error, got success\n", name);
    exit(1);
  }
  OrtErrorCode got = OTT_ORT(g_ort, GetErrorCode)(status);
  const char* message = OTT_ORT(g_ort, GetErrorMessage)(status);
  printf("case %s %d %s\n", name, (int)got, message);
  fflush(stdout);
  if (got != code || strstr(message, names) == NULL) {
    fprintf(stderr, "case %s: expected code %d naming %s, got %d (%s)\n", name, (int)code, names, (int)got, message);
    exit(1);
  }
  OTT_ORT(g_ort, ReleaseStatus)(status);
}

static OrtEnv* g_env;
static OrtSessionOptions* g_options;
static const char* g_dir;

static void open_session(OrtCheckpointState** state, OrtTrainingSession** session) {
  char path[3][1024];
  const char* names[3] = {"training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"};
  for (int i = 0; i < 3; i++) snprintf(path[i], sizeof path[i], "%s/%s", g_dir, names[i]);
  char checkpoint[1024];
  snprintf(checkpoint, sizeof checkpoint, "%s/checkpoint", g_dir);
  CHECK(g_api->LoadCheckpoint(checkpoint, state));
  CHECK(g_api->CreateTrainingSession(g_env, g_options, *state, path[0], path[1], path[2], session));
}

static float g_x[8 * 20];
static int64_t g_y[8];
static const int64_t g_x_dims[2] = {8, 20}, g_y_dims[1] = {8};

/* A float tensor of `dims` whose data pointer is NULL (ORT makes one: it checks the length, not the pointer). */
static OrtValue* null_tensor(const int64_t* dims, size_t rank, ONNXTensorElementDataType type, size_t bytes) {
  return tensor_over(NULL, bytes, type, dims, rank);
}

/* A tensor that says its memory is on a device the library does not handle (DirectML). */
static OrtValue* foreign_tensor(void* data, size_t bytes, const int64_t* dims, size_t rank) {
  OrtMemoryInfo* info = NULL;
  CHECK(OTT_ORT(g_ort, CreateMemoryInfo)("DML", OrtDeviceAllocator, 0, OrtMemTypeDefault, &info));
  OrtValue* value = NULL;
  CHECK(OTT_ORT(g_ort, CreateTensorWithDataAsOrtValue)(info, data, bytes, dims, rank,
                                                         ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &value));
  OTT_ORT(g_ort, ReleaseMemoryInfo)(info);
  return value;
}

/* An allocator whose allocations fail (Alloc answers NULL), as an unchecked allocation would leave a program. */
static OrtMemoryInfo* g_failing_info;
static void* failing_alloc(OrtAllocator* self, size_t size) {
  (void)self;
  (void)size;
  return NULL;
}
static void failing_free(OrtAllocator* self, void* p) {
  (void)self;
  free(p);
}
static const OrtMemoryInfo* failing_info(const OrtAllocator* self) {
  (void)self;
  return g_failing_info;
}

static size_t g_count;
static float* parameters_now(OrtTrainingSession* session) {
  float* data = (float*)calloc(g_count, sizeof(float));
  int64_t dims[1] = {(int64_t)g_count};
  OrtValue* buffer = tensor_over(data, g_count * sizeof(float), ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, dims, 1);
  CHECK(g_api->CopyParametersToBuffer(session, buffer, false));
  OTT_ORT(g_ort, ReleaseValue)(buffer);
  return data;
}

static float* g_before;
static void expect_unchanged(const char* name, OrtTrainingSession* session) {
  float* now = parameters_now(session);
  if (memcmp(now, g_before, g_count * sizeof(float)) != 0) {
    fprintf(stderr, "case %s: the parameters changed\n", name);
    exit(1);
  }
  free(now);
}

static void step_cases(OrtTrainingSession* session) {
  static float short_x[8 * 10];
  static float loss_data[1];
  const int64_t short_dims[2] = {8, 10};
  OrtValue* good_x = tensor_over(g_x, sizeof g_x, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, g_x_dims, 2);
  OrtValue* good_y = tensor_over(g_y, sizeof g_y, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, g_y_dims, 1);
  OrtValue* null_x = null_tensor(g_x_dims, 2, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, sizeof g_x);
  OrtValue* null_y = null_tensor(g_y_dims, 1, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, sizeof g_y);
  OrtValue* short_in = tensor_over(short_x, sizeof short_x, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, short_dims, 2);
  OrtValue* foreign_x = foreign_tensor(g_x, sizeof g_x, g_x_dims, 2);
  OrtValue* loss = NULL;
  const OrtValue* with_null_x[2] = {null_x, good_y};
  const OrtValue* with_null_y[2] = {good_x, null_y};
  const OrtValue* with_short_x[2] = {short_in, good_y};
  const OrtValue* with_foreign_x[2] = {foreign_x, good_y};
  const OrtValue* good[2] = {good_x, good_y};
  expect_refused("train_input_null", g_api->TrainStep(session, NULL, 2, with_null_x, 1, &loss), ORT_INVALID_ARGUMENT,
                 "inputs[0]");
  expect_refused("train_input_null_labels", g_api->TrainStep(session, NULL, 2, with_null_y, 1, &loss),
                 ORT_INVALID_ARGUMENT, "inputs[1]");
  expect_refused("train_input_short", g_api->TrainStep(session, NULL, 2, with_short_x, 1, &loss),
                 ORT_INVALID_ARGUMENT, "input");
  expect_refused("train_input_memory", g_api->TrainStep(session, NULL, 2, with_foreign_x, 1, &loss),
                 ORT_INVALID_ARGUMENT, "inputs[0]");
  expect_refused("eval_input_null", g_api->EvalStep(session, NULL, 2, with_null_x, 1, &loss), ORT_INVALID_ARGUMENT,
                 "inputs[0]");
  expect_refused("eval_input_short", g_api->EvalStep(session, NULL, 2, with_short_x, 1, &loss), ORT_INVALID_ARGUMENT,
                 "input");
  EXPECT(loss == NULL);
  OrtValue* null_loss = null_tensor(NULL, 0, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, sizeof loss_data);
  expect_refused("train_output_null", g_api->TrainStep(session, NULL, 2, good, 1, &null_loss), ORT_INVALID_ARGUMENT,
                 "outputs[0]");
  expect_refused("eval_output_null", g_api->EvalStep(session, NULL, 2, good, 1, &null_loss), ORT_INVALID_ARGUMENT,
                 "outputs[0]");
  int64_t empty_dims[1] = {0};
  OrtValue* short_loss = tensor_over(loss_data, 0, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, empty_dims, 1);
  expect_refused("eval_output_short", g_api->EvalStep(session, NULL, 2, good, 1, &short_loss), ORT_INVALID_ARGUMENT,
                 "outputs[0]");
  OrtValue* foreign_loss = foreign_tensor(loss_data, sizeof loss_data, NULL, 0);
  expect_refused("train_output_memory", g_api->TrainStep(session, NULL, 2, good, 1, &foreign_loss),
                 ORT_INVALID_ARGUMENT, "outputs[0]");
  expect_unchanged("step", session);
  OrtRunOptions* terminate = NULL; /* a difference from ONNX Runtime: run options are not read */
  CHECK(OTT_ORT(g_ort, CreateRunOptions)(&terminate));
  CHECK(OTT_ORT(g_ort, RunOptionsSetTerminate)(terminate));
  CHECK(g_api->EvalStep(session, terminate, 2, good, 1, &loss));
  printf("differs run_options_terminate_not_read\n");
  OTT_ORT(g_ort, ReleaseValue)(loss);
  OTT_ORT(g_ort, ReleaseRunOptions)(terminate);
  OrtValue* values[] = {good_x, good_y, null_x, null_y, short_in, foreign_x, null_loss, short_loss, foreign_loss};
  for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) OTT_ORT(g_ort, ReleaseValue)(values[i]);
}

static void buffer_cases(OrtTrainingSession* session) {
  int64_t full[1] = {(int64_t)g_count}, shorter[1] = {(int64_t)g_count - 1};
  float* room = (float*)calloc(g_count, sizeof(float));
  OrtValue* null_buffer = null_tensor(full, 1, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, g_count * sizeof(float));
  OrtValue* short_buffer = tensor_over(room, (g_count - 1) * sizeof(float), ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT,
                                       shorter, 1);
  OrtValue* foreign_buffer = foreign_tensor(room, g_count * sizeof(float), full, 1);
  expect_refused("copy_to_null", g_api->CopyParametersToBuffer(session, null_buffer, false), ORT_INVALID_ARGUMENT,
                 "parameters_buffer");
  expect_refused("copy_to_short", g_api->CopyParametersToBuffer(session, short_buffer, false), ORT_INVALID_ARGUMENT,
                 "parameters_buffer");
  expect_refused("copy_to_memory", g_api->CopyParametersToBuffer(session, foreign_buffer, false),
                 ORT_INVALID_ARGUMENT, "parameters_buffer");
  expect_refused("copy_from_null", g_api->CopyBufferToParameters(session, null_buffer, false), ORT_INVALID_ARGUMENT,
                 "parameters_buffer");
  expect_refused("copy_from_short", g_api->CopyBufferToParameters(session, short_buffer, false),
                 ORT_INVALID_ARGUMENT, "parameters_buffer");
  expect_refused("copy_from_memory", g_api->CopyBufferToParameters(session, foreign_buffer, false),
                 ORT_INVALID_ARGUMENT, "parameters_buffer");
  expect_unchanged("buffers", session);
  OTT_ORT(g_ort, ReleaseValue)(null_buffer);
  OTT_ORT(g_ort, ReleaseValue)(short_buffer);
  OTT_ORT(g_ort, ReleaseValue)(foreign_buffer);
  free(room);
}

static void parameter_cases(OrtTrainingSession* session, OrtCheckpointState* state) {
  static float bias[32];
  int64_t full[1] = {32}, shorter[1] = {31};
  OrtValue* null_bias = null_tensor(full, 1, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, sizeof bias);
  OrtValue* short_bias = tensor_over(bias, 31 * sizeof(float), ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, shorter, 1);
  OrtValue* foreign_bias = foreign_tensor(bias, sizeof bias, full, 1);
  expect_refused("update_null", g_api->UpdateParameter(state, "0.bias", null_bias), ORT_INVALID_ARGUMENT, "parameter");
  expect_refused("update_short", g_api->UpdateParameter(state, "0.bias", short_bias), ORT_INVALID_ARGUMENT,
                 "parameter");
  expect_refused("update_memory", g_api->UpdateParameter(state, "0.bias", foreign_bias), ORT_INVALID_ARGUMENT,
                 "parameter");
  CHECK(OTT_ORT(g_ort, CreateCpuMemoryInfo)(OrtDeviceAllocator, OrtMemTypeDefault, &g_failing_info));
  OrtAllocator failing = {ORT_API_VERSION, failing_alloc, failing_free, failing_info};
  OrtValue* got = NULL;
  expect_refused("get_parameter_null", g_api->GetParameter(state, "0.bias", &failing, &got), ORT_INVALID_ARGUMENT,
                 "allocator");
  EXPECT(got == NULL);
  expect_unchanged("parameters", session);
  OTT_ORT(g_ort, ReleaseMemoryInfo)(g_failing_info);
  OTT_ORT(g_ort, ReleaseValue)(null_bias);
  OTT_ORT(g_ort, ReleaseValue)(short_bias);
  OTT_ORT(g_ort, ReleaseValue)(foreign_bias);
}

static void handle_cases(void) {
  OrtCheckpointState* state = NULL;
  OrtTrainingSession* session = NULL;
  open_session(&state, &session);
  g_api->ReleaseCheckpointState(state); /* ORT requires the state to outlive the session; here it lives on */
  float learning_rate = 0;
  CHECK(g_api->GetLearningRate(session, &learning_rate));
  printf("differs state_released_before_session\n");
  g_api->ReleaseTrainingSession(session);
  open_session(&state, &session);
  g_api->ReleaseTrainingSession(session);
  g_api->ReleaseCheckpointState(state);
  float lr = 0;
  size_t count = 0;
  OrtValue* loss = NULL;
  OrtValue* parameter = NULL;
  OrtAllocator* allocator = NULL;
  CHECK(OTT_ORT(g_ort, GetAllocatorWithDefaultOptions)(&allocator));
  expect_refused("session_used_after_release", g_api->GetLearningRate(session, &lr), ORT_INVALID_ARGUMENT, "sess");
  expect_refused("session_step_after_release", g_api->TrainStep(session, NULL, 0, NULL, 1, &loss),
                 ORT_INVALID_ARGUMENT, "released");
  expect_refused("session_size_after_release", g_api->GetParametersSize(session, &count, false),
                 ORT_INVALID_ARGUMENT, "released");
  expect_refused("state_used_after_release", g_api->GetParameter(state, "0.bias", allocator, &parameter),
                 ORT_INVALID_ARGUMENT, "checkpoint_state");
  OrtTrainingSession* other = NULL;
  char path[1024];
  snprintf(path, sizeof path, "%s/training_model.onnx", g_dir);
  expect_refused("session_from_released_state",
                 g_api->CreateTrainingSession(g_env, g_options, state, path, NULL, NULL, &other),
                 ORT_INVALID_ARGUMENT, "checkpoint_state");
  g_api->ReleaseTrainingSession(session); /* twice: ignored, with a line on stderr */
  g_api->ReleaseCheckpointState(state);
  expect_refused("not_a_session", g_api->OptimizerStep((OrtTrainingSession*)g_x, NULL), ORT_INVALID_ARGUMENT,
                 "never created");
}

static int fork_case(OrtTrainingSession* session) {
  OrtValue* inputs[2] = {tensor_over(g_x, sizeof g_x, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, g_x_dims, 2),
                         tensor_over(g_y, sizeof g_y, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, g_y_dims, 1)};
  OrtValue* loss = NULL;
  CHECK(g_api->TrainStep(session, NULL, 2, (const OrtValue* const*)inputs, 1, &loss));
  OTT_ORT(g_ort, ReleaseValue)(loss);
  loss = NULL;
  fflush(stdout);
  pid_t child = fork();
  if (child == 0) {
    alarm(60); /* a hang fails the test instead of holding it */
    expect_refused("train_step_in_forked_child",
                   g_api->TrainStep(session, NULL, 2, (const OrtValue* const*)inputs, 1, &loss), ORT_FAIL, "fork");
    g_api->ReleaseTrainingSession(session);
    fflush(stdout);
    _exit(loss == NULL ? 0 : 1);
  }
  int wstatus = 0;
  EXPECT(waitpid(child, &wstatus, 0) == child);
  EXPECT(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
  CHECK(g_api->TrainStep(session, NULL, 2, (const OrtValue* const*)inputs, 1, &loss)); /* the parent goes on */
  OTT_ORT(g_ort, ReleaseValue)(loss);
  OTT_ORT(g_ort, ReleaseValue)(inputs[0]);
  OTT_ORT(g_ort, ReleaseValue)(inputs[1]);
  return 0;
}

/* The host starts Python itself (libpython is loaded with the library), uses the library, then finalizes. */
static int finalize_case(const char* site_dir) {
  void (*initialize)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "Py_Initialize");
  int (*finalize)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "Py_FinalizeEx");
  int (*run)(const char*) = (int (*)(const char*))dlsym(RTLD_DEFAULT, "PyRun_SimpleString");
  EXPECT(initialize != NULL && finalize != NULL && run != NULL);
  initialize();
  char code[1200];
  snprintf(code, sizeof code, "import site; site.addsitedir('%s')", site_dir);
  EXPECT(run(code) == 0);
  char checkpoint[1024];
  snprintf(checkpoint, sizeof checkpoint, "%s/checkpoint", g_dir);
  OrtCheckpointState* state = NULL;
  CHECK(g_api->LoadCheckpoint(checkpoint, &state));
  finalize();
  OrtCheckpointState* again = NULL;
  expect_refused("load_after_py_finalize", g_api->LoadCheckpoint(checkpoint, &again), ORT_FAIL, "Py_Finalize");
  OrtAllocator* allocator = NULL;
  OrtValue* parameter = NULL;
  CHECK(OTT_ORT(g_ort, GetAllocatorWithDefaultOptions)(&allocator));
  expect_refused("state_after_py_finalize", g_api->GetParameter(state, "0.bias", allocator, &parameter), ORT_FAIL,
                 "Py_Finalize");
  g_api->ReleaseCheckpointState(state); /* forgotten, not touched */
  printf("done\n");
  return 0;
}

static void bad_model_case(OrtCheckpointState* state, const char* model, const char* text) {
  OrtTrainingSession* other = NULL;
  expect_refused("bad_model_path", g_api->CreateTrainingSession(g_env, g_options, state, model, NULL, NULL, &other),
                 ORT_FAIL, text);
  size_t size = 0;
  void* bytes = read_file(model, &size);
  expect_refused("bad_model_buffer",
                 g_api->CreateTrainingSessionFromBuffer(g_env, g_options, state, bytes, size, NULL, 0, NULL, 0, &other),
                 ORT_FAIL, text);
  EXPECT(other == NULL);
  free(bytes);
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: boundary ARTIFACTS_DIR tensors,handles,fork,badmodel [MODEL TEXT ...]|finalize SITE_DIR\n");
    return 2;
  }
  g_dir = argv[1];
  open_apis();
  if (strcmp(argv[2], "finalize") == 0) return finalize_case(argc > 3 ? argv[3] : ".");
  for (int i = 0; i < 8 * 20; i++) g_x[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
  for (int i = 0; i < 8; i++) g_y[i] = i % 5;
  CHECK(OTT_ORT(g_ort, CreateEnv)(ORT_LOGGING_LEVEL_WARNING, "boundary", &g_env));
  CHECK(OTT_ORT(g_ort, CreateSessionOptions)(&g_options));
  OrtCheckpointState* state = NULL;
  OrtTrainingSession* session = NULL;
  open_session(&state, &session);
  CHECK(g_api->GetParametersSize(session, &g_count, false));
  g_before = parameters_now(session);
  if (strstr(argv[2], "tensors") != NULL) {
    step_cases(session);
    buffer_cases(session);
    parameter_cases(session, state);
  }
  if (strstr(argv[2], "handles") != NULL) handle_cases();
  if (strstr(argv[2], "fork") != NULL) fork_case(session);
  if (strstr(argv[2], "badmodel") != NULL)
    for (int i = 3; i + 1 < argc; i += 2) bad_model_case(state, argv[i], argv[i + 1]);
  g_api->ReleaseTrainingSession(session);
  g_api->ReleaseCheckpointState(state);
  free(g_before);
  OTT_ORT(g_ort, ReleaseSessionOptions)(g_options);
  OTT_ORT(g_ort, ReleaseEnv)(g_env);
  printf("done\n");
  return 0;
}
