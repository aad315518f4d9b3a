/* ONNX Runtime's training loop in C, through libort_torch_train (the explicit way in).
 *
 *   ort-torch-train native build --prefix build/native
 *   cc examples/native/train.c $(ort-torch-train native flags --prefix build/native --cflags) \
 *      $(ort-torch-train native flags --prefix build/native --libs) -o train_c
 *   ./train_c tests/fixtures/mlp_ce_adamw_sched/artifacts OUT_DIR
 *
 * Trains the artifacts' MLP (20 features, 5 classes) on a synthetic task (the class is the index of the
 * largest of the first five features) with a linear learning-rate schedule, evaluates, saves the checkpoint,
 * exports the inference model and runs it in ONNX Runtime. Prints "loss STEP VALUE" lines and "accuracy A". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ort_torch_train_training_c_api.h"

#define STEPS 60
#define BATCH 32

static const OrtApi* ort;
static const OrtTrainingApi* training;

static void check(OrtStatus* status) {
  if (status == NULL) return;
  fprintf(stderr, "error %d: %s\n", (int)OTT_ORT(ort, GetErrorCode)(status), OTT_ORT(ort, GetErrorMessage)(status));
  OTT_ORT(ort, ReleaseStatus)(status);
  exit(1);
}

/* A batch of the synthetic task, deterministic in `seed`. */
static void make_batch(unsigned seed, float* x, int64_t* y) {
  for (int row = 0; row < BATCH; row++) {
    int best = 0;
    for (int col = 0; col < 20; col++) {
      seed = seed * 1103515245u + 12345u;
      x[row * 20 + col] = (float)((seed >> 8) % 2001) / 1000.0f - 1.0f;
      if (col < 5 && x[row * 20 + col] > x[row * 20 + best]) best = col;
    }
    y[row] = best;
  }
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s ARTIFACTS_DIR OUT_DIR\n", argv[0]);
    return 2;
  }
  char checkpoint[1024], train_model[1024], eval_model[1024], optimizer_model[1024], path[1024];
  snprintf(checkpoint, sizeof checkpoint, "%s/checkpoint", argv[1]);
  snprintf(train_model, sizeof train_model, "%s/training_model.onnx", argv[1]);
  snprintf(eval_model, sizeof eval_model, "%s/eval_model.onnx", argv[1]);
  snprintf(optimizer_model, sizeof optimizer_model, "%s/optimizer_model.onnx", argv[1]);
  ort = OrtGetApiBase()->GetApi(ORT_API_VERSION);
  training = OrtTorchTrainGetTrainingApi(ORT_API_VERSION);

  OrtEnv* env = NULL;
  OrtSessionOptions* options = NULL;
  OrtMemoryInfo* cpu = NULL;
  check(OTT_ORT(ort, CreateEnv)(ORT_LOGGING_LEVEL_WARNING, "train_c", &env));
  check(OTT_ORT(ort, CreateSessionOptions)(&options));
  check(OTT_ORT(ort, CreateCpuMemoryInfo)(OrtArenaAllocator, OrtMemTypeDefault, &cpu));

  OrtCheckpointState* state = NULL;
  OrtTrainingSession* session = NULL;
  check(training->LoadCheckpoint(checkpoint, &state));
  check(training->CreateTrainingSession(env, options, state, train_model, eval_model, optimizer_model, &session));
  check(training->RegisterLinearLRScheduler(session, 5, STEPS, 0.05f));

  static float x[BATCH * 20];
  static int64_t y[BATCH];
  const int64_t x_dims[2] = {BATCH, 20}, y_dims[1] = {BATCH};
  OrtValue* inputs[2] = {NULL, NULL};
  check(OTT_ORT(ort, CreateTensorWithDataAsOrtValue)(cpu, x, sizeof x, x_dims, 2, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &inputs[0]));
  check(OTT_ORT(ort, CreateTensorWithDataAsOrtValue)(cpu, y, sizeof y, y_dims, 1, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, &inputs[1]));
  for (int step = 0; step < STEPS; step++) {
    make_batch(1000u + (unsigned)step, x, y); /* the OrtValues wrap x and y: new data, same values */
    OrtValue* loss = NULL;
    check(training->TrainStep(session, NULL, 2, (const OrtValue* const*)inputs, 1, &loss));
    float* value = NULL;
    check(OTT_ORT(ort, GetTensorMutableData)(loss, (void**)&value));
    if (step % 10 == 0 || step == STEPS - 1) printf("loss %d %.6f\n", step, (double)*value);
    OTT_ORT(ort, ReleaseValue)(loss);
    check(training->OptimizerStep(session, NULL));
    check(training->SchedulerStep(session));
    check(training->LazyResetGrad(session));
  }

  make_batch(7u, x, y);
  OrtValue* eval_loss = NULL;
  check(training->EvalStep(session, NULL, 2, (const OrtValue* const*)inputs, 1, &eval_loss));
  float* value = NULL;
  check(OTT_ORT(ort, GetTensorMutableData)(eval_loss, (void**)&value));
  printf("eval_loss %.6f\n", (double)*value);
  OTT_ORT(ort, ReleaseValue)(eval_loss);

  int64_t epoch = 1;
  check(training->AddProperty(state, "epoch", OrtIntProperty, &epoch));
  snprintf(path, sizeof path, "%s/checkpoint", argv[2]);
  check(training->SaveCheckpoint(state, path, true));
  snprintf(path, sizeof path, "%s/inference.onnx", argv[2]);
  const char* outputs[1] = {"logits"};
  check(training->ExportModelForInferencing(session, path, 1, outputs));

  /* the exported model in ONNX Runtime, from the same program */
  OrtSession* inference = NULL;
  check(OTT_ORT(ort, CreateSession)(env, path, options, &inference));
  OrtAllocator* allocator = NULL;
  char* features_name = NULL; /* the model's own name for its input ("input", "features", ...) */
  check(OTT_ORT(ort, GetAllocatorWithDefaultOptions)(&allocator));
  check(training->TrainingSessionGetTrainingModelInputName(session, 0, allocator, &features_name));
  const char* input_names[1] = {features_name};
  OrtValue* logits = NULL;
  check(OTT_ORT(ort, Run)(inference, NULL, input_names, (const OrtValue* const*)inputs, 1, outputs, 1, &logits));
  check(OTT_ORT(ort, AllocatorFree)(allocator, features_name));
  float* scores = NULL;
  check(OTT_ORT(ort, GetTensorMutableData)(logits, (void**)&scores));
  int correct = 0;
  for (int row = 0; row < BATCH; row++) {
    int best = 0;
    for (int k = 1; k < 5; k++)
      if (scores[row * 5 + k] > scores[row * 5 + best]) best = k;
    correct += best == y[row];
  }
  printf("accuracy %.4f\n", (double)correct / BATCH);

  OTT_ORT(ort, ReleaseValue)(logits);
  OTT_ORT(ort, ReleaseSession)(inference);
  OTT_ORT(ort, ReleaseValue)(inputs[0]);
  OTT_ORT(ort, ReleaseValue)(inputs[1]);
  training->ReleaseTrainingSession(session);
  training->ReleaseCheckpointState(state); /* after the session, as ORT requires */
  OTT_ORT(ort, ReleaseMemoryInfo)(cpu);
  OTT_ORT(ort, ReleaseSessionOptions)(options);
  OTT_ORT(ort, ReleaseEnv)(env);
  return 0;
}
