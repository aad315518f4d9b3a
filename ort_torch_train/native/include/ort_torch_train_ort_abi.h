/* The facts of ONNX Runtime's C ABI that ort-torch-train's native library and its programs use.
 *
 * ONNX Runtime's own headers are not shipped here. What follows declares only what is needed: opaque
 * handle types, the enums whose values cross the boundary, and the positions of the OrtApi members that
 * are called. OrtApi is a table of function pointers that ONNX Runtime only ever appends to, so a
 * member's position never changes once released.
 *
 * Source of every position and value: onnxruntime_c_api.h of ORT_API_VERSION 30 (ONNX Runtime 1.25);
 * the positions were checked against libonnxruntime 1.32.0 by tests/integration/test_native_abi.py.
 */
#ifndef ORT_TORCH_TRAIN_ORT_ABI_H
#define ORT_TORCH_TRAIN_ORT_ABI_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef ORT_API2_STATUS /* ONNX Runtime's own C header not included: declare what is used */
/* The API version programs pass to GetApi / GetTrainingApi. 23 (ORT 1.23) holds every member listed
 * below; libonnxruntime answers it for any version up to its own. */
#ifndef ORT_API_VERSION
#define ORT_API_VERSION 23
#endif
#define ORTCHAR_T char /* Linux and macOS: paths are char (ORT 1.x) */

/* Opaque handles (ORT 1.x). */
typedef struct OrtApi OrtApi;
typedef struct OrtStatus OrtStatus;
typedef struct OrtEnv OrtEnv;
typedef struct OrtSession OrtSession;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtRunOptions OrtRunOptions;
typedef struct OrtValue OrtValue;
typedef struct OrtMemoryInfo OrtMemoryInfo;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef struct OrtCUDAProviderOptionsV2 OrtCUDAProviderOptionsV2;
typedef struct OrtCUDAProviderOptions OrtCUDAProviderOptions; /* only its first member is read: int device_id */

/* The allocator interface: its first four members (ORT 1.0 on; later members are appended). */
typedef struct OrtAllocator {
  uint32_t version;
  void* (*Alloc)(struct OrtAllocator* self, size_t size);
  void (*Free)(struct OrtAllocator* self, void* p);
  const OrtMemoryInfo* (*Info)(const struct OrtAllocator* self);
} OrtAllocator;

typedef struct OrtApiBase {
  const OrtApi* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)(void);
} OrtApiBase;

/* Status codes (ORT 1.0; ORT_EP_FAIL from ORT 1.8). */
typedef enum OrtErrorCode {
  ORT_OK = 0,
  ORT_FAIL = 1,
  ORT_INVALID_ARGUMENT = 2,
  ORT_NO_SUCHFILE = 3,
  ORT_NO_MODEL = 4,
  ORT_ENGINE_ERROR = 5,
  ORT_RUNTIME_EXCEPTION = 6,
  ORT_INVALID_PROTOBUF = 7,
  ORT_MODEL_LOADED = 8,
  ORT_NOT_IMPLEMENTED = 9,
  ORT_INVALID_GRAPH = 10,
  ORT_EP_FAIL = 11
} OrtErrorCode;

/* Tensor element types: ONNX TensorProto numbering (ORT 1.0; BFLOAT16 = 16 from ORT 1.2). */
typedef enum ONNXTensorElementDataType {
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED = 0,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT = 1,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 = 2,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 = 3,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16 = 4,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16 = 5,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 = 6,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 = 7,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING = 8,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL = 9,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 = 10,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE = 11,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32 = 12,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64 = 13,
  ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16 = 16
} ONNXTensorElementDataType;

typedef enum OrtLoggingLevel { /* ORT 1.0 */
  ORT_LOGGING_LEVEL_VERBOSE = 0,
  ORT_LOGGING_LEVEL_INFO = 1,
  ORT_LOGGING_LEVEL_WARNING = 2,
  ORT_LOGGING_LEVEL_ERROR = 3,
  ORT_LOGGING_LEVEL_FATAL = 4
} OrtLoggingLevel;

