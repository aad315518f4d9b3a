// The core OrtApi members a training program calls, answered by the packaged runtime itself (no onnxruntime in the
// process): statuses, environments, session and run options, CPU memory info, the default allocator and tensors
// (an OrtValue holds an at::Tensor), and inference sessions over the models it exported (ott_packaged_inference.cpp).
// Every other member of the table is NULL: a program calling one fails at once.
#include <cstdlib>
#include <cstring>

#include "ott_packaged.h"

namespace ott {

OrtStatus* make_status(OrtErrorCode code, const std::string& message) {
  return new (std::nothrow) OrtStatus{code, message};
}

at::ScalarType scalar_type(int32_t type, const std::string& what) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return at::kFloat;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return at::kDouble;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return at::kHalf;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return at::kBFloat16;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return at::kLong;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return at::kInt;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: return at::kShort;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return at::kChar;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return at::kByte;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return at::kBool;
    default: throw invalid_argument(what + ": element type " + std::to_string(type) + " is not supported");
  }
}

ONNXTensorElementDataType onnx_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    case at::kDouble: return ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE;
    case at::kHalf: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
    case at::kBFloat16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
    case at::kLong: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
    case at::kInt: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
    case at::kShort: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16;
    case at::kChar: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
    case at::kByte: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
    case at::kBool: return ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL;
    default: throw Error(ORT_FAIL, std::string("no ONNX element type for ") + c10::toString(type));
  }
}

namespace {
const std::pair<const char*, at::ScalarType> kDtypeNames[] = {
    {"float32", at::kFloat}, {"float64", at::kDouble}, {"float16", at::kHalf}, {"bfloat16", at::kBFloat16},
    {"int64", at::kLong},    {"int32", at::kInt},      {"int16", at::kShort},  {"int8", at::kChar},
    {"uint8", at::kByte},    {"bool", at::kBool}};
}  // namespace

at::ScalarType dtype_named(const std::string& name, const std::string& what) {
  for (const auto& [known, type] : kDtypeNames)
    if (name == known) return type;
  throw Error(ORT_FAIL, what + ": dtype '" + name + "' is not supported");
}

std::string dtype_name(at::ScalarType type) {
  for (const auto& [known, named] : kDtypeNames)
    if (type == named) return known;
  return c10::toString(type);
}

}  // namespace ott

