/* packaged_boundary.c's check of two training sessions over one checkpoint state. */
#ifndef PACKAGED_SHARED_STATE_H
#define PACKAGED_SHARED_STATE_H

#include <stdlib.h>
#include <string.h>

#include "packaged_handles.h"

/* Two sessions over one checkpoint state: the second trains the flat buffers the first put behind the state's
 * parameters and moments, so that each sees the other's steps. */
static void shared_state(OrtEnv* env, OrtSessionOptions* options, const char* package, const char* checkpoint,
                         OrtValue** inputs) {
  OrtCheckpointState* state = NULL;
  CHECK(g_api->LoadCheckpoint(checkpoint, &state));
  OrtTrainingSession *first = NULL, *second = NULL;
  CHECK(g_api->CreateTrainingSession(env, options, state, package, NULL, NULL, &first));
  CHECK(g_api->CreateTrainingSession(env, options, state, package, NULL, NULL, &second));
  size_t count = 0;
  CHECK(g_api->GetParametersSize(first, &count, true));
  float* values[3];
  OrtValue* buffers[3];
  const int64_t dims[1] = {(int64_t)count};
  for (int i = 0; i < 3; i++) {
    values[i] = (float*)malloc(count * sizeof(float));
    buffers[i] = tensor_over(values[i], count * sizeof(float), ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, dims, 1);
  }
  CHECK(g_api->CopyParametersToBuffer(first, buffers[0], true));
  OrtValue* loss = NULL;
  CHECK(g_api->TrainStep(second, NULL, 2, (const OrtValue* const*)inputs, 1, &loss));
  CHECK(g_api->OptimizerStep(second, NULL));
  CHECK(g_api->CopyParametersToBuffer(first, buffers[1], true));
  CHECK(g_api->CopyParametersToBuffer(second, buffers[2], true));
  EXPECT(memcmp(values[0], values[1], count * sizeof(float)) != 0); /* the second's step moved the first's */
  EXPECT(memcmp(values[1], values[2], count * sizeof(float)) == 0);
  OTT_ORT(g_ort, ReleaseValue)(loss);
  for (int i = 0; i < 3; i++) {
    OTT_ORT(g_ort, ReleaseValue)(buffers[i]);
    free(values[i]);
  }
  g_api->ReleaseTrainingSession(second);
  g_api->ReleaseTrainingSession(first);
  g_api->ReleaseCheckpointState(state);
}

#endif
