/* The table of live handles (checkpoint states, training sessions) and the process checks made on every call:
 * a handle that was never made here or was already released, a call in a child made by fork(), a call after
 * the host finalized Python, are statuses instead of crashes. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "ott_internal.h"

/* Released handles are kept (their memory not reused) until this many more were released, so a stale
 * handle is recognised as released rather than mistaken for a new one at the same address. */
#define OTT_RELEASED_KEPT 1024

typedef struct {
  const void* handle;
  OttHandleKind kind;
} LiveHandle;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static LiveHandle* g_live;
static size_t g_live_count, g_live_room;
static void* g_released[OTT_RELEASED_KEPT];
static size_t g_released_next;

static const char* kind_name(OttHandleKind kind) {
  return kind == OTT_HANDLE_SESSION ? "OrtTrainingSession" : "OrtCheckpointState";
}

int ott_handle_add(const void* handle, OttHandleKind kind) {
  pthread_mutex_lock(&g_lock);
  int added = 0;
  if (g_live_count == g_live_room) {
    size_t room = g_live_room ? 2 * g_live_room : 16;
    LiveHandle* grown = (LiveHandle*)realloc(g_live, room * sizeof *grown);
    if (grown != NULL) {
      g_live = grown;
      g_live_room = room;
    }
  }
  if (g_live_count < g_live_room) {
    g_live[g_live_count++] = (LiveHandle){handle, kind};
    added = 1;
  }
  pthread_mutex_unlock(&g_lock);
  return added;
}

static size_t find(const void* handle, OttHandleKind kind) {
  for (size_t i = 0; i < g_live_count; i++)
    if (g_live[i].handle == handle && g_live[i].kind == kind) return i;
  return g_live_count;
}

OrtStatus* ott_handle_check(const void* handle, OttHandleKind kind, const char* what) {
  if (handle == NULL)
    return ott_status(ORT_INVALID_ARGUMENT, "%s: expected a non-NULL pointer, got NULL", what);
  pthread_mutex_lock(&g_lock);
  int live = find(handle, kind) < g_live_count;
  pthread_mutex_unlock(&g_lock);
  if (live) return NULL;
  return ott_status(ORT_INVALID_ARGUMENT, "%s: expected a live %s, got one that was released or never created",
                    what, kind_name(kind));
}

int ott_handle_remove(void* handle, OttHandleKind kind) {
  pthread_mutex_lock(&g_lock);
  size_t at = find(handle, kind);
  int removed = at < g_live_count;
  if (removed) {
    g_live[at] = g_live[--g_live_count];
    free(g_released[g_released_next]); /* the oldest released handle's memory may now be reused */
    g_released[g_released_next] = handle;
    g_released_next = (g_released_next + 1) % OTT_RELEASED_KEPT;
  }
  pthread_mutex_unlock(&g_lock);
  if (!removed)
    fprintf(stderr, "libort_torch_train: Release%s: %p is not a live %s (released twice?); ignored\n",
            kind == OTT_HANDLE_SESSION ? "TrainingSession" : "CheckpointState", handle, kind_name(kind));
  return removed;
}

void ott_handle_release(void* handle, OttHandleKind kind, PyObject* const* object) {
  if (!ott_python_usable()) { /* after fork or Py_Finalize: the Python object cannot be touched, only forgotten */
    ott_handle_remove(handle, kind);
    return;
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* held = ott_handle_remove(handle, kind) ? *object : NULL; /* read only from a live handle */
  Py_XDECREF(held); /* the handle's memory is freed by the table, later */
  PyGILState_Release(gil);
}
