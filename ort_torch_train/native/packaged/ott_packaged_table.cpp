// The OrtTrainingApi table over packages: every argument checked at the boundary, every error a status.
//
// CreateTrainingSession takes the package folder (written by `ort-torch-train package`) as train_model_path, or the
// model files it was built from (ott_packaged_locate.cpp: their package, their digests checked);
// CreateTrainingSessionFromBuffer takes the models' bytes, the package named by $ORT_TORCH_TRAIN_PACKAGE.
// ExportModelForInferencing writes an output set the package prepared (ott_packaged_export.cpp).
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "ott_packaged.h"

namespace {

using ott::check_allocator;
using ott::Error;
using ott::guarded;
using ott::invalid_argument;
using ott::Kind;
using ott::make_handle;
using ott::require;
using ott::resolve;

constexpr size_t kCheckpointLimit = size_t(1) << 31;  // bytes of a checkpoint read at most (one FlatBuffer)

// The step's inputs: the count it takes (before any is read), each a live value.
std::vector<at::Tensor> input_tensors(size_t count, const OrtValue* const* inputs, size_t expected, const char* what) {
  if (count != expected)
    throw invalid_argument(std::string(what) + ": expected " + std::to_string(expected) + " inputs, got " +
                           std::to_string(count));
  if (count > 0) require(inputs, "inputs");
  ott::check_handles(reinterpret_cast<const void* const*>(inputs), count, Kind::value, "inputs", false);
  std::vector<at::Tensor> tensors;
  for (size_t i = 0; i < count; i++) tensors.push_back(inputs[i]->tensor);
  return tensors;
}

// The output slots a step fills, as many as it has outputs: each NULL or a live value (checked before it runs).
void check_output_slots(size_t count, OrtValue* const* outputs, size_t expected, const char* what) {
  if (count != expected)
    throw invalid_argument(std::string(what) + ": outputs_len is " + std::to_string(count) + "; the step has " +
                           std::to_string(expected) + " outputs");
  if (count > 0) require(outputs, "outputs");
  ott::check_handles(reinterpret_cast<const void* const*>(outputs), count, Kind::value, "outputs", true);
}

// A step's output as the caller's own value (ORT's rule: later steps never change it): the program's tensor itself
// where nothing else holds it or its storage (a buffer the program allocated in this call), else a copy (an output
// that is an input, a parameter, a gradient, a constant or another output shares its storage).
at::Tensor callers_own(at::Tensor&& produced) {
  bool sole = produced.defined() && produced.use_count() == 1 && produced.has_storage() &&
              produced.storage().use_count() == 1;
  return sole ? std::move(produced) : produced.clone();
}

void give_outputs(std::vector<at::Tensor>&& produced, size_t count, OrtValue** outputs, const char* what) {
  if (count != produced.size())
    throw invalid_argument(std::string(what) + ": outputs_len is " + std::to_string(count) + "; the step has " +
                           std::to_string(produced.size()) + " outputs");
  for (size_t i = 0; i < count; i++) {
    ott::release_handle(outputs[i], what);  // ORT's rule: an OrtValue given in an output slot is replaced
    outputs[i] = make_handle<OrtValue>(callers_own(std::move(produced[i])));
  }
}

ott::Session& session_of(const OrtTrainingSession* session) {
  return *resolve(session, "session")->session;
}

OrtStatus* LoadCheckpointFromBuffer(const void* buffer, const size_t size, OrtCheckpointState** out) {
  return guarded([&] {
    require(buffer, "checkpoint_buffer"), require(out, "checkpoint_state");
    *out = make_handle<OrtCheckpointState>(ott::read_checkpoint(static_cast<const uint8_t*>(buffer), size));
  });
}

OrtStatus* LoadCheckpoint(const ORTCHAR_T* path, OrtCheckpointState** out) {
  return guarded([&] {
    require(path, "checkpoint_path"), require(out, "checkpoint_state");
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (!in) throw Error(ORT_NO_SUCHFILE, std::string("LoadCheckpoint: cannot open '") + path + "'");
    std::streamoff size = in.tellg();
    if (size < 0 || size_t(size) > kCheckpointLimit)
      throw invalid_argument(std::string("LoadCheckpoint: '") + path + "' is not a checkpoint file of at most 2 GiB");
    std::vector<uint8_t> bytes(static_cast<size_t>(size));
    in.seekg(0);
    if (!in.read(reinterpret_cast<char*>(bytes.data()), size))
      throw Error(ORT_FAIL, std::string("LoadCheckpoint: cannot read '") + path + "'");
    *out = make_handle<OrtCheckpointState>(ott::read_checkpoint(bytes.data(), bytes.size()));
  });
}

OrtStatus* SaveCheckpoint(OrtCheckpointState* state, const ORTCHAR_T* path, const bool include_optimizer_state) {
  return guarded([&] {
    resolve(state, "checkpoint_state"), require(path, "checkpoint_path");
    std::vector<uint8_t> bytes = ott::write_checkpoint(state->data, include_optimizer_state);
    std::string temporary = std::string(path) + ".tmp";  // written whole, then renamed over the file
    {
      std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
      if (!out || !out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size())))
        throw Error(ORT_FAIL, std::string("SaveCheckpoint: cannot write '") + temporary + "'");
    }
    if (std::rename(temporary.c_str(), path) != 0) {
      std::remove(temporary.c_str());
      throw Error(ORT_FAIL, std::string("SaveCheckpoint: cannot replace '") + path + "'");
    }
  });
}

