// The table of live handles: every object the runtime hands a caller is registered with its kind when made and
// unregistered when released, and every handle an entry point takes is looked up (kind included) before it is
// touched. A released handle's memory is not reused before many more handles were released, so a stale one is
// recognised as released rather than mistaken for a newer object at the same address.
#include <array>
#include <cstdio>
#include <mutex>
#include <vector>

#include "ott_packaged.h"

namespace ott {
namespace {

constexpr size_t kReleasedKept = 1024;
const char kErasedMark = 0;
const void* const kErased = &kErasedMark;  // an erased slot's handle: an address no handle has

// The live handles: an open-addressing set of (handle, kind) whose capacity is a power of two, probed linearly.
class LiveSet {
 public:
  const Kind* find(const void* handle) const {
    if (handle == nullptr || handle == kErased) return nullptr;  // the marks of free slots are never handles
    for (size_t at = slot_of(handle);; at = (at + 1) & mask()) {
      if (slots_[at].handle == handle) return &slots_[at].kind;
      if (slots_[at].handle == nullptr) return nullptr;
    }
  }
  void insert(const void* handle, Kind kind) {
    if (2 * (used_ + 1) > slots_.size()) grow();
    size_t at = slot_of(handle);
    while (slots_[at].handle != nullptr && slots_[at].handle != kErased) at = (at + 1) & mask();
    used_ += slots_[at].handle == nullptr;
    live_++;
    slots_[at] = {handle, kind};
  }
  void erase(const void* handle) {
    for (size_t at = slot_of(handle); slots_[at].handle != nullptr; at = (at + 1) & mask())
      if (slots_[at].handle == handle) {
        slots_[at].handle = kErased;
        live_--;
        return;
      }
  }