typedef enum OrtAllocatorType { OrtDeviceAllocator = 0, OrtArenaAllocator = 1 } OrtAllocatorType; /* ORT 1.0 */
typedef enum OrtMemType { OrtMemTypeCPUOutput = -1, OrtMemTypeDefault = 0 } OrtMemType;            /* ORT 1.0 */

/* Custom operators (ORT 1.0; members appended by ORT_API_VERSION as noted): what a custom-op library gives. */
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtShapeInferContext OrtShapeInferContext;
typedef enum OrtCustomOpInputOutputCharacteristic {
  INPUT_OUTPUT_REQUIRED = 0,
  INPUT_OUTPUT_OPTIONAL,
  INPUT_OUTPUT_VARIADIC
} OrtCustomOpInputOutputCharacteristic;
typedef struct OrtCustomOp {
  uint32_t version; /* the ORT_API_VERSION the op was written for: says which members below exist */
  void* (*CreateKernel)(const struct OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info);
  const char* (*GetName)(const struct OrtCustomOp* op);
  const char* (*GetExecutionProviderType)(const struct OrtCustomOp* op);
  ONNXTensorElementDataType (*GetInputType)(const struct OrtCustomOp* op, size_t index);
  size_t (*GetInputTypeCount)(const struct OrtCustomOp* op);
  ONNXTensorElementDataType (*GetOutputType)(const struct OrtCustomOp* op, size_t index);
  size_t (*GetOutputTypeCount)(const struct OrtCustomOp* op);
  void (*KernelCompute)(void* op_kernel, OrtKernelContext* context);
  void (*KernelDestroy)(void* op_kernel);
  OrtCustomOpInputOutputCharacteristic (*GetInputCharacteristic)(const struct OrtCustomOp* op, size_t index);
  OrtCustomOpInputOutputCharacteristic (*GetOutputCharacteristic)(const struct OrtCustomOp* op, size_t index);
  OrtMemType (*GetInputMemoryType)(const struct OrtCustomOp* op, size_t index);          /* version 8 */
  int (*GetVariadicInputMinArity)(const struct OrtCustomOp* op);                         /* version 14 */
  int (*GetVariadicInputHomogeneity)(const struct OrtCustomOp* op);
  int (*GetVariadicOutputMinArity)(const struct OrtCustomOp* op);
  int (*GetVariadicOutputHomogeneity)(const struct OrtCustomOp* op);
  OrtStatus* (*CreateKernelV2)(const struct OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                               void** kernel);                                           /* version 16 */
  OrtStatus* (*KernelComputeV2)(void* op_kernel, OrtKernelContext* context);
  OrtStatus* (*InferOutputShapeFn)(const struct OrtCustomOp* op, OrtShapeInferContext* context); /* version 17 */
  int (*GetStartVersion)(const struct OrtCustomOp* op);
  int (*GetEndVersion)(const struct OrtCustomOp* op);
} OrtCustomOp;
#endif /* ORT_API2_STATUS */

/* The version from which OrtCustomOp has CreateKernelV2 and KernelComputeV2. */
#define OTT_CUSTOM_OP_V2_VERSION 16

