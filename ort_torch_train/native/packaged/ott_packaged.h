// libort_torch_train_packaged's internals: the handles, values, statuses and checkpoint state, over libtorch alone.
#ifndef OTT_PACKAGED_H
#define OTT_PACKAGED_H

#include <ATen/ATen.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ort_torch_train_training_c_api.h"

// The handles the program holds. A status, a value, a memory info and an env are this library's own: the runtime
// answers the few core OrtApi members a training program calls (ott_packaged_core.cpp), not ONNX Runtime.
struct OrtStatus {
  OrtErrorCode code;
  std::string message;
};
struct OrtValue {
  at::Tensor tensor;
};
struct OrtMemoryInfo {
  int id;
};
struct OrtEnv {
  int unused;
};
struct OrtSessionOptions {
  int unused;
};
struct OrtRunOptions {
  int unused;
};
struct OrtTensorTypeAndShapeInfo {
  ONNXTensorElementDataType type;
  std::vector<int64_t> dims;
};

namespace ott {

// An error that becomes a status at the C boundary.
struct Error : std::runtime_error {
  OrtErrorCode code;
  Error(OrtErrorCode code, const std::string& message) : std::runtime_error(message), code(code) {}
};
inline Error invalid_argument(const std::string& message) { return Error(ORT_INVALID_ARGUMENT, message); }

OrtStatus* make_status(OrtErrorCode code, const std::string& message);

// Runs body, turning every exception into a status: nothing thrown crosses the C boundary.
template <typename Body>
OrtStatus* guarded(Body body) noexcept {
  try {
    body();
    return nullptr;
  } catch (const Error& error) {
    return make_status(error.code, error.what());
  } catch (const std::exception& error) {
    return make_status(ORT_RUNTIME_EXCEPTION, error.what());
  } catch (...) {
    return make_status(ORT_RUNTIME_EXCEPTION, "unknown error");
  }
}

// The int a C caller passed as an enum argument, read as bytes: a value outside the enum's range (a bad argument, to
// be refused) is undefined behaviour to load as the enum itself.
template <typename Enum>
int enum_value(const Enum& given) {
  static_assert(sizeof(Enum) == sizeof(int));
  int value;
  std::memcpy(&value, &given, sizeof value);
  return value;
}

template <typename T>
void require(T* pointer, const char* what) {
  if (pointer == nullptr) throw invalid_argument(std::string(what) + " is NULL");
}

// The handles the runtime hands out, each registered with its kind while it lives (ott_packaged_handles.cpp). A
// status is not: as ONNX Runtime's, it is the caller's to read and release once.
enum class Kind { env, session_options, run_options, memory_info, allocator, value, type_and_shape_info,
                  checkpoint_state, training_session, inference_session };
template <typename T>
struct HandleKind;
#define OTT_HANDLE_KIND(Type, Name) \
  template <>                      \
  struct HandleKind<Type> {        \
    static constexpr Kind kind = Kind::Name; \
  };
OTT_HANDLE_KIND(OrtEnv, env)
OTT_HANDLE_KIND(OrtSessionOptions, session_options)
OTT_HANDLE_KIND(OrtRunOptions, run_options)
OTT_HANDLE_KIND(OrtMemoryInfo, memory_info)
OTT_HANDLE_KIND(OrtAllocator, allocator)
OTT_HANDLE_KIND(OrtValue, value)
OTT_HANDLE_KIND(OrtTensorTypeAndShapeInfo, type_and_shape_info)
OTT_HANDLE_KIND(OrtCheckpointState, checkpoint_state)
OTT_HANDLE_KIND(OrtTrainingSession, training_session)
OTT_HANDLE_KIND(OrtSession, inference_session)
#undef OTT_HANDLE_KIND

void register_handle(const void* handle, Kind kind);
// Error (ORT_INVALID_ARGUMENT) naming what and what came where handle is not a live handle of kind.
void check_handle(const void* handle, Kind kind, const char* what);
// The same for each of handles[0..count) under one lock, named what[i]; a NULL one passes where null_allowed.
void check_handles(const void* const* handles, size_t count, Kind kind, const char* what, bool null_allowed);
// An allocator the runtime made, or else (never one of its other handles) the caller's own OrtAllocator with a
// version this API knows and its Alloc and Free set.
OrtAllocator* check_allocator(OrtAllocator* allocator, const char* what);
// Forget a live handle of kind: false, with one line on stderr naming release, where it was none (released
// twice, another kind, unknown).
bool unregister_handle(const void* handle, Kind kind, const char* release);
// Keep the memory of a destroyed object from reuse until many more were released, then free it.
void retire(void* memory, Kind kind);

// handle, checked as a live handle of its type's kind.
template <typename T>
T* resolve(T* handle, const char* what) {
  check_handle(handle, HandleKind<std::remove_const_t<T>>::kind, what);
  return handle;
}
// A new object made with new T{arguments...}, registered.
template <typename T, typename... Arguments>
T* make_handle(Arguments&&... arguments) {
  std::unique_ptr<T> made(new T{std::forward<Arguments>(arguments)...});
  register_handle(made.get(), HandleKind<T>::kind);
  return made.release();
}
// Destroy an object make_handle made that is no longer registered.
template <typename T>
void destroy_handle(T* object) {
  object->~T();
  retire(object, HandleKind<T>::kind);
}
// What each Release* does: a live handle is unregistered and destroyed; NULL, a released or an unknown one is left.
template <typename T>
void release_handle(T* handle, const char* release) {
  if (handle != nullptr && unregister_handle(handle, HandleKind<T>::kind, release)) destroy_handle(handle);
}

// ONNX element type <-> torch dtype; Error for one the runtime does not hold.
at::ScalarType scalar_type(int32_t onnx_type, const std::string& what);
ONNXTensorElementDataType onnx_type(at::ScalarType type);
// torch's dtype name ("float32", "int64", ...) as the package's description writes it.
at::ScalarType dtype_named(const std::string& name, const std::string& what);
std::string dtype_name(at::ScalarType type);

// A named tensor as a checkpoint holds it.
struct Named {
  std::string name;
  at::Tensor tensor;
};

// One property of the checkpoint's property bag: an int64, a float or a string.
struct Property {
  std::string name;
  int kind;  // 0 int64, 1 float, 2 string
  int64_t int_value = 0;
  float float_value = 0;
  std::string string_value;
};

// The one optimizer group ORT keeps: its step count, initial learning rate and each parameter's moments.
struct OptimizerGroup {
  std::string name;
  int64_t step = 0;
  float initial_learning_rate = 0;
  std::map<std::string, std::vector<Named>> momentums;  // parameter -> its moments (name -> tensor)
};

// What an ODTC checkpoint holds (ott_packaged_odtc.cpp reads and writes it).
struct CheckpointData {
  std::vector<Named> trainable, frozen;  // file order
  bool is_nominal = false;
  bool has_optimizer = false;
  OptimizerGroup optimizer;
  std::vector<Property> properties;
  at::Tensor* find(const std::string& name);
};

// Parse an untrusted ODTC buffer (every offset bounds-checked); Error naming what is wrong.
CheckpointData read_checkpoint(const uint8_t* data, size_t size);
// The ODTC bytes the Python engine writes for this state (ORT's save::FromCheckpointState layout).
std::vector<uint8_t> write_checkpoint(const CheckpointData& state, bool include_optimizer_state);

// One flat buffer holding the tensors end to end (one dtype and device, else an Error naming what), each tensor
// pointed at its view of it (ott_packaged_flat.cpp): whoever holds the checkpoint state's tensors then sees the
// buffer's storage. Tensors already laid end to end in one storage (another session's buffer over the same state)
// keep it: the buffer is then a view of that storage.
at::Tensor flatten(const std::vector<at::Tensor*>& tensors, const std::string& what);

class Session;

// A tensor a package names: its name, dtype and shape (-1: an axis of any size).
struct TensorSpec {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
};
// Reads "NAME DTYPE RANK SIZES..." from words; Error naming line where it is malformed.
TensorSpec read_spec(std::istringstream& words, const std::string& line);
std::string shape_text(const std::vector<int64_t>& shape);

// One inference export a package prepared (ott_packaged_export.cpp): its model file, whose parameters' data lie at
// the ranges given (each parameter's bytes, in the model's order), and its compiled inference program.
struct ExportSet {
  struct Range {
    TensorSpec tensor;
    uint64_t offset = 0, length = 0;
  };
  int64_t index = 0;  // its description's "export INDEX MODEL_FILE PROGRAM_FILE" entry
  std::string folder, model_file, program_file;
  std::vector<std::string> outputs;
  std::vector<TensorSpec> inputs;
  std::vector<Range> parameters;
};

// What a package prepares besides its steps: the digests of the artifacts it was built from and its inference
// exports, read from the native_steps.txt lines the session's description hands over.
struct Prepared {
  std::string folder;
  std::map<std::string, std::string> artifacts;  // model role -> sha1 of its file
  std::map<int64_t, std::shared_ptr<ExportSet>> exports;
  // Reads one line whose key is its own (artifact, export, export_input, export_output, export_parameter); false
  // for another key.
  bool read(const std::string& key, std::istringstream& words, const std::string& line);
};

// The bytes of a prepared inference model at most (one protobuf message).
constexpr size_t kModelLimit = (size_t(1) << 31) - 1;

// A file's bytes (at most limit); Error naming what and the path where it cannot be read.
std::string read_file(const std::string& path, size_t limit, const std::string& what);
// Write bytes to path whole, then rename it into place; Error naming what where it fails.
void write_file_atomically(const std::string& path, const std::string& bytes, const std::string& what);
// ExportModelForInferencing: the prepared export of outputs, with state's current parameter values, at path.
void export_model(const Prepared& prepared, CheckpointData& state, const std::string& path,
                  const std::vector<std::string>& outputs);
// Make a package's exports known to CreateSession while the returned holder lives (a training session's).
std::shared_ptr<void> register_exports(const Prepared& prepared);

// Fill the slots of OrtApi's CreateSession, Run and ReleaseSession (ott_packaged_inference.cpp).
void set_inference_members(void** slots);

// CreateTrainingSession's rule for model paths (ott_packaged_locate.cpp): a package folder is the package itself; a
// model file's package is $ORT_TORCH_TRAIN_PACKAGE, else the folder "package" beside the file.
std::string package_folder_for(const std::string& train_model_path);
// The path of the file `name` in the package folder, for the description's entry `entry` that names it. Every file
// name the runtime reads from a package is untrusted: an empty name, an absolute one, one with '/' or '\\', '.' or
// '..', or one holding a control character is an Error naming the file, the entry and what a name must be.
std::string package_file(const std::string& folder, const std::string& name, const std::string& entry);
// One model given to CreateTrainingSession(FromBuffer): its role, bytes and where they came from.
struct GivenModel {
  std::string role, bytes, where;
};
// Refuse models other than the ones the package in folder was built from, naming the one that differs.
void check_models(const std::string& folder, const std::vector<GivenModel>& models);

}  // namespace ott

