// A program written against ONNX Runtime's C++ API: the core classes real applications call around the
// training classes. Runs the eval model in ONNX Runtime's own inference session, with the checkpoint's
// parameters as inputs, and checks its loss against the training session's EvalStep.
//   ort_cxx_core ARTIFACTS_DIR      prints "loss INFERENCE EVAL" and "ok"
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "ort_torch_train_training_cxx_api.h"

#define EXPECT(cond)                                                           \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      return 1;                                                                \
    }                                                                          \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  Ort::Env env;
  Ort::SessionOptions options;
  Ort::MemoryInfo memory_info = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);

  std::vector<float> x(8 * 20);
  std::vector<int64_t> labels(8);
  for (size_t i = 0; i < x.size(); i++) x[i] = std::sin(0.37f * static_cast<float>(i));
  for (size_t i = 0; i < labels.size(); i++) labels[i] = static_cast<int64_t>(i % 5);
  const int64_t x_shape[2] = {8, 20}, labels_shape[1] = {8};
  std::vector<Ort::Value> inputs;
  inputs.push_back(Ort::Value::CreateTensor(memory_info, x.data(), x.size() * sizeof(float), x_shape, 2,
                                            ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT));
  inputs.push_back(Ort::Value::CreateTensor<int64_t>(memory_info, labels.data(), labels.size(), labels_shape, 1));
  EXPECT(inputs[0].IsTensor());
  Ort::TensorTypeAndShapeInfo info = inputs[0].GetTensorTypeAndShapeInfo();
  EXPECT(info.GetElementType() == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT);
  EXPECT(info.GetShape() == (std::vector<int64_t>{8, 20}) && info.GetElementCount() == 160);
  EXPECT(info.GetDimensionsCount() == 2);

  Ort::AllocatorWithDefaultOptions allocator;
  Ort::Value made = Ort::Value::CreateTensor<float>(allocator, x_shape, 2);
  EXPECT(made.GetTensorTypeAndShapeInfo().GetElementCount() == 160);

  Ort::RunOptions run_options;
  run_options.SetRunTag("ort_cxx_core");
  EXPECT(std::string(run_options.GetRunTag()) == "ort_cxx_core");

  // the eval model takes the parameters as inputs: fed from the checkpoint state
  const std::string eval_path = dir + "/eval_model.onnx";
  auto state = Ort::CheckpointState::LoadCheckpoint(dir + "/checkpoint");
  Ort::TrainingSession session(env, options, state, dir + "/training_model.onnx", eval_path);
  const char* input_names[] = {"input", "labels", "0.weight", "0.bias", "2.weight", "2.bias"};
  for (size_t i = 2; i < 6; i++) inputs.push_back(state.GetParameter(input_names[i]));
  const char* output_names[] = {"onnx::loss::2"};
  Ort::Session inference(env, eval_path.c_str(), options);
  EXPECT(inference.GetInputCount() == 6 && inference.GetOutputCount() == 1);
  std::vector<Ort::Value> outputs = inference.Run(run_options, input_names, inputs.data(), 6, output_names, 1);
  EXPECT(outputs.size() == 1 && outputs[0].IsTensor());
  const float inference_loss = *outputs[0].GetTensorData<float>();

  std::ifstream file(eval_path, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  Ort::Session from_bytes(env, bytes.data(), bytes.size(), options);
  Ort::Value into[1] = {Ort::Value(nullptr)};
  from_bytes.Run(Ort::RunOptions{nullptr}, input_names, inputs.data(), 6, output_names, into, 1);
  EXPECT(*into[0].GetTensorData<float>() == inference_loss);

  inputs.resize(2);
  std::vector<Ort::Value> eval = session.EvalStep(inputs);
  const float eval_loss = *eval[0].GetTensorData<float>();
  std::printf("loss %.9g %.9g\n", static_cast<double>(inference_loss), static_cast<double>(eval_loss));
  EXPECT(std::fabs(inference_loss - eval_loss) <= 1e-6f * std::fabs(inference_loss));
  std::printf("ok\n");
  return 0;
}
