/* OrtTrainingApi: the training session's functions. */
#include <stdlib.h>

#include "ott_api.h"
#include "ott_custom_ops.h"

static OrtStatus* session_out(PyObject* session, OrtTrainingSession** out) {
  if (session == NULL) return ott_python_error();
  OrtTrainingSession* handle = (OrtTrainingSession*)malloc(sizeof *handle);
  if (handle == NULL || !ott_handle_add(handle, OTT_HANDLE_SESSION)) {
    free(handle);
    Py_DECREF(session);
    return ott_status(ORT_FAIL, "out of memory");
  }
  handle->session = session;
  *out = handle;
  return NULL;
}

static PyObject* path_or_none(const char* path) {
  if (path == NULL) Py_RETURN_NONE;
  return PyUnicode_DecodeFSDefault(path);
}

static PyObject* bytes_or_none(const void* data, size_t length) {
  if (data == NULL || length == 0) Py_RETURN_NONE;
  return PyBytes_FromStringAndSize((const char*)data, (Py_ssize_t)length);
}

static OrtStatus* create(const OrtSessionOptions* options, OrtCheckpointState* state, PyObject* train,
                         PyObject* evaluation, PyObject* optimizer, OrtTrainingSession** out) {
  char device[64], compile[64];
  ott_session_settings(options, device, sizeof device, compile, sizeof compile);
  PyObject* custom_ops = ott_custom_ops_for(options); /* the OrtCustomOps registered on the options */
  PyObject* kernels = custom_ops != NULL && PyList_GET_SIZE(custom_ops) > 0 ? ott_kernel_functions() : Py_NewRef(Py_None);
  if (custom_ops == NULL || kernels == NULL) {
    Py_XDECREF(custom_ops);
    Py_XDECREF(kernels);
    Py_XDECREF(train);
    Py_XDECREF(evaluation);
    Py_XDECREF(optimizer);
    return ott_python_error();
  }
  PyObject* args = Py_BuildValue("(ONNNssNN)", state->state, train, evaluation, optimizer, device, compile,
                                 custom_ops, kernels);
  if (args == NULL) return ott_python_error();
  return session_out(ott_call(OTT_create_session, args), out);
}

OrtStatus* ott_CreateTrainingSession(const OrtEnv* env, const OrtSessionOptions* options,
                                     OrtCheckpointState* checkpoint_state, const ORTCHAR_T* train_model_path,
                                     const ORTCHAR_T* eval_model_path, const ORTCHAR_T* optimizer_model_path,
                                     OrtTrainingSession** out) {
  OTT_REQUIRE(env);
  OTT_REQUIRE(options);
  OTT_REQUIRE(checkpoint_state);
  OTT_REQUIRE(train_model_path);
  OTT_REQUIRE(out);
  OTT_ENTER_LIVE(checkpoint_state, OTT_HANDLE_STATE);
  status = create(options, checkpoint_state, PyUnicode_DecodeFSDefault(train_model_path),
                  path_or_none(eval_model_path), path_or_none(optimizer_model_path), out);
  OTT_LEAVE();
}

OrtStatus* ott_CreateTrainingSessionFromBuffer(const OrtEnv* env, const OrtSessionOptions* options,
                                               OrtCheckpointState* checkpoint_state, const void* train_model_data,
                                               size_t train_data_length, const void* eval_model_data,
                                               size_t eval_data_length, const void* optim_model_data,
                                               size_t optim_data_length, OrtTrainingSession** out) {
  OTT_REQUIRE(env);
  OTT_REQUIRE(options);
  OTT_REQUIRE(checkpoint_state);
  OTT_REQUIRE(out);
  if (train_model_data == NULL || train_data_length == 0) /* ORT's wording first, then the argument */
    return ott_status(ORT_INVALID_ARGUMENT, "Training Session Creation failed. Train model data cannot be NULL. (%s)",
                      train_model_data == NULL ? "train_model_data: expected a non-NULL pointer, got NULL"
                                               : "train_data_length: expected the training model's size, got 0");
  OTT_ENTER_LIVE(checkpoint_state, OTT_HANDLE_STATE);
  status = create(options, checkpoint_state, bytes_or_none(train_model_data, train_data_length),
                  bytes_or_none(eval_model_data, eval_data_length), bytes_or_none(optim_model_data, optim_data_length),
                  out);
  OTT_LEAVE();
}