namespace {

using ott::check_allocator;
using ott::guarded;
using ott::invalid_argument;
using ott::make_handle;
using ott::release_handle;
using ott::require;
using ott::resolve;

void* allocator_alloc(OrtAllocator*, size_t size) { return std::malloc(size ? size : 1); }
void allocator_free(OrtAllocator*, void* pointer) { std::free(pointer); }
OrtMemoryInfo cpu_memory{0};
const OrtMemoryInfo* allocator_info(const OrtAllocator*) { return &cpu_memory; }
OrtAllocator default_allocator{1, allocator_alloc, allocator_free, allocator_info};

OrtStatus* CreateStatus(OrtErrorCode code, const char* message) {
  return ott::make_status(code, message ? message : "");
}
OrtErrorCode GetErrorCode(const OrtStatus* status) { return status ? status->code : ORT_OK; }
const char* GetErrorMessage(const OrtStatus* status) { return status ? status->message.c_str() : ""; }
void ReleaseStatus(OrtStatus* status) { delete status; }
OrtStatus* CreateEnv(OrtLoggingLevel, const char*, OrtEnv** out) {
  return guarded([&] { require(out, "out"), *out = make_handle<OrtEnv>(0); });
}
void ReleaseEnv(OrtEnv* env) { release_handle(env, "ReleaseEnv"); }
OrtStatus* CreateSessionOptions(OrtSessionOptions** out) {
  return guarded([&] { require(out, "out"), *out = make_handle<OrtSessionOptions>(0); });
}
void ReleaseSessionOptions(OrtSessionOptions* options) { release_handle(options, "ReleaseSessionOptions"); }
OrtStatus* CreateRunOptions(OrtRunOptions** out) {
  return guarded([&] { require(out, "out"), *out = make_handle<OrtRunOptions>(0); });
}
void ReleaseRunOptions(OrtRunOptions* options) { release_handle(options, "ReleaseRunOptions"); }
OrtStatus* CreateCpuMemoryInfo(OrtAllocatorType, OrtMemType, OrtMemoryInfo** out) {
  return guarded([&] { require(out, "out"), *out = make_handle<OrtMemoryInfo>(0); });
}
void ReleaseMemoryInfo(OrtMemoryInfo* info) {
  if (info != &cpu_memory) release_handle(info, "ReleaseMemoryInfo");  // the allocator's own is never released
}
OrtStatus* GetAllocatorWithDefaultOptions(OrtAllocator** out) {
  return guarded([&] { require(out, "out"), *out = &default_allocator; });
}
OrtStatus* AllocatorFree(OrtAllocator* allocator, void* pointer) {
  return guarded([&] { check_allocator(allocator, "allocator")->Free(allocator, pointer); });
}

std::vector<int64_t> checked_shape(const int64_t* shape, size_t rank) {
  if (rank > 0) require(shape, "shape");
  if (rank > 32) throw invalid_argument("shape: rank " + std::to_string(rank) + " is over 32");
  std::vector<int64_t> dims(shape, shape + rank);
  int64_t count = 1;
  for (int64_t dim : dims) {
    if (dim < 0 || (dim > 0 && count > (int64_t(1) << 48) / dim))
      throw invalid_argument("shape: a dimension is negative or the size overflows");
    count *= dim;
  }
  return dims;
}

OrtStatus* CreateTensorWithDataAsOrtValue(const OrtMemoryInfo* info, void* data, size_t data_len,
                                          const int64_t* shape, size_t rank, ONNXTensorElementDataType type,
                                          OrtValue** out) {
  return guarded([&] {
    resolve(info, "info"), require(out, "out");
    std::vector<int64_t> dims = checked_shape(shape, rank);
    at::ScalarType scalar = ott::scalar_type(ott::enum_value(type), "CreateTensorWithDataAsOrtValue");
    int64_t count = 1;
    for (int64_t dim : dims) count *= dim;
    size_t needed = size_t(count) * at::elementSize(scalar);
    if (data_len < needed)
      throw invalid_argument("CreateTensorWithDataAsOrtValue: data_len " + std::to_string(data_len) +
                             " is less than the shape needs (" + std::to_string(needed) + ")");
    if (needed) require(data, "data");
    *out = make_handle<OrtValue>(at::from_blob(data, dims, at::TensorOptions().dtype(scalar)));
  });
}

OrtStatus* CreateTensorAsOrtValue(OrtAllocator* allocator, const int64_t* shape, size_t rank,
                                  ONNXTensorElementDataType type, OrtValue** out) {
  return guarded([&] {
    check_allocator(allocator, "allocator"), require(out, "out");
    std::vector<int64_t> dims = checked_shape(shape, rank);
    at::ScalarType scalar = ott::scalar_type(ott::enum_value(type), "CreateTensorAsOrtValue");
    *out = make_handle<OrtValue>(at::zeros(dims, at::TensorOptions().dtype(scalar)));
  });
}

OrtStatus* IsTensor(const OrtValue* value, int* out) {
  return guarded([&] { resolve(value, "value"), require(out, "out"), *out = 1; });
}
OrtStatus* GetTensorMutableData(OrtValue* value, void** out) {
  return guarded([&] { resolve(value, "value"), require(out, "out"), *out = value->tensor.data_ptr(); });
}
OrtStatus* GetTensorTypeAndShape(const OrtValue* value, OrtTensorTypeAndShapeInfo** out) {
  return guarded([&] {
    resolve(value, "value"), require(out, "out");
    *out = make_handle<OrtTensorTypeAndShapeInfo>(ott::onnx_type(value->tensor.scalar_type()), value->tensor.sizes().vec());
  });
}
OrtStatus* GetTensorElementType(const OrtTensorTypeAndShapeInfo* info, ONNXTensorElementDataType* out) {
  return guarded([&] { resolve(info, "info"), require(out, "out"), *out = info->type; });
}
OrtStatus* GetDimensionsCount(const OrtTensorTypeAndShapeInfo* info, size_t* out) {
  return guarded([&] { resolve(info, "info"), require(out, "out"), *out = info->dims.size(); });
}
OrtStatus* GetDimensions(const OrtTensorTypeAndShapeInfo* info, int64_t* dims, size_t length) {
  return guarded([&] {
    resolve(info, "info");
    if (length > 0) require(dims, "dims");
    for (size_t i = 0; i < length && i < info->dims.size(); i++) dims[i] = info->dims[i];
  });
}
OrtStatus* GetTensorShapeElementCount(const OrtTensorTypeAndShapeInfo* info, size_t* out) {
  return guarded([&] {
    resolve(info, "info"), require(out, "out");
    size_t count = 1;
    for (int64_t dim : info->dims) count *= size_t(dim);
    *out = count;
  });
}
void ReleaseTensorTypeAndShapeInfo(OrtTensorTypeAndShapeInfo* info) {
  release_handle(info, "ReleaseTensorTypeAndShapeInfo");
}
void ReleaseValue(OrtValue* value) { release_handle(value, "ReleaseValue"); }
const OrtTrainingApi* GetTrainingApi(uint32_t version) { return OrtTorchTrainGetTrainingApi(version); }

struct CoreTable {
  void* slots[OTT_ORT_KNOWN_MEMBERS] = {};
  CoreTable() {
#define OTT_SET(Name) slots[OTT_ORT_##Name] = reinterpret_cast<void*>(&Name)
    OTT_SET(CreateStatus), OTT_SET(GetErrorCode), OTT_SET(GetErrorMessage), OTT_SET(ReleaseStatus);
    OTT_SET(CreateEnv), OTT_SET(ReleaseEnv), OTT_SET(CreateSessionOptions), OTT_SET(ReleaseSessionOptions);
    OTT_SET(CreateRunOptions), OTT_SET(ReleaseRunOptions), OTT_SET(CreateCpuMemoryInfo), OTT_SET(ReleaseMemoryInfo);
    OTT_SET(GetAllocatorWithDefaultOptions), OTT_SET(AllocatorFree), OTT_SET(CreateTensorWithDataAsOrtValue);
    OTT_SET(CreateTensorAsOrtValue), OTT_SET(IsTensor), OTT_SET(GetTensorMutableData), OTT_SET(GetTensorTypeAndShape);
    OTT_SET(GetTensorElementType), OTT_SET(GetDimensionsCount), OTT_SET(GetDimensions);
    OTT_SET(GetTensorShapeElementCount), OTT_SET(ReleaseTensorTypeAndShapeInfo), OTT_SET(ReleaseValue);
    OTT_SET(GetTrainingApi);
#undef OTT_SET
    ott::set_inference_members(slots);
    ott::register_handle(&cpu_memory, ott::Kind::memory_info);  // both live as long as the process
    ott::register_handle(&default_allocator, ott::Kind::allocator);
  }
};

const OrtApi* get_api(uint32_t version) {
  static const CoreTable table;
  return version >= 1 && version <= ORT_API_VERSION ? reinterpret_cast<const OrtApi*>(table.slots) : nullptr;
}
const char* version_string() { return "ort-torch-train packaged runtime"; }
const OrtApiBase api_base{get_api, version_string};

}  // namespace

extern "C" __attribute__((visibility("default"))) const OrtApiBase* OrtGetApiBase(void) { return &api_base; }