struct OrtCheckpointState {
  ott::CheckpointData data;
  int sessions = 0;       // sessions training it
  bool released = false;  // ReleaseCheckpointState came before the last of them was released
};
struct OrtTrainingSession {
  std::unique_ptr<ott::Session> session;
  std::shared_ptr<void> exports;  // the package's exports, known to CreateSession while the session lives
};

namespace ott {

// A package's steps over a checkpoint state (ott_packaged_session.cpp).
class Session {
 public:
  Session(const std::string& folder, OrtCheckpointState* state);
  ~Session();
  std::vector<at::Tensor> train_step(const std::vector<at::Tensor>& inputs);
  std::vector<at::Tensor> eval_step(const std::vector<at::Tensor>& inputs);
  void lazy_reset_grad() { reset_ = true; }
  void optimizer_step();
  void set_learning_rate(float value);
  float learning_rate() const { return learning_rate_; }
  OrtCheckpointState* state() const { return state_; }
  void register_linear_scheduler(int64_t warmup, int64_t total, float initial);
  void scheduler_step();
  size_t parameters_size(bool trainable_only) const;
  void copy_parameters_to(at::Tensor buffer, bool trainable_only) const;
  void copy_parameters_from(const at::Tensor& buffer, bool trainable_only);
  size_t train_outputs() const;
  size_t eval_outputs() const;
  size_t train_inputs() const;
  size_t eval_inputs() const;
  // The name of a step's input or output (train: the train step, else the eval step); Error past the last.
  const std::string& name(bool train, bool input, size_t index) const;
  // The package's artifact digests and prepared inference exports.
  const Prepared& prepared() const;
  struct Description;

 private:
  std::vector<at::Tensor> parameters(bool trainable_only) const;
  OrtCheckpointState* state_;
  std::unique_ptr<Description> description_;
  std::vector<at::Tensor> trainable_, frozen_, grads_;  // the trainable ones and their gradients: views of the flat
  std::vector<std::pair<bool, at::Tensor>> ordered_;  // (trainable, parameter) in the training graph's order
  // With an optimizer program: the trainable parameters, their gradients and each moment (in the description's
  // order) as one flat buffer each, the checkpoint state's tensors views of them; the optimizer program takes these.
  at::Tensor flat_params_, flat_grads_;
  std::vector<at::Tensor> flat_moments_;
  bool reset_ = true;
  at::Tensor reset_flags_[2];  // the train program's reset argument: false, true
  at::Tensor scalars_;         // the optimizer program's per-step scalars, rewritten each step
  size_t train_outputs_ = 0;
  float learning_rate_;
  bool scheduled_ = false;
  int64_t warmup_ = 0, total_ = 0;
};

}  // namespace ott

#endif  // OTT_PACKAGED_H
