/* Custom-op libraries: the OrtCustomOps registered on each OrtSessionOptions (recorded as they pass through the
 * forwarded table, and still given to ONNX Runtime), and the kernel calls a training session makes to run them.
 *
 * A kernel runs inside a context of this library's own (ott_kernel.c answers the KernelContext and KernelInfo
 * functions for it); the Python side (ort_torch_train.native.custom_ops) wraps the calls as a torch op. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ott_custom_ops.h"

typedef struct Domain {
  const OrtCustomOpDomain* handle; /* ONNX Runtime's */
  char* name;
  const OrtCustomOp** ops;
  size_t op_count;
  struct Domain* next;
} Domain;

typedef struct Use { /* a domain added to a session options */
  const OrtSessionOptions* options;
  const Domain* domain;
  struct Use* next;
} Use;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static Domain* g_domains;
static Use* g_uses;
static const void* const* g_real; /* ONNX Runtime's table */
static const OrtApiBase* g_forwarded_base;

#define REAL(Name) ((OttFn_##Name)g_real[OTT_ORT_##Name])

static Domain* find_domain(const OrtCustomOpDomain* handle) {
  for (Domain* domain = g_domains; domain != NULL; domain = domain->next)
    if (domain->handle == handle) return domain;
  return NULL;
}

static OrtStatus* no_memory(void) { return ott_status(ORT_FAIL, "out of memory recording a custom-op domain"); }

static OrtStatus* forwarded_CreateCustomOpDomain(const char* name, OrtCustomOpDomain** out) {
  if (name == NULL || out == NULL)
    return ott_status(ORT_INVALID_ARGUMENT, "CreateCustomOpDomain: %s: expected a non-NULL pointer, got NULL",
                      name == NULL ? "domain" : "out");
  OrtStatus* status = REAL(CreateCustomOpDomain)(name, out);
  if (status != NULL) return status;
  Domain* domain = (Domain*)calloc(1, sizeof *domain);
  if (domain == NULL || (domain->name = strdup(name)) == NULL) {
    free(domain);
    return no_memory();
  }
  domain->handle = *out;
  pthread_mutex_lock(&g_lock);
  domain->next = g_domains;
  g_domains = domain;
  pthread_mutex_unlock(&g_lock);
  return NULL;
}

static OrtStatus* forwarded_CustomOpDomain_Add(OrtCustomOpDomain* handle, const OrtCustomOp* op) {
  if (handle == NULL || op == NULL)
    return ott_status(ORT_INVALID_ARGUMENT, "CustomOpDomain_Add: %s: expected a non-NULL pointer, got NULL",
                      handle == NULL ? "custom_op_domain" : "op");
  OrtStatus* status = REAL(CustomOpDomain_Add)(handle, op);
  if (status != NULL) return status;
  pthread_mutex_lock(&g_lock);
  Domain* domain = find_domain(handle);
  if (domain != NULL) {
    const OrtCustomOp** ops = (const OrtCustomOp**)realloc(domain->ops, (domain->op_count + 1) * sizeof *ops);
    if (ops == NULL) status = no_memory();
    else {
      ops[domain->op_count++] = op;
      domain->ops = ops;
    }
  }
  pthread_mutex_unlock(&g_lock);
  return status;
}

static OrtStatus* forwarded_AddCustomOpDomain(OrtSessionOptions* options, OrtCustomOpDomain* handle) {
  if (options == NULL || handle == NULL)
    return ott_status(ORT_INVALID_ARGUMENT, "AddCustomOpDomain: %s: expected a non-NULL pointer, got NULL",
                      options == NULL ? "options" : "custom_op_domain");
  OrtStatus* status = REAL(AddCustomOpDomain)(options, handle);
  if (status != NULL) return status;
  pthread_mutex_lock(&g_lock);
  Domain* domain = find_domain(handle);
  if (domain != NULL) {
    Use* use = (Use*)malloc(sizeof *use);
    if (use == NULL) status = no_memory();
    else {
      *use = (Use){options, domain, g_uses};
      g_uses = use;
    }
  }
  pthread_mutex_unlock(&g_lock);
  return status;
}

