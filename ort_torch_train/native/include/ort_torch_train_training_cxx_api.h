// ONNX Runtime's training C++ API (Ort::TrainingSession, Ort::CheckpointState, Ort::SetSeed, as ONNX
// Runtime's onnxruntime_training_cxx_api.h declares them) over the OrtTrainingApi table of libort_torch_train;
// header-only. The core classes (Ort::Env, Ort::Value, Ort::Session, ...) are ONNX Runtime's own where its
// onnxruntime_cxx_api.h is on the include path (include this header before, or instead of, that one), and
// otherwise those of ort_torch_train_core_cxx_api.h, a subset with ORT's names and signatures. Define
// ORT_TORCH_TRAIN_SELF_CONTAINED to use the subset even where ORT's header is present. Errors throw
// Ort::Exception, as ORT's do.
#ifndef ORT_TORCH_TRAIN_TRAINING_CXX_API_H
#define ORT_TORCH_TRAIN_TRAINING_CXX_API_H

#if !defined(ORT_TORCH_TRAIN_SELF_CONTAINED) && defined(__has_include)
#if __has_include("onnxruntime_cxx_api.h")
#define ORT_TORCH_TRAIN_WITH_ORT_CXX_API 1
#endif
#endif

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#ifdef ORT_TORCH_TRAIN_WITH_ORT_CXX_API
#include "onnxruntime_c_api.h"
#include "ort_torch_train_training_c_api.h"
namespace Ort::detail {
// declared before ORT's header, so that its detail::Base<T> releases the training handles
void OrtRelease(OrtCheckpointState* p);
void OrtRelease(OrtTrainingSession* p);
}  // namespace Ort::detail
#include "onnxruntime_cxx_api.h"
#else
#include "ort_torch_train_core_cxx_api.h"
#endif

namespace Ort {

// The training table of libort_torch_train (the explicit way in).
inline const OrtTrainingApi& GetTrainingApi() {
  static const OrtTrainingApi* api = OrtTorchTrainGetTrainingApi(ORT_API_VERSION);
  if (api == nullptr)
    throw Exception("libort_torch_train has no training API for ORT_API_VERSION " + std::to_string(ORT_API_VERSION),
                    ORT_FAIL);
  return *api;
}

namespace detail {
inline void OrtRelease(OrtCheckpointState* p) { GetTrainingApi().ReleaseCheckpointState(p); }
inline void OrtRelease(OrtTrainingSession* p) { GetTrainingApi().ReleaseTrainingSession(p); }
}  // namespace detail

using Property = std::variant<int64_t, float, std::string>;

inline void SetSeed(const int64_t seed) { ThrowOnError(GetTrainingApi().SetSeed(seed)); }

class CheckpointState : public detail::Base<OrtCheckpointState> {
 private:
  explicit CheckpointState(OrtCheckpointState* p) { p_ = p; }

 public:
  CheckpointState() = delete;

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
    OrtPropertyType type = OrtIntProperty;
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

class TrainingSession : public detail::Base<OrtTrainingSession> {
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
    OrtAllocator* allocator = nullptr;
    ThrowOnError(OTT_ORT(&GetApi(), GetAllocatorWithDefaultOptions)(&allocator));
    Value buffer = Value::CreateTensor<float>(allocator, shape, 1);
    ThrowOnError(GetTrainingApi().CopyParametersToBuffer(p_, buffer, only_trainable));
    return buffer;
  }
  // The buffer's size says which: all parameters or the trainable ones.
  void FromBuffer(Value& buffer) {
    size_t all = 0;
    ThrowOnError(GetTrainingApi().GetParametersSize(p_, &all, false));
    size_t given = buffer.GetTensorTypeAndShapeInfo().GetElementCount();
    ThrowOnError(GetTrainingApi().CopyBufferToParameters(p_, buffer, given != all));
  }

 private:
  void Counts() {
    ThrowOnError(GetTrainingApi().TrainingSessionGetTrainingModelOutputCount(p_, &training_outputs_));
    ThrowOnError(GetTrainingApi().TrainingSessionGetEvalModelOutputCount(p_, &eval_outputs_));
  }
  std::vector<Value> Step(bool training, const std::vector<Value>& input_values, size_t outputs) {
    std::vector<const OrtValue*> in;
    for (const Value& value : input_values) in.push_back(value);
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