static OrtStatus* io_count(const OrtTrainingSession* sess, size_t* out, int training, int inputs) {
  OTT_REQUIRE(sess);
  OTT_REQUIRE(out);
  OTT_ENTER_LIVE(sess, OTT_HANDLE_SESSION);
  PyObject* count = ott_call(OTT_io_count, Py_BuildValue("(Oii)", sess->session, training, inputs));
  if (count == NULL) {
    status = ott_python_error();
  } else {
    *out = PyLong_AsSize_t(count);
    Py_DECREF(count);
  }
  OTT_LEAVE();
}

static OrtStatus* io_name(const OrtTrainingSession* sess, size_t index, OrtAllocator* allocator, char** output,
                          int training, int inputs) {
  OTT_REQUIRE(sess);
  OTT_REQUIRE(allocator);
  OTT_REQUIRE(output);
  OTT_ENTER_LIVE(sess, OTT_HANDLE_SESSION);
  PyObject* name = ott_call(OTT_io_name, Py_BuildValue("(OiiK)", sess->session, training, inputs, (unsigned long long)index));
  status = name ? ott_string_out(name, allocator, output) : ott_python_error();
  Py_XDECREF(name);
  OTT_LEAVE();
}

OrtStatus* ott_TrainingSessionGetTrainingModelOutputCount(const OrtTrainingSession* sess, size_t* out) {
  return io_count(sess, out, 1, 0);
}
OrtStatus* ott_TrainingSessionGetEvalModelOutputCount(const OrtTrainingSession* sess, size_t* out) {
  return io_count(sess, out, 0, 0);
}
OrtStatus* ott_TrainingSessionGetTrainingModelInputCount(const OrtTrainingSession* sess, size_t* out) {
  return io_count(sess, out, 1, 1);
}
OrtStatus* ott_TrainingSessionGetEvalModelInputCount(const OrtTrainingSession* sess, size_t* out) {
  return io_count(sess, out, 0, 1);
}
OrtStatus* ott_TrainingSessionGetTrainingModelOutputName(const OrtTrainingSession* sess, size_t index,
                                                         OrtAllocator* allocator, char** output) {
  return io_name(sess, index, allocator, output, 1, 0);
}
OrtStatus* ott_TrainingSessionGetEvalModelOutputName(const OrtTrainingSession* sess, size_t index,
                                                     OrtAllocator* allocator, char** output) {
  return io_name(sess, index, allocator, output, 0, 0);
}
OrtStatus* ott_TrainingSessionGetTrainingModelInputName(const OrtTrainingSession* sess, size_t index,
                                                        OrtAllocator* allocator, char** output) {
  return io_name(sess, index, allocator, output, 1, 1);
}
OrtStatus* ott_TrainingSessionGetEvalModelInputName(const OrtTrainingSession* sess, size_t index,
                                                    OrtAllocator* allocator, char** output) {
  return io_name(sess, index, allocator, output, 0, 1);
}

