/* The embedded interpreter, ONNX Runtime's table, statuses and tensor conversion. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ott_internal.h"

#ifndef OTT_PYTHON_EXECUTABLE /* set by the build: the interpreter whose packages hold ort_torch_train */
#define OTT_PYTHON_EXECUTABLE "python3"
#endif
#ifndef OTT_LIBPYTHON
#define OTT_LIBPYTHON "libpython3.so"
#endif

static const OrtApi* g_ort = NULL;
static pthread_once_t g_ort_once = PTHREAD_ONCE_INIT;
static pthread_once_t g_python_once = PTHREAD_ONCE_INIT;
static PyObject* g_bridge[OTT_BRIDGE_COUNT];
static char g_python_failure[1024];
static volatile int g_forked_child; /* set in a child made by fork() after Python started here */
static volatile int g_python_finalized; /* set by Py_FinalizeEx (the host's) */

static const char* const g_bridge_names[OTT_BRIDGE_COUNT] = {
    "error_status",       "load_checkpoint",    "load_checkpoint_buffer",
    "save_checkpoint",    "add_property",       "get_property",
    "parameter_type_and_shape", "update_parameter", "get_parameter",
    "create_session",     "io_count",           "io_name",
    "train_step",         "eval_step",          "lazy_reset_grad",
    "optimizer_step",     "set_learning_rate",  "get_learning_rate",
    "register_linear_lr_scheduler", "scheduler_step", "parameters_size",
    "copy_parameters_to_buffer", "copy_buffer_to_parameters", "export_model",
    "seed"};

typedef const OrtApiBase* (*GetApiBaseFn)(void);

const OrtApiBase* ott_real_base(void) {
  /* ONNX Runtime's own OrtGetApiBase: the next definition after this library's (which forwards to it). */
  GetApiBaseFn base = (GetApiBaseFn)dlsym(RTLD_NEXT, "OrtGetApiBase");
  if (base == NULL || base == OrtGetApiBase) {
    void* handle = dlopen("libonnxruntime.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (handle == NULL) handle = dlopen("libonnxruntime.so.1", RTLD_NOW);
    base = handle ? (GetApiBaseFn)dlsym(handle, "OrtGetApiBase") : NULL;
  }
  return base != NULL && base != OrtGetApiBase ? base() : NULL;
}

static void find_ort(void) {
  const OrtApiBase* base = ott_real_base();
  if (base != NULL) g_ort = base->GetApi(ORT_API_VERSION);
}

const OrtApi* ott_ort(void) {
  pthread_once(&g_ort_once, find_ort);
  return g_ort;
}

OrtStatus* ott_status(OrtErrorCode code, const char* format, ...) {
  char message[2048];
  va_list args;
  va_start(args, format);
  vsnprintf(message, sizeof message, format, args);
  va_end(args);
  const OrtApi* ort = ott_ort();
  if (ort == NULL) { /* no ONNX Runtime: nothing can make a status; say so once and stop */
    fprintf(stderr, "libort_torch_train: libonnxruntime not found (%s)\n", message);
    abort();
  }
  return OTT_ORT(ort, CreateStatus)(code, message);
}

static int import_bridge(void) {
  PyObject* module = PyImport_ImportModule("ort_torch_train.native.bridge");
  if (module == NULL) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject* text = value ? PyObject_Str(value) : NULL;
    snprintf(g_python_failure, sizeof g_python_failure, "ort-torch-train's Python package cannot be imported: %s",
             text && PyUnicode_Check(text) ? PyUnicode_AsUTF8(text) : "unknown error");
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    return 0;
  }
  for (int i = 0; i < OTT_BRIDGE_COUNT; i++) {
    g_bridge[i] = PyObject_GetAttrString(module, g_bridge_names[i]);
    if (g_bridge[i] == NULL) {
      PyErr_Clear();
      snprintf(g_python_failure, sizeof g_python_failure, "ort_torch_train.native.bridge lacks %s",
               g_bridge_names[i]);
      Py_DECREF(module);
      return 0;
    }
  }
  Py_DECREF(module);
  return 1;
}

static void mark_forked_child(void) { g_forked_child = 1; }
static void mark_finalized(void) { g_python_finalized = 1; }

int ott_python_usable(void) { return !g_forked_child && !g_python_finalized && Py_IsInitialized(); }

static void watch_process(void) {
  pthread_atfork(NULL, NULL, mark_forked_child);
  Py_AtExit(mark_finalized);
}