 private:
  struct Slot {
    const void* handle;  // nullptr: never used; kErased: erased
    Kind kind;
  };
  size_t mask() const { return slots_.size() - 1; }
  size_t slot_of(const void* handle) const {  // Fibonacci hashing of the address
    return size_t((uintptr_t(handle) >> 4) * 0x9E3779B97F4A7C15ull >> 32) & mask();
  }
  void grow() {  // to at least four slots per live handle, the erased ones dropped
    size_t capacity = 64;
    while (capacity < 4 * (live_ + 1)) capacity *= 2;
    std::vector<Slot> held(capacity, Slot{nullptr, Kind::env});
    held.swap(slots_);
    used_ = live_ = 0;
    for (const Slot& slot : held)
      if (slot.handle != nullptr && slot.handle != kErased) insert(slot.handle, slot.kind);
  }
  std::vector<Slot> slots_ = std::vector<Slot>(64, Slot{nullptr, Kind::env});
  size_t used_ = 0;  // slots not empty, erased ones included
  size_t live_ = 0;
};

struct Registry {
  std::mutex lock;
  LiveSet live;
  std::array<std::pair<void*, Kind>, kReleasedKept> released{};  // destroyed objects whose memory is kept
  size_t next = 0;
};

// Never destroyed: a handle released from an exit handler or another thread at exit still finds the table.
Registry& registry() {
  static Registry* table = new Registry;
  return *table;
}

const char* named(Kind kind) {
  switch (kind) {
    case Kind::env: return "an env";
    case Kind::session_options: return "a session options";
    case Kind::run_options: return "a run options";
    case Kind::memory_info: return "a memory info";
    case Kind::allocator: return "an allocator";
    case Kind::value: return "a value";
    case Kind::type_and_shape_info: return "a tensor type and shape info";
    case Kind::checkpoint_state: return "a checkpoint state";
    case Kind::training_session: return "a training session";
    case Kind::inference_session: return "an inference session";
  }
  return "a handle";
}

// The name of kind without its article ("value", "checkpoint state").
std::string bare(Kind kind) {
  std::string text = named(kind);
  return text.substr(text.find(' ') + 1);
}

// The kind of a released handle whose memory is still kept, if handle is one (the table locked by the caller).
const Kind* released_kind(const Registry& table, const void* handle) {
  for (const auto& [memory, kind] : table.released)
    if (memory == handle) return &kind;
  return nullptr;
}

// Why handle is not a live one of kind (the table locked by the caller).
Error refusal(const Registry& table, const void* handle, Kind kind, const std::string& what) {
  if (const Kind* live = table.live.find(handle))
    return invalid_argument(what + " is " + named(*live) + ", expected " + named(kind));
  if (const Kind* was = released_kind(table, handle))
    return invalid_argument(what + " is a released " + bare(*was) +
                            (*was == kind ? "" : ", expected " + std::string(named(kind))));
  return invalid_argument(what + " is a released or unknown handle, expected " + named(kind));
}

}  // namespace

void register_handle(const void* handle, Kind kind) {
  Registry& table = registry();
  std::lock_guard<std::mutex> guard(table.lock);
  table.live.insert(handle, kind);
}

void check_handle(const void* handle, Kind kind, const char* what) {
  if (handle == nullptr) throw invalid_argument(std::string(what) + " is NULL");
  Registry& table = registry();
  std::lock_guard<std::mutex> guard(table.lock);
  const Kind* live = table.live.find(handle);
  if (live == nullptr || *live != kind) throw refusal(table, handle, kind, what);
}

void check_handles(const void* const* handles, size_t count, Kind kind, const char* what, bool null_allowed) {
  Registry& table = registry();
  if (count == 0) return;
  std::lock_guard<std::mutex> guard(table.lock);
  for (size_t i = 0; i < count; i++) {
    if (handles[i] == nullptr && null_allowed) continue;
    const Kind* live = handles[i] == nullptr ? nullptr : table.live.find(handles[i]);
    if (live != nullptr && *live == kind) continue;
    std::string item = std::string(what) + "[" + std::to_string(i) + "]";
    if (handles[i] == nullptr) throw invalid_argument(item + " is NULL");
    throw refusal(table, handles[i], kind, item);
  }
}

OrtAllocator* check_allocator(OrtAllocator* allocator, const char* what) {
  if (allocator == nullptr) throw invalid_argument(std::string(what) + " is NULL");
  Registry& table = registry();
  std::lock_guard<std::mutex> guard(table.lock);
  const Kind* live = table.live.find(allocator);
  if (live != nullptr && *live == Kind::allocator) return allocator;
  if (live != nullptr || released_kind(table, allocator) != nullptr)
    throw refusal(table, allocator, Kind::allocator, what);
  // Not one of the runtime's: the caller's own OrtAllocator (ORT's API lets a program implement one).
  if (allocator->version < 1 || allocator->version > ORT_API_VERSION || allocator->Alloc == nullptr ||
      allocator->Free == nullptr)
    throw invalid_argument(std::string(what) + " is a released or unknown handle, expected an allocator (as the "
                           "caller's own OrtAllocator: version " + std::to_string(allocator->version) +
                           ", Alloc and Free must be set)");
  return allocator;
}

bool unregister_handle(const void* handle, Kind kind, const char* release) {
  if (handle == nullptr) return false;
  Registry& table = registry();
  std::unique_lock<std::mutex> guard(table.lock);
  const Kind* live = table.live.find(handle);
  if (live != nullptr && *live == kind) {
    table.live.erase(handle);
    return true;
  }
  std::string why = refusal(table, handle, kind, "the handle").what();
  guard.unlock();
  std::fprintf(stderr, "libort_torch_train_packaged: %s(%p): %s; ignored\n", release, handle, why.c_str());
  return false;
}

void retire(void* memory, Kind kind) {
  Registry& table = registry();
  void* oldest;
  {
    std::lock_guard<std::mutex> guard(table.lock);
    oldest = table.released[table.next].first;
    table.released[table.next] = {memory, kind};
    table.next = (table.next + 1) % kReleasedKept;
  }
  ::operator delete(oldest);  // its address may now be reused
}

}  // namespace ott
