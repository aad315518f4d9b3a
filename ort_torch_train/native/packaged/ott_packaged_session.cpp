// A package's steps over a checkpoint state: the description the package's build wrote (native_steps.txt), the
// AOTInductor programs loaded with libtorch's C++ loader, and the step-by-step bookkeeping the Python engine does
// (gradient accumulation until LazyResetGrad, the optimizer's per-step scalars, the step count, the LR schedule).
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <sys/utsname.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "ott_packaged.h"

#ifndef OTT_TORCH_VERSION
#error "build with -DOTT_TORCH_VERSION=\"<torch.__version__>\""
#endif

namespace ott {

TensorSpec read_spec(std::istringstream& words, const std::string& line) {
  TensorSpec entry;
  std::string dtype;
  int rank = -1;
  words >> entry.name >> dtype >> rank;
  if (!words || rank < 0 || rank > 32) throw Error(ORT_FAIL, "package description: malformed line '" + line + "'");
  entry.dtype = dtype_named(dtype, "package description");
  entry.shape.resize(size_t(rank));
  for (int64_t& extent : entry.shape)
    if (!(words >> extent) || extent < -1) throw Error(ORT_FAIL, "package description: malformed line '" + line + "'");
  return entry;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); i++) text += (i ? ", " : "") + (shape[i] < 0 ? "any" : std::to_string(shape[i]));
  return text + "]";
}

namespace {

constexpr const char* kFormat = "ort-torch-train-native/3";  // /3: the optimizer program takes flat buffers
constexpr const char* kDescription = "native_steps.txt";
constexpr const char* kGroup = "group0";         // ORT's one optimizer group
constexpr float kDefaultLearningRate = 0.001f;   // ORT's, until the first SetLearningRate

using Entry = TensorSpec;

// The programs write the parameters, gradients, moments and frozen statistics in place, as contiguous tensors.
void require_contiguous(const at::Tensor& tensor, const std::string& what) {
  if (!tensor.is_contiguous()) throw invalid_argument("CreateTrainingSession: " + what + " is not contiguous");
}

}  // namespace

struct Session::Description {
  std::vector<Entry> trainable, frozen;
  std::map<std::string, std::string> files;              // program -> its file
  std::map<std::string, std::vector<Entry>> inputs;      // program -> its user inputs
  std::map<std::string, std::vector<std::string>> outputs;
  std::vector<std::string> eval_parameters, moments, order;
  std::string algorithm;
  std::map<std::string, double> hyperparameters;
  std::map<std::string, std::unique_ptr<torch::inductor::AOTIModelPackageLoader>> programs;
  Prepared prepared;

