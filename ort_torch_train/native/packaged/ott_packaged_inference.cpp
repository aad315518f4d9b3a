// OrtApi's CreateSession, Run and ReleaseSession over the models this runtime exported: a training program that exports
// its model and runs it (examples/native/train.c) needs no ONNX Runtime. A model file is recognised as one of the
// prepared exports of a package with a training session open in the process: its bytes equal the prepared model's
// outside the parameters' ranges. Its parameters are read from those ranges and the package's compiled inference
// program runs it. Any other model is refused with ORT_INVALID_ARGUMENT.
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "ott_packaged.h"

struct OrtSession {
  std::shared_ptr<const ott::ExportSet> set;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> program;
  std::vector<at::Tensor> parameters;
};

namespace ott {
namespace {

// The exports of the packages whose training sessions are open, for CreateSession.
std::mutex open_exports_lock;
std::vector<std::weak_ptr<const ExportSet>> open_exports;

// Whether model is the prepared model of set with other parameter values: equal bytes outside the ranges.
bool is_export_of(const std::string& model, const ExportSet& set) {
  std::string path = package_file(set.folder, set.model_file, "export " + std::to_string(set.index)), prepared;
  try {
    prepared = read_file(path, kModelLimit, "CreateSession");
  } catch (const Error&) {
    return false;
  }
  if (prepared.size() != model.size()) return false;
  uint64_t from = 0;
  for (const ExportSet::Range& range : set.parameters) {  // the ranges lie in the file's order
    if (range.offset < from || range.offset + range.length > model.size()) return false;
    if (std::memcmp(model.data() + from, prepared.data() + from, range.offset - from) != 0) return false;
    from = range.offset + range.length;
  }
  return std::memcmp(model.data() + from, prepared.data() + from, model.size() - from) == 0;
}

}  // namespace

std::shared_ptr<void> register_exports(const Prepared& prepared) {
  auto held = std::make_shared<std::vector<std::shared_ptr<const ExportSet>>>();
  for (const auto& [index, set] : prepared.exports) held->push_back(set);
  std::lock_guard<std::mutex> guard(open_exports_lock);
  std::erase_if(open_exports, [](const std::weak_ptr<const ExportSet>& known) { return known.expired(); });
  for (const auto& set : *held) open_exports.push_back(set);
  return held;
}

}  // namespace ott