constexpr const char* kRoles[3] = {"training_model", "eval_model", "optimizer_model"};
constexpr size_t kModelLimit = (size_t(1) << 31) - 1;  // bytes of a model checked against a package's digest at most

void open_session(const std::string& folder, OrtCheckpointState* state, OrtTrainingSession** out) {
  auto session = std::make_unique<ott::Session>(folder, state);
  std::shared_ptr<void> exports = ott::register_exports(session->prepared());
  *out = make_handle<OrtTrainingSession>(std::move(session), std::move(exports));
  state->sessions++;
}

OrtStatus* CreateTrainingSession(const OrtEnv* env, const OrtSessionOptions* options, OrtCheckpointState* state,
                                 const ORTCHAR_T* train_path, const ORTCHAR_T* eval_path,
                                 const ORTCHAR_T* optimizer_path, OrtTrainingSession** out) {
  return guarded([&] {
    resolve(env, "env"), resolve(options, "options"), resolve(state, "checkpoint_state");
    require(train_path, "train_model_path"), require(out, "out");
    const std::string folder = ott::package_folder_for(train_path);
    const ORTCHAR_T* paths[3] = {train_path, eval_path, optimizer_path};
    if (folder == train_path) {  // the package folder itself
      for (const ORTCHAR_T* other : {eval_path, optimizer_path})
        if (other != nullptr && std::strcmp(other, train_path) != 0)
          throw invalid_argument(std::string("CreateTrainingSession: train_model_path is a package folder; "
                                             "eval_model_path and optimizer_model_path must be NULL or the same "
                                             "folder, got '") + other + "'");
    } else {  // model files: their package, built from them
      std::vector<ott::GivenModel> models;
      for (size_t i = 0; i < 3; i++)
        if (paths[i] != nullptr)
          models.push_back({kRoles[i], ott::read_file(paths[i], kModelLimit, "CreateTrainingSession"),
                            std::string("'") + paths[i] + "'"});
      ott::check_models(folder, models);
    }
    open_session(folder, state, out);
  });
}

OrtStatus* CreateTrainingSessionFromBuffer(const OrtEnv* env, const OrtSessionOptions* options,
                                           OrtCheckpointState* state, const void* train_data, size_t train_len,
                                           const void* eval_data, size_t eval_len, const void* optimizer_data,
                                           size_t optimizer_len, OrtTrainingSession** out) {
  return guarded([&] {
    resolve(env, "env"), resolve(options, "options"), resolve(state, "checkpoint_state");
    require(train_data, "train_model_data"), require(out, "out");
    const char* folder = std::getenv("ORT_TORCH_TRAIN_PACKAGE");
    if (folder == nullptr || *folder == '\0')
      throw invalid_argument("CreateTrainingSessionFromBuffer: set ORT_TORCH_TRAIN_PACKAGE to the package built from "
                             "these models (`ort-torch-train package`): the packaged runtime trains a package");
    const void* data[3] = {train_data, eval_data, optimizer_data};
    const size_t sizes[3] = {train_len, eval_len, optimizer_len};
    std::vector<ott::GivenModel> models;
    for (size_t i = 0; i < 3; i++) {
      if ((data[i] == nullptr) != (sizes[i] == 0) || sizes[i] > kModelLimit)
        throw invalid_argument(std::string("CreateTrainingSessionFromBuffer: the ") + kRoles[i] + " buffer is " +
                               (data[i] ? "given" : "NULL") + " with " + std::to_string(sizes[i]) + " bytes");
      if (data[i] != nullptr)
        models.push_back({kRoles[i], std::string(static_cast<const char*>(data[i]), sizes[i]),
                          std::string("the ") + kRoles[i] + " buffer"});
    }
    ott::check_models(folder, models);
    open_session(folder, state, out);
  });
}