/* TrainStep / EvalStep: inputs wrapped in place, outputs copied into new or the caller's OrtValues. */
static OrtStatus* step(OttBridgeFn fn, const OrtTrainingSession* sess, size_t inputs_len,
                       const OrtValue* const* inputs, size_t outputs_len, OrtValue** outputs) {
  OTT_REQUIRE(sess);
  if (inputs_len > 0) OTT_REQUIRE(inputs);
  if (outputs_len > 0) OTT_REQUIRE(outputs);
  OTT_ENTER_LIVE(sess, OTT_HANDLE_SESSION);
  PyObject* specs = PyTuple_New((Py_ssize_t)inputs_len);
  for (size_t i = 0; specs != NULL && status == NULL && i < inputs_len; i++) {
    PyObject* spec = NULL;
    char what[48];
    snprintf(what, sizeof what, "inputs[%zu]", i);
    status = ott_tensor_spec(inputs[i], what, &spec);
    if (status == NULL) PyTuple_SET_ITEM(specs, (Py_ssize_t)i, spec);
  }
  if (specs == NULL) status = ott_python_error();
  for (size_t i = 0; status == NULL && i < outputs_len; i++) { /* the caller's outputs, checked before the step */
    char what[48];
    snprintf(what, sizeof what, "outputs[%zu]", i);
    if (outputs[i] != NULL) status = ott_check_destination(outputs[i], what, -1, 0);
  }
  PyObject* results = NULL;
  if (status == NULL) {
    results = ott_call(fn, Py_BuildValue("(OO)", sess->session, specs));
    if (results == NULL) status = ott_python_error();
  }
  Py_XDECREF(specs);
  if (status == NULL && (size_t)PyList_GET_SIZE(results) != outputs_len)
    status = ott_status(ORT_INVALID_ARGUMENT, "outputs_len: the model has %zd user outputs, got %zu",
                        PyList_GET_SIZE(results), outputs_len);
  unsigned char* created = status == NULL ? (unsigned char*)calloc(outputs_len + 1, 1) : NULL;
  if (status == NULL && created == NULL) status = ott_status(ORT_FAIL, "out of memory");
  for (size_t i = 0; status == NULL && i < outputs_len; i++) {
    char what[48];
    snprintf(what, sizeof what, "outputs[%zu]", i);
    created[i] = outputs[i] == NULL;
    status = ott_tensor_from_out(PyList_GET_ITEM(results, (Py_ssize_t)i), NULL, &outputs[i], what);
  }
  for (size_t i = 0; status != NULL && created != NULL && i < outputs_len; i++) {
    if (created[i] && outputs[i] != NULL) { /* give back the ones made here; the caller's stay theirs */
      OTT_ORT(ott_ort(), ReleaseValue)(outputs[i]);
      outputs[i] = NULL;
    }
  }
  free(created);
  Py_XDECREF(results);
  OTT_LEAVE();
}

OrtStatus* ott_TrainStep(OrtTrainingSession* sess, const OrtRunOptions* run_options, size_t inputs_len,
                         const OrtValue* const* inputs, size_t outputs_len, OrtValue** outputs) {
  (void)run_options;
  return step(OTT_train_step, sess, inputs_len, inputs, outputs_len, outputs);
}

OrtStatus* ott_EvalStep(const OrtTrainingSession* sess, const OrtRunOptions* run_options, size_t inputs_len,
                        const OrtValue* const* inputs, size_t outputs_len, OrtValue** outputs) {
  (void)run_options;
  return step(OTT_eval_step, sess, inputs_len, inputs, outputs_len, outputs);
}

static OrtStatus* session_call(OttBridgeFn fn, OrtTrainingSession* sess) {
  OTT_REQUIRE(sess);
  OTT_ENTER_LIVE(sess, OTT_HANDLE_SESSION);
  status = ott_done(ott_call(fn, Py_BuildValue("(O)", sess->session)));
  OTT_LEAVE();
}

OrtStatus* ott_LazyResetGrad(OrtTrainingSession* session) { return session_call(OTT_lazy_reset_grad, session); }
OrtStatus* ott_SchedulerStep(OrtTrainingSession* sess) { return session_call(OTT_scheduler_step, sess); }
OrtStatus* ott_OptimizerStep(OrtTrainingSession* sess, const OrtRunOptions* run_options) {
  (void)run_options;
  return session_call(OTT_optimizer_step, sess);
}

OrtStatus* ott_SetLearningRate(OrtTrainingSession* sess, float learning_rate) {
  OTT_REQUIRE(sess);
  OTT_ENTER_LIVE(sess, OTT_HANDLE_SESSION);
  status = ott_done(ott_call(OTT_set_learning_rate, Py_BuildValue("(Od)", sess->session, (double)learning_rate)));
  OTT_LEAVE();
}

OrtStatus* ott_GetLearningRate(OrtTrainingSession* sess, float* learning_rate) {
  OTT_REQUIRE(sess);
  OTT_REQUIRE(learning_rate);
  OTT_ENTER_LIVE(sess, OTT_HANDLE_SESSION);
  PyObject* value = ott_call(OTT_get_learning_rate, Py_BuildValue("(O)", sess->session));
  if (value == NULL) {
    status = ott_python_error();
  } else {
    *learning_rate = (float)PyFloat_AsDouble(value);
    Py_DECREF(value);
  }
  OTT_LEAVE();
}