static void forwarded_ReleaseCustomOpDomain(OrtCustomOpDomain* handle) {
  pthread_mutex_lock(&g_lock);
  for (Use** use = &g_uses; *use != NULL;) {
    if ((*use)->domain->handle == handle) {
      Use* gone = *use;
      *use = gone->next;
      free(gone);
    } else {
      use = &(*use)->next;
    }
  }
  for (Domain** domain = &g_domains; *domain != NULL; domain = &(*domain)->next) {
    if ((*domain)->handle == handle) {
      Domain* gone = *domain;
      *domain = gone->next;
      free(gone->name);
      free(gone->ops);
      free(gone);
      break;
    }
  }
  pthread_mutex_unlock(&g_lock);
  REAL(ReleaseCustomOpDomain)(handle);
}

/* The options' uses forgotten (a new options object may get the same address). */
static void forget_uses(const OrtSessionOptions* options) {
  for (Use** use = &g_uses; *use != NULL;) {
    if ((*use)->options == options) {
      Use* gone = *use;
      *use = gone->next;
      free(gone);
    } else {
      use = &(*use)->next;
    }
  }
}

static void forwarded_ReleaseSessionOptions(OrtSessionOptions* options) {
  pthread_mutex_lock(&g_lock);
  forget_uses(options);
  pthread_mutex_unlock(&g_lock);
  REAL(ReleaseSessionOptions)(options);
}

/* A clone has the original's custom-op domains (ONNX Runtime copies them): so do the records. */
static OrtStatus* forwarded_CloneSessionOptions(const OrtSessionOptions* options, OrtSessionOptions** out) {
  OrtStatus* status = REAL(CloneSessionOptions)(options, out);
  if (status != NULL || out == NULL || *out == NULL) return status;
  pthread_mutex_lock(&g_lock);
  forget_uses(*out);
  Use* clones = NULL;
  for (const Use* use = g_uses; use != NULL && status == NULL; use = use->next) {
    if (use->options != options) continue;
    Use* clone = (Use*)malloc(sizeof *clone);
    if (clone == NULL) status = no_memory();
    else {
      *clone = (Use){*out, use->domain, clones};
      clones = clone;
    }
  }
  while (clones != NULL) { /* prepended after the walk, so that the walk never meets them */
    Use* next = clones->next;
    clones->next = g_uses;
    g_uses = clones;
    clones = next;
  }
  pthread_mutex_unlock(&g_lock);
  return status;
}

/* The library's RegisterCustomOps, called with this library's table so that its domains are recorded here too. */
static OrtStatus* register_from(OrtSessionOptions* options, void* library, const char* path, const char* function) {
  OttFn_RegisterCustomOps registration = (OttFn_RegisterCustomOps)dlsym(library, function);
  if (registration == NULL)
    return ott_status(ORT_INVALID_ARGUMENT, "custom-op library %s: it has no function %s to register its ops with",
                      path, function);
  return registration(options, g_forwarded_base);
}

static OrtStatus* open_library(OrtSessionOptions* options, const char* path, void** handle) {
  if (options == NULL || path == NULL)
    return ott_status(ORT_INVALID_ARGUMENT, "RegisterCustomOpsLibrary: %s: expected a non-NULL pointer, got NULL",
                      options == NULL ? "options" : "library_path");
  void* library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) {
    const char* reason = dlerror();
    return ott_status(ORT_FAIL, "custom-op library %s cannot be loaded: %s", path, reason ? reason : "dlopen failed");
  }
  OrtStatus* status = register_from(options, library, path, "RegisterCustomOps");
  if (status != NULL) {
    dlclose(library);
    return status;
  }
  if (handle != NULL) *handle = library; /* the program closes it after its sessions, as with ONNX Runtime */
  return NULL; /* else kept open for the process's life (ONNX Runtime would close it with its environment) */
}

