/* The OrtTrainingApi table, and the two ways to it: OrtTorchTrainGetTrainingApi (explicit) and the
 * forwarded OrtGetApiBase (transparent: ONNX Runtime's table with GetTrainingApi answered here, and the
 * CUDA execution provider calls recorded as this library's device setting). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ott_api.h"
#include "ott_custom_ops.h"

#define OTT_EXPORT __attribute__((visibility("default")))

static const OrtTrainingApi g_training_api = {
    ott_LoadCheckpoint,
    ott_SaveCheckpoint,
    ott_CreateTrainingSession,
    ott_CreateTrainingSessionFromBuffer,
    ott_TrainingSessionGetTrainingModelOutputCount,
    ott_TrainingSessionGetEvalModelOutputCount,
    ott_TrainingSessionGetTrainingModelOutputName,
    ott_TrainingSessionGetEvalModelOutputName,
    ott_LazyResetGrad,
    ott_TrainStep,
    ott_EvalStep,
    ott_SetLearningRate,
    ott_GetLearningRate,
    ott_OptimizerStep,
    ott_RegisterLinearLRScheduler,
    ott_SchedulerStep,
    ott_GetParametersSize,
    ott_CopyParametersToBuffer,
    ott_CopyBufferToParameters,
    ott_ReleaseTrainingSession,
    ott_ReleaseCheckpointState,
    ott_ExportModelForInferencing,
    ott_SetSeed,
    ott_TrainingSessionGetTrainingModelInputCount,
    ott_TrainingSessionGetEvalModelInputCount,
    ott_TrainingSessionGetTrainingModelInputName,
    ott_TrainingSessionGetEvalModelInputName,
    ott_AddProperty,
    ott_GetProperty,
    ott_LoadCheckpointFromBuffer,
    ott_GetParameterTypeAndShape,
    ott_UpdateParameter,
    ott_GetParameter,
};

/* Versions 1 .. the running ONNX Runtime's own ORT_API_VERSION (the training table never changed shape). */
OTT_EXPORT const OrtTrainingApi* OrtTorchTrainGetTrainingApi(uint32_t version) {
  const OrtApi* ort = ott_ort();
  if (version < 1 || ort == NULL) return NULL;
  if (version > ORT_API_VERSION && ott_real_base()->GetApi(version) == NULL) return NULL;
  return &g_training_api;
}

/* ---- transparent path ------------------------------------------------------------------------ */

#define OTT_TABLE_SLOTS 1024 /* room for any OrtApi; only the slots inside ORT's mapped table are copied */
static void* g_table[OTT_TABLE_SLOTS];
static OrtApiBase g_base;
static const void* const* g_real_table;
static pthread_once_t g_table_once = PTHREAD_ONCE_INIT;

#define g_real_slot(index) (g_real_table[index])

static const OrtApi* forwarded_GetApi(uint32_t version);

static const OrtTrainingApi* forwarded_GetTrainingApi(uint32_t version) { return OrtTorchTrainGetTrainingApi(version); }

static OrtStatus* record_device(OrtSessionOptions* options, const char* device) {
  return OTT_ORT(ott_ort(), AddSessionConfigEntry)(options, ORT_TORCH_TRAIN_DEVICE_KEY, device);
}

/* A CUDA execution provider appended to the options: recorded as this library's device. ONNX Runtime's own
 * call runs too; its refusal (a build without CUDA) is dropped, as training runs on torch's CUDA. */
static OrtStatus* forwarded_AppendCUDA(OrtSessionOptions* options, const OrtCUDAProviderOptions* cuda_options) {
  if (options == NULL || cuda_options == NULL)
    return ott_status(ORT_INVALID_ARGUMENT, "SessionOptionsAppendExecutionProvider_CUDA: NULL argument");
  char device[32];
  snprintf(device, sizeof device, "cuda:%d", *(const int*)cuda_options); /* device_id is the first member */
  OrtStatus* status = ((OttFn_SessionOptionsAppendExecutionProvider_CUDA)g_real_slot(OTT_ORT_SessionOptionsAppendExecutionProvider_CUDA))(options, cuda_options);
  if (status != NULL) OTT_ORT(ott_ort(), ReleaseStatus)(status);
  return record_device(options, device);
}

