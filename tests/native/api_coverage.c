/* Calls every OrtTrainingApi function on the MLP fixture, with good and bad arguments:
 *   api_coverage ARTIFACTS_DIR OUT_DIR
 * Prints "called NAME" once per function, and "case NAME CODE MESSAGE" for each error case; exits 1 on a
 * failed expectation. The checks of the session's queries are in api_coverage_checks.h, its bad arguments in
 * api_coverage_errors.h. */
#include <math.h>
#include <stdint.h>

#include "api_coverage_errors.h"

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
