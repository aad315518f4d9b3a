// The part of ONNX Runtime's C++ core API (namespace Ort) that training programs call, for where ONNX
// Runtime's own onnxruntime_cxx_api.h is not installed; ort_torch_train_training_cxx_api.h includes it then.
// Each class and member has the name and signature of ONNX Runtime's, so a program written against ORT's
// header compiles against this subset: Exception, ThrowOnError, detail::Base, Env, SessionOptions,
// MemoryInfo, AllocatorWithDefaultOptions, TensorTypeAndShapeInfo, Value, RunOptions, Session. Written over
// ONNX Runtime's C table (ort_torch_train_ort_abi.h); errors throw Ort::Exception with ORT's code.
#ifndef ORT_TORCH_TRAIN_CORE_CXX_API_H
#define ORT_TORCH_TRAIN_CORE_CXX_API_H

// the standard headers ONNX Runtime's C++ header brings in, which programs written against it rely on
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ort_torch_train_training_c_api.h"

namespace Ort {

inline const OrtApi& GetApi() {
  static const OrtApi* api = OrtGetApiBase()->GetApi(ORT_API_VERSION);
  return *api;
}

class Exception : public std::exception {
 public:
  Exception(std::string&& message, OrtErrorCode code) : message_(std::move(message)), code_(code) {}
  OrtErrorCode GetOrtErrorCode() const { return code_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
  OrtErrorCode code_;
};

inline void ThrowOnError(OrtStatus* status) {
  if (status == nullptr) return;
  std::string message = OTT_ORT(&GetApi(), GetErrorMessage)(status);
  OrtErrorCode code = OTT_ORT(&GetApi(), GetErrorCode)(status);
  OTT_ORT(&GetApi(), ReleaseStatus)(status);
  throw Exception(std::move(message), code);
}

namespace detail {
inline void OrtRelease(OrtEnv* p) { OTT_ORT(&GetApi(), ReleaseEnv)(p); }
inline void OrtRelease(OrtSessionOptions* p) { OTT_ORT(&GetApi(), ReleaseSessionOptions)(p); }
inline void OrtRelease(OrtMemoryInfo* p) { OTT_ORT(&GetApi(), ReleaseMemoryInfo)(p); }
inline void OrtRelease(OrtValue* p) { OTT_ORT(&GetApi(), ReleaseValue)(p); }
inline void OrtRelease(OrtSession* p) { OTT_ORT(&GetApi(), ReleaseSession)(p); }
inline void OrtRelease(OrtRunOptions* p) { OTT_ORT(&GetApi(), ReleaseRunOptions)(p); }
inline void OrtRelease(OrtTensorTypeAndShapeInfo* p) { OTT_ORT(&GetApi(), ReleaseTensorTypeAndShapeInfo)(p); }
void OrtRelease(OrtCheckpointState* p);  // defined with the training classes
void OrtRelease(OrtTrainingSession* p);

// Owns one C handle (move-only), released by the OrtRelease for its type.
template <typename T>
struct Base {
  using contained_type = T;
  Base() = default;
  explicit Base(contained_type* p) noexcept : p_(p) {}
  ~Base() { OrtRelease(p_); }
  Base(const Base&) = delete;
  Base& operator=(const Base&) = delete;
  Base(Base&& other) noexcept : p_(std::exchange(other.p_, nullptr)) {}
  Base& operator=(Base&& other) noexcept {
    if (this != &other) {
      OrtRelease(p_);
      p_ = std::exchange(other.p_, nullptr);
    }
    return *this;
  }
  constexpr operator contained_type*() const noexcept { return p_; }
  contained_type* release() { return std::exchange(p_, nullptr); }

 protected:
  contained_type* p_ = nullptr;
};

template <typename T>
constexpr ONNXTensorElementDataType ElementType();
template <> constexpr ONNXTensorElementDataType ElementType<float>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
template <> constexpr ONNXTensorElementDataType ElementType<double>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE; }
template <> constexpr ONNXTensorElementDataType ElementType<int8_t>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8; }
template <> constexpr ONNXTensorElementDataType ElementType<uint8_t>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8; }
template <> constexpr ONNXTensorElementDataType ElementType<int16_t>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16; }
template <> constexpr ONNXTensorElementDataType ElementType<uint16_t>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16; }
template <> constexpr ONNXTensorElementDataType ElementType<int32_t>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32; }
template <> constexpr ONNXTensorElementDataType ElementType<uint32_t>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32; }
template <> constexpr ONNXTensorElementDataType ElementType<int64_t>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64; }
template <> constexpr ONNXTensorElementDataType ElementType<uint64_t>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64; }
template <> constexpr ONNXTensorElementDataType ElementType<bool>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL; }
}  // namespace detail

