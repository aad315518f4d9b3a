/* Custom-op libraries: registration recorded per OrtSessionOptions, and kernels run for training sessions. */
#ifndef OTT_CUSTOM_OPS_H
#define OTT_CUSTOM_OPS_H

#include "ott_internal.h"

/* Put the custom-op registration functions and the kernel context/info functions into the forwarded table
 * `table` (ONNX Runtime's own are `real`; `forwarded_base` is what a library's RegisterCustomOps is given). */
void ott_custom_ops_install(void** table, const void* const* real, const OrtApiBase* forwarded_base);
void ott_kernel_install(void** table, const void* const* real);

/* The ops registered on `options`: a list of (domain, op name, OrtCustomOp address, input element types,
 * output element types); NULL with a Python error set on failure. Called with the GIL held. */
PyObject* ott_custom_ops_for(const OrtSessionOptions* options);

/* (create_kernel, compute): the Python callables that run an OrtCustomOp's kernel (ott_kernel.c). */
PyObject* ott_kernel_functions(void);

/* The forwarded table (ONNX Runtime's, with this library's entries), or NULL without ONNX Runtime. */
const OrtApi* ott_forwarded_api(void);

#endif /* OTT_CUSTOM_OPS_H */