  explicit Description(const std::string& folder) {
    prepared.folder = folder;
    std::ifstream in(folder + "/" + kDescription);
    if (!in) throw Error(ORT_NO_SUCHFILE, "package '" + folder + "': no " + kDescription +
                                              " (expected a folder written by `ort-torch-train package`)");
    std::string line;
    std::getline(in, line);
    if (line != kFormat)
      throw Error(ORT_FAIL, "package '" + folder + "': " + kDescription + " is of format '" + line +
                                "', this runtime reads '" + kFormat + "'; rebuild the package (`ort-torch-train package`)");
    bool ended = false;
    while (std::getline(in, line)) {
      std::istringstream words(line);
      std::string key, role;
      words >> key;
      if (key == "end") {
        ended = true;
      } else if (key == "torch") {
        words >> role;
        if (role != OTT_TORCH_VERSION)
          throw Error(ORT_FAIL, "package '" + folder + "' was built for another torch version: '" + role +
                                    "' (this runtime is built with " + OTT_TORCH_VERSION + ")");
      } else if (key == "machine") {
        words >> role;
        struct utsname here;
        if (uname(&here) != 0 || role != here.machine)
          throw Error(ORT_FAIL, "package '" + folder + "' was built for another CPU architecture: '" + role + "'");
      } else if (key == "parameter") {
        words >> role;
        (role == "trainable" ? trainable : frozen).push_back(read_spec(words, line));
      } else if (key == "parameter_order") {
        order.emplace_back();
        words >> order.back();
      } else if (key == "program") {
        words >> role >> files[role];
      } else if (key == "input") {
        words >> role;
        inputs[role].push_back(read_spec(words, line));
      } else if (key == "output") {
        words >> role;
        outputs[role].emplace_back();
        words >> outputs[role].back();
      } else if (key == "eval_parameter") {
        eval_parameters.emplace_back();
        words >> eval_parameters.back();
      } else if (key == "algorithm") {
        words >> algorithm;
      } else if (key == "moment") {
        moments.emplace_back();
        words >> moments.back();
      } else if (key == "hyperparameter") {
        std::string value;
        words >> role >> value;
        char* end = nullptr;
        hyperparameters[role] = std::strtod(value.c_str(), &end);
        if (value.empty() || end != value.c_str() + value.size())
          throw Error(ORT_FAIL, "package description: malformed line '" + line + "'");
      } else if (!prepared.read(key, words, line)) {
        throw Error(ORT_FAIL, "package description: unknown line '" + line + "'");
      }
    }
    if (!ended || !files.count("train"))
      throw Error(ORT_FAIL, "package '" + folder + "': " + kDescription + " is incomplete");
    for (const auto& [role, file] : files) {
      std::string path = package_file(folder, file, "program " + role);
      try {
        programs[role] = std::make_unique<torch::inductor::AOTIModelPackageLoader>(path, "model", true);
      } catch (const std::exception& error) {
        throw Error(ORT_FAIL, "package '" + folder + "': cannot load '" + file + "': " + error.what());
      }
    }
  }

  std::vector<at::Tensor> checked(const std::string& role, const std::vector<at::Tensor>& given, const char* what) {
    const std::vector<Entry>& entries = inputs[role];
    if (given.size() != entries.size())
      throw invalid_argument(std::string(what) + ": expected " + std::to_string(entries.size()) + " inputs, got " +
                             std::to_string(given.size()));
    std::vector<at::Tensor> ready;
    for (size_t i = 0; i < given.size(); i++) {
      const Entry& entry = entries[i];
      bool fits = given[i].scalar_type() == entry.dtype && size_t(given[i].dim()) == entry.shape.size();
      for (size_t axis = 0; fits && axis < entry.shape.size(); axis++)
        fits = entry.shape[axis] < 0 ? given[i].size(int64_t(axis)) >= 1 : given[i].size(int64_t(axis)) == entry.shape[axis];
      if (!fits)
        throw invalid_argument(std::string(what) + ": input '" + entry.name + "': the package takes " +
                               dtype_name(entry.dtype) + " " + shape_text(entry.shape) + ", got " +
                               dtype_name(given[i].scalar_type()) + " " + shape_text(given[i].sizes().vec()));
      ready.push_back(given[i].contiguous());
    }
    return ready;
  }

  torch::inductor::AOTIModelPackageLoader& program(const std::string& role) {
    auto found = programs.find(role);
    if (found == programs.end()) throw Error(ORT_FAIL, "the package holds no " + role + " step");
    return *found->second;
  }

  std::vector<at::Tensor> run(const std::string& role, const std::vector<at::Tensor>& arguments) {
    return program(role).run(arguments);
  }
};

