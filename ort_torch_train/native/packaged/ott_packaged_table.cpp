// The OrtTrainingApi table over packages: every argument checked at the boundary, every error a status.
//
// CreateTrainingSession takes the package folder (written by `ort-torch-train package`) as train_model_path; the
// package holds the eval and optimizer steps too, so eval_model_path and optimizer_model_path must each be NULL or
// the same folder. Members a package cannot answer (the models' bytes, ExportModelForInferencing, ...) return
// ORT_NOT_IMPLEMENTED naming themselves.
#include <cstring>
#include <fstream>
#include <iterator>

#include "ott_packaged.h"

namespace {

using ott::Error;
using ott::guarded;
using ott::invalid_argument;
using ott::require;

constexpr size_t kCheckpointLimit = size_t(1) << 31;  // bytes of a checkpoint read at most (one FlatBuffer)

std::vector<at::Tensor> input_tensors(size_t count, const OrtValue* const* inputs) {
  if (count > 0) require(inputs, "inputs");
  std::vector<at::Tensor> tensors;
  for (size_t i = 0; i < count; i++) {
    if (inputs[i] == nullptr) throw invalid_argument("inputs[" + std::to_string(i) + "] is NULL");
    tensors.push_back(inputs[i]->tensor);
  }
  return tensors;
}

void give_outputs(const std::vector<at::Tensor>& produced, size_t count, OrtValue** outputs, const char* what) {
  if (count != produced.size())
    throw invalid_argument(std::string(what) + ": outputs_len is " + std::to_string(count) + "; the step has " +
                           std::to_string(produced.size()) + " outputs");
  if (count > 0) require(outputs, "outputs");
  for (size_t i = 0; i < count; i++) {
    delete outputs[i];  // ORT's rule: an OrtValue given in an output slot is replaced
    outputs[i] = new OrtValue{produced[i].clone()};
  }
}

ott::Session& session_of(const OrtTrainingSession* session) {
  require(session, "session");
  return *session->session;
}

OrtStatus* LoadCheckpointFromBuffer(const void* buffer, const size_t size, OrtCheckpointState** out) {
  return guarded([&] {
    require(buffer, "checkpoint_buffer"), require(out, "checkpoint_state");
    *out = new OrtCheckpointState{ott::read_checkpoint(static_cast<const uint8_t*>(buffer), size)};
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
    *out = new OrtCheckpointState{ott::read_checkpoint(bytes.data(), bytes.size())};
  });
}

OrtStatus* SaveCheckpoint(OrtCheckpointState* state, const ORTCHAR_T* path, const bool include_optimizer_state) {
  return guarded([&] {
    require(state, "checkpoint_state"), require(path, "checkpoint_path");
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

OrtStatus* CreateTrainingSession(const OrtEnv* env, const OrtSessionOptions* options, OrtCheckpointState* state,
                                 const ORTCHAR_T* package, const ORTCHAR_T* eval_path, const ORTCHAR_T* optimizer_path,
                                 OrtTrainingSession** out) {
  return guarded([&] {
    require(env, "env"), require(options, "options"), require(state, "checkpoint_state");
    require(package, "train_model_path (the package folder)"), require(out, "out");
    for (const ORTCHAR_T* other : {eval_path, optimizer_path})
      if (other != nullptr && std::strcmp(other, package) != 0)
        throw invalid_argument(std::string("CreateTrainingSession: the packaged runtime takes the package folder as "
                                           "train_model_path; eval_model_path and optimizer_model_path must be NULL "
                                           "or the same folder, got '") + other + "'");
    auto session = std::make_unique<ott::Session>(package, state);
    *out = new OrtTrainingSession{std::move(session)};
    state->sessions++;
  });
}

OrtStatus* CreateTrainingSessionFromBuffer(const OrtEnv*, const OrtSessionOptions*, OrtCheckpointState*, const void*,
                                           size_t, const void*, size_t, const void*, size_t, OrtTrainingSession**) {
  return ott::make_status(ORT_NOT_IMPLEMENTED, "CreateTrainingSessionFromBuffer: the packaged runtime trains a "
                                               "package folder (CreateTrainingSession), not models' bytes");
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

OrtStatus* NameNotImplemented(const OrtTrainingSession*, size_t, OrtAllocator*, char**) {
  return ott::make_status(ORT_NOT_IMPLEMENTED, "the packaged runtime does not answer input and output names yet");
}

OrtStatus* LazyResetGrad(OrtTrainingSession* session) {
  return guarded([&] { session_of(session).lazy_reset_grad(); });
}

OrtStatus* TrainStep(OrtTrainingSession* session, const OrtRunOptions*, size_t inputs_len,
                     const OrtValue* const* inputs, size_t outputs_len, OrtValue** outputs) {
  return guarded([&] {
    ott::Session& steps = session_of(session);
    if (outputs_len != steps.train_outputs())
      throw invalid_argument("TrainStep: outputs_len is " + std::to_string(outputs_len) + "; the step has " +
                             std::to_string(steps.train_outputs()) + " outputs");
    give_outputs(steps.train_step(input_tensors(inputs_len, inputs)), outputs_len, outputs, "TrainStep");
  });
}

OrtStatus* EvalStep(const OrtTrainingSession* session, const OrtRunOptions*, size_t inputs_len,
                    const OrtValue* const* inputs, size_t outputs_len, OrtValue** outputs) {
  return guarded([&] {
    ott::Session& steps = session_of(session);
    if (outputs_len != steps.eval_outputs())
      throw invalid_argument("EvalStep: outputs_len is " + std::to_string(outputs_len) + "; the step has " +
                             std::to_string(steps.eval_outputs()) + " outputs");
    give_outputs(steps.eval_step(input_tensors(inputs_len, inputs)), outputs_len, outputs, "EvalStep");
  });
}

OrtStatus* SetLearningRate(OrtTrainingSession* session, float value) {
  return guarded([&] { session_of(session).set_learning_rate(value); });
}
OrtStatus* GetLearningRate(OrtTrainingSession* session, float* out) {
  return guarded([&] { require(out, "learning_rate"), *out = session_of(session).learning_rate(); });
}
OrtStatus* OptimizerStep(OrtTrainingSession* session, const OrtRunOptions*) {
  return guarded([&] { session_of(session).optimizer_step(); });
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
    require(buffer, "parameters_buffer");
    session_of(session).copy_parameters_to(buffer->tensor, trainable_only);
  });
}
OrtStatus* CopyBufferToParameters(OrtTrainingSession* session, OrtValue* buffer, bool trainable_only) {
  return guarded([&] {
    require(buffer, "parameters_buffer");
    session_of(session).copy_parameters_from(buffer->tensor, trainable_only);
  });
}

void ReleaseCheckpointState(OrtCheckpointState* state) {
  if (state == nullptr) return;
  if (state->sessions > 0) state->released = true;  // freed with the last session training it
  else delete state;
}
void ReleaseTrainingSession(OrtTrainingSession* session) {
  if (session == nullptr) return;
  OrtCheckpointState* state = session->session ? session->session->state() : nullptr;
  delete session;
  if (state != nullptr && --state->sessions == 0 && state->released) delete state;
}

OrtStatus* ExportModelForInferencing(OrtTrainingSession*, const ORTCHAR_T*, size_t, const char* const*) {
  return ott::make_status(ORT_NOT_IMPLEMENTED, "ExportModelForInferencing: not answered by the packaged runtime yet");
}
OrtStatus* SetSeed(const int64_t seed) { return guarded([&] { at::manual_seed(uint64_t(seed)); }); }
OrtStatus* AddProperty(OrtCheckpointState*, const char*, enum OrtPropertyType, void*) {
  return ott::make_status(ORT_NOT_IMPLEMENTED, "AddProperty: not answered by the packaged runtime yet");
}
OrtStatus* GetProperty(const OrtCheckpointState*, const char*, OrtAllocator*, enum OrtPropertyType*, void**) {
  return ott::make_status(ORT_NOT_IMPLEMENTED, "GetProperty: not answered by the packaged runtime yet");
}
OrtStatus* GetParameterTypeAndShape(const OrtCheckpointState*, const char*, OrtTensorTypeAndShapeInfo**) {
  return ott::make_status(ORT_NOT_IMPLEMENTED, "GetParameterTypeAndShape: not answered by the packaged runtime yet");
}
OrtStatus* UpdateParameter(OrtCheckpointState*, const char*, OrtValue*) {
  return ott::make_status(ORT_NOT_IMPLEMENTED, "UpdateParameter: not answered by the packaged runtime yet");
}
OrtStatus* GetParameter(const OrtCheckpointState*, const char*, OrtAllocator*, OrtValue**) {
  return ott::make_status(ORT_NOT_IMPLEMENTED, "GetParameter: not answered by the packaged runtime yet");
}

const OrtTrainingApi kTable = {
    LoadCheckpoint, SaveCheckpoint, CreateTrainingSession, CreateTrainingSessionFromBuffer, TrainOutputCount,
    EvalOutputCount, NameNotImplemented, NameNotImplemented, LazyResetGrad, TrainStep, EvalStep, SetLearningRate,
    GetLearningRate, OptimizerStep, RegisterLinearLRScheduler, SchedulerStep, GetParametersSize,
    CopyParametersToBuffer, CopyBufferToParameters, ReleaseTrainingSession, ReleaseCheckpointState,
    ExportModelForInferencing, SetSeed, TrainInputCount, EvalInputCount, NameNotImplemented, NameNotImplemented,
    AddProperty, GetProperty, LoadCheckpointFromBuffer, GetParameterTypeAndShape, UpdateParameter, GetParameter,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const OrtTrainingApi* OrtTorchTrainGetTrainingApi(uint32_t version) {
  return version >= 1 && version <= ORT_API_VERSION ? &kTable : nullptr;
}
