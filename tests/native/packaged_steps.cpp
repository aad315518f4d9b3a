// Trains through a package of steps (ort-torch-train package) with libtorch alone: no Python in the process.
//
// usage: packaged_steps PACKAGE_DIR RUN_FILE
// RUN_FILE holds tensors, each a text header "dtype rank d0 d1 ...\n" (dtype f32, i64 or b8) and its raw bytes:
// the trainable parameters (P of them, given first as "count P\n"), the moments' count M ("count M\n") and their
// M * P tensors (moment by moment), the steps' count S ("count S\n"), then per step its user inputs (the train program's count, "count I\n" given
// once before the steps) and the optimizer's scalars. Each step is TrainStep (the gradients reset), then
// OptimizerStep; the programs write the gradients, parameters and moments in place. It prints "libpython mapped: N" (the /proc/self/maps lines naming libpython), each step's
// loss as "loss %.9g", then each parameter's values as "param %.9g ...".
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

int count(std::ifstream& in) {
  std::string line;
  std::getline(in, line);
  std::istringstream words(line);
  std::string tag;
  int value = -1;
  words >> tag >> value;
  if (tag != "count" || value < 0) throw std::runtime_error("run file: expected 'count N', got '" + line + "'");
  return value;
}

at::Tensor tensor(std::ifstream& in) {
  std::string line;
  std::getline(in, line);
  std::istringstream words(line);
  std::string dtype;
  int rank = -1;
  words >> dtype >> rank;
  if (rank < 0 || rank > 8) throw std::runtime_error("run file: bad tensor header '" + line + "'");
  std::vector<int64_t> shape(rank);
  for (auto& extent : shape) words >> extent;
  at::ScalarType type = dtype == "f32" ? at::kFloat : dtype == "i64" ? at::kLong : dtype == "b8" ? at::kBool : at::kByte;
  if (type == at::kByte) throw std::runtime_error("run file: unknown dtype '" + dtype + "'");
  at::Tensor value = at::empty(shape, at::TensorOptions().dtype(type));
  in.read(static_cast<char*>(value.data_ptr()), static_cast<std::streamsize>(value.nbytes()));
  if (!in) throw std::runtime_error("run file: short tensor data");
  return value;
}

int libpython_lines() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int found = 0;
  while (std::getline(maps, line)) found += line.find("libpython") != std::string::npos;
  return found;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s PACKAGE_DIR RUN_FILE\n", argv[0]);
    return 2;
  }
  try {
    const std::string package = argv[1];
    torch::inductor::AOTIModelPackageLoader train(package + "/train_step", "model", true);
    torch::inductor::AOTIModelPackageLoader optimizer(package + "/optimizer_step", "model", true);
    std::ifstream in(argv[2], std::ios::binary);
    const int parameters = count(in);
    std::vector<at::Tensor> params, grads, pieces;
    for (int i = 0; i < parameters; i++) pieces.push_back(tensor(in));
    // the optimizer program takes the parameters, gradients and each moment as one flat tensor each; the train
    // program takes views of them
    auto flat = [&](const std::vector<at::Tensor>& tensors, std::vector<at::Tensor>* views) {
      std::vector<at::Tensor> rows;
      for (const at::Tensor& piece : tensors) rows.push_back(piece.reshape({-1}));
      at::Tensor whole = at::cat(rows);
      int64_t offset = 0;
      for (const at::Tensor& piece : tensors) {
        if (views != nullptr) views->push_back(whole.narrow(0, offset, piece.numel()).view(piece.sizes()));
        offset += piece.numel();
      }
      return whole;
    };
    const at::Tensor flat_params = flat(pieces, &params);
    const at::Tensor flat_grads = at::zeros_like(flat_params);
    int64_t offset = 0;
    for (const at::Tensor& param : params) {
      grads.push_back(flat_grads.narrow(0, offset, param.numel()).view(param.sizes()));
      offset += param.numel();
    }
    const int moments = count(in);
    std::vector<at::Tensor> states;  // one flat tensor per moment
    for (int m = 0; m < moments; m++) {
      std::vector<at::Tensor> moment;
      for (int i = 0; i < parameters; i++) moment.push_back(tensor(in));
      states.push_back(flat(moment, nullptr));
    }
    const int steps = count(in);
    const int inputs = count(in);
    std::printf("libpython mapped: %d\n", libpython_lines());
    const at::Tensor reset = at::ones({}, at::TensorOptions().dtype(at::kBool));
    for (int step = 0; step < steps; step++) {
      std::vector<at::Tensor> arguments;
      for (int i = 0; i < inputs; i++) arguments.push_back(tensor(in));
      arguments.insert(arguments.end(), params.begin(), params.end());
      arguments.insert(arguments.end(), grads.begin(), grads.end());
      arguments.push_back(reset);
      std::vector<at::Tensor> returned = train.run(arguments);  // the package has no frozen parameters here
      std::printf("loss %.9g\n", returned[0].item<float>());
      std::vector<at::Tensor> update{flat_params, flat_grads};
      update.insert(update.end(), states.begin(), states.end());
      update.push_back(tensor(in));
      if (!optimizer.run(update).empty()) throw std::runtime_error("the optimizer program returned tensors");
    }
    for (const auto& param : params) {
      at::Tensor flat = param.contiguous().view({-1});
      std::printf("param");
      for (int64_t i = 0; i < flat.numel(); i++) std::printf(" %.9g", flat[i].item<float>());
      std::printf("\n");
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "packaged_steps: %s\n", error.what());
    return 1;
  }
  return 0;
}