struct Env : detail::Base<OrtEnv> {
  explicit Env(OrtLoggingLevel logging_level = ORT_LOGGING_LEVEL_WARNING, const char* logid = "") {
    ThrowOnError(OTT_ORT(&GetApi(), CreateEnv)(logging_level, logid, &p_));
  }
};

struct SessionOptions : detail::Base<OrtSessionOptions> {
  SessionOptions() { ThrowOnError(OTT_ORT(&GetApi(), CreateSessionOptions)(&p_)); }
  SessionOptions& AddConfigEntry(const char* config_key, const char* config_value) {
    ThrowOnError(OTT_ORT(&GetApi(), AddSessionConfigEntry)(p_, config_key, config_value));
    return *this;
  }
  SessionOptions& SetIntraOpNumThreads(int intra_op_num_threads) {
    ThrowOnError(OTT_ORT(&GetApi(), SetIntraOpNumThreads)(p_, intra_op_num_threads));
    return *this;
  }
};

struct MemoryInfo : detail::Base<OrtMemoryInfo> {
  explicit MemoryInfo(OrtMemoryInfo* p) : Base(p) {}
  MemoryInfo(const char* name, OrtAllocatorType type, int id, OrtMemType mem_type) {
    ThrowOnError(OTT_ORT(&GetApi(), CreateMemoryInfo)(name, type, id, mem_type, &p_));
  }
  static MemoryInfo CreateCpu(OrtAllocatorType type, OrtMemType mem_type) {
    OrtMemoryInfo* p = nullptr;
    ThrowOnError(OTT_ORT(&GetApi(), CreateCpuMemoryInfo)(type, mem_type, &p));
    return MemoryInfo(p);
  }
};

// ONNX Runtime's default CPU allocator (owned by ONNX Runtime: nothing to release).
struct AllocatorWithDefaultOptions {
  AllocatorWithDefaultOptions() { ThrowOnError(OTT_ORT(&GetApi(), GetAllocatorWithDefaultOptions)(&p_)); }
  operator OrtAllocator*() const { return p_; }
  void* Alloc(size_t size) {
    void* out = nullptr;
    ThrowOnError(OTT_ORT(&GetApi(), AllocatorAlloc)(p_, size, &out));
    return out;
  }
  void Free(void* p) { ThrowOnError(OTT_ORT(&GetApi(), AllocatorFree)(p_, p)); }

 private:
  OrtAllocator* p_ = nullptr;
};

struct TensorTypeAndShapeInfo : detail::Base<OrtTensorTypeAndShapeInfo> {
  explicit TensorTypeAndShapeInfo(OrtTensorTypeAndShapeInfo* p) : Base(p) {}
  ONNXTensorElementDataType GetElementType() const {
    ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    ThrowOnError(OTT_ORT(&GetApi(), GetTensorElementType)(p_, &type));
    return type;
  }
  size_t GetElementCount() const {
    size_t count = 0;
    ThrowOnError(OTT_ORT(&GetApi(), GetTensorShapeElementCount)(p_, &count));
    return count;
  }
  size_t GetDimensionsCount() const {
    size_t rank = 0;
    ThrowOnError(OTT_ORT(&GetApi(), GetDimensionsCount)(p_, &rank));
    return rank;
  }
  std::vector<int64_t> GetShape() const {
    std::vector<int64_t> shape(GetDimensionsCount());
    ThrowOnError(OTT_ORT(&GetApi(), GetDimensions)(p_, shape.data(), shape.size()));
    return shape;
  }
};

