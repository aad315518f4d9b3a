/* libort_torch_train's internals: the handles, the embedded interpreter and the status helpers. */
#ifndef OTT_INTERNAL_H
#define OTT_INTERNAL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "ort_torch_train_training_c_api.h"

/* The handles hold the Python objects made by ort_torch_train.native.bridge. */
struct OrtCheckpointState {
  PyObject* state;
};
struct OrtTrainingSession {
  PyObject* session;
};

/* The bridge functions, looked up once when Python starts. */
typedef enum OttBridgeFn {
  OTT_error_status,
  OTT_load_checkpoint,
  OTT_load_checkpoint_buffer,
  OTT_save_checkpoint,
  OTT_add_property,
  OTT_get_property,
  OTT_parameter_type_and_shape,
  OTT_update_parameter,
  OTT_get_parameter,
  OTT_create_session,
  OTT_io_count,
  OTT_io_name,
  OTT_train_step,
  OTT_eval_step,
  OTT_lazy_reset_grad,
  OTT_optimizer_step,
  OTT_set_learning_rate,
  OTT_get_learning_rate,
  OTT_register_linear_lr_scheduler,
  OTT_scheduler_step,
  OTT_parameters_size,
  OTT_copy_parameters_to_buffer,
  OTT_copy_buffer_to_parameters,
  OTT_export_model,
  OTT_seed,
  OTT_BRIDGE_COUNT
} OttBridgeFn;

/* ONNX Runtime's own OrtApiBase and table (the program's libonnxruntime), or NULL when it cannot be found. */
const OrtApiBase* ott_real_base(void);
const OrtApi* ott_ort(void);

/* A status made by ONNX Runtime's CreateStatus; printf-style message. */
OrtStatus* ott_status(OrtErrorCode code, const char* format, ...);

/* Start Python (once) and take the GIL. On failure returns the status and holds nothing. */
OrtStatus* ott_enter(PyGILState_STATE* gil);
void ott_leave(PyGILState_STATE gil);

/* Call a bridge function with a new tuple of arguments (stolen); NULL with a Python error set on failure. */
PyObject* ott_call(OttBridgeFn fn, PyObject* args);

/* The status for the Python exception now set (which is cleared). */
OrtStatus* ott_python_error(void);

/* ORT tensors <-> the bridge's specs. */
OrtStatus* ott_tensor_spec(const OrtValue* value, const char* what, PyObject** spec);
OrtStatus* ott_tensor_from_out(PyObject* out, OrtAllocator* allocator, OrtValue** value, const char* what);

/* A copy of a Python str in memory from `allocator`. */
OrtStatus* ott_string_out(PyObject* text, OrtAllocator* allocator, char** out);

/* The session options' device and compile settings (ORT's config entries, recorded execution providers). */
void ott_session_settings(const OrtSessionOptions* options, char* device, size_t device_size, char* compile,
                          size_t compile_size);

/* The table of live handles: a handle is added when made, checked on every call, removed when released. */
typedef enum OttHandleKind { OTT_HANDLE_STATE, OTT_HANDLE_SESSION } OttHandleKind;
int ott_handle_add(const void* handle, OttHandleKind kind); /* 0: no memory for the table */
/* ORT_INVALID_ARGUMENT naming `what` unless `handle` is a live handle of that kind. */
OrtStatus* ott_handle_check(const void* handle, OttHandleKind kind, const char* what);
/* 0 (and a line on stderr) for a handle that is not live: released twice, or never made here. */
int ott_handle_remove(void* handle, OttHandleKind kind);
/* A Release call: `handle` removed from the table and the Python object it holds (`object`, read only when the
 * handle was live) released; after fork or Py_Finalize the object is only forgotten. */
void ott_handle_release(void* handle, OttHandleKind kind, PyObject* const* object);
/* Whether Python may be called: not after the host finalized it, nor in a child made by fork(). */
int ott_python_usable(void);

/* A tensor the library writes into (an output given by the caller, a new one from the caller's allocator):
 * ORT_INVALID_ARGUMENT naming `what` unless it is a tensor in host memory with data of `nbytes` bytes and
 * element type `type` (`type` < 0: only the data and the memory are checked). */
OrtStatus* ott_check_destination(const OrtValue* value, const char* what, int type, long long nbytes);

/* Argument checks: return ORT_INVALID_ARGUMENT naming the argument. */
#define OTT_REQUIRE(arg)                                                                              \
  do {                                                                                                \
    if ((arg) == NULL) return ott_status(ORT_INVALID_ARGUMENT, "%s: expected a non-NULL pointer, got NULL", #arg); \
  } while (0)

#endif /* OTT_INTERNAL_H */
