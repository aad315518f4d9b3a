// ONNX Runtime's training C++ API (Ort::TrainingSession, Ort::CheckpointState, Ort::SetSeed) over the
// OrtTrainingApi table of libort_torch_train; header-only. It also holds the few Ort:: core classes these
// use (Env, SessionOptions, MemoryInfo, Value, Session, Exception), written over ONNX Runtime's C table,
// since ONNX Runtime's own C++ headers are not shipped here. Errors throw Ort::Exception, as ORT's do.
#ifndef ORT_TORCH_TRAIN_TRAINING_CXX_API_H
#define ORT_TORCH_TRAIN_TRAINING_CXX_API_H

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "ort_torch_train_training_c_api.h"

namespace Ort {

inline const OrtApi& GetApi() {
  static const OrtApi* api = OrtGetApiBase()->GetApi(ORT_API_VERSION);
  return *api;
}

inline const OrtTrainingApi& GetTrainingApi() {
  static const OrtTrainingApi* api = OrtTorchTrainGetTrainingApi(ORT_API_VERSION);
  return *api;
}

class Exception : public std::runtime_error {
 public:
  Exception(std::string message, OrtErrorCode code) : std::runtime_error(std::move(message)), code_(code) {}
  OrtErrorCode GetOrtErrorCode() const { return code_; }

 private:
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
// Owns one C handle; move-only, released by Release.
template <typename T, void (*Release)(T*)>
class Owner {
 public:
  Owner() = default;
  explicit Owner(T* p) : p_(p) {}
  Owner(const Owner&) = delete;
  Owner& operator=(const Owner&) = delete;
  Owner(Owner&& other) noexcept : p_(std::exchange(other.p_, nullptr)) {}
  Owner& operator=(Owner&& other) noexcept {
    if (this != &other) {
      reset();
      p_ = std::exchange(other.p_, nullptr);
    }
    return *this;
  }
  ~Owner() { reset(); }
  operator T*() const { return p_; }
  T* release() { return std::exchange(p_, nullptr); }

 protected:
  void reset() {
    if (p_ != nullptr) Release(p_);
    p_ = nullptr;
  }
  T* p_ = nullptr;
};

inline void ReleaseEnv(OrtEnv* p) { OTT_ORT(&GetApi(), ReleaseEnv)(p); }
inline void ReleaseSessionOptions(OrtSessionOptions* p) { OTT_ORT(&GetApi(), ReleaseSessionOptions)(p); }
inline void ReleaseMemoryInfo(OrtMemoryInfo* p) { OTT_ORT(&GetApi(), ReleaseMemoryInfo)(p); }
inline void ReleaseValue(OrtValue* p) { OTT_ORT(&GetApi(), ReleaseValue)(p); }
inline void ReleaseSession(OrtSession* p) { OTT_ORT(&GetApi(), ReleaseSession)(p); }
inline void ReleaseTrainingSession(OrtTrainingSession* p) { GetTrainingApi().ReleaseTrainingSession(p); }
inline void ReleaseCheckpointState(OrtCheckpointState* p) { GetTrainingApi().ReleaseCheckpointState(p); }

template <typename T>
constexpr ONNXTensorElementDataType ElementType();
template <> constexpr ONNXTensorElementDataType ElementType<float>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
template <> constexpr ONNXTensorElementDataType ElementType<double>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE; }
template <> constexpr ONNXTensorElementDataType ElementType<int64_t>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64; }
template <> constexpr ONNXTensorElementDataType ElementType<int32_t>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32; }
template <> constexpr ONNXTensorElementDataType ElementType<uint8_t>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8; }
template <> constexpr ONNXTensorElementDataType ElementType<bool>() { return ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL; }
}  // namespace detail

class Env : public detail::Owner<OrtEnv, detail::ReleaseEnv> {
 public:
  explicit Env(OrtLoggingLevel level = ORT_LOGGING_LEVEL_WARNING, const char* logid = "") {
    ThrowOnError(OTT_ORT(&GetApi(), CreateEnv)(level, logid, &p_));
  }
};

class SessionOptions : public detail::Owner<OrtSessionOptions, detail::ReleaseSessionOptions> {
 public:
  SessionOptions() { ThrowOnError(OTT_ORT(&GetApi(), CreateSessionOptions)(&p_)); }
  SessionOptions& AddConfigEntry(const char* key, const char* value) {
    ThrowOnError(OTT_ORT(&GetApi(), AddSessionConfigEntry)(p_, key, value));
    return *this;
  }
  SessionOptions& SetIntraOpNumThreads(int threads) {
    ThrowOnError(OTT_ORT(&GetApi(), SetIntraOpNumThreads)(p_, threads));
    return *this;
  }
};

