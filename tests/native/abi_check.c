/* Checks the OrtApi positions of ort_torch_train_ort_abi.h against the libonnxruntime it is linked with,
 * by calling each member and checking what it does. Prints "ok" and exits 0, or names the first mismatch. */
#include "ott_test.h"

int main(void) {
  g_ort = OrtGetApiBase()->GetApi(ORT_API_VERSION);
  EXPECT(g_ort != NULL);
  OrtStatus* status = OTT_ORT(g_ort, CreateStatus)(ORT_NO_MODEL, "probe");
  EXPECT(OTT_ORT(g_ort, GetErrorCode)(status) == ORT_NO_MODEL);
  EXPECT(strcmp(OTT_ORT(g_ort, GetErrorMessage)(status), "probe") == 0);
  OTT_ORT(g_ort, ReleaseStatus)(status);

  OrtEnv* env = NULL;
  CHECK(OTT_ORT(g_ort, CreateEnv)(ORT_LOGGING_LEVEL_FATAL, "abi_check", &env));
  OrtSessionOptions* options = NULL;
  CHECK(OTT_ORT(g_ort, CreateSessionOptions)(&options));
  CHECK(OTT_ORT(g_ort, SetIntraOpNumThreads)(options, 1));
  CHECK(OTT_ORT(g_ort, AddSessionConfigEntry)(options, "ort_torch_train.probe", "value"));
  int present = 0;
  CHECK(OTT_ORT(g_ort, HasSessionConfigEntry)(options, "ort_torch_train.probe", &present));
  EXPECT(present == 1);
  char value[16];
  size_t size = sizeof value;
  CHECK(OTT_ORT(g_ort, GetSessionConfigEntry)(options, "ort_torch_train.probe", value, &size));
  EXPECT(strcmp(value, "value") == 0);

  OrtAllocator* allocator = NULL;
  CHECK(OTT_ORT(g_ort, GetAllocatorWithDefaultOptions)(&allocator));
  void* block = NULL;
  CHECK(OTT_ORT(g_ort, AllocatorAlloc)(allocator, 64, &block));
  CHECK(OTT_ORT(g_ort, AllocatorFree)(allocator, block));
  int64_t dims[2] = {2, 3}, read[2] = {0, 0};
  OrtValue* value_made = NULL;
  CHECK(OTT_ORT(g_ort, CreateTensorAsOrtValue)(allocator, dims, 2, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, &value_made));
  int is_tensor = 0;
  CHECK(OTT_ORT(g_ort, IsTensor)(value_made, &is_tensor));
  EXPECT(is_tensor == 1);
  OrtTensorTypeAndShapeInfo* info = NULL;
  CHECK(OTT_ORT(g_ort, GetTensorTypeAndShape)(value_made, &info));
  ONNXTensorElementDataType type;
  size_t rank = 0, count = 0;
  CHECK(OTT_ORT(g_ort, GetTensorElementType)(info, &type));
  CHECK(OTT_ORT(g_ort, GetDimensionsCount)(info, &rank));
  CHECK(OTT_ORT(g_ort, GetDimensions)(info, read, 2));
  CHECK(OTT_ORT(g_ort, GetTensorShapeElementCount)(info, &count));
  EXPECT(type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 && rank == 2 && read[0] == 2 && read[1] == 3 && count == 6);
  OTT_ORT(g_ort, ReleaseTensorTypeAndShapeInfo)(info);
  const OrtMemoryInfo* memory = NULL;
  const char* name = NULL;
  int id = -1;
  CHECK(OTT_ORT(g_ort, GetTensorMemoryInfo)(value_made, &memory));
  CHECK(OTT_ORT(g_ort, MemoryInfoGetName)(memory, &name));
  CHECK(OTT_ORT(g_ort, MemoryInfoGetId)(memory, &id));
  EXPECT(strcmp(name, "Cpu") == 0 && id == 0);
  OTT_ORT(g_ort, ReleaseValue)(value_made);

  float data[6] = {0};
  OrtValue* over = tensor_over(data, sizeof data, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, dims, 2);
  EXPECT(tensor_data(over) == (void*)data && tensor_count(over) == 6);
  OTT_ORT(g_ort, ReleaseValue)(over);
  OTT_ORT(g_ort, ReleaseMemoryInfo)(g_cpu);

  OrtMemoryInfo* named = NULL; /* CreateMemoryInfo: the name given comes back */
  CHECK(OTT_ORT(g_ort, CreateMemoryInfo)("Cpu", OrtDeviceAllocator, 0, OrtMemTypeDefault, &named));
  CHECK(OTT_ORT(g_ort, MemoryInfoGetName)(named, &name));
  EXPECT(strcmp(name, "Cpu") == 0);
  OTT_ORT(g_ort, ReleaseMemoryInfo)(named);
  OrtRunOptions* run_options = NULL; /* the run options: a tag set is read back; terminate set and unset */
  const char* tag = NULL;
  CHECK(OTT_ORT(g_ort, CreateRunOptions)(&run_options));
  CHECK(OTT_ORT(g_ort, RunOptionsSetRunTag)(run_options, "abi_check"));
  CHECK(OTT_ORT(g_ort, RunOptionsGetRunTag)(run_options, &tag));
  EXPECT(strcmp(tag, "abi_check") == 0);
  CHECK(OTT_ORT(g_ort, RunOptionsSetTerminate)(run_options));
  CHECK(OTT_ORT(g_ort, RunOptionsUnsetTerminate)(run_options));
  OTT_ORT(g_ort, ReleaseRunOptions)(run_options);
  OrtSession* no_session = NULL; /* CreateSessionFromArray: bytes that are no model are refused as such */
  status = OTT_ORT(g_ort, CreateSessionFromArray)(env, "not a model", 11, options, &no_session);
  EXPECT(status != NULL && no_session == NULL);
  OTT_ORT(g_ort, ReleaseStatus)(status);

  CHECK(OTT_ORT(g_ort, CreateTensorTypeAndShapeInfo)(&info));
  CHECK(OTT_ORT(g_ort, SetTensorElementType)(info, ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE));
  CHECK(OTT_ORT(g_ort, SetDimensions)(info, dims, 2));
  CHECK(OTT_ORT(g_ort, GetTensorElementType)(info, &type));
  EXPECT(type == ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE);
  OTT_ORT(g_ort, ReleaseTensorTypeAndShapeInfo)(info);

  /* this build has neither training nor CUDA: both answer so, at their positions */
  EXPECT(OTT_ORT(g_ort, GetTrainingApi)(ORT_API_VERSION) == NULL);
  int cuda_options[32] = {0};
  status = OTT_ORT(g_ort, SessionOptionsAppendExecutionProvider_CUDA)(options, (const OrtCUDAProviderOptions*)cuda_options);
  EXPECT(status != NULL);
  printf("cuda refused: %s\n", OTT_ORT(g_ort, GetErrorMessage)(status));
  OTT_ORT(g_ort, ReleaseStatus)(status);
  OTT_ORT(g_ort, ReleaseSessionOptions)(options);
  OTT_ORT(g_ort, ReleaseEnv)(env);
  printf("ok\n");
  return 0;
}