static void start_python(void) {
  if (Py_IsInitialized()) { /* the program embeds Python itself: use its interpreter */
    watch_process();
    PyGILState_STATE gil = PyGILState_Ensure();
    import_bridge();
    PyGILState_Release(gil);
    return;
  }
  /* extension modules (torch, numpy) resolve the interpreter's symbols globally */
  if (dlopen(OTT_LIBPYTHON, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD) == NULL) dlopen(OTT_LIBPYTHON, RTLD_NOW | RTLD_GLOBAL);
  PyConfig config;
  PyConfig_InitPythonConfig(&config);
  config.install_signal_handlers = 0; /* the host program keeps its signals */
  config.parse_argv = 0;
  const char* executable = getenv("ORT_TORCH_TRAIN_PYTHON");
  PyStatus status = PyConfig_SetBytesString(&config, &config.executable,
                                            executable && *executable ? executable : OTT_PYTHON_EXECUTABLE);
  if (!PyStatus_Exception(status)) status = Py_InitializeFromConfig(&config);
  PyConfig_Clear(&config);
  if (PyStatus_Exception(status)) {
    snprintf(g_python_failure, sizeof g_python_failure, "Python could not start: %s",
             status.err_msg ? status.err_msg : "unknown error");
    return;
  }
  watch_process();
  import_bridge();
  PyEval_SaveThread(); /* every call takes the GIL for itself */
}

OrtStatus* ott_enter(PyGILState_STATE* gil) {
  pthread_once(&g_python_once, start_python);
  if (g_forked_child)
    return ott_status(ORT_FAIL, "libort_torch_train cannot run in a child made by fork() after the parent process "
                      "used it (the parent's Python and OpenMP threads do not exist in the child): start the child "
                      "with exec or posix_spawn, or make the library's first call after the fork");
  if (g_python_finalized || (g_bridge[OTT_BRIDGE_COUNT - 1] != NULL && !Py_IsInitialized()))
    return ott_status(ORT_FAIL, "libort_torch_train cannot run after the host finalized Python (Py_Finalize): "
                      "finalize only after the library's last call");
  if (g_bridge[OTT_BRIDGE_COUNT - 1] == NULL)
    return ott_status(ORT_FAIL, "%s", g_python_failure[0] ? g_python_failure : "Python is not available");
  *gil = PyGILState_Ensure();
  return NULL;
}

void ott_leave(PyGILState_STATE gil) { PyGILState_Release(gil); }

PyObject* ott_call(OttBridgeFn fn, PyObject* args) {
  if (args == NULL) return NULL;
  PyObject* result = PyObject_Call(g_bridge[fn], args, NULL);
  Py_DECREF(args);
  return result;
}

OrtStatus* ott_python_error(void) {
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (traceback != NULL && value != NULL) PyException_SetTraceback(value, traceback);
  long code = ORT_RUNTIME_EXCEPTION;
  const char* message = "unknown Python error";
  PyObject* answer = value ? PyObject_CallOneArg(g_bridge[OTT_error_status], value) : NULL;
  if (answer != NULL && PyTuple_Check(answer) && PyTuple_GET_SIZE(answer) == 2) {
    code = PyLong_AsLong(PyTuple_GET_ITEM(answer, 0));
    const char* text = PyUnicode_AsUTF8(PyTuple_GET_ITEM(answer, 1));
    if (text != NULL) message = text;
  }
  PyErr_Clear();
  OrtStatus* status = ott_status((OrtErrorCode)code, "%s", message);
  Py_XDECREF(answer);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(traceback);
  return status;
}

static size_t element_size(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: return 4;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return 1;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16: case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return 2;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: return 8;
    default: return 0;
  }
}

/* What the tensor's memory info says: 1 host memory (Cpu, CudaPinned), 2 a CUDA device, 0 anything else. */
static int memory_kind(const char* location) {
  if (strcmp(location, "Cpu") == 0 || strcmp(location, "CudaPinned") == 0) return 1;
  return strcmp(location, "Cuda") == 0 ? 2 : 0;
}

typedef struct {
  ONNXTensorElementDataType type;
  size_t rank, bytes;
  int64_t dims[64];
  void* data;
  int memory; /* memory_kind */
  int device_id;
} TensorFacts;

/* The facts of a tensor OrtValue, checked: ORT_INVALID_ARGUMENT naming `what` for a value that is not a tensor,
 * of an element type or memory this library does not handle, or whose data pointer is NULL. */