struct Value : detail::Base<OrtValue> {
  explicit Value(std::nullptr_t = nullptr) {}
  explicit Value(OrtValue* p) : Base(p) {}
  // A tensor over the caller's memory (not copied): typed, and with its element type given.
  template <typename T>
  static Value CreateTensor(const OrtMemoryInfo* info, T* p_data, size_t p_data_element_count, const int64_t* shape,
                            size_t shape_len) {
    return CreateTensor(info, p_data, p_data_element_count * sizeof(T), shape, shape_len, detail::ElementType<T>());
  }
  static Value CreateTensor(const OrtMemoryInfo* info, void* p_data, size_t p_data_byte_count, const int64_t* shape,
                            size_t shape_len, ONNXTensorElementDataType type) {
    OrtValue* p = nullptr;
    ThrowOnError(OTT_ORT(&GetApi(), CreateTensorWithDataAsOrtValue)(info, p_data, p_data_byte_count, shape, shape_len,
                                                                     type, &p));
    return Value(p);
  }
  // A tensor in memory from `allocator`.
  template <typename T>
  static Value CreateTensor(OrtAllocator* allocator, const int64_t* shape, size_t shape_len) {
    return CreateTensor(allocator, shape, shape_len, detail::ElementType<T>());
  }
  static Value CreateTensor(OrtAllocator* allocator, const int64_t* shape, size_t shape_len,
                            ONNXTensorElementDataType type) {
    OrtValue* p = nullptr;
    ThrowOnError(OTT_ORT(&GetApi(), CreateTensorAsOrtValue)(allocator, shape, shape_len, type, &p));
    return Value(p);
  }
  bool IsTensor() const {
    int out = 0;
    ThrowOnError(OTT_ORT(&GetApi(), IsTensor)(p_, &out));
    return out != 0;
  }
  TensorTypeAndShapeInfo GetTensorTypeAndShapeInfo() const {
    OrtTensorTypeAndShapeInfo* info = nullptr;
    ThrowOnError(OTT_ORT(&GetApi(), GetTensorTypeAndShape)(p_, &info));
    return TensorTypeAndShapeInfo(info);
  }
  template <typename T>
  T* GetTensorMutableData() {
    void* data = nullptr;
    ThrowOnError(OTT_ORT(&GetApi(), GetTensorMutableData)(p_, &data));
    return static_cast<T*>(data);
  }
  template <typename T>
  const T* GetTensorData() const {
    void* data = nullptr;
    ThrowOnError(OTT_ORT(&GetApi(), GetTensorMutableData)(p_, &data));
    return static_cast<const T*>(data);
  }
};

struct RunOptions : detail::Base<OrtRunOptions> {
  explicit RunOptions(std::nullptr_t) {}
  RunOptions() { ThrowOnError(OTT_ORT(&GetApi(), CreateRunOptions)(&p_)); }
  RunOptions& SetRunTag(const char* run_tag) {
    ThrowOnError(OTT_ORT(&GetApi(), RunOptionsSetRunTag)(p_, run_tag));
    return *this;
  }
  const char* GetRunTag() const {
    const char* tag = nullptr;
    ThrowOnError(OTT_ORT(&GetApi(), RunOptionsGetRunTag)(p_, &tag));
    return tag;
  }
  RunOptions& SetTerminate() {
    ThrowOnError(OTT_ORT(&GetApi(), RunOptionsSetTerminate)(p_));
    return *this;
  }
  RunOptions& UnsetTerminate() {
    ThrowOnError(OTT_ORT(&GetApi(), RunOptionsUnsetTerminate)(p_));
    return *this;
  }
};

// ONNX Runtime's inference session (an exported model runs in ONNX Runtime itself).
struct Session : detail::Base<OrtSession> {
  explicit Session(std::nullptr_t) {}
  Session(const Env& env, const ORTCHAR_T* model_path, const SessionOptions& options) {
    ThrowOnError(OTT_ORT(&GetApi(), CreateSession)(env, model_path, options, &p_));
  }
  Session(const Env& env, const void* model_data, size_t model_data_length, const SessionOptions& options) {
    ThrowOnError(OTT_ORT(&GetApi(), CreateSessionFromArray)(env, model_data, model_data_length, options, &p_));
  }
  size_t GetInputCount() const {
    size_t count = 0;
    ThrowOnError(OTT_ORT(&GetApi(), SessionGetInputCount)(p_, &count));
    return count;
  }
  size_t GetOutputCount() const {
    size_t count = 0;
    ThrowOnError(OTT_ORT(&GetApi(), SessionGetOutputCount)(p_, &count));
    return count;
  }
  std::vector<Value> Run(const RunOptions& run_options, const char* const* input_names, const Value* input_values,
                         size_t input_count, const char* const* output_names, size_t output_count) {
    std::vector<Value> outputs;
    for (size_t i = 0; i < output_count; i++) outputs.emplace_back(nullptr);
    Run(run_options, input_names, input_values, input_count, output_names, outputs.data(), output_count);
    return outputs;
  }
  // Into `output_values`: the caller's tensors are filled, empty Values receive new ones.
  void Run(const RunOptions& run_options, const char* const* input_names, const Value* input_values,
           size_t input_count, const char* const* output_names, Value* output_values, size_t output_count) {
    std::vector<const OrtValue*> in(input_count);
    for (size_t i = 0; i < input_count; i++) in[i] = input_values[i];
    std::vector<OrtValue*> out(output_count);
    for (size_t i = 0; i < output_count; i++) out[i] = output_values[i];
    ThrowOnError(OTT_ORT(&GetApi(), Run)(p_, run_options, input_names, in.data(), input_count, output_names,
                                         output_count, out.data()));
    for (size_t i = 0; i < output_count; i++)
      if (static_cast<OrtValue*>(output_values[i]) == nullptr) output_values[i] = Value(out[i]);
  }
};

}  // namespace Ort

#endif  // ORT_TORCH_TRAIN_CORE_CXX_API_H