/* Positions of the OrtApi members used (index into the table of function pointers). */
enum OttOrtApiIndex {
  OTT_ORT_CreateStatus = 0,
  OTT_ORT_GetErrorCode = 1,
  OTT_ORT_GetErrorMessage = 2,
  OTT_ORT_CreateEnv = 3,
  OTT_ORT_CreateSession = 7,
  OTT_ORT_CreateSessionFromArray = 8,
  OTT_ORT_Run = 9,
  OTT_ORT_CreateSessionOptions = 10,
  OTT_ORT_CloneSessionOptions = 12,
  OTT_ORT_SetIntraOpNumThreads = 24,
  OTT_ORT_CreateCustomOpDomain = 26,
  OTT_ORT_CustomOpDomain_Add = 27,
  OTT_ORT_AddCustomOpDomain = 28,
  OTT_ORT_RegisterCustomOpsLibrary = 29,
  OTT_ORT_SessionGetInputCount = 30,
  OTT_ORT_SessionGetOutputCount = 31,
  OTT_ORT_SessionGetInputName = 36,
  OTT_ORT_SessionGetOutputName = 37,
  OTT_ORT_CreateRunOptions = 39,
  OTT_ORT_RunOptionsSetRunTag = 42,
  OTT_ORT_RunOptionsGetRunTag = 45,
  OTT_ORT_RunOptionsSetTerminate = 46,
  OTT_ORT_RunOptionsUnsetTerminate = 47,
  OTT_ORT_CreateTensorAsOrtValue = 48,
  OTT_ORT_CreateTensorWithDataAsOrtValue = 49,
  OTT_ORT_IsTensor = 50,
  OTT_ORT_GetTensorMutableData = 51,
  OTT_ORT_CreateTensorTypeAndShapeInfo = 57,
  OTT_ORT_SetTensorElementType = 58,
  OTT_ORT_SetDimensions = 59,
  OTT_ORT_GetTensorElementType = 60,
  OTT_ORT_GetDimensionsCount = 61,
  OTT_ORT_GetDimensions = 62,
  OTT_ORT_GetTensorShapeElementCount = 64,
  OTT_ORT_GetTensorTypeAndShape = 65,
  OTT_ORT_CreateMemoryInfo = 68,
  OTT_ORT_CreateCpuMemoryInfo = 69,
  OTT_ORT_MemoryInfoGetName = 71,
  OTT_ORT_MemoryInfoGetId = 72,
  OTT_ORT_AllocatorAlloc = 75,
  OTT_ORT_AllocatorFree = 76,
  OTT_ORT_GetAllocatorWithDefaultOptions = 78,
  OTT_ORT_KernelInfoGetAttribute_float = 85,
  OTT_ORT_KernelInfoGetAttribute_int64 = 86,
  OTT_ORT_KernelInfoGetAttribute_string = 87,
  OTT_ORT_KernelContext_GetInputCount = 88,
  OTT_ORT_KernelContext_GetOutputCount = 89,
  OTT_ORT_KernelContext_GetInput = 90,
  OTT_ORT_KernelContext_GetOutput = 91,
  OTT_ORT_ReleaseEnv = 92,
  OTT_ORT_ReleaseStatus = 93,
  OTT_ORT_ReleaseMemoryInfo = 94,
  OTT_ORT_ReleaseSession = 95,
  OTT_ORT_ReleaseValue = 96,
  OTT_ORT_ReleaseRunOptions = 97,
  OTT_ORT_ReleaseTensorTypeAndShapeInfo = 99,
  OTT_ORT_ReleaseSessionOptions = 100,
  OTT_ORT_ReleaseCustomOpDomain = 101,
  OTT_ORT_AddSessionConfigEntry = 130,
  OTT_ORT_SessionOptionsAppendExecutionProvider_CUDA = 152,
  OTT_ORT_KernelInfoGetAttributeArray_float = 162,
  OTT_ORT_KernelInfoGetAttributeArray_int64 = 163,
  OTT_ORT_GetTensorMemoryInfo = 194,
  OTT_ORT_SessionOptionsAppendExecutionProvider_CUDA_V2 = 204,
  OTT_ORT_GetCUDAProviderOptionsAsString = 207,
  OTT_ORT_GetTrainingApi = 219,
  OTT_ORT_RegisterCustomOpsLibrary_V2 = 228,
  OTT_ORT_RegisterCustomOpsUsingFunction = 229,
  OTT_ORT_KernelInfo_GetInputCount = 230,
  OTT_ORT_KernelInfo_GetOutputCount = 231,
  OTT_ORT_KernelInfoGetAttribute_tensor = 236,
  OTT_ORT_HasSessionConfigEntry = 237,
  OTT_ORT_GetSessionConfigEntry = 238,
  OTT_ORT_KNOWN_MEMBERS = 239 /* members up to and including GetSessionConfigEntry */
};