static OrtStatus* tensor_facts(const OrtValue* value, const char* what, TensorFacts* facts) {
  const OrtApi* ort = ott_ort();
  if (value == NULL) return ott_status(ORT_INVALID_ARGUMENT, "%s: expected an OrtValue, got NULL", what);
  int is_tensor = 0;
  OrtStatus* status = OTT_ORT(ort, IsTensor)(value, &is_tensor);
  if (status != NULL) return status;
  if (!is_tensor) return ott_status(ORT_INVALID_ARGUMENT, "%s: expected a tensor OrtValue, got another kind", what);
  OrtTensorTypeAndShapeInfo* info = NULL;
  if ((status = OTT_ORT(ort, GetTensorTypeAndShape)(value, &info)) != NULL) return status;
  size_t count = 0;
  facts->type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  if ((status = OTT_ORT(ort, GetTensorElementType)(info, &facts->type)) == NULL &&
      (status = OTT_ORT(ort, GetDimensionsCount)(info, &facts->rank)) == NULL && facts->rank > 64)
    status = ott_status(ORT_INVALID_ARGUMENT, "%s: rank %zu is over 64", what, facts->rank);
  if (status == NULL && (status = OTT_ORT(ort, GetDimensions)(info, facts->dims, facts->rank)) == NULL)
    status = OTT_ORT(ort, GetTensorShapeElementCount)(info, &count);
  OTT_ORT(ort, ReleaseTensorTypeAndShapeInfo)(info);
  if (status != NULL) return status;
  size_t size = element_size(facts->type);
  if (size == 0)
    return ott_status(ORT_INVALID_ARGUMENT, "%s: element type %d is not supported by ort-torch-train", what,
                      (int)facts->type);
  if (count > SIZE_MAX / size)
    return ott_status(ORT_INVALID_ARGUMENT, "%s: %zu elements of %zu bytes overflow the address space", what, count,
                      size);
  facts->bytes = count * size;
  const OrtMemoryInfo* memory = NULL;
  const char* location = NULL;
  facts->device_id = 0;
  if ((status = OTT_ORT(ort, GetTensorMemoryInfo)(value, &memory)) != NULL) return status;
  if (memory == NULL || (status = OTT_ORT(ort, MemoryInfoGetName)(memory, &location)) != NULL ||
      (status = OTT_ORT(ort, MemoryInfoGetId)(memory, &facts->device_id)) != NULL || location == NULL) {
    if (status != NULL) OTT_ORT(ort, ReleaseStatus)(status);
    return ott_status(ORT_INVALID_ARGUMENT, "%s: the tensor's memory info cannot be read", what);
  }
  facts->memory = memory_kind(location);
  if (facts->memory == 0)
    return ott_status(ORT_INVALID_ARGUMENT, "%s: expected a tensor in Cpu or Cuda memory, got %s memory", what,
                      location);
  facts->data = NULL;
  if ((status = OTT_ORT(ort, GetTensorMutableData)((OrtValue*)value, &facts->data)) != NULL) return status;
  if (facts->data == NULL && facts->bytes > 0)
    return ott_status(ORT_INVALID_ARGUMENT, "%s: the tensor's data pointer is NULL, its shape needs %zu bytes", what,
                      facts->bytes);
  return NULL;
}

OrtStatus* ott_tensor_spec(const OrtValue* value, const char* what, PyObject** spec) {
  TensorFacts facts;
  OrtStatus* status = tensor_facts(value, what, &facts);
  if (status != NULL) return status;
  PyObject* shape = PyTuple_New((Py_ssize_t)facts.rank);
  if (shape == NULL) return ott_python_error();
  for (size_t i = 0; i < facts.rank; i++) PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(facts.dims[i]));
  PyObject* memory_object;
  PyObject* device;
  if (facts.memory == 2) {
    memory_object = PyLong_FromVoidPtr(facts.data);
    device = PyUnicode_FromFormat("cuda:%d", facts.device_id);
  } else {
    static char empty[1];
    memory_object = PyMemoryView_FromMemory(facts.bytes ? (char*)facts.data : empty, (Py_ssize_t)facts.bytes,
                                            PyBUF_WRITE);
    device = PyUnicode_FromString("cpu");
  }
  *spec = Py_BuildValue("(NiNN)", memory_object, (int)facts.type, shape, device);
  return *spec ? NULL : ott_python_error();
}