OrtStatus* OutputCount(const OrtTrainingSession* session, size_t* out, bool train) {
  return guarded([&] {
    require(out, "out");
    *out = train ? session_of(session).train_outputs() : session_of(session).eval_outputs();
  });
}
OrtStatus* TrainOutputCount(const OrtTrainingSession* s, size_t* out) { return OutputCount(s, out, true); }
OrtStatus* EvalOutputCount(const OrtTrainingSession* s, size_t* out) { return OutputCount(s, out, false); }
OrtStatus* InputCount(const OrtTrainingSession* session, size_t* out, bool train) {
  return guarded([&] {
    require(out, "out");
    *out = train ? session_of(session).train_inputs() : session_of(session).eval_inputs();
  });
}
OrtStatus* TrainInputCount(const OrtTrainingSession* s, size_t* out) { return InputCount(s, out, true); }
OrtStatus* EvalInputCount(const OrtTrainingSession* s, size_t* out) { return InputCount(s, out, false); }

OrtStatus* Name(const OrtTrainingSession* session, size_t index, OrtAllocator* allocator, char** out, bool train,
                bool input) {
  return guarded([&] {
    check_allocator(allocator, "allocator"), require(out, "output");
    const std::string& name = session_of(session).name(train, input, index);
    void* copy = allocator->Alloc(allocator, name.size() + 1);
    if (copy == nullptr) throw Error(ORT_FAIL, "the allocator returned NULL");
    std::memcpy(copy, name.c_str(), name.size() + 1);
    *out = static_cast<char*>(copy);
  });
}
OrtStatus* TrainOutputName(const OrtTrainingSession* s, size_t i, OrtAllocator* a, char** out) {
  return Name(s, i, a, out, true, false);
}
OrtStatus* EvalOutputName(const OrtTrainingSession* s, size_t i, OrtAllocator* a, char** out) {
  return Name(s, i, a, out, false, false);
}
OrtStatus* TrainInputName(const OrtTrainingSession* s, size_t i, OrtAllocator* a, char** out) {
  return Name(s, i, a, out, true, true);
}
OrtStatus* EvalInputName(const OrtTrainingSession* s, size_t i, OrtAllocator* a, char** out) {
  return Name(s, i, a, out, false, true);
}

OrtStatus* LazyResetGrad(OrtTrainingSession* session) {
  return guarded([&] { session_of(session).lazy_reset_grad(); });
}

OrtStatus* TrainStep(OrtTrainingSession* session, const OrtRunOptions* options, size_t inputs_len,
                     const OrtValue* const* inputs, size_t outputs_len, OrtValue** outputs) {
  return guarded([&] {
    ott::Session& steps = session_of(session);
    if (options != nullptr) resolve(options, "run_options");
    check_output_slots(outputs_len, outputs, steps.train_outputs(), "TrainStep");
    std::vector<at::Tensor> given = input_tensors(inputs_len, inputs, steps.train_inputs(), "TrainStep");
    give_outputs(steps.train_step(given), outputs_len, outputs, "TrainStep");
  });
}

