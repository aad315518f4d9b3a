/* api_coverage.c's bad arguments: inputs of another dtype, rank or count, a wrong outputs_len, and a NULL for each
 * pointer argument of every function (each ORT_INVALID_ARGUMENT). */
#ifndef API_COVERAGE_ERRORS_H
#define API_COVERAGE_ERRORS_H

#include "api_coverage_checks.h"

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

#endif
