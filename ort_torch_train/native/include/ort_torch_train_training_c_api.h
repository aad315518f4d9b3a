/* ONNX Runtime's training C API (OrtTrainingApi), answered by libort_torch_train.
 *
 * The table has the member order, signatures, argument and ownership rules of ONNX Runtime's training C
 * API (onnxruntime_training_c_api.h, 1.19): a program written against it compiles against this header.
 * Two ways in:
 *   - explicit: OrtTorchTrainGetTrainingApi(ORT_API_VERSION), exported by libort_torch_train;
 *   - transparent: OrtGetApiBase()->GetApi(v)->GetTrainingApi(v) with libort_torch_train linked ahead of
 *     libonnxruntime or LD_PRELOADed (it forwards ONNX Runtime's table with GetTrainingApi answered here).
 * Values, statuses and allocators are ONNX Runtime's own (the program's libonnxruntime). See docs/native.md.
 */
#ifndef ORT_TORCH_TRAIN_TRAINING_C_API_H
#define ORT_TORCH_TRAIN_TRAINING_C_API_H

#include "ort_torch_train_ort_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct OrtTrainingSession OrtTrainingSession;
typedef struct OrtCheckpointState OrtCheckpointState;

typedef enum OrtPropertyType {
  OrtIntProperty = 0,    /* int64_t */
  OrtFloatProperty = 1,  /* float */
  OrtStringProperty = 2, /* NUL-terminated char string */
} OrtPropertyType;

