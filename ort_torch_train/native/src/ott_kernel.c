/* Running an OrtCustomOp's kernel for a training session: the kernel info and kernel context it is given are
 * this library's, and the KernelInfo / KernelContext functions of the forwarded table answer them (a context
 * or info of ONNX Runtime's own, from an inference session, goes on to ONNX Runtime).
 *
 * Python calls create_kernel and compute (ott_kernel_functions) with the GIL held; the kernel runs on that
 * thread, so an output it asks for is allocated by calling back into Python (a torch tensor). */
#include <stdlib.h>
#include <string.h>

#include "ott_custom_ops.h"

typedef struct {
  PyObject* attributes; /* dict: name -> float, int, str, list of float, list of int */
  size_t inputs, outputs;
} KernelInfo;

typedef struct {
  OrtValue** inputs;
  size_t input_count;
  OrtValue** outputs;
  size_t output_count;
  PyObject* allocate; /* (index, shape) -> (address, bytes, element type) of a new tensor */
  PyObject *error_type, *error_value, *error_traceback; /* a Python error raised while the kernel ran */
} KernelContext;

typedef struct {
  const OrtCustomOp* op;
  void* kernel;
} Kernel;

static const void* const* g_real;
static __thread const KernelInfo* t_info;      /* the info of the kernel being created on this thread */
static __thread KernelContext* t_context;       /* the context of the kernel computing on this thread */
static OrtMemoryInfo* g_cpu;

#define REAL(Name) ((OttFn_##Name)g_real[OTT_ORT_##Name])
#define OURS_INFO(info) ((const void*)(info) == (const void*)t_info && t_info != NULL)
#define OURS_CONTEXT(context) ((const void*)(context) == (const void*)t_context && t_context != NULL)

/* ---- KernelInfo ------------------------------------------------------------------------------ */

static OrtStatus* attribute(const OrtKernelInfo* info, const char* name, PyObject** value) {
  if (name == NULL) return ott_status(ORT_INVALID_ARGUMENT, "name: expected a non-NULL pointer, got NULL");
  *value = PyDict_GetItemString(((const KernelInfo*)(const void*)info)->attributes, name);
  return *value ? NULL : ott_status(ORT_FAIL, "No attribute with name:'%s' is defined.", name);
}

static OrtStatus* mismatch(const char* name, const char* expected) {
  return ott_status(ORT_FAIL, "Attribute name and type don't match: attribute '%s' is not %s", name, expected);
}

static OrtStatus* info_float(const OrtKernelInfo* info, const char* name, float* out) {
  if (!OURS_INFO(info)) return REAL(KernelInfoGetAttribute_float)(info, name, out);
  PyObject* value;
  OrtStatus* status = attribute(info, name, &value);
  if (status != NULL) return status;
  if (!PyFloat_Check(value)) return mismatch(name, "a float");
  if (out == NULL) return ott_status(ORT_INVALID_ARGUMENT, "out: expected a non-NULL pointer, got NULL");
  *out = (float)PyFloat_AS_DOUBLE(value);
  return NULL;
}

static OrtStatus* info_int64(const OrtKernelInfo* info, const char* name, int64_t* out) {
  if (!OURS_INFO(info)) return REAL(KernelInfoGetAttribute_int64)(info, name, out);
  PyObject* value;
  OrtStatus* status = attribute(info, name, &value);
  if (status != NULL) return status;
  if (!PyLong_Check(value)) return mismatch(name, "an int");
  if (out == NULL) return ott_status(ORT_INVALID_ARGUMENT, "out: expected a non-NULL pointer, got NULL");
  *out = (int64_t)PyLong_AsLongLong(value);
  return NULL;
}

/* ORT's rule for results of a caller-sized buffer: NULL asks the size; a short buffer gets the size and a status. */
static OrtStatus* sized(size_t needed, const void* out, size_t* size) {
  if (size == NULL) return ott_status(ORT_INVALID_ARGUMENT, "size: expected a non-NULL pointer, got NULL");
  size_t given = *size;
  *size = needed;
  if (out != NULL && given < needed)
    return ott_status(ORT_INVALID_ARGUMENT, "Result buffer is not large enough: %zu given, %zu needed", given, needed);
  return NULL;
}

static OrtStatus* info_string(const OrtKernelInfo* info, const char* name, char* out, size_t* size) {
  if (!OURS_INFO(info)) return REAL(KernelInfoGetAttribute_string)(info, name, out, size);
  PyObject* value;
  OrtStatus* status = attribute(info, name, &value);
  if (status != NULL) return status;
  Py_ssize_t length = 0;
  const char* text = PyUnicode_Check(value) ? PyUnicode_AsUTF8AndSize(value, &length) : NULL;
  if (text == NULL) {
    PyErr_Clear();
    return mismatch(name, "a string");
  }
  if ((status = sized((size_t)length + 1, out, size)) == NULL && out != NULL) memcpy(out, text, (size_t)length + 1);
  return status;
}