namespace {

using ott::Error;
using ott::guarded;
using ott::invalid_argument;
using ott::Kind;
using ott::require;
using ott::resolve;

OrtStatus* CreateSession(const OrtEnv* env, const ORTCHAR_T* path, const OrtSessionOptions* options, OrtSession** out) {
  return guarded([&] {
    resolve(env, "env"), require(path, "model_path"), resolve(options, "options"), require(out, "out");
    std::string model = ott::read_file(path, ott::kModelLimit, "CreateSession");
    std::vector<std::shared_ptr<const ott::ExportSet>> known;
    {
      std::lock_guard<std::mutex> guard(ott::open_exports_lock);
      for (const auto& entry : ott::open_exports)
        if (auto set = entry.lock()) known.push_back(set);
    }
    for (const auto& set : known) {
      if (!ott::is_export_of(model, *set)) continue;
      auto session = std::make_unique<OrtSession>();
      session->set = set;
      for (const ott::ExportSet::Range& range : set->parameters) {
        at::Tensor tensor = at::empty(range.tensor.shape, at::TensorOptions().dtype(range.tensor.dtype));
        if (range.length) std::memcpy(tensor.data_ptr(), model.data() + range.offset, range.length);
        session->parameters.push_back(tensor);
      }
      std::string program = ott::package_file(set->folder, set->program_file, "export " + std::to_string(set->index));
      try {
        session->program = std::make_unique<torch::inductor::AOTIModelPackageLoader>(program, "model", true);
      } catch (const std::exception& error) {
        throw Error(ORT_FAIL, "CreateSession: cannot load '" + set->program_file + "': " + error.what());
      }
      ott::register_handle(session.get(), Kind::inference_session);
      *out = session.release();
      return;
    }
    throw invalid_argument(std::string("CreateSession: the packaged runtime runs only the models it exported "
                                       "(ExportModelForInferencing) from a package with a training session open in "
                                       "this process; '") + path + "' is none of them");
  });
}

size_t input_position(const ott::ExportSet& set, const char* name) {
  for (size_t i = 0; i < set.inputs.size(); i++)
    if (set.inputs[i].name == name) return i;
  throw invalid_argument(std::string("Run: the model has no input '") + name + "'");
}

OrtStatus* Run(OrtSession* session, const OrtRunOptions* options, const char* const* input_names,
               const OrtValue* const* inputs, size_t input_len, const char* const* output_names, size_t output_len,
               OrtValue** outputs) {
  return guarded([&] {
    const ott::ExportSet& set = *resolve(session, "session")->set;
    if (options != nullptr) resolve(options, "run_options");
    if (input_len != set.inputs.size())
      throw invalid_argument("Run: input_len is " + std::to_string(input_len) + "; the model has " +
                             std::to_string(set.inputs.size()) + " inputs");
    if (input_len > 0) require(input_names, "input_names"), require(inputs, "inputs");
    if (output_len > 0) require(output_names, "output_names"), require(outputs, "outputs");
    ott::check_handles(reinterpret_cast<const void* const*>(inputs), input_len, Kind::value, "inputs", false);
    ott::check_handles(reinterpret_cast<const void* const*>(outputs), output_len, Kind::value, "outputs", true);
    std::vector<at::Tensor> arguments(input_len);
    for (size_t i = 0; i < input_len; i++) {
      if (input_names[i] == nullptr) throw invalid_argument("Run: input_names[" + std::to_string(i) + "] is NULL");
      size_t at = input_position(set, input_names[i]);
      const ott::TensorSpec& spec = set.inputs[at];
      const at::Tensor& given = inputs[i]->tensor;
      bool fits = given.scalar_type() == spec.dtype && size_t(given.dim()) == spec.shape.size();
      for (size_t axis = 0; fits && axis < spec.shape.size(); axis++)
        fits = spec.shape[axis] < 0 ? given.size(int64_t(axis)) >= 1 : given.size(int64_t(axis)) == spec.shape[axis];
      if (!fits)
        throw invalid_argument("Run: input '" + spec.name + "': the model takes " + ott::dtype_name(spec.dtype) + " " +
                               ott::shape_text(spec.shape) + ", got " + ott::dtype_name(given.scalar_type()) + " " +
                               ott::shape_text(given.sizes().vec()));
      if (arguments[at].defined()) throw invalid_argument("Run: input '" + spec.name + "' is given twice");
      arguments[at] = given.contiguous();
    }
    std::vector<size_t> chosen;
    for (size_t i = 0; i < output_len; i++) {
      if (output_names[i] == nullptr) throw invalid_argument("Run: output_names[" + std::to_string(i) + "] is NULL");
      auto found = std::find(set.outputs.begin(), set.outputs.end(), std::string(output_names[i]));
      if (found == set.outputs.end())
        throw invalid_argument(std::string("Run: the model has no output '") + output_names[i] + "'");
      chosen.push_back(size_t(found - set.outputs.begin()));
    }
    arguments.insert(arguments.end(), session->parameters.begin(), session->parameters.end());
    std::vector<at::Tensor> produced = session->program->run(arguments);
    if (produced.size() != set.outputs.size())
      throw Error(ORT_FAIL, "Run: the inference program returned " + std::to_string(produced.size()) + " tensors");
    for (size_t i = 0; i < output_len; i++) {  // ORT's rule: a given tensor is filled, an empty slot gets a new one
      const at::Tensor& value = produced[chosen[i]];
      if (outputs[i] == nullptr) continue;
      if (outputs[i]->tensor.scalar_type() != value.scalar_type() || outputs[i]->tensor.sizes() != value.sizes())
        throw invalid_argument("Run: outputs[" + std::to_string(i) + "] is not a " + ott::dtype_name(value.scalar_type()) +
                               " " + ott::shape_text(value.sizes().vec()) + " tensor");
    }
    for (size_t i = 0; i < output_len; i++) {
      if (outputs[i] == nullptr) outputs[i] = ott::make_handle<OrtValue>(produced[chosen[i]].clone());
      else outputs[i]->tensor.copy_(produced[chosen[i]]);
    }
  });
}

void ReleaseSession(OrtSession* session) { ott::release_handle(session, "ReleaseSession"); }

}  // namespace

namespace ott {

void set_inference_members(void** slots) {
  slots[OTT_ORT_CreateSession] = reinterpret_cast<void*>(&CreateSession);
  slots[OTT_ORT_Run] = reinterpret_cast<void*>(&Run);
  slots[OTT_ORT_ReleaseSession] = reinterpret_cast<void*>(&ReleaseSession);
}

}  // namespace ott