OrtStatus* ott_RegisterLinearLRScheduler(OrtTrainingSession* sess, const int64_t warmup_step_count,
                                         const int64_t total_step_count, const float initial_lr) {
  OTT_REQUIRE(sess);
  OTT_ENTER_LIVE(sess, OTT_HANDLE_SESSION);
  status = ott_done(ott_call(OTT_register_linear_lr_scheduler,
                             Py_BuildValue("(OLLd)", sess->session, (long long)warmup_step_count,
                                           (long long)total_step_count, (double)initial_lr)));
  OTT_LEAVE();
}

OrtStatus* ott_GetParametersSize(OrtTrainingSession* sess, size_t* out, bool trainable_only) {
  OTT_REQUIRE(sess);
  OTT_REQUIRE(out);
  OTT_ENTER_LIVE(sess, OTT_HANDLE_SESSION);
  PyObject* size = ott_call(OTT_parameters_size, Py_BuildValue("(OO)", sess->session, trainable_only ? Py_True : Py_False));
  if (size == NULL) {
    status = ott_python_error();
  } else {
    *out = PyLong_AsSize_t(size);
    Py_DECREF(size);
  }
  OTT_LEAVE();
}

static OrtStatus* buffer_call(OttBridgeFn fn, OrtTrainingSession* sess, OrtValue* parameters_buffer, bool trainable_only) {
  OTT_REQUIRE(sess);
  OTT_REQUIRE(parameters_buffer);
  OTT_ENTER_LIVE(sess, OTT_HANDLE_SESSION);
  PyObject* spec = NULL;
  status = ott_tensor_spec(parameters_buffer, "parameters_buffer", &spec);
  if (status == NULL)
    status = ott_done(ott_call(fn, Py_BuildValue("(ONO)", sess->session, spec, trainable_only ? Py_True : Py_False)));
  OTT_LEAVE();
}

OrtStatus* ott_CopyParametersToBuffer(OrtTrainingSession* sess, OrtValue* parameters_buffer, bool trainable_only) {
  return buffer_call(OTT_copy_parameters_to_buffer, sess, parameters_buffer, trainable_only);
}

OrtStatus* ott_CopyBufferToParameters(OrtTrainingSession* sess, OrtValue* parameters_buffer, bool trainable_only) {
  return buffer_call(OTT_copy_buffer_to_parameters, sess, parameters_buffer, trainable_only);
}

void ott_ReleaseTrainingSession(OrtTrainingSession* input) {
  if (input != NULL) ott_handle_release(input, OTT_HANDLE_SESSION, &input->session);
}

OrtStatus* ott_ExportModelForInferencing(OrtTrainingSession* sess, const ORTCHAR_T* inference_model_path,
                                         size_t graph_outputs_len, const char* const* graph_output_names) {
  OTT_REQUIRE(sess);
  OTT_REQUIRE(inference_model_path);
  if (graph_outputs_len > 0) OTT_REQUIRE(graph_output_names);
  for (size_t i = 0; i < graph_outputs_len; i++)
    if (graph_output_names[i] == NULL)
      return ott_status(ORT_INVALID_ARGUMENT, "graph_output_names[%zu]: expected a name, got NULL", i);
  OTT_ENTER_LIVE(sess, OTT_HANDLE_SESSION);
  PyObject* names = PyList_New((Py_ssize_t)graph_outputs_len);
  for (size_t i = 0; names != NULL && i < graph_outputs_len; i++) {
    PyObject* name = PyUnicode_FromString(graph_output_names[i]);
    if (name == NULL) { /* no slot of the list may stay empty: Python code would read it */
      PyErr_Clear();
      Py_DECREF(names);
      status = ott_status(ORT_INVALID_ARGUMENT, "graph_output_names[%zu]: expected a UTF-8 name, got bytes that are "
                          "not UTF-8", i);
      OTT_LEAVE();
    }
    PyList_SET_ITEM(names, (Py_ssize_t)i, name);
  }
  status = names ? ott_done(ott_call(OTT_export_model, Py_BuildValue("(ONN)", sess->session,
                                                                     PyUnicode_DecodeFSDefault(inference_model_path),
                                                                     names)))
                 : ott_python_error();
  OTT_LEAVE();
}