static OrtStatus* numbers(const OrtKernelInfo* info, const char* name, void* out, size_t* size, int floats) {
  PyObject* value;
  OrtStatus* status = attribute(info, name, &value);
  if (status != NULL) return status;
  if (!PyList_Check(value)) return mismatch(name, floats ? "a list of floats" : "a list of ints");
  size_t count = (size_t)PyList_GET_SIZE(value);
  for (size_t i = 0; i < count; i++) {
    PyObject* item = PyList_GET_ITEM(value, i);
    if (floats ? !PyFloat_Check(item) : !PyLong_Check(item))
      return mismatch(name, floats ? "a list of floats" : "a list of ints");
  }
  if ((status = sized(count, out, size)) != NULL || out == NULL) return status;
  for (size_t i = 0; i < count; i++) {
    PyObject* item = PyList_GET_ITEM(value, i);
    if (floats) ((float*)out)[i] = (float)PyFloat_AS_DOUBLE(item);
    else ((int64_t*)out)[i] = (int64_t)PyLong_AsLongLong(item);
  }
  return NULL;
}

static OrtStatus* info_floats(const OrtKernelInfo* info, const char* name, float* out, size_t* size) {
  if (!OURS_INFO(info)) return REAL(KernelInfoGetAttributeArray_float)(info, name, out, size);
  return numbers(info, name, out, size, 1);
}

static OrtStatus* info_ints(const OrtKernelInfo* info, const char* name, int64_t* out, size_t* size) {
  if (!OURS_INFO(info)) return REAL(KernelInfoGetAttributeArray_int64)(info, name, out, size);
  return numbers(info, name, out, size, 0);
}

static OrtStatus* info_tensor(const OrtKernelInfo* info, const char* name, OrtAllocator* allocator, OrtValue** out) {
  if (!OURS_INFO(info)) return REAL(KernelInfoGetAttribute_tensor)(info, name, allocator, out);
  return ott_status(ORT_NOT_IMPLEMENTED, "KernelInfoGetAttribute_tensor: tensor attributes ('%s') are not given to "
                    "custom-op kernels run by ort-torch-train", name ? name : "");
}

static OrtStatus* info_input_count(const OrtKernelInfo* info, size_t* out) {
  if (!OURS_INFO(info)) return REAL(KernelInfo_GetInputCount)(info, out);
  OTT_REQUIRE(out);
  *out = ((const KernelInfo*)(const void*)info)->inputs;
  return NULL;
}

static OrtStatus* info_output_count(const OrtKernelInfo* info, size_t* out) {
  if (!OURS_INFO(info)) return REAL(KernelInfo_GetOutputCount)(info, out);
  OTT_REQUIRE(out);
  *out = ((const KernelInfo*)(const void*)info)->outputs;
  return NULL;
}

/* ---- KernelContext --------------------------------------------------------------------------- */

static OrtStatus* context_input_count(const OrtKernelContext* context, size_t* out) {
  if (!OURS_CONTEXT(context)) return REAL(KernelContext_GetInputCount)(context, out);
  OTT_REQUIRE(out);
  *out = t_context->input_count;
  return NULL;
}

static OrtStatus* context_output_count(const OrtKernelContext* context, size_t* out) {
  if (!OURS_CONTEXT(context)) return REAL(KernelContext_GetOutputCount)(context, out);
  OTT_REQUIRE(out);
  *out = t_context->output_count;
  return NULL;
}

static OrtStatus* context_input(const OrtKernelContext* context, size_t index, const OrtValue** out) {
  if (!OURS_CONTEXT(context)) return REAL(KernelContext_GetInput)(context, index, out);
  OTT_REQUIRE(out);
  if (index >= t_context->input_count)
    return ott_status(ORT_INVALID_ARGUMENT, "index: the kernel has %zu inputs, got index %zu", t_context->input_count,
                      index);
  *out = t_context->inputs[index];
  return NULL;
}