static OrtStatus* forwarded_AppendCUDA_V2(OrtSessionOptions* options, const OrtCUDAProviderOptionsV2* cuda_options) {
  if (options == NULL || cuda_options == NULL)
    return ott_status(ORT_INVALID_ARGUMENT, "SessionOptionsAppendExecutionProvider_CUDA_V2: NULL argument");
  const OrtApi* ort = ott_ort();
  char device[32] = "cuda:0";
  OrtAllocator* allocator = NULL;
  char* text = NULL;
  OrtStatus* status = OTT_ORT(ort, GetAllocatorWithDefaultOptions)(&allocator);
  if (status == NULL) status = OTT_ORT(ort, GetCUDAProviderOptionsAsString)(cuda_options, allocator, &text);
  if (status == NULL && text != NULL) {
    const char* found = strstr(text, "device_id=");
    if (found != NULL) snprintf(device, sizeof device, "cuda:%d", atoi(found + 10));
    OTT_ORT(ort, AllocatorFree)(allocator, text);
  }
  if (status != NULL) OTT_ORT(ort, ReleaseStatus)(status);
  status = ((OttFn_SessionOptionsAppendExecutionProvider_CUDA_V2)g_real_slot(OTT_ORT_SessionOptionsAppendExecutionProvider_CUDA_V2))(options, cuda_options);
  if (status != NULL) OTT_ORT(ort, ReleaseStatus)(status);
  return record_device(options, device);
}

struct segment_search {
  const void* address;
  size_t room; /* bytes from address to the end of its mapped segment */
};

static int find_segment(struct dl_phdr_info* info, size_t size, void* data) {
  (void)size;
  struct segment_search* search = (struct segment_search*)data;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr)* header = &info->dlpi_phdr[i];
    if (header->p_type != PT_LOAD) continue;
    uintptr_t start = info->dlpi_addr + header->p_vaddr, end = start + header->p_memsz;
    uintptr_t at = (uintptr_t)search->address;
    if (at >= start && at < end) {
      search->room = end - at;
      return 1;
    }
  }
  return 0;
}

static void build_table(void) {
  const OrtApi* real = ott_ort();
  const OrtApiBase* real_base = ott_real_base();
  if (real == NULL || real_base == NULL) return;
  struct segment_search search = {real, 0};
  dl_iterate_phdr(find_segment, &search);
  size_t slots = search.room / sizeof(void*);
  if (slots > OTT_TABLE_SLOTS) slots = OTT_TABLE_SLOTS;
  if (slots <= OTT_ORT_KNOWN_MEMBERS) return; /* not a table this library knows */
  memcpy(g_table, real, slots * sizeof(void*));
  g_real_table = (const void* const*)real;
  g_table[OTT_ORT_GetTrainingApi] = (void*)forwarded_GetTrainingApi;
  g_table[OTT_ORT_SessionOptionsAppendExecutionProvider_CUDA] = (void*)forwarded_AppendCUDA;
  g_table[OTT_ORT_SessionOptionsAppendExecutionProvider_CUDA_V2] = (void*)forwarded_AppendCUDA_V2;
  ott_custom_ops_install(g_table, g_real_table, &g_base);
  g_base.GetVersionString = real_base->GetVersionString;
  g_base.GetApi = forwarded_GetApi;
}

static const OrtApi* forwarded_GetApi(uint32_t version) {
  const OrtApiBase* real_base = ott_real_base();
  if (real_base == NULL || real_base->GetApi(version) == NULL) return NULL; /* a version ORT does not know */
  return (const OrtApi*)(const void*)g_table;
}

const OrtApi* ott_forwarded_api(void) {
  pthread_once(&g_table_once, build_table);
  return g_base.GetApi != NULL ? (const OrtApi*)(const void*)g_table : NULL;
}

/* ONNX Runtime's entry point, forwarded: its table with the training API answered by this library. */
OTT_EXPORT const OrtApiBase* OrtGetApiBase(void) {
  pthread_once(&g_table_once, build_table);
  if (g_base.GetApi != NULL) return &g_base;
  return ott_real_base(); /* no ONNX Runtime table to extend: ONNX Runtime's own, or NULL without it */
}
