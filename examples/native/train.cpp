// ONNX Runtime's training loop in C++ (Ort::TrainingSession), through libort_torch_train.
//
//   ort-torch-train native build --prefix build/native
//   c++ -std=c++17 examples/native/train.cpp -o train_cpp $(ort-torch-train native flags --prefix build/native)
//   (the flags: `native flags --cflags` and `--libs` print each part)
//   ./train_cpp tests/fixtures/mlp_ce_adamw_sched/artifacts OUT_DIR
//
// The same task as train.c, with the C++ classes: load the checkpoint, train with a linear schedule,
// evaluate, round-trip the parameters through ToBuffer/FromBuffer, save, export and run the inference
// model in ONNX Runtime. Prints "loss STEP VALUE" lines and "accuracy A".
#include <cstdio>
#include <string>
#include <vector>

#include "ort_torch_train_training_cxx_api.h"

namespace {

constexpr int kSteps = 60;
constexpr int kBatch = 32;

void MakeBatch(unsigned seed, std::vector<float>& x, std::vector<int64_t>& y) {
  for (int row = 0; row < kBatch; row++) {
    int best = 0;
    for (int col = 0; col < 20; col++) {
      seed = seed * 1103515245u + 12345u;
      x[row * 20 + col] = static_cast<float>((seed >> 8) % 2001) / 1000.0f - 1.0f;
      if (col < 5 && x[row * 20 + col] > x[row * 20 + best]) best = col;
    }
    y[row] = best;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s ARTIFACTS_DIR OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string artifacts = argv[1], out = argv[2];
  try {
    Ort::Env env;
    Ort::SessionOptions options;
    Ort::SetSeed(1);
    auto state = Ort::CheckpointState::LoadCheckpoint(artifacts + "/checkpoint");
    Ort::TrainingSession session(env, options, state, artifacts + "/training_model.onnx",
                                 artifacts + "/eval_model.onnx", artifacts + "/optimizer_model.onnx");
    session.RegisterLinearLRScheduler(5, kSteps, 0.05f);

    auto cpu = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
    std::vector<float> x(kBatch * 20);
    std::vector<int64_t> y(kBatch);
    const int64_t x_dims[2] = {kBatch, 20}, y_dims[1] = {kBatch};
    std::vector<Ort::Value> inputs;
    inputs.push_back(Ort::Value::CreateTensor<float>(cpu, x.data(), x.size(), x_dims, 2));
    inputs.push_back(Ort::Value::CreateTensor<int64_t>(cpu, y.data(), y.size(), y_dims, 1));
    for (int step = 0; step < kSteps; step++) {
      MakeBatch(1000u + static_cast<unsigned>(step), x, y);
      auto loss = session.TrainStep(inputs);
      if (step % 10 == 0 || step == kSteps - 1)
        std::printf("loss %d %.6f\n", step, static_cast<double>(*loss[0].GetTensorData<float>()));
      session.OptimizerStep();
      session.SchedulerStep();
      session.LazyResetGrad();
    }
    MakeBatch(7u, x, y);
    auto eval_loss = session.EvalStep(inputs);
    std::printf("eval_loss %.6f\n", static_cast<double>(*eval_loss[0].GetTensorData<float>()));

    auto buffer = session.ToBuffer(true);  // a copy of the trained parameters, loaded back unchanged
    session.FromBuffer(buffer);
    state.AddProperty("epoch", int64_t{1});
    Ort::CheckpointState::SaveCheckpoint(state, out + "/checkpoint", true);
    session.ExportModelForInferencing(out + "/inference.onnx", {"logits"});

    Ort::Session inference(env, (out + "/inference.onnx").c_str(), options);
    std::vector<Ort::Value> features;
    features.push_back(Ort::Value::CreateTensor<float>(cpu, x.data(), x.size(), x_dims, 2));
    const std::string features_name = session.InputNames(true)[0];  // the model's own input name
    const char* input_names[] = {features_name.c_str()};
    const char* output_names[] = {"logits"};
    auto logits = inference.Run(Ort::RunOptions{nullptr}, input_names, features.data(), 1, output_names, 1);
    const float* scores = logits[0].GetTensorData<float>();
    int correct = 0;
    for (int row = 0; row < kBatch; row++) {
      int best = 0;
      for (int k = 1; k < 5; k++)
        if (scores[row * 5 + k] > scores[row * 5 + best]) best = k;
      correct += best == y[row];
    }
    std::printf("accuracy %.4f\n", static_cast<double>(correct) / kBatch);
    std::printf("inputs %s %s\n", session.InputNames(true)[0].c_str(), session.InputNames(true)[1].c_str());
  } catch (const Ort::Exception& error) {
    std::fprintf(stderr, "error %d: %s\n", static_cast<int>(error.GetOrtErrorCode()), error.what());
    return 1;
  }
  return 0;
}