static OrtStatus* context_output(OrtKernelContext* context, size_t index, const int64_t* dims, size_t rank,
                                 OrtValue** out) {
  if (!OURS_CONTEXT(context)) return REAL(KernelContext_GetOutput)(context, index, dims, rank, out);
  KernelContext* ours = t_context;
  OTT_REQUIRE(out);
  if (dims == NULL && rank > 0) return ott_status(ORT_INVALID_ARGUMENT, "dim_values: expected %zu sizes, got NULL", rank);
  if (index >= ours->output_count)
    return ott_status(ORT_INVALID_ARGUMENT, "index: the kernel has %zu outputs, got index %zu", ours->output_count,
                      index);
  if (ours->outputs[index] != NULL) { /* asked again: the same tensor, as ONNX Runtime answers */
    *out = ours->outputs[index];
    return NULL;
  }
  PyObject* shape = PyTuple_New((Py_ssize_t)rank);
  for (size_t i = 0; shape != NULL && i < rank; i++) PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(dims[i]));
  PyObject* made = shape ? PyObject_CallFunction(ours->allocate, "nN", (Py_ssize_t)index, shape) : NULL;
  unsigned long long address = 0, nbytes = 0;
  int type = 0;
  if (made == NULL || !PyArg_ParseTuple(made, "KKi", &address, &nbytes, &type)) {
    Py_XDECREF(made);
    if (ours->error_type == NULL) PyErr_Fetch(&ours->error_type, &ours->error_value, &ours->error_traceback);
    PyErr_Clear();
    return ott_status(ORT_FAIL, "KernelContext_GetOutput: output %zu could not be allocated", index);
  }
  Py_DECREF(made);
  OrtStatus* status = OTT_ORT(ott_ort(), CreateTensorWithDataAsOrtValue)(
      g_cpu, (void*)(uintptr_t)address, (size_t)nbytes, dims, rank, (ONNXTensorElementDataType)type, &ours->outputs[index]);
  if (status == NULL) *out = ours->outputs[index];
  return status;
}

void ott_kernel_install(void** table, const void* const* real) {
  g_real = real;
  table[OTT_ORT_KernelInfoGetAttribute_float] = (void*)info_float;
  table[OTT_ORT_KernelInfoGetAttribute_int64] = (void*)info_int64;
  table[OTT_ORT_KernelInfoGetAttribute_string] = (void*)info_string;
  table[OTT_ORT_KernelInfoGetAttributeArray_float] = (void*)info_floats;
  table[OTT_ORT_KernelInfoGetAttributeArray_int64] = (void*)info_ints;
  table[OTT_ORT_KernelInfoGetAttribute_tensor] = (void*)info_tensor;
  table[OTT_ORT_KernelInfo_GetInputCount] = (void*)info_input_count;
  table[OTT_ORT_KernelInfo_GetOutputCount] = (void*)info_output_count;
  table[OTT_ORT_KernelContext_GetInputCount] = (void*)context_input_count;
  table[OTT_ORT_KernelContext_GetOutputCount] = (void*)context_output_count;
  table[OTT_ORT_KernelContext_GetInput] = (void*)context_input;
  table[OTT_ORT_KernelContext_GetOutput] = (void*)context_output;
}

/* ---- the Python callables -------------------------------------------------------------------- */

static int uses_v2(const OrtCustomOp* op, int compute) {
  return op->version >= OTT_CUSTOM_OP_V2_VERSION && (compute ? op->KernelComputeV2 != NULL : op->CreateKernelV2 != NULL);
}

static PyObject* raise_status(OrtStatus* status, const char* what) {
  const OrtApi* ort = ott_ort();
  PyErr_Format(PyExc_RuntimeError, "%s: %s", what, OTT_ORT(ort, GetErrorMessage)(status));
  OTT_ORT(ort, ReleaseStatus)(status);
  return NULL;
}

static void destroy_kernel(PyObject* capsule) {
  Kernel* kernel = (Kernel*)PyCapsule_GetPointer(capsule, "ott.kernel");
  if (kernel == NULL) return;
  if (kernel->kernel != NULL && kernel->op->KernelDestroy != NULL) kernel->op->KernelDestroy(kernel->kernel);
  free(kernel);
}

/* create_kernel(op address, attributes, input count, output count) -> the kernel (a capsule). */
static PyObject* create_kernel(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *address, *attributes;
  Py_ssize_t inputs, outputs;
  if (!PyArg_ParseTuple(args, "OO!nn", &address, &PyDict_Type, &attributes, &inputs, &outputs)) return NULL;
  const OrtCustomOp* op = (const OrtCustomOp*)PyLong_AsVoidPtr(address);
  const OrtApi* api = ott_forwarded_api();
  if (op == NULL || api == NULL) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "custom op: no OrtCustomOp or no ONNX Runtime table");
    return NULL;
  }
  Kernel* kernel = (Kernel*)calloc(1, sizeof *kernel);
  if (kernel == NULL) return PyErr_NoMemory();
  kernel->op = op;
  KernelInfo info = {attributes, (size_t)inputs, (size_t)outputs};
  const KernelInfo* outer = t_info;
  t_info = &info;
  OrtStatus* status = NULL;
  if (uses_v2(op, 0)) status = op->CreateKernelV2(op, api, (const OrtKernelInfo*)(const void*)&info, &kernel->kernel);
  else kernel->kernel = op->CreateKernel(op, api, (const OrtKernelInfo*)(const void*)&info);
  t_info = outer;
  if (status != NULL) {
    free(kernel);
    return raise_status(status, "the custom op's CreateKernel failed");
  }
  PyObject* capsule = PyCapsule_New(kernel, "ott.kernel", destroy_kernel);
  if (capsule == NULL) {
    if (kernel->kernel != NULL && op->KernelDestroy != NULL) op->KernelDestroy(kernel->kernel);
    free(kernel);
  }
  return capsule;
}