class MemoryInfo : public detail::Owner<OrtMemoryInfo, detail::ReleaseMemoryInfo> {
 public:
  explicit MemoryInfo(OrtMemoryInfo* p) : Owner(p) {}
  static MemoryInfo CreateCpu(OrtAllocatorType type, OrtMemType mem_type) {
    OrtMemoryInfo* p = nullptr;
    ThrowOnError(OTT_ORT(&GetApi(), CreateCpuMemoryInfo)(type, mem_type, &p));
    return MemoryInfo(p);
  }
};

class Value : public detail::Owner<OrtValue, detail::ReleaseValue> {
 public:
  explicit Value(std::nullptr_t = nullptr) {}
  explicit Value(OrtValue* p) : Owner(p) {}
  // A tensor over the caller's memory (not copied).
  template <typename T>
  static Value CreateTensor(const OrtMemoryInfo* info, T* data, size_t count, const int64_t* shape, size_t rank) {
    OrtValue* p = nullptr;
    ThrowOnError(OTT_ORT(&GetApi(), CreateTensorWithDataAsOrtValue)(info, data, count * sizeof(T), shape, rank,
                                                                     detail::ElementType<T>(), &p));
    return Value(p);
  }
  // A tensor in memory from ONNX Runtime's default allocator.
  template <typename T>
  static Value CreateTensor(const int64_t* shape, size_t rank) {
    OrtAllocator* allocator = nullptr;
    ThrowOnError(OTT_ORT(&GetApi(), GetAllocatorWithDefaultOptions)(&allocator));
    OrtValue* p = nullptr;
    ThrowOnError(OTT_ORT(&GetApi(), CreateTensorAsOrtValue)(allocator, shape, rank, detail::ElementType<T>(), &p));
    return Value(p);
  }
  template <typename T>
  T* GetTensorMutableData() {
    void* data = nullptr;
    ThrowOnError(OTT_ORT(&GetApi(), GetTensorMutableData)(p_, &data));
    return static_cast<T*>(data);
  }
  template <typename T>
  const T* GetTensorData() const {
    return const_cast<Value*>(this)->GetTensorMutableData<T>();
  }
  std::vector<int64_t> GetShape() const {
    OrtTensorTypeAndShapeInfo* info = nullptr;
    ThrowOnError(OTT_ORT(&GetApi(), GetTensorTypeAndShape)(p_, &info));
    size_t rank = 0;
    OrtStatus* status = OTT_ORT(&GetApi(), GetDimensionsCount)(info, &rank);
    std::vector<int64_t> shape(rank);
    if (status == nullptr) status = OTT_ORT(&GetApi(), GetDimensions)(info, shape.data(), rank);
    OTT_ORT(&GetApi(), ReleaseTensorTypeAndShapeInfo)(info);
    ThrowOnError(status);
    return shape;
  }
  size_t GetElementCount() const {
    size_t count = 1;
    for (int64_t dim : GetShape()) count *= static_cast<size_t>(dim);
    return count;
  }
};

// ONNX Runtime's inference session, for running an exported model.
class Session : public detail::Owner<OrtSession, detail::ReleaseSession> {
 public:
  Session(const Env& env, const char* model_path, const SessionOptions& options) {
    ThrowOnError(OTT_ORT(&GetApi(), CreateSession)(env, model_path, options, &p_));
  }
  std::vector<Value> Run(const std::vector<const char*>& input_names, const std::vector<Value>& inputs,
                         const std::vector<const char*>& output_names) {
    std::vector<const OrtValue*> in(inputs.begin(), inputs.end());
    std::vector<OrtValue*> out(output_names.size(), nullptr);
    ThrowOnError(OTT_ORT(&GetApi(), Run)(p_, nullptr, input_names.data(), in.data(), in.size(), output_names.data(),
                                         out.size(), out.data()));
    std::vector<Value> values;
    for (OrtValue* value : out) values.emplace_back(value);
    return values;
  }
};

using Property = std::variant<int64_t, float, std::string>;

inline void SetSeed(const int64_t seed) { ThrowOnError(GetTrainingApi().SetSeed(seed)); }

class CheckpointState : public detail::Owner<OrtCheckpointState, detail::ReleaseCheckpointState> {
 public:
  explicit CheckpointState(OrtCheckpointState* p) : Owner(p) {}

