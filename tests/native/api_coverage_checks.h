/* api_coverage.c's checks of a live session and checkpoint state: the names and counts, properties, parameters
 * and parameter buffers, each with its error cases; and the helpers they share (the "called NAME" and
 * "case NAME CODE MESSAGE" lines, the batch of inputs). */
#ifndef API_COVERAGE_CHECKS_H
#define API_COVERAGE_CHECKS_H

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

#endif
