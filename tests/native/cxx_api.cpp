// The C++ classes' remaining members (the example covers the training loop): buffers in, properties,
// parameters, names, learning rate, and an error as Ort::Exception with ORT's code; ORT-format models (the
// fixture's artifacts_ort/, beside ARTIFACTS_DIR) from paths and from buffers train as the ONNX models do.
//   cxx_api ARTIFACTS_DIR OUT_DIR        prints "ok"
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <variant>
#include <vector>

#include "ort_torch_train_training_cxx_api.h"

#define EXPECT(cond)                                                        \
  do {                                                                      \
    if (!(cond)) {                                                          \
      std::fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      return 1;                                                             \
    }                                                                       \
  } while (0)

static std::vector<uint8_t> Read(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(file), {});
}

// The loss of a second training step (the first step's update applied) on fixed data.
static float SecondStepLoss(Ort::TrainingSession& session) {
  std::vector<float> x(8 * 20);
  std::vector<int64_t> y(8);
  for (size_t i = 0; i < x.size(); i++) x[i] = static_cast<float>((i * 37) % 11) / 11.0f - 0.5f;
  for (size_t i = 0; i < y.size(); i++) y[i] = static_cast<int64_t>(i % 5);
  auto cpu = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  const int64_t x_dims[2] = {8, 20}, y_dims[1] = {8};
  std::vector<Ort::Value> inputs;
  inputs.push_back(Ort::Value::CreateTensor<float>(cpu, x.data(), x.size(), x_dims, 2));
  inputs.push_back(Ort::Value::CreateTensor<int64_t>(cpu, y.data(), y.size(), y_dims, 1));
  float loss = 0.0f;
  for (int step = 0; step < 2; step++) {
    loss = session.TrainStep(inputs)[0].GetTensorData<float>()[0];
    session.OptimizerStep();
    session.LazyResetGrad();
  }
  return loss;
}

static int OrtFormatModelsTrainAsOnnxModels(const Ort::Env& env, const Ort::SessionOptions& options,
                                            const std::string& dir) {
  const std::string ort = dir + "/../artifacts_ort";
  auto onnx_state = Ort::CheckpointState::LoadCheckpoint(dir + "/checkpoint");
  auto path_state = Ort::CheckpointState::LoadCheckpoint(dir + "/checkpoint");
  auto buffer_state = Ort::CheckpointState::LoadCheckpoint(dir + "/checkpoint");
  Ort::TrainingSession onnx(env, options, onnx_state, dir + "/training_model.onnx", dir + "/eval_model.onnx",
                            dir + "/optimizer_model.onnx");
  Ort::TrainingSession from_paths(env, options, path_state, ort + "/training_model.ort", ort + "/eval_model.ort",
                                  ort + "/optimizer_model.ort");
  Ort::TrainingSession from_buffers(env, options, buffer_state, Read(ort + "/training_model.ort"),
                                    Read(ort + "/eval_model.ort"), Read(ort + "/optimizer_model.ort"));
  EXPECT(from_paths.InputNames(true) == onnx.InputNames(true));
  EXPECT(from_buffers.OutputNames(false) == onnx.OutputNames(false));
  const float expected = SecondStepLoss(onnx);
  EXPECT(SecondStepLoss(from_paths) == expected);
  EXPECT(SecondStepLoss(from_buffers) == expected);
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const std::string dir = argv[1], out = argv[2];
  Ort::Env env;
  Ort::SessionOptions options;
  auto state = Ort::CheckpointState::LoadCheckpointFromBuffer(Read(dir + "/checkpoint"));
  Ort::TrainingSession session(env, options, state, Read(dir + "/training_model.onnx"),
                               Read(dir + "/eval_model.onnx"), Read(dir + "/optimizer_model.onnx"));
  EXPECT(session.InputNames(false) == (std::vector<std::string>{"input", "labels"}));
  EXPECT(session.OutputNames(true) == std::vector<std::string>{"onnx::loss::2"});
  session.SetLearningRate(0.02f);
  EXPECT(session.GetLearningRate() == 0.02f);

  state.AddProperty("epoch", int64_t{4});
  state.AddProperty("best", 0.5f);
  state.AddProperty("tag", std::string("cxx"));
  EXPECT(std::get<int64_t>(state.GetProperty("epoch")) == 4);
  EXPECT(std::get<float>(state.GetProperty("best")) == 0.5f);
  EXPECT(std::get<std::string>(state.GetProperty("tag")) == "cxx");

  Ort::Value bias = state.GetParameter("2.bias");
  EXPECT(bias.GetTensorTypeAndShapeInfo().GetShape() == std::vector<int64_t>{5});
  float* values = bias.GetTensorMutableData<float>();
  for (int i = 0; i < 5; i++) values[i] = 0.25f * static_cast<float>(i);
  state.UpdateParameter("2.bias", bias);
  Ort::Value again = state.GetParameter("2.bias");
  EXPECT(again.GetTensorData<float>()[4] == 1.0f);

  Ort::Value all = session.ToBuffer(false);
  EXPECT(all.GetTensorTypeAndShapeInfo().GetElementCount() == 837);
  all.GetTensorMutableData<float>()[0] = 3.0f;
  session.FromBuffer(all);
  EXPECT(session.ToBuffer(true).GetTensorData<float>()[0] == 3.0f);

  Ort::SetSeed(3);
  try {
    Ort::CheckpointState::LoadCheckpoint(out + "/missing");
    return 1;
  } catch (const Ort::Exception& error) {
    EXPECT(error.GetOrtErrorCode() == ORT_NO_SUCHFILE);
  }
  try {
    std::vector<Ort::Value> none;
    session.TrainStep(none);
    return 1;
  } catch (const Ort::Exception& error) {
    EXPECT(error.GetOrtErrorCode() == ORT_INVALID_ARGUMENT);
  }
  try {  // ONNX Runtime's own test (LoadModelsFromBufferThrows) asserts this text
    std::vector<uint8_t> no_model;
    Ort::TrainingSession empty(env, options, state, no_model);
    return 1;
  } catch (const Ort::Exception& error) {
    EXPECT(std::string(error.what()).find("Training Session Creation failed. Train model data cannot be NULL.") !=
           std::string::npos);
    EXPECT(error.GetOrtErrorCode() == ORT_INVALID_ARGUMENT);
  }
  if (OrtFormatModelsTrainAsOnnxModels(env, options, dir) != 0) return 1;
  Ort::CheckpointState::SaveCheckpoint(state, out + "/checkpoint", false);
  auto reloaded = Ort::CheckpointState::LoadCheckpoint(out + "/checkpoint");
  EXPECT(std::get<std::string>(reloaded.GetProperty("tag")) == "cxx");
  std::printf("ok\n");
  return 0;
}