  static CheckpointState LoadCheckpoint(const std::basic_string<ORTCHAR_T>& path) {
    OrtCheckpointState* p = nullptr;
    ThrowOnError(GetTrainingApi().LoadCheckpoint(path.c_str(), &p));
    return CheckpointState(p);
  }
  static CheckpointState LoadCheckpointFromBuffer(const std::vector<uint8_t>& buffer) {
    OrtCheckpointState* p = nullptr;
    ThrowOnError(GetTrainingApi().LoadCheckpointFromBuffer(buffer.data(), buffer.size(), &p));
    return CheckpointState(p);
  }
  static void SaveCheckpoint(const CheckpointState& state, const std::basic_string<ORTCHAR_T>& path,
                             const bool include_optimizer_state = false) {
    ThrowOnError(GetTrainingApi().SaveCheckpoint(state, path.c_str(), include_optimizer_state));
  }
  void AddProperty(const std::string& name, const Property& value) {
    if (auto* number = std::get_if<int64_t>(&value)) {
      int64_t copy = *number;
      ThrowOnError(GetTrainingApi().AddProperty(p_, name.c_str(), OrtIntProperty, &copy));
    } else if (auto* real = std::get_if<float>(&value)) {
      float copy = *real;
      ThrowOnError(GetTrainingApi().AddProperty(p_, name.c_str(), OrtFloatProperty, &copy));
    } else {
      std::string copy = std::get<std::string>(value);
      ThrowOnError(GetTrainingApi().AddProperty(p_, name.c_str(), OrtStringProperty, copy.data()));
    }
  }
  Property GetProperty(const std::string& name) {
    OrtAllocator* allocator = nullptr;
    ThrowOnError(OTT_ORT(&GetApi(), GetAllocatorWithDefaultOptions)(&allocator));
    OrtPropertyType type;
    void* value = nullptr;
    ThrowOnError(GetTrainingApi().GetProperty(p_, name.c_str(), allocator, &type, &value));
    Property property = type == OrtIntProperty     ? Property(*static_cast<int64_t*>(value))
                        : type == OrtFloatProperty ? Property(*static_cast<float*>(value))
                                                   : Property(std::string(static_cast<char*>(value)));
    ThrowOnError(OTT_ORT(&GetApi(), AllocatorFree)(allocator, value));
    return property;
  }
  void UpdateParameter(const std::string& name, const Value& value) {
    ThrowOnError(GetTrainingApi().UpdateParameter(p_, name.c_str(), value));
  }
  Value GetParameter(const std::string& name) {
    OrtAllocator* allocator = nullptr;
    ThrowOnError(OTT_ORT(&GetApi(), GetAllocatorWithDefaultOptions)(&allocator));
    OrtValue* p = nullptr;
    ThrowOnError(GetTrainingApi().GetParameter(p_, name.c_str(), allocator, &p));
    return Value(p);
  }
};

class TrainingSession : public detail::Owner<OrtTrainingSession, detail::ReleaseTrainingSession> {
 public:
  TrainingSession(const Env& env, const SessionOptions& options, CheckpointState& state,
                  const std::basic_string<ORTCHAR_T>& train_model_path,
                  const std::optional<std::basic_string<ORTCHAR_T>>& eval_model_path = std::nullopt,
                  const std::optional<std::basic_string<ORTCHAR_T>>& optimizer_model_path = std::nullopt) {
    ThrowOnError(GetTrainingApi().CreateTrainingSession(
        env, options, state, train_model_path.c_str(), eval_model_path ? eval_model_path->c_str() : nullptr,
        optimizer_model_path ? optimizer_model_path->c_str() : nullptr, &p_));
    Counts();
  }
  TrainingSession(const Env& env, const SessionOptions& options, CheckpointState& state,
                  const std::vector<uint8_t>& train_model_data, const std::vector<uint8_t>& eval_model_data = {},
                  const std::vector<uint8_t>& optim_model_data = {}) {
    ThrowOnError(GetTrainingApi().CreateTrainingSessionFromBuffer(
        env, options, state, train_model_data.data(), train_model_data.size(), eval_model_data.data(),
        eval_model_data.size(), optim_model_data.data(), optim_model_data.size(), &p_));
    Counts();
  }

