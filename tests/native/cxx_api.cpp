// The C++ classes' remaining members (the example covers the training loop): buffers in, properties,
// parameters, names, learning rate, and an error as Ort::Exception with ORT's code.
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
  Ort::CheckpointState::SaveCheckpoint(state, out + "/checkpoint", false);
  auto reloaded = Ort::CheckpointState::LoadCheckpoint(out + "/checkpoint");
  EXPECT(std::get<std::string>(reloaded.GetProperty("tag")) == "cxx");
  std::printf("ok\n");
  return 0;
}
