/* OrtTrainingApi: the checkpoint state's functions, and SetSeed. */
#include <stdlib.h>
#include <string.h>

#include "ott_api.h"

static PyObject* path_object(const char* path) { return PyUnicode_DecodeFSDefault(path); }

static OrtStatus* state_out(PyObject* state, OrtCheckpointState** out) {
  if (state == NULL) return ott_python_error();
  OrtCheckpointState* handle = (OrtCheckpointState*)malloc(sizeof *handle);
  if (handle == NULL || !ott_handle_add(handle, OTT_HANDLE_STATE)) {
    free(handle);
    Py_DECREF(state);
    return ott_status(ORT_FAIL, "out of memory");
  }
  handle->state = state;
  *out = handle;
  return NULL;
}

/* The status of a call whose result is None (or NULL with an exception). */
OrtStatus* ott_done(PyObject* result) {
  if (result == NULL) return ott_python_error();
  Py_DECREF(result);
  return NULL;
}

OrtStatus* ott_LoadCheckpoint(const ORTCHAR_T* checkpoint_path, OrtCheckpointState** checkpoint_state) {
  OTT_REQUIRE(checkpoint_path);
  OTT_REQUIRE(checkpoint_state);
  OTT_ENTER();
  status = state_out(ott_call(OTT_load_checkpoint, Py_BuildValue("(N)", path_object(checkpoint_path))),
                     checkpoint_state);
  OTT_LEAVE();
}

OrtStatus* ott_LoadCheckpointFromBuffer(const void* checkpoint_buffer, const size_t num_bytes,
                                        OrtCheckpointState** checkpoint_state) {
  OTT_REQUIRE(checkpoint_buffer);
  OTT_REQUIRE(checkpoint_state);
  const size_t largest = (size_t)-1 >> 1; /* Py_ssize_t's largest value: the largest buffer Python can view */
  if (num_bytes > largest)
    return ott_status(ORT_INVALID_ARGUMENT, "num_bytes: %zu is larger than any buffer can be (at most %zu)", num_bytes,
                      largest);
  OTT_ENTER();
  PyObject* view = PyMemoryView_FromMemory((char*)checkpoint_buffer, (Py_ssize_t)num_bytes, PyBUF_READ);
  status = state_out(ott_call(OTT_load_checkpoint_buffer, Py_BuildValue("(N)", view)), checkpoint_state);
  OTT_LEAVE();
}

OrtStatus* ott_SaveCheckpoint(OrtCheckpointState* checkpoint_state, const ORTCHAR_T* checkpoint_path,
                              const bool include_optimizer_state) {
  OTT_REQUIRE(checkpoint_state);
  OTT_REQUIRE(checkpoint_path);
  OTT_ENTER_LIVE(checkpoint_state, OTT_HANDLE_STATE);
  status = ott_done(ott_call(OTT_save_checkpoint, Py_BuildValue("(ONO)", checkpoint_state->state,
                                                                path_object(checkpoint_path),
                                                                include_optimizer_state ? Py_True : Py_False)));
  OTT_LEAVE();
}

void ott_ReleaseCheckpointState(OrtCheckpointState* input) {
  if (input != NULL) ott_handle_release(input, OTT_HANDLE_STATE, &input->state);
}

OrtStatus* ott_AddProperty(OrtCheckpointState* checkpoint_state, const char* property_name,
                           enum OrtPropertyType property_type, void* property_value) {
  OTT_REQUIRE(checkpoint_state);
  OTT_REQUIRE(property_name);
  OTT_REQUIRE(property_value);
  if (property_type != OrtIntProperty && property_type != OrtFloatProperty && property_type != OrtStringProperty)
    return ott_status(ORT_INVALID_ARGUMENT, "property_type: expected OrtIntProperty, OrtFloatProperty or "
                      "OrtStringProperty (0, 1, 2), got %d", (int)property_type);
  OTT_ENTER_LIVE(checkpoint_state, OTT_HANDLE_STATE);
  PyObject* value = property_type == OrtIntProperty     ? PyLong_FromLongLong(*(const int64_t*)property_value)
                    : property_type == OrtFloatProperty ? PyFloat_FromDouble(*(const float*)property_value)
                                                        : PyUnicode_FromString((const char*)property_value);
  status = ott_done(ott_call(OTT_add_property, Py_BuildValue("(OsN)", checkpoint_state->state, property_name, value)));
  OTT_LEAVE();
}

static OrtStatus* property_out(PyObject* value, OrtAllocator* allocator, enum OrtPropertyType* type, void** out) {
  const OrtApi* ort = ott_ort();
  OrtStatus* status;
  if (PyLong_Check(value)) {
    int64_t number = PyLong_AsLongLong(value);
    if ((status = OTT_ORT(ort, AllocatorAlloc)(allocator, sizeof number, out)) != NULL) return status;
    memcpy(*out, &number, sizeof number);
    *type = OrtIntProperty;
  } else if (PyFloat_Check(value)) {
    float number = (float)PyFloat_AsDouble(value);
    if ((status = OTT_ORT(ort, AllocatorAlloc)(allocator, sizeof number, out)) != NULL) return status;
    memcpy(*out, &number, sizeof number);
    *type = OrtFloatProperty;
  } else {
    if ((status = ott_string_out(value, allocator, (char**)out)) != NULL) return status;
    *type = OrtStringProperty;
  }
  return NULL;
}