Session::Session(const std::string& folder, OrtCheckpointState* state)
    : state_(state), description_(std::make_unique<Description>(folder)), learning_rate_(kDefaultLearningRate) {
  CheckpointData& data = state->data;
  if (data.is_nominal) throw invalid_argument("CreateTrainingSession: the checkpoint is nominal (no parameter values)");
  auto bind = [&](const std::vector<Entry>& entries) {
    std::vector<at::Tensor*> found;
    for (const Entry& entry : entries) {
      at::Tensor* tensor = data.find(entry.name);
      if (tensor == nullptr || tensor->scalar_type() != entry.dtype || tensor->sizes().vec() != entry.shape)
        throw invalid_argument("CreateTrainingSession: parameter '" + entry.name + "' is " +
                               dtype_name(entry.dtype) + " " + shape_text(entry.shape) + " in the package, " +
                               (tensor ? dtype_name(tensor->scalar_type()) + " " +
                                             shape_text(tensor->sizes().vec())
                                       : std::string("absent")) +
                               " in the checkpoint state");
      require_contiguous(*tensor, "parameter '" + entry.name + "'");
      found.push_back(tensor);
    }
    return found;
  };
  std::vector<at::Tensor*> trainable = bind(description_->trainable);
  for (at::Tensor* tensor : bind(description_->frozen)) frozen_.push_back(*tensor);
  const bool optimizes = description_->files.count("optimizer") > 0;
  if (optimizes && trainable.empty())
    throw Error(ORT_FAIL, "package description: an optimizer program with no trainable parameter");
  if (optimizes) {  // the trainable parameters become views of one flat buffer, as do their gradients
    flat_params_ = flatten(trainable, "trainable parameters");
    flat_grads_ = at::zeros_like(flat_params_);
  }
  int64_t offset = 0;
  for (at::Tensor* tensor : trainable) {
    trainable_.push_back(*tensor);
    grads_.push_back(optimizes ? flat_grads_.narrow(0, offset, tensor->numel()).view(tensor->sizes())
                               : at::zeros_like(*tensor));
    offset += tensor->numel();
  }
  for (const std::string& name : description_->order) {  // the flat buffer's order: the training graph's
    for (size_t i = 0; i < trainable_.size(); i++)
      if (description_->trainable[i].name == name) ordered_.push_back({true, trainable_[i]});
    for (size_t i = 0; i < frozen_.size(); i++)
      if (description_->frozen[i].name == name) ordered_.push_back({false, frozen_[i]});
  }
  if (ordered_.size() != trainable_.size() + frozen_.size())
    throw Error(ORT_FAIL, "package description: parameter_order does not list each parameter once");
  for (bool flag : {false, true}) reset_flags_[flag] = at::scalar_tensor(flag, at::TensorOptions().dtype(at::kBool));
  train_outputs_ = description_->outputs["train"].size();
  if (!optimizes) return;
  if (!data.has_optimizer) {
    data.has_optimizer = true;
    data.optimizer = OptimizerGroup{kGroup, 0, kDefaultLearningRate, {}};
  } else if (data.optimizer.name != kGroup) {
    throw invalid_argument("CreateTrainingSession: the checkpoint's optimizer group is named '" + data.optimizer.name +
                           "'; ORT uses exactly one group, 'group0'");
  }
  // Every moment made first: a moment added to a parameter's list may move the ones it holds.
  for (const std::string& moment : description_->moments) {
    for (size_t i = 0; i < trainable_.size(); i++) {
      std::vector<Named>& held = data.optimizer.momentums[description_->trainable[i].name];
      bool present = false;
      for (const Named& named : held) {
        if (named.name != moment) continue;
        present = true;
        if (named.tensor.sizes() != trainable_[i].sizes() || named.tensor.scalar_type() != trainable_[i].scalar_type())
          throw invalid_argument("CreateTrainingSession: moment '" + moment + "' of '" +
                                 description_->trainable[i].name + "' does not match its parameter");
        require_contiguous(named.tensor, "moment '" + moment + "' of '" + description_->trainable[i].name + "'");
      }
      if (!present) held.push_back(Named{moment, at::zeros_like(trainable_[i])});
    }
  }
  for (const std::string& moment : description_->moments) {
    std::vector<at::Tensor*> tensors;
    for (size_t i = 0; i < trainable_.size(); i++)
      for (Named& named : data.optimizer.momentums[description_->trainable[i].name])
        if (named.name == moment) tensors.push_back(&named.tensor);
    flat_moments_.push_back(flatten(tensors, "moments '" + moment + "'"));
  }
}

Session::~Session() = default;

