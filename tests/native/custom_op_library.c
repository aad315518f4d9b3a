/* A custom-op library as ONNX Runtime loads one (RegisterCustomOps), with two ops of domain "ott.test":
 *   ScaledSquare (OrtCustomOp version 16: CreateKernelV2 / KernelComputeV2): y = alpha * x * x + shift,
 *     alpha a float attribute, shift an int attribute;
 *   Negate (version 10: CreateKernel / KernelCompute): y = -x.
 * Both on float tensors of any shape; they use only the OrtApi table they are given. */
#include <stdlib.h>

#include "ort_torch_train_ort_abi.h"

static const OrtApi* g_api;

typedef struct {
  float alpha;
  int64_t shift;
} ScaledSquareKernel;

/* The kernel's input 0 and an output 0 of the same shape; NULL status when both are there. */
static OrtStatus* input_and_output(OrtKernelContext* context, const float** x, float** y, size_t* count) {
  const OrtValue* input = NULL;
  OrtStatus* status = OTT_ORT(g_api, KernelContext_GetInput)(context, 0, &input);
  if (status != NULL) return status;
  OrtTensorTypeAndShapeInfo* info = NULL;
  if ((status = OTT_ORT(g_api, GetTensorTypeAndShape)(input, &info)) != NULL) return status;
  size_t rank = 0;
  int64_t dims[8];
  if ((status = OTT_ORT(g_api, GetDimensionsCount)(info, &rank)) == NULL && rank <= 8 &&
      (status = OTT_ORT(g_api, GetDimensions)(info, dims, rank)) == NULL)
    status = OTT_ORT(g_api, GetTensorShapeElementCount)(info, count);
  OTT_ORT(g_api, ReleaseTensorTypeAndShapeInfo)(info);
  if (status == NULL && rank > 8) status = OTT_ORT(g_api, CreateStatus)(ORT_INVALID_ARGUMENT, "rank over 8");
  if (status != NULL) return status;
  OrtValue* output = NULL;
  if ((status = OTT_ORT(g_api, GetTensorMutableData)((OrtValue*)input, (void**)x)) != NULL) return status;
  if ((status = OTT_ORT(g_api, KernelContext_GetOutput)(context, 0, dims, rank, &output)) != NULL) return status;
  return OTT_ORT(g_api, GetTensorMutableData)(output, (void**)y);
}

static OrtStatus* scaled_square_create(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info,
                                       void** kernel) {
  (void)op;
  ScaledSquareKernel* made = (ScaledSquareKernel*)malloc(sizeof *made);
  if (made == NULL) return OTT_ORT(api, CreateStatus)(ORT_FAIL, "out of memory");
  OrtStatus* status = OTT_ORT(api, KernelInfoGetAttribute_float)(info, "alpha", &made->alpha);
  if (status == NULL) status = OTT_ORT(api, KernelInfoGetAttribute_int64)(info, "shift", &made->shift);
  size_t inputs = 0;
  if (status == NULL) status = OTT_ORT(api, KernelInfo_GetInputCount)(info, &inputs);
  if (status == NULL && inputs != 1) status = OTT_ORT(api, CreateStatus)(ORT_INVALID_ARGUMENT, "one input expected");
  if (status != NULL) {
    free(made);
    return status;
  }
  *kernel = made;
  return NULL;
}

static OrtStatus* scaled_square_compute(void* kernel, OrtKernelContext* context) {
  const ScaledSquareKernel* self = (const ScaledSquareKernel*)kernel;
  const float* x = NULL;
  float* y = NULL;
  size_t count = 0;
  OrtStatus* status = input_and_output(context, &x, &y, &count);
  if (status != NULL) return status;
  for (size_t i = 0; i < count; i++) y[i] = self->alpha * x[i] * x[i] + (float)self->shift;
  return NULL;
}