OrtStatus* ott_GetProperty(const OrtCheckpointState* checkpoint_state, const char* property_name,
                           OrtAllocator* allocator, enum OrtPropertyType* property_type, void** property_value) {
  OTT_REQUIRE(checkpoint_state);
  OTT_REQUIRE(property_name);
  OTT_REQUIRE(allocator);
  OTT_REQUIRE(property_type);
  OTT_REQUIRE(property_value);
  OTT_ENTER_LIVE(checkpoint_state, OTT_HANDLE_STATE);
  PyObject* value = ott_call(OTT_get_property, Py_BuildValue("(Os)", checkpoint_state->state, property_name));
  status = value ? property_out(value, allocator, property_type, property_value) : ott_python_error();
  Py_XDECREF(value);
  OTT_LEAVE();
}

static OrtStatus* type_and_shape_out(PyObject* answer, OrtTensorTypeAndShapeInfo** out) {
  const OrtApi* ort = ott_ort();
  int type = 0;
  PyObject* shape = NULL;
  if (!PyArg_ParseTuple(answer, "iO!", &type, &PyTuple_Type, &shape)) return ott_python_error();
  size_t rank = (size_t)PyTuple_GET_SIZE(shape);
  int64_t dims[64];
  if (rank > 64) return ott_status(ORT_FAIL, "parameter rank %zu is over 64", rank);
  for (size_t i = 0; i < rank; i++) dims[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
  OrtTensorTypeAndShapeInfo* info = NULL;
  OrtStatus* status = OTT_ORT(ort, CreateTensorTypeAndShapeInfo)(&info);
  if (status == NULL) status = OTT_ORT(ort, SetTensorElementType)(info, (ONNXTensorElementDataType)type);
  if (status == NULL) status = OTT_ORT(ort, SetDimensions)(info, dims, rank);
  if (status != NULL) {
    OTT_ORT(ort, ReleaseTensorTypeAndShapeInfo)(info);
    return status;
  }
  *out = info;
  return NULL;
}

OrtStatus* ott_GetParameterTypeAndShape(const OrtCheckpointState* checkpoint_state, const char* parameter_name,
                                        OrtTensorTypeAndShapeInfo** parameter_type_and_shape) {
  OTT_REQUIRE(checkpoint_state);
  OTT_REQUIRE(parameter_name);
  OTT_REQUIRE(parameter_type_and_shape);
  OTT_ENTER_LIVE(checkpoint_state, OTT_HANDLE_STATE);
  PyObject* answer =
      ott_call(OTT_parameter_type_and_shape, Py_BuildValue("(Os)", checkpoint_state->state, parameter_name));
  status = answer ? type_and_shape_out(answer, parameter_type_and_shape) : ott_python_error();
  Py_XDECREF(answer);
  OTT_LEAVE();
}

OrtStatus* ott_UpdateParameter(OrtCheckpointState* checkpoint_state, const char* parameter_name, OrtValue* parameter) {
  OTT_REQUIRE(checkpoint_state);
  OTT_REQUIRE(parameter_name);
  OTT_REQUIRE(parameter);
  OTT_ENTER_LIVE(checkpoint_state, OTT_HANDLE_STATE);
  PyObject* spec = NULL;
  status = ott_tensor_spec(parameter, "parameter", &spec);
  if (status == NULL)
    status = ott_done(
        ott_call(OTT_update_parameter, Py_BuildValue("(OsN)", checkpoint_state->state, parameter_name, spec)));
  OTT_LEAVE();
}

OrtStatus* ott_GetParameter(const OrtCheckpointState* checkpoint_state, const char* parameter_name,
                            OrtAllocator* allocator, OrtValue** parameter) {
  OTT_REQUIRE(checkpoint_state);
  OTT_REQUIRE(parameter_name);
  OTT_REQUIRE(allocator);
  OTT_REQUIRE(parameter);
  OTT_ENTER_LIVE(checkpoint_state, OTT_HANDLE_STATE);
  PyObject* out = ott_call(OTT_get_parameter, Py_BuildValue("(Os)", checkpoint_state->state, parameter_name));
  *parameter = NULL;
  status = out ? ott_tensor_from_out(out, allocator, parameter, "parameter") : ott_python_error();
  Py_XDECREF(out);
  OTT_LEAVE();
}

OrtStatus* ott_SetSeed(const int64_t seed) {
  OTT_ENTER();
  status = ott_done(ott_call(OTT_seed, Py_BuildValue("(L)", (long long)seed)));
  OTT_LEAVE();
}