struct OrtTrainingApi {
  OrtStatus* (*LoadCheckpoint)(const ORTCHAR_T* checkpoint_path, OrtCheckpointState** checkpoint_state);
  OrtStatus* (*SaveCheckpoint)(OrtCheckpointState* checkpoint_state, const ORTCHAR_T* checkpoint_path,
                               const bool include_optimizer_state);
  OrtStatus* (*CreateTrainingSession)(const OrtEnv* env, const OrtSessionOptions* options,
                                      OrtCheckpointState* checkpoint_state, const ORTCHAR_T* train_model_path,
                                      const ORTCHAR_T* eval_model_path, const ORTCHAR_T* optimizer_model_path,
                                      OrtTrainingSession** out);
  OrtStatus* (*CreateTrainingSessionFromBuffer)(const OrtEnv* env, const OrtSessionOptions* options,
                                                OrtCheckpointState* checkpoint_state, const void* train_model_data,
                                                size_t train_data_length, const void* eval_model_data,
                                                size_t eval_data_length, const void* optim_model_data,
                                                size_t optim_data_length, OrtTrainingSession** out);
  OrtStatus* (*TrainingSessionGetTrainingModelOutputCount)(const OrtTrainingSession* sess, size_t* out);
  OrtStatus* (*TrainingSessionGetEvalModelOutputCount)(const OrtTrainingSession* sess, size_t* out);
  OrtStatus* (*TrainingSessionGetTrainingModelOutputName)(const OrtTrainingSession* sess, size_t index,
                                                          OrtAllocator* allocator, char** output);
  OrtStatus* (*TrainingSessionGetEvalModelOutputName)(const OrtTrainingSession* sess, size_t index,
                                                      OrtAllocator* allocator, char** output);
  OrtStatus* (*LazyResetGrad)(OrtTrainingSession* session);
  OrtStatus* (*TrainStep)(OrtTrainingSession* sess, const OrtRunOptions* run_options, size_t inputs_len,
                          const OrtValue* const* inputs, size_t outputs_len, OrtValue** outputs);
  OrtStatus* (*EvalStep)(const OrtTrainingSession* sess, const OrtRunOptions* run_options, size_t inputs_len,
                         const OrtValue* const* inputs, size_t outputs_len, OrtValue** outputs);
  OrtStatus* (*SetLearningRate)(OrtTrainingSession* sess, float learning_rate);
  OrtStatus* (*GetLearningRate)(OrtTrainingSession* sess, float* learning_rate);
  OrtStatus* (*OptimizerStep)(OrtTrainingSession* sess, const OrtRunOptions* run_options);
  OrtStatus* (*RegisterLinearLRScheduler)(OrtTrainingSession* sess, const int64_t warmup_step_count,
                                          const int64_t total_step_count, const float initial_lr);
  OrtStatus* (*SchedulerStep)(OrtTrainingSession* sess);
  OrtStatus* (*GetParametersSize)(OrtTrainingSession* sess, size_t* out, bool trainable_only);
  OrtStatus* (*CopyParametersToBuffer)(OrtTrainingSession* sess, OrtValue* parameters_buffer, bool trainable_only);
  OrtStatus* (*CopyBufferToParameters)(OrtTrainingSession* sess, OrtValue* parameters_buffer, bool trainable_only);
  void (*ReleaseTrainingSession)(OrtTrainingSession* input);
  void (*ReleaseCheckpointState)(OrtCheckpointState* input);
  OrtStatus* (*ExportModelForInferencing)(OrtTrainingSession* sess, const ORTCHAR_T* inference_model_path,
                                          size_t graph_outputs_len, const char* const* graph_output_names);
  OrtStatus* (*SetSeed)(const int64_t seed);
  OrtStatus* (*TrainingSessionGetTrainingModelInputCount)(const OrtTrainingSession* sess, size_t* out);
  OrtStatus* (*TrainingSessionGetEvalModelInputCount)(const OrtTrainingSession* sess, size_t* out);
  OrtStatus* (*TrainingSessionGetTrainingModelInputName)(const OrtTrainingSession* sess, size_t index,
                                                         OrtAllocator* allocator, char** output);
  OrtStatus* (*TrainingSessionGetEvalModelInputName)(const OrtTrainingSession* sess, size_t index,
                                                     OrtAllocator* allocator, char** output);
  OrtStatus* (*AddProperty)(OrtCheckpointState* checkpoint_state, const char* property_name,
                            enum OrtPropertyType property_type, void* property_value);
  OrtStatus* (*GetProperty)(const OrtCheckpointState* checkpoint_state, const char* property_name,
                            OrtAllocator* allocator, enum OrtPropertyType* property_type, void** property_value);
  OrtStatus* (*LoadCheckpointFromBuffer)(const void* checkpoint_buffer, const size_t num_bytes,
                                         OrtCheckpointState** checkpoint_state);
  OrtStatus* (*GetParameterTypeAndShape)(const OrtCheckpointState* checkpoint_state, const char* parameter_name,
                                         OrtTensorTypeAndShapeInfo** parameter_type_and_shape);
  OrtStatus* (*UpdateParameter)(OrtCheckpointState* checkpoint_state, const char* parameter_name,
                                OrtValue* parameter);
  OrtStatus* (*GetParameter)(const OrtCheckpointState* checkpoint_state, const char* parameter_name,
                             OrtAllocator* allocator, OrtValue** parameter);
};
typedef struct OrtTrainingApi OrtTrainingApi;

/* The explicit way in: the training table for `version` (1 .. ORT_API_VERSION of the running ONNX Runtime),
 * or NULL for a version it does not know. */
const OrtTrainingApi* OrtTorchTrainGetTrainingApi(uint32_t version);

/* Session options read by CreateTrainingSession (set with OrtApi::AddSessionConfigEntry):
 *   "ort_torch_train.device"  "cpu" (default), "cuda" or "cuda:N"
 *   "ort_torch_train.compile" "0" (default), "1" / "default", or a torch.compile mode ("max-autotune", ...)
 * SessionOptionsAppendExecutionProvider_CUDA(_V2) called through the transparent table sets the device. */
#define ORT_TORCH_TRAIN_DEVICE_KEY "ort_torch_train.device"
#define ORT_TORCH_TRAIN_COMPILE_KEY "ort_torch_train.compile"

#ifdef __cplusplus
}
#endif

#endif /* ORT_TORCH_TRAIN_TRAINING_C_API_H */