static void* negate_create(const OrtCustomOp* op, const OrtApi* api, const OrtKernelInfo* info) {
  (void)op, (void)api, (void)info;
  return malloc(1);
}

static void negate_compute(void* kernel, OrtKernelContext* context) {
  (void)kernel;
  const float* x = NULL;
  float* y = NULL;
  size_t count = 0;
  OrtStatus* status = input_and_output(context, &x, &y, &count);
  if (status != NULL) { /* version-1 kernels cannot report: leave the output as allocated */
    OTT_ORT(g_api, ReleaseStatus)(status);
    return;
  }
  for (size_t i = 0; i < count; i++) y[i] = -x[i];
}

static void destroy(void* kernel) { free(kernel); }
static const char* scaled_square_name(const OrtCustomOp* op) { (void)op; return "ScaledSquare"; }
static const char* negate_name(const OrtCustomOp* op) { (void)op; return "Negate"; }
static const char* cpu(const OrtCustomOp* op) { (void)op; return "CPUExecutionProvider"; }
static ONNXTensorElementDataType float_type(const OrtCustomOp* op, size_t index) {
  (void)op, (void)index;
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
static size_t one(const OrtCustomOp* op) { (void)op; return 1; }
static OrtCustomOpInputOutputCharacteristic required(const OrtCustomOp* op, size_t index) {
  (void)op, (void)index;
  return INPUT_OUTPUT_REQUIRED;
}
static OrtMemType default_memory(const OrtCustomOp* op, size_t index) {
  (void)op, (void)index;
  return OrtMemTypeDefault;
}
static int zero(const OrtCustomOp* op) { (void)op; return 0; }
static int start_version(const OrtCustomOp* op) { (void)op; return 1; }
static int end_version(const OrtCustomOp* op) { (void)op; return 2147483647; }

static OrtCustomOp g_scaled_square, g_negate;

__attribute__((visibility("default"))) OrtStatus* RegisterCustomOps(OrtSessionOptions* options,
                                                                     const OrtApiBase* base) {
  g_api = base->GetApi(16);
  if (g_api == NULL) return NULL;
  OrtCustomOp common = {0};
  common.GetExecutionProviderType = cpu;
  common.GetInputType = float_type;
  common.GetInputTypeCount = one;
  common.GetOutputType = float_type;
  common.GetOutputTypeCount = one;
  common.KernelDestroy = destroy;
  common.GetInputCharacteristic = required;
  common.GetOutputCharacteristic = required;
  common.GetInputMemoryType = default_memory;
  g_negate = common;
  g_negate.version = 10;
  g_negate.GetName = negate_name;
  g_negate.CreateKernel = negate_create;
  g_negate.KernelCompute = negate_compute;
  g_scaled_square = common;
  g_scaled_square.version = 17;
  g_scaled_square.GetName = scaled_square_name;
  g_scaled_square.GetVariadicInputMinArity = zero;
  g_scaled_square.GetVariadicInputHomogeneity = zero;
  g_scaled_square.GetVariadicOutputMinArity = zero;
  g_scaled_square.GetVariadicOutputHomogeneity = zero;
  g_scaled_square.CreateKernelV2 = scaled_square_create;
  g_scaled_square.KernelComputeV2 = scaled_square_compute;
  g_scaled_square.GetStartVersion = start_version;
  g_scaled_square.GetEndVersion = end_version;
  OrtCustomOpDomain* domain = NULL;
  OrtStatus* status = OTT_ORT(g_api, CreateCustomOpDomain)("ott.test", &domain);
  if (status == NULL) status = OTT_ORT(g_api, CustomOpDomain_Add)(domain, &g_scaled_square);
  if (status == NULL) status = OTT_ORT(g_api, CustomOpDomain_Add)(domain, &g_negate);
  if (status == NULL) status = OTT_ORT(g_api, AddCustomOpDomain)(options, domain);
  return status; /* the domain lives as long as the process (ORT needs it while sessions use it) */
}