// The steps copy and allocate no state: the programs' arguments are handed over (boxed_run) and the programs write
// the gradients, frozen statistics, parameters and moments in place (every handle to them, the checkpoint state's
// included, sees the new values).
std::vector<at::Tensor> Session::train_step(const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> arguments = description_->checked("train", inputs, "TrainStep");
  arguments.reserve(arguments.size() + 2 * grads_.size() + frozen_.size() + 1);
  arguments.insert(arguments.end(), trainable_.begin(), trainable_.end());
  arguments.insert(arguments.end(), frozen_.begin(), frozen_.end());
  arguments.insert(arguments.end(), grads_.begin(), grads_.end());
  arguments.push_back(reset_flags_[reset_ ? 1 : 0]);
  std::vector<at::Tensor> returned = description_->program("train").boxed_run(std::move(arguments));
  if (returned.size() != train_outputs_)
    throw Error(ORT_FAIL, "TrainStep: the train program returned " + std::to_string(returned.size()) + " tensors");
  reset_ = false;
  return returned;
}

std::vector<at::Tensor> Session::eval_step(const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> arguments = description_->checked("eval", inputs, "EvalStep");
  for (const std::string& name : description_->eval_parameters) {
    at::Tensor* tensor = state_->data.find(name);
    if (tensor == nullptr) throw Error(ORT_FAIL, "EvalStep: the checkpoint state has no parameter '" + name + "'");
    arguments.push_back(*tensor);
  }
  return description_->run("eval", arguments);
}

void Session::optimizer_step() {
  if (!description_->files.count("optimizer")) throw Error(ORT_FAIL, "OptimizerStep: the package holds no optimizer step");
  auto& h = description_->hyperparameters;
  if (state_->data.optimizer.step == std::numeric_limits<int64_t>::max())
    throw Error(ORT_FAIL, "OptimizerStep: the checkpoint state's step count is int64's largest (" +
                              std::to_string(state_->data.optimizer.step) + "); it cannot count another step");
  const int64_t step = state_->data.optimizer.step + 1;
  const double lr = learning_rate_;
  std::vector<float> values;
  if (description_->algorithm == "sgd") {
    values = {float(-lr)};
  } else if (description_->algorithm == "adamw") {  // optim/adamw.py's adamw_step_scalars, every rounding as there
    const double beta1 = h["beta1"], beta2 = h["beta2"];
    float bc1 = 1.0f, bc2 = 1.0f, corrected = float(lr);
    if (h["correct_bias"] != 0) {
      bc1 = float(1.0 - double(float(std::pow(beta1, double(step)))));
      bc2 = float(1.0 - double(float(std::pow(beta2, double(step)))));
      corrected = float(lr * double(float(double(float(std::sqrt(double(bc2)))) / double(bc1))));
    }
    values = {float(lr), float(beta1), float(1.0 - beta1), float(beta2), float(1.0 - beta2), float(h["eps"]),
              bc1, bc2, corrected, float(h["weight_decay"]), float(lr * h["weight_decay"])};
  } else {
    throw Error(ORT_NOT_IMPLEMENTED, "OptimizerStep: algorithm '" + description_->algorithm + "' is not supported");
  }
  if (!scalars_.defined() || size_t(scalars_.numel()) != values.size()) {
    scalars_ = at::empty({int64_t(values.size())}, at::TensorOptions().dtype(at::kFloat));
    if (values.size() == 1) scalars_ = scalars_.reshape({});
  }
  std::copy(values.begin(), values.end(), scalars_.data_ptr<float>());
  std::vector<at::Tensor> arguments{flat_params_, flat_grads_};
  arguments.reserve(3 + flat_moments_.size());
  arguments.insert(arguments.end(), flat_moments_.begin(), flat_moments_.end());
  arguments.push_back(scalars_);
  std::vector<at::Tensor> returned = description_->program("optimizer").boxed_run(std::move(arguments));
  if (!returned.empty())
    throw Error(ORT_FAIL, "OptimizerStep: the optimizer program returned " + std::to_string(returned.size()) + " tensors");
  state_->data.optimizer.step = step;
}

void Session::set_learning_rate(float value) {
  if (!std::isfinite(value) || value < 0)
    throw invalid_argument("SetLearningRate: the learning rate must be finite and >= 0, got " + std::to_string(value));
  learning_rate_ = value;
}