struct OrtTrainingApi;

/* The signatures of those members (ORT 1.x, unchanged since each was added). */
typedef OrtStatus* (*OttFn_CreateStatus)(OrtErrorCode code, const char* msg);
typedef OrtErrorCode (*OttFn_GetErrorCode)(const OrtStatus* status);
typedef const char* (*OttFn_GetErrorMessage)(const OrtStatus* status);
typedef OrtStatus* (*OttFn_CreateEnv)(OrtLoggingLevel level, const char* logid, OrtEnv** out);
typedef OrtStatus* (*OttFn_CreateSession)(const OrtEnv* env, const ORTCHAR_T* path, const OrtSessionOptions* options,
                                          OrtSession** out);
typedef OrtStatus* (*OttFn_CreateSessionFromArray)(const OrtEnv* env, const void* model_data, size_t model_data_length,
                                                   const OrtSessionOptions* options, OrtSession** out);
typedef OrtStatus* (*OttFn_CreateRunOptions)(OrtRunOptions** out);
typedef OrtStatus* (*OttFn_RunOptionsSetRunTag)(OrtRunOptions* options, const char* run_tag);
typedef OrtStatus* (*OttFn_RunOptionsGetRunTag)(const OrtRunOptions* options, const char** run_tag);
typedef OrtStatus* (*OttFn_RunOptionsSetTerminate)(OrtRunOptions* options);
typedef OrtStatus* (*OttFn_RunOptionsUnsetTerminate)(OrtRunOptions* options);
typedef void (*OttFn_ReleaseRunOptions)(OrtRunOptions* p);
typedef OrtStatus* (*OttFn_Run)(OrtSession* session, const OrtRunOptions* run_options, const char* const* input_names,
                                const OrtValue* const* inputs, size_t input_len, const char* const* output_names,
                                size_t output_names_len, OrtValue** outputs);
typedef OrtStatus* (*OttFn_CreateSessionOptions)(OrtSessionOptions** out);
typedef OrtStatus* (*OttFn_SetIntraOpNumThreads)(OrtSessionOptions* options, int threads);
typedef OrtStatus* (*OttFn_SessionGetInputCount)(const OrtSession* session, size_t* out);
typedef OrtStatus* (*OttFn_SessionGetOutputCount)(const OrtSession* session, size_t* out);
typedef OrtStatus* (*OttFn_SessionGetInputName)(const OrtSession* session, size_t index, OrtAllocator* allocator,
                                                char** value);
typedef OrtStatus* (*OttFn_SessionGetOutputName)(const OrtSession* session, size_t index, OrtAllocator* allocator,
                                                 char** value);
typedef OrtStatus* (*OttFn_CreateTensorAsOrtValue)(OrtAllocator* allocator, const int64_t* shape, size_t shape_len,
                                                   ONNXTensorElementDataType type, OrtValue** out);
typedef OrtStatus* (*OttFn_CreateTensorWithDataAsOrtValue)(const OrtMemoryInfo* info, void* data, size_t data_len,
                                                           const int64_t* shape, size_t shape_len,
                                                           ONNXTensorElementDataType type, OrtValue** out);
typedef OrtStatus* (*OttFn_IsTensor)(const OrtValue* value, int* out);
typedef OrtStatus* (*OttFn_GetTensorMutableData)(OrtValue* value, void** out);
typedef OrtStatus* (*OttFn_CreateTensorTypeAndShapeInfo)(OrtTensorTypeAndShapeInfo** out);
typedef OrtStatus* (*OttFn_SetTensorElementType)(OrtTensorTypeAndShapeInfo* info, ONNXTensorElementDataType type);
typedef OrtStatus* (*OttFn_SetDimensions)(OrtTensorTypeAndShapeInfo* info, const int64_t* dims, size_t count);
typedef OrtStatus* (*OttFn_GetTensorElementType)(const OrtTensorTypeAndShapeInfo* info,
                                                 ONNXTensorElementDataType* out);
