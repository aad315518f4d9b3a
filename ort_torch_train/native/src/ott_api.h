/* The OrtTrainingApi functions, as this library implements them (one per table member). */
#ifndef OTT_API_H
#define OTT_API_H

#include "ott_internal.h"

/* Start Python and take the GIL into `status`'s scope; OTT_LEAVE releases it and returns status. */
#define OTT_ENTER()                          \
  PyGILState_STATE ott_gil_;                 \
  OrtStatus* status = ott_enter(&ott_gil_);  \
  if (status != NULL) return status
#define OTT_LEAVE()     \
  ott_leave(ott_gil_);  \
  return status
/* OTT_ENTER, then ORT_INVALID_ARGUMENT unless `handle` is live (checked with the GIL held, which a release takes). */
#define OTT_ENTER_LIVE(handle, kind)                                           \
  OTT_ENTER();                                                                 \
  if ((status = ott_handle_check((handle), (kind), #handle)) != NULL) {        \
    OTT_LEAVE();                                                               \
  }

OrtStatus* ott_done(PyObject* result);

OrtStatus* ott_LoadCheckpoint(const ORTCHAR_T* checkpoint_path, OrtCheckpointState** checkpoint_state);
OrtStatus* ott_SaveCheckpoint(OrtCheckpointState* checkpoint_state, const ORTCHAR_T* checkpoint_path,
                              const bool include_optimizer_state);
OrtStatus* ott_CreateTrainingSession(const OrtEnv* env, const OrtSessionOptions* options,
                                     OrtCheckpointState* checkpoint_state, const ORTCHAR_T* train_model_path,
                                     const ORTCHAR_T* eval_model_path, const ORTCHAR_T* optimizer_model_path,
                                     OrtTrainingSession** out);
OrtStatus* ott_CreateTrainingSessionFromBuffer(const OrtEnv* env, const OrtSessionOptions* options,
                                               OrtCheckpointState* checkpoint_state, const void* train_model_data,
                                               size_t train_data_length, const void* eval_model_data,
                                               size_t eval_data_length, const void* optim_model_data,
                                               size_t optim_data_length, OrtTrainingSession** out);
OrtStatus* ott_TrainingSessionGetTrainingModelOutputCount(const OrtTrainingSession* sess, size_t* out);
OrtStatus* ott_TrainingSessionGetEvalModelOutputCount(const OrtTrainingSession* sess, size_t* out);
OrtStatus* ott_TrainingSessionGetTrainingModelOutputName(const OrtTrainingSession* sess, size_t index,
                                                         OrtAllocator* allocator, char** output);
OrtStatus* ott_TrainingSessionGetEvalModelOutputName(const OrtTrainingSession* sess, size_t index,
                                                     OrtAllocator* allocator, char** output);
OrtStatus* ott_LazyResetGrad(OrtTrainingSession* session);
OrtStatus* ott_TrainStep(OrtTrainingSession* sess, const OrtRunOptions* run_options, size_t inputs_len,
                         const OrtValue* const* inputs, size_t outputs_len, OrtValue** outputs);
OrtStatus* ott_EvalStep(const OrtTrainingSession* sess, const OrtRunOptions* run_options, size_t inputs_len,
                        const OrtValue* const* inputs, size_t outputs_len, OrtValue** outputs);
OrtStatus* ott_SetLearningRate(OrtTrainingSession* sess, float learning_rate);
OrtStatus* ott_GetLearningRate(OrtTrainingSession* sess, float* learning_rate);
OrtStatus* ott_OptimizerStep(OrtTrainingSession* sess, const OrtRunOptions* run_options);
OrtStatus* ott_RegisterLinearLRScheduler(OrtTrainingSession* sess, const int64_t warmup_step_count,
                                         const int64_t total_step_count, const float initial_lr);
OrtStatus* ott_SchedulerStep(OrtTrainingSession* sess);
OrtStatus* ott_GetParametersSize(OrtTrainingSession* sess, size_t* out, bool trainable_only);
OrtStatus* ott_CopyParametersToBuffer(OrtTrainingSession* sess, OrtValue* parameters_buffer, bool trainable_only);
OrtStatus* ott_CopyBufferToParameters(OrtTrainingSession* sess, OrtValue* parameters_buffer, bool trainable_only);
void ott_ReleaseTrainingSession(OrtTrainingSession* input);
void ott_ReleaseCheckpointState(OrtCheckpointState* input);
OrtStatus* ott_ExportModelForInferencing(OrtTrainingSession* sess, const ORTCHAR_T* inference_model_path,
                                         size_t graph_outputs_len, const char* const* graph_output_names);
OrtStatus* ott_SetSeed(const int64_t seed);
OrtStatus* ott_TrainingSessionGetTrainingModelInputCount(const OrtTrainingSession* sess, size_t* out);
OrtStatus* ott_TrainingSessionGetEvalModelInputCount(const OrtTrainingSession* sess, size_t* out);
OrtStatus* ott_TrainingSessionGetTrainingModelInputName(const OrtTrainingSession* sess, size_t index,
                                                        OrtAllocator* allocator, char** output);
OrtStatus* ott_TrainingSessionGetEvalModelInputName(const OrtTrainingSession* sess, size_t index,
                                                    OrtAllocator* allocator, char** output);
OrtStatus* ott_AddProperty(OrtCheckpointState* checkpoint_state, const char* property_name,
                           enum OrtPropertyType property_type, void* property_value);
OrtStatus* ott_GetProperty(const OrtCheckpointState* checkpoint_state, const char* property_name,
                           OrtAllocator* allocator, enum OrtPropertyType* property_type, void** property_value);
OrtStatus* ott_LoadCheckpointFromBuffer(const void* checkpoint_buffer, const size_t num_bytes,
                                        OrtCheckpointState** checkpoint_state);
OrtStatus* ott_GetParameterTypeAndShape(const OrtCheckpointState* checkpoint_state, const char* parameter_name,
                                        OrtTensorTypeAndShapeInfo** parameter_type_and_shape);
OrtStatus* ott_UpdateParameter(OrtCheckpointState* checkpoint_state, const char* parameter_name, OrtValue* parameter);
OrtStatus* ott_GetParameter(const OrtCheckpointState* checkpoint_state, const char* parameter_name,
                            OrtAllocator* allocator, OrtValue** parameter);

#endif /* OTT_API_H */