void Session::register_linear_scheduler(int64_t warmup, int64_t total, float initial) {
  if (warmup < 0 || total < 0 || warmup > total)
    throw invalid_argument("RegisterLinearLRScheduler: expected 0 <= warmup_step_count <= total_step_count, got " +
                           std::to_string(warmup) + " and " + std::to_string(total));
  if (!std::isfinite(initial) || initial < 0) throw invalid_argument("RegisterLinearLRScheduler: initial_lr must be >= 0");
  if (!description_->files.count("optimizer")) throw Error(ORT_FAIL, "RegisterLinearLRScheduler: no optimizer step");
  if (state_->data.optimizer.step >= total)
    throw invalid_argument("RegisterLinearLRScheduler: total_step_count (" + std::to_string(total) +
                           ") is not above the optimizer's completed steps");
  warmup_ = warmup, total_ = total, scheduled_ = true;
  state_->data.optimizer.initial_learning_rate = initial;
  scheduler_step();
}

void Session::scheduler_step() {
  if (!scheduled_) throw Error(ORT_FAIL, "SchedulerStep: no scheduler registered (RegisterLinearLRScheduler)");
  const int64_t step = state_->data.optimizer.step;
  double factor = step < warmup_ ? double(step) / double(std::max<int64_t>(1, warmup_))
                                 : std::max(0.0, double(total_ - step) / double(std::max<int64_t>(1, total_ - warmup_)));
  learning_rate_ = state_->data.optimizer.initial_learning_rate * float(factor);
}

std::vector<at::Tensor> Session::parameters(bool trainable_only) const {
  std::vector<at::Tensor> chosen;
  for (const auto& [trainable, tensor] : ordered_)
    if (trainable || !trainable_only) chosen.push_back(tensor);
  return chosen;
}

size_t Session::parameters_size(bool trainable_only) const {
  size_t count = 0;
  for (const at::Tensor& param : parameters(trainable_only)) count += size_t(param.numel());
  return count;
}

void Session::copy_parameters_to(at::Tensor buffer, bool trainable_only) const {
  if (buffer.dim() != 1 || size_t(buffer.numel()) != parameters_size(trainable_only) || buffer.scalar_type() != at::kFloat)
    throw invalid_argument("CopyParametersToBuffer: expected a float32 buffer of " +
                           std::to_string(parameters_size(trainable_only)) + " elements");
  int64_t at = 0;
  for (const at::Tensor& param : parameters(trainable_only)) {
    buffer.narrow(0, at, param.numel()).copy_(param.reshape({-1}));
    at += param.numel();
  }
}

void Session::copy_parameters_from(const at::Tensor& buffer, bool trainable_only) {
  if (buffer.dim() != 1 || size_t(buffer.numel()) != parameters_size(trainable_only) || buffer.scalar_type() != at::kFloat)
    throw invalid_argument("CopyBufferToParameters: expected a float32 buffer of " +
                           std::to_string(parameters_size(trainable_only)) + " elements");
  int64_t at = 0;
  for (at::Tensor& param : parameters(trainable_only)) {
    param.copy_(buffer.narrow(0, at, param.numel()).view(param.sizes()));
    at += param.numel();
  }
}

const Prepared& Session::prepared() const { return description_->prepared; }

size_t Session::train_outputs() const { return description_->outputs["train"].size(); }
size_t Session::eval_outputs() const { return description_->outputs["eval"].size(); }
size_t Session::train_inputs() const { return description_->inputs["train"].size(); }
size_t Session::eval_inputs() const { return description_->inputs["eval"].size(); }

const std::string& Session::name(bool train, bool input, size_t index) const {
  const char* role = train ? "train" : "eval";
  size_t count = input ? description_->inputs[role].size() : description_->outputs[role].size();
  if (index >= count)
    throw invalid_argument(std::string("index ") + std::to_string(index) + " is past the " + role + " step's " +
                           std::to_string(count) + (input ? " inputs" : " outputs"));
  return input ? description_->inputs[role][index].name : description_->outputs[role][index];
}

}  // namespace ott