typedef OrtStatus* (*OttFn_GetDimensionsCount)(const OrtTensorTypeAndShapeInfo* info, size_t* out);
typedef OrtStatus* (*OttFn_GetDimensions)(const OrtTensorTypeAndShapeInfo* info, int64_t* dims, size_t length);
typedef OrtStatus* (*OttFn_GetTensorShapeElementCount)(const OrtTensorTypeAndShapeInfo* info, size_t* out);
typedef OrtStatus* (*OttFn_GetTensorTypeAndShape)(const OrtValue* value, OrtTensorTypeAndShapeInfo** out);
typedef OrtStatus* (*OttFn_CreateMemoryInfo)(const char* name, OrtAllocatorType type, int id, OrtMemType mem_type,
                                             OrtMemoryInfo** out);
typedef OrtStatus* (*OttFn_CreateCpuMemoryInfo)(OrtAllocatorType type, OrtMemType mem_type, OrtMemoryInfo** out);
typedef OrtStatus* (*OttFn_MemoryInfoGetName)(const OrtMemoryInfo* info, const char** out);
typedef OrtStatus* (*OttFn_MemoryInfoGetId)(const OrtMemoryInfo* info, int* out);
typedef OrtStatus* (*OttFn_AllocatorAlloc)(OrtAllocator* allocator, size_t size, void** out);
typedef OrtStatus* (*OttFn_AllocatorFree)(OrtAllocator* allocator, void* p);
typedef OrtStatus* (*OttFn_GetAllocatorWithDefaultOptions)(OrtAllocator** out);
typedef void (*OttFn_ReleaseEnv)(OrtEnv* p);
typedef void (*OttFn_ReleaseStatus)(OrtStatus* p);
typedef void (*OttFn_ReleaseMemoryInfo)(OrtMemoryInfo* p);
typedef void (*OttFn_ReleaseSession)(OrtSession* p);
typedef void (*OttFn_ReleaseValue)(OrtValue* p);
typedef void (*OttFn_ReleaseTensorTypeAndShapeInfo)(OrtTensorTypeAndShapeInfo* p);
typedef void (*OttFn_ReleaseSessionOptions)(OrtSessionOptions* p);
typedef OrtStatus* (*OttFn_AddSessionConfigEntry)(OrtSessionOptions* options, const char* key, const char* value);
typedef OrtStatus* (*OttFn_SessionOptionsAppendExecutionProvider_CUDA)(OrtSessionOptions* options,
                                                                      const OrtCUDAProviderOptions* cuda_options);
typedef OrtStatus* (*OttFn_GetTensorMemoryInfo)(const OrtValue* value, const OrtMemoryInfo** out);
typedef OrtStatus* (*OttFn_SessionOptionsAppendExecutionProvider_CUDA_V2)(OrtSessionOptions* options,
                                                                         const OrtCUDAProviderOptionsV2* cuda_options);
typedef OrtStatus* (*OttFn_GetCUDAProviderOptionsAsString)(const OrtCUDAProviderOptionsV2* cuda_options,
                                                          OrtAllocator* allocator, char** out);
typedef const struct OrtTrainingApi* (*OttFn_GetTrainingApi)(uint32_t version);
typedef OrtStatus* (*OttFn_CloneSessionOptions)(const OrtSessionOptions* in_options, OrtSessionOptions** out_options);
typedef OrtStatus* (*OttFn_CreateCustomOpDomain)(const char* domain, OrtCustomOpDomain** out);
typedef OrtStatus* (*OttFn_CustomOpDomain_Add)(OrtCustomOpDomain* domain, const OrtCustomOp* op);
typedef OrtStatus* (*OttFn_AddCustomOpDomain)(OrtSessionOptions* options, OrtCustomOpDomain* domain);
typedef OrtStatus* (*OttFn_RegisterCustomOpsLibrary)(OrtSessionOptions* options, const char* library_path,
                                                     void** library_handle);