static OrtStatus* forwarded_RegisterCustomOpsLibrary(OrtSessionOptions* options, const char* path, void** handle) {
  if (handle == NULL)
    return ott_status(ORT_INVALID_ARGUMENT, "RegisterCustomOpsLibrary: library_handle: expected a non-NULL "
                      "pointer, got NULL");
  return open_library(options, path, handle);
}

static OrtStatus* forwarded_RegisterCustomOpsLibrary_V2(OrtSessionOptions* options, const ORTCHAR_T* path) {
  return open_library(options, path, NULL);
}

static OrtStatus* forwarded_RegisterCustomOpsUsingFunction(OrtSessionOptions* options, const char* name) {
  if (options == NULL || name == NULL)
    return ott_status(ORT_INVALID_ARGUMENT, "RegisterCustomOpsUsingFunction: %s: expected a non-NULL pointer, got "
                      "NULL", options == NULL ? "options" : "registration_func_name");
  return register_from(options, RTLD_DEFAULT, "of the program", name);
}

void ott_custom_ops_install(void** table, const void* const* real, const OrtApiBase* forwarded_base) {
  g_real = real;
  g_forwarded_base = forwarded_base;
  table[OTT_ORT_CreateCustomOpDomain] = (void*)forwarded_CreateCustomOpDomain;
  table[OTT_ORT_CustomOpDomain_Add] = (void*)forwarded_CustomOpDomain_Add;
  table[OTT_ORT_AddCustomOpDomain] = (void*)forwarded_AddCustomOpDomain;
  table[OTT_ORT_ReleaseCustomOpDomain] = (void*)forwarded_ReleaseCustomOpDomain;
  table[OTT_ORT_RegisterCustomOpsLibrary] = (void*)forwarded_RegisterCustomOpsLibrary;
  table[OTT_ORT_RegisterCustomOpsLibrary_V2] = (void*)forwarded_RegisterCustomOpsLibrary_V2;
  table[OTT_ORT_RegisterCustomOpsUsingFunction] = (void*)forwarded_RegisterCustomOpsUsingFunction;
  table[OTT_ORT_ReleaseSessionOptions] = (void*)forwarded_ReleaseSessionOptions;
  table[OTT_ORT_CloneSessionOptions] = (void*)forwarded_CloneSessionOptions;
  ott_kernel_install(table, real);
}

static PyObject* types_of(const OrtCustomOp* op, int outputs) {
  size_t count = outputs ? op->GetOutputTypeCount(op) : op->GetInputTypeCount(op);
  PyObject* types = PyList_New((Py_ssize_t)count);
  for (size_t i = 0; types != NULL && i < count; i++)
    PyList_SET_ITEM(types, i, PyLong_FromLong((long)(outputs ? op->GetOutputType(op, i) : op->GetInputType(op, i))));
  return types;
}

PyObject* ott_custom_ops_for(const OrtSessionOptions* options) {
  PyObject* found = PyList_New(0);
  if (found == NULL || options == NULL) return found;
  pthread_mutex_lock(&g_lock);
  for (const Use* use = g_uses; use != NULL; use = use->next) {
    if (use->options != options) continue;
    for (size_t i = 0; i < use->domain->op_count; i++) {
      const OrtCustomOp* op = use->domain->ops[i];
      PyObject* entry = Py_BuildValue("(ssNNN)", use->domain->name, op->GetName(op), PyLong_FromVoidPtr((void*)op),
                                      types_of(op, 0), types_of(op, 1));
      if (entry == NULL || PyList_Append(found, entry) != 0) {
        Py_XDECREF(entry);
        Py_CLEAR(found);
        break;
      }
      Py_DECREF(entry);
    }
    if (found == NULL) break;
  }
  pthread_mutex_unlock(&g_lock);
  return found;
}