OrtStatus* ott_check_destination(const OrtValue* value, const char* what, int type, long long nbytes) {
  TensorFacts facts;
  OrtStatus* status = tensor_facts(value, what, &facts);
  if (status != NULL) return status;
  if (facts.memory != 1)
    return ott_status(ORT_INVALID_ARGUMENT, "%s: expected a tensor in host (Cpu) memory to write into, got one on "
                      "CUDA device %d", what, facts.device_id);
  if (type >= 0 && ((int)facts.type != type || (long long)facts.bytes != nbytes))
    return ott_status(ORT_INVALID_ARGUMENT, "%s: expected element type %d and %lld bytes, got element type %d and "
                      "%zu bytes", what, type, nbytes, (int)facts.type, facts.bytes);
  return NULL;
}

OrtStatus* ott_tensor_from_out(PyObject* out, OrtAllocator* allocator, OrtValue** value, const char* what) {
  const OrtApi* ort = ott_ort();
  PyObject* shape_object = NULL;
  unsigned long long address = 0, nbytes = 0;
  int type = 0;
  PyObject* tensor = NULL;
  if (!PyArg_ParseTuple(out, "OKKiO!", &tensor, &address, &nbytes, &type, &PyTuple_Type, &shape_object))
    return ott_python_error();
  size_t rank = (size_t)PyTuple_GET_SIZE(shape_object);
  int64_t dims[64];
  if (rank > 64) return ott_status(ORT_FAIL, "%s: rank %zu is over 64", what, rank);
  for (size_t i = 0; i < rank; i++) dims[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape_object, i));
  OrtStatus* status;
  int created = *value == NULL;
  if (created) { /* a new OrtValue from the caller's allocator, or ONNX Runtime's */
    if (allocator == NULL && (status = OTT_ORT(ort, GetAllocatorWithDefaultOptions)(&allocator)) != NULL) return status;
    if ((status = OTT_ORT(ort, CreateTensorAsOrtValue)(allocator, dims, rank, (ONNXTensorElementDataType)type, value)))
      return status;
  }
  status = ott_check_destination(*value, what, type, (long long)nbytes);
  if (status != NULL && created) { /* the allocator's doing, not the caller's value */
    OrtStatus* named = ott_status(ORT_INVALID_ARGUMENT, "allocator: the tensor it allocated is unusable: %s",
                                  OTT_ORT(ort, GetErrorMessage)(status));
    OTT_ORT(ort, ReleaseStatus)(status);
    OTT_ORT(ort, ReleaseValue)(*value);
    *value = NULL;
    return named;
  }
  if (status != NULL) return status;
  void* data = NULL;
  if ((status = OTT_ORT(ort, GetTensorMutableData)(*value, &data)) != NULL) return status;
  if (nbytes) memcpy(data, (const void*)(uintptr_t)address, (size_t)nbytes);
  return NULL;
}

OrtStatus* ott_string_out(PyObject* text, OrtAllocator* allocator, char** out) {
  Py_ssize_t length = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(text, &length);
  if (utf8 == NULL) return ott_python_error();
  void* memory = NULL;
  OrtStatus* status = OTT_ORT(ott_ort(), AllocatorAlloc)(allocator, (size_t)length + 1, &memory);
  if (status != NULL) return status;
  memcpy(memory, utf8, (size_t)length + 1);
  *out = (char*)memory;
  return NULL;
}

static void config_entry(const OrtSessionOptions* options, const char* key, char* value, size_t size) {
  const OrtApi* ort = ott_ort();
  int present = 0;
  value[0] = '\0';
  OrtStatus* status = OTT_ORT(ort, HasSessionConfigEntry)(options, key, &present);
  if (status != NULL) {
    OTT_ORT(ort, ReleaseStatus)(status);
    return;
  }
  if (!present) return;
  size_t length = size;
  status = OTT_ORT(ort, GetSessionConfigEntry)(options, key, value, &length);
  if (status != NULL) {
    OTT_ORT(ort, ReleaseStatus)(status);
    value[0] = '\0';
  }
}

void ott_session_settings(const OrtSessionOptions* options, char* device, size_t device_size, char* compile,
                          size_t compile_size) {
  device[0] = compile[0] = '\0';
  if (options == NULL) return;
  config_entry(options, ORT_TORCH_TRAIN_DEVICE_KEY, device, device_size);
  config_entry(options, ORT_TORCH_TRAIN_COMPILE_KEY, compile, compile_size);
}