  std::vector<Value> TrainStep(const std::vector<Value>& input_values) {
    return Step(true, input_values, training_outputs_);
  }
  std::vector<Value> EvalStep(const std::vector<Value>& input_values) { return Step(false, input_values, eval_outputs_); }
  void LazyResetGrad() { ThrowOnError(GetTrainingApi().LazyResetGrad(p_)); }
  void SetLearningRate(float learning_rate) { ThrowOnError(GetTrainingApi().SetLearningRate(p_, learning_rate)); }
  float GetLearningRate() const {
    float learning_rate = 0;
    ThrowOnError(GetTrainingApi().GetLearningRate(p_, &learning_rate));
    return learning_rate;
  }
  void RegisterLinearLRScheduler(int64_t warmup_step_count, int64_t total_step_count, float initial_lr) {
    ThrowOnError(GetTrainingApi().RegisterLinearLRScheduler(p_, warmup_step_count, total_step_count, initial_lr));
  }
  void SchedulerStep() { ThrowOnError(GetTrainingApi().SchedulerStep(p_)); }
  void OptimizerStep() { ThrowOnError(GetTrainingApi().OptimizerStep(p_, nullptr)); }
  void ExportModelForInferencing(const std::basic_string<ORTCHAR_T>& inference_model_path,
                                 const std::vector<std::string>& graph_output_names) {
    std::vector<const char*> names;
    for (const std::string& name : graph_output_names) names.push_back(name.c_str());
    ThrowOnError(GetTrainingApi().ExportModelForInferencing(p_, inference_model_path.c_str(), names.size(), names.data()));
  }
  std::vector<std::string> InputNames(const bool training) { return Names(training, true); }
  std::vector<std::string> OutputNames(const bool training) { return Names(training, false); }
  Value ToBuffer(const bool only_trainable) {
    size_t size = 0;
    ThrowOnError(GetTrainingApi().GetParametersSize(p_, &size, only_trainable));
    int64_t shape[1] = {static_cast<int64_t>(size)};
    Value buffer = Value::CreateTensor<float>(shape, 1);
    ThrowOnError(GetTrainingApi().CopyParametersToBuffer(p_, buffer, only_trainable));
    return buffer;
  }
  // The buffer's size says which: all parameters or the trainable ones.
  void FromBuffer(Value& buffer) {
    size_t all = 0;
    ThrowOnError(GetTrainingApi().GetParametersSize(p_, &all, false));
    ThrowOnError(GetTrainingApi().CopyBufferToParameters(p_, buffer, buffer.GetElementCount() != all));
  }

 private:
  void Counts() {
    ThrowOnError(GetTrainingApi().TrainingSessionGetTrainingModelOutputCount(p_, &training_outputs_));
    ThrowOnError(GetTrainingApi().TrainingSessionGetEvalModelOutputCount(p_, &eval_outputs_));
  }
  std::vector<Value> Step(bool training, const std::vector<Value>& input_values, size_t outputs) {
    std::vector<const OrtValue*> in(input_values.begin(), input_values.end());
    std::vector<OrtValue*> out(outputs, nullptr);
    const OrtTrainingApi& api = GetTrainingApi();
    ThrowOnError(training ? api.TrainStep(p_, nullptr, in.size(), in.data(), out.size(), out.data())
                          : api.EvalStep(p_, nullptr, in.size(), in.data(), out.size(), out.data()));
    std::vector<Value> values;
    for (OrtValue* value : out) values.emplace_back(value);
    return values;
  }
  std::vector<std::string> Names(bool training, bool inputs) {
    const OrtTrainingApi& api = GetTrainingApi();
    size_t count = 0;
    ThrowOnError(inputs ? (training ? api.TrainingSessionGetTrainingModelInputCount(p_, &count)
                                    : api.TrainingSessionGetEvalModelInputCount(p_, &count))
                        : (training ? api.TrainingSessionGetTrainingModelOutputCount(p_, &count)
                                    : api.TrainingSessionGetEvalModelOutputCount(p_, &count)));
    OrtAllocator* allocator = nullptr;
    ThrowOnError(OTT_ORT(&GetApi(), GetAllocatorWithDefaultOptions)(&allocator));
    std::vector<std::string> names;
    for (size_t i = 0; i < count; i++) {
      char* name = nullptr;
      ThrowOnError(inputs ? (training ? api.TrainingSessionGetTrainingModelInputName(p_, i, allocator, &name)
                                      : api.TrainingSessionGetEvalModelInputName(p_, i, allocator, &name))
                          : (training ? api.TrainingSessionGetTrainingModelOutputName(p_, i, allocator, &name)
                                      : api.TrainingSessionGetEvalModelOutputName(p_, i, allocator, &name)));
      names.emplace_back(name);
      ThrowOnError(OTT_ORT(&GetApi(), AllocatorFree)(allocator, name));
    }
    return names;
  }
  size_t training_outputs_ = 0, eval_outputs_ = 0;
};

}  // namespace Ort

#endif  // ORT_TORCH_TRAIN_TRAINING_CXX_API_H