OrtStatus* EvalStep(const OrtTrainingSession* session, const OrtRunOptions* options, size_t inputs_len,
                    const OrtValue* const* inputs, size_t outputs_len, OrtValue** outputs) {
  return guarded([&] {
    ott::Session& steps = session_of(session);
    if (options != nullptr) resolve(options, "run_options");
    check_output_slots(outputs_len, outputs, steps.eval_outputs(), "EvalStep");
    std::vector<at::Tensor> given = input_tensors(inputs_len, inputs, steps.eval_inputs(), "EvalStep");
    give_outputs(steps.eval_step(given), outputs_len, outputs, "EvalStep");
  });
}

OrtStatus* SetLearningRate(OrtTrainingSession* session, float value) {
  return guarded([&] { session_of(session).set_learning_rate(value); });
}
OrtStatus* GetLearningRate(OrtTrainingSession* session, float* out) {
  return guarded([&] { require(out, "learning_rate"), *out = session_of(session).learning_rate(); });
}
OrtStatus* OptimizerStep(OrtTrainingSession* session, const OrtRunOptions* options) {
  return guarded([&] {
    ott::Session& steps = session_of(session);
    if (options != nullptr) resolve(options, "run_options");
    steps.optimizer_step();
  });
}
OrtStatus* RegisterLinearLRScheduler(OrtTrainingSession* session, const int64_t warmup, const int64_t total,
                                     const float initial) {
  return guarded([&] { session_of(session).register_linear_scheduler(warmup, total, initial); });
}
OrtStatus* SchedulerStep(OrtTrainingSession* session) {
  return guarded([&] { session_of(session).scheduler_step(); });
}
OrtStatus* GetParametersSize(OrtTrainingSession* session, size_t* out, bool trainable_only) {
  return guarded([&] { require(out, "out"), *out = session_of(session).parameters_size(trainable_only); });
}
OrtStatus* CopyParametersToBuffer(OrtTrainingSession* session, OrtValue* buffer, bool trainable_only) {
  return guarded([&] {
    resolve(buffer, "parameters_buffer");
    session_of(session).copy_parameters_to(buffer->tensor, trainable_only);
  });
}
OrtStatus* CopyBufferToParameters(OrtTrainingSession* session, OrtValue* buffer, bool trainable_only) {
  return guarded([&] {
    resolve(buffer, "parameters_buffer");
    session_of(session).copy_parameters_from(buffer->tensor, trainable_only);
  });
}

void ReleaseCheckpointState(OrtCheckpointState* state) {
  if (!ott::unregister_handle(state, Kind::checkpoint_state, "ReleaseCheckpointState")) return;
  if (state->sessions > 0) state->released = true;  // freed with the last session training it
  else ott::destroy_handle(state);
}
void ReleaseTrainingSession(OrtTrainingSession* session) {
  if (!ott::unregister_handle(session, Kind::training_session, "ReleaseTrainingSession")) return;
  OrtCheckpointState* state = session->session ? session->session->state() : nullptr;
  ott::destroy_handle(session);
  if (state != nullptr && --state->sessions == 0 && state->released) ott::destroy_handle(state);
}