static void release_values(OrtValue** values, size_t count) {
  for (size_t i = 0; i < count; i++)
    if (values[i] != NULL) OTT_ORT(ott_ort(), ReleaseValue)(values[i]);
  free(values);
}

/* compute(kernel, inputs as (address, bytes, element type, shape), output count, allocate) -> None. */
static PyObject* compute(PyObject* self, PyObject* args) {
  (void)self;
  PyObject *capsule, *specs, *allocate;
  Py_ssize_t output_count;
  if (!PyArg_ParseTuple(args, "OO!nO", &capsule, &PyTuple_Type, &specs, &output_count, &allocate)) return NULL;
  Kernel* kernel = (Kernel*)PyCapsule_GetPointer(capsule, "ott.kernel");
  if (kernel == NULL) return NULL;
  const OrtApi* ort = ott_ort();
  OrtStatus* status = NULL;
  if (g_cpu == NULL && (status = OTT_ORT(ort, CreateCpuMemoryInfo)(OrtDeviceAllocator, OrtMemTypeDefault, &g_cpu)))
    return raise_status(status, "custom op");
  KernelContext context = {NULL, (size_t)PyTuple_GET_SIZE(specs), NULL, (size_t)output_count, allocate, NULL, NULL, NULL};
  context.inputs = (OrtValue**)calloc(context.input_count + 1, sizeof(OrtValue*));
  context.outputs = (OrtValue**)calloc(context.output_count + 1, sizeof(OrtValue*));
  if (context.inputs == NULL || context.outputs == NULL) {
    free(context.inputs);
    free(context.outputs);
    return PyErr_NoMemory();
  }
  for (size_t i = 0; status == NULL && i < context.input_count; i++) {
    unsigned long long address = 0, nbytes = 0;
    int type = 0;
    PyObject* shape = NULL;
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(specs, i), "KKiO!", &address, &nbytes, &type, &PyTuple_Type, &shape)) {
      release_values(context.inputs, context.input_count);
      free(context.outputs);
      return NULL;
    }
    int64_t dims[64];
    size_t rank = (size_t)PyTuple_GET_SIZE(shape);
    if (rank > 64) {
      status = ott_status(ORT_INVALID_ARGUMENT, "input %zu: rank %zu is over 64", i, rank);
      break;
    }
    for (size_t d = 0; d < rank; d++) dims[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
    status = OTT_ORT(ort, CreateTensorWithDataAsOrtValue)(g_cpu, (void*)(uintptr_t)address, (size_t)nbytes, dims, rank,
                                                          (ONNXTensorElementDataType)type, &context.inputs[i]);
  }
  if (status == NULL) {
    KernelContext* outer = t_context;
    t_context = &context;
    OrtKernelContext* handle = (OrtKernelContext*)(void*)&context;
    if (uses_v2(kernel->op, 1)) status = kernel->op->KernelComputeV2(kernel->kernel, handle);
    else kernel->op->KernelCompute(kernel->kernel, handle);
    t_context = outer;
  }
  release_values(context.inputs, context.input_count);
  release_values(context.outputs, context.output_count);
  if (context.error_type != NULL) { /* the allocation's own error says most */
    if (status != NULL) OTT_ORT(ort, ReleaseStatus)(status);
    PyErr_Restore(context.error_type, context.error_value, context.error_traceback);
    return NULL;
  }
  if (status != NULL) return raise_status(status, "the custom op's kernel failed");
  Py_RETURN_NONE;
}

static PyMethodDef g_functions[] = {
    {"create_kernel", create_kernel, METH_VARARGS, "create_kernel(op, attributes, inputs, outputs) -> kernel"},
    {"compute", compute, METH_VARARGS, "compute(kernel, inputs, output_count, allocate) -> None"},
};

PyObject* ott_kernel_functions(void) {
  return Py_BuildValue("(NN)", PyCFunction_New(&g_functions[0], NULL), PyCFunction_New(&g_functions[1], NULL));
}