typedef OrtStatus* (*OttFn_RegisterCustomOpsLibrary_V2)(OrtSessionOptions* options, const ORTCHAR_T* library_name);
typedef OrtStatus* (*OttFn_RegisterCustomOpsUsingFunction)(OrtSessionOptions* options,
                                                           const char* registration_func_name);
typedef void (*OttFn_ReleaseCustomOpDomain)(OrtCustomOpDomain* p);
typedef OrtStatus* (*OttFn_KernelInfoGetAttribute_float)(const OrtKernelInfo* info, const char* name, float* out);
typedef OrtStatus* (*OttFn_KernelInfoGetAttribute_int64)(const OrtKernelInfo* info, const char* name, int64_t* out);
typedef OrtStatus* (*OttFn_KernelInfoGetAttribute_string)(const OrtKernelInfo* info, const char* name, char* out,
                                                          size_t* size);
typedef OrtStatus* (*OttFn_KernelInfoGetAttributeArray_float)(const OrtKernelInfo* info, const char* name,
                                                              float* out, size_t* size);
typedef OrtStatus* (*OttFn_KernelInfoGetAttributeArray_int64)(const OrtKernelInfo* info, const char* name,
                                                              int64_t* out, size_t* size);
typedef OrtStatus* (*OttFn_KernelInfo_GetInputCount)(const OrtKernelInfo* info, size_t* out);
typedef OrtStatus* (*OttFn_KernelInfo_GetOutputCount)(const OrtKernelInfo* info, size_t* out);
typedef OrtStatus* (*OttFn_KernelInfoGetAttribute_tensor)(const OrtKernelInfo* info, const char* name,
                                                          OrtAllocator* allocator, OrtValue** out);
typedef OrtStatus* (*OttFn_KernelContext_GetInputCount)(const OrtKernelContext* context, size_t* out);
typedef OrtStatus* (*OttFn_KernelContext_GetOutputCount)(const OrtKernelContext* context, size_t* out);
typedef OrtStatus* (*OttFn_KernelContext_GetInput)(const OrtKernelContext* context, size_t index,
                                                   const OrtValue** out);
typedef OrtStatus* (*OttFn_KernelContext_GetOutput)(OrtKernelContext* context, size_t index, const int64_t* dim_values,
                                                    size_t dim_count, OrtValue** out);
/* What a custom-op library exports (RegisterCustomOpsLibrary looks it up by this name). */
typedef OrtStatus* (*OttFn_RegisterCustomOps)(OrtSessionOptions* options, const OrtApiBase* api);
typedef OrtStatus* (*OttFn_HasSessionConfigEntry)(const OrtSessionOptions* options, const char* key, int* out);
typedef OrtStatus* (*OttFn_GetSessionConfigEntry)(const OrtSessionOptions* options, const char* key, char* value,
                                                  size_t* size);

/* OTT_ORT(api, Name)(args...): call OrtApi member Name of the table api. */
#define OTT_ORT_SLOT(api, index) (((void* const*)(const void*)(api))[index])
#define OTT_ORT(api, Name) ((OttFn_##Name)OTT_ORT_SLOT(api, OTT_ORT_##Name))

#ifndef ORT_API2_STATUS
/* ONNX Runtime's entry point, exported by libonnxruntime (and by libort_torch_train, which forwards it). */
const OrtApiBase* OrtGetApiBase(void);
#endif

#ifdef __cplusplus
}
#endif

#endif /* ORT_TORCH_TRAIN_ORT_ABI_H */