OrtStatus* ExportModelForInferencing(OrtTrainingSession* session, const ORTCHAR_T* path, size_t outputs_len,
                                     const char* const* outputs) {
  return guarded([&] {
    ott::Session& steps = session_of(session);
    require(path, "inference_model_path");
    if (outputs_len == 0) throw invalid_argument("ExportModelForInferencing: graph_outputs_len is 0");
    require(outputs, "graph_output_names");
    std::vector<std::string> names;
    for (size_t i = 0; i < outputs_len; i++) {
      if (outputs[i] == nullptr) throw invalid_argument("graph_output_names[" + std::to_string(i) + "] is NULL");
      names.push_back(outputs[i]);
    }
    ott::export_model(steps.prepared(), steps.state()->data, path, names);
  });
}
OrtStatus* SetSeed(const int64_t seed) { return guarded([&] { at::manual_seed(uint64_t(seed)); }); }
OrtStatus* AddProperty(OrtCheckpointState* state, const char* name, enum OrtPropertyType type, void* value) {
  return guarded([&] {
    resolve(state, "checkpoint_state"), require(name, "property_name"), require(value, "property_value");
    const int kind = ott::enum_value(type);
    ott::Property property{name, kind};
    if (kind == OrtIntProperty) property.int_value = *static_cast<const int64_t*>(value);
    else if (kind == OrtFloatProperty) property.float_value = *static_cast<const float*>(value);
    else if (kind == OrtStringProperty) property.string_value = static_cast<const char*>(value);
    else throw invalid_argument("AddProperty: unknown property type " + std::to_string(kind));
    for (ott::Property& held : state->data.properties)
      if (held.name == property.name) return void(held = property);
    state->data.properties.push_back(property);
  });
}
OrtStatus* GetProperty(const OrtCheckpointState* state, const char* name, OrtAllocator* allocator,
                       enum OrtPropertyType* type, void** value) {
  return guarded([&] {
    resolve(state, "checkpoint_state"), require(name, "property_name"), check_allocator(allocator, "allocator");
    require(type, "property_type"), require(value, "property_value");
    for (const ott::Property& held : state->data.properties) {
      if (held.name != name) continue;
      size_t size = held.kind == 0 ? 8 : held.kind == 1 ? 4 : held.string_value.size() + 1;
      const void* source = held.kind == 0 ? static_cast<const void*>(&held.int_value)
                           : held.kind == 1 ? static_cast<const void*>(&held.float_value)
                                            : static_cast<const void*>(held.string_value.c_str());
      void* copy = allocator->Alloc(allocator, size);
      if (copy == nullptr) throw Error(ORT_FAIL, "the allocator returned NULL");
      std::memcpy(copy, source, size);
      *type = OrtPropertyType(held.kind), *value = copy;
      return;
    }
    throw invalid_argument(std::string("GetProperty: the checkpoint state has no property '") + name + "'");
  });
}

at::Tensor& parameter(const OrtCheckpointState* state, const char* name) {
  resolve(state, "checkpoint_state"), require(name, "parameter_name");
  at::Tensor* found = const_cast<OrtCheckpointState*>(state)->data.find(name);
  if (found == nullptr) throw invalid_argument(std::string("the checkpoint state has no parameter '") + name + "'");
  return *found;
}
OrtStatus* GetParameterTypeAndShape(const OrtCheckpointState* state, const char* name, OrtTensorTypeAndShapeInfo** out) {
  return guarded([&] {
    require(out, "parameter_type_and_shape");
    const at::Tensor& tensor = parameter(state, name);
    *out = make_handle<OrtTensorTypeAndShapeInfo>(ott::onnx_type(tensor.scalar_type()), tensor.sizes().vec());
  });
}
OrtStatus* UpdateParameter(OrtCheckpointState* state, const char* name, OrtValue* value) {
  return guarded([&] {
    resolve(value, "parameter");
    at::Tensor& tensor = parameter(state, name);
    if (value->tensor.scalar_type() != tensor.scalar_type() || value->tensor.sizes() != tensor.sizes())
      throw invalid_argument(std::string("UpdateParameter: '") + name + "' is " + ott::dtype_name(tensor.scalar_type()) +
                             " of another shape or type than the value given");
    tensor.copy_(value->tensor);  // in place: a session training the state sees it
  });
}
OrtStatus* GetParameter(const OrtCheckpointState* state, const char* name, OrtAllocator* allocator, OrtValue** out) {
  return guarded([&] {
    check_allocator(allocator, "allocator"), require(out, "parameter");
    *out = make_handle<OrtValue>(parameter(state, name).clone());
  });
}

const OrtTrainingApi kTable = {
    LoadCheckpoint, SaveCheckpoint, CreateTrainingSession, CreateTrainingSessionFromBuffer, TrainOutputCount,
    EvalOutputCount, TrainOutputName, EvalOutputName, LazyResetGrad, TrainStep, EvalStep, SetLearningRate,
    GetLearningRate, OptimizerStep, RegisterLinearLRScheduler, SchedulerStep, GetParametersSize,
    CopyParametersToBuffer, CopyBufferToParameters, ReleaseTrainingSession, ReleaseCheckpointState,
    ExportModelForInferencing, SetSeed, TrainInputCount, EvalInputCount, TrainInputName, EvalInputName,
    AddProperty, GetProperty, LoadCheckpointFromBuffer, GetParameterTypeAndShape, UpdateParameter, GetParameter,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const OrtTrainingApi* OrtTorchTrainGetTrainingApi(uint32_t version) {
  return version >= 1 && version <= ORT_API_VERSION ? &kTable : nullptr;
}
