// ORT's ODTC checkpoint (FlatBuffers, file identifier "ODTC", version 2): the reader of the untrusted file, every
// offset, size and count bounds-checked (as ort_torch_train/checkpoint/odtc_walk.py walks it).
#include <algorithm>
#include <cstring>

#include "ott_packaged.h"

namespace ott {
namespace {

constexpr int32_t kVersion = 2;

Error bad(const std::string& message) { return Error(ORT_INVALID_ARGUMENT, "Checkpoint is invalid. " + message); }

// A view of the buffer whose every read is checked against its size.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  template <typename T>
  T read(size_t at, const char* what) const {
    if (at > size_ || size_ - at < sizeof(T)) throw bad(std::string(what) + " lies outside the buffer.");
    T value;
    std::memcpy(&value, data_ + at, sizeof(T));
    return value;
  }
  size_t follow(size_t at, const char* what) const {  // a uoffset: the position it points to
    uint64_t target = uint64_t(at) + read<uint32_t>(at, what);
    if (target >= size_) throw bad(std::string(what) + " points outside the buffer.");
    return size_t(target);
  }
  const uint8_t* bytes(size_t at, size_t count, const char* what) const {
    if (at > size_ || size_ - at < count) throw bad(std::string(what) + " lies outside the buffer.");
    return data_ + at;
  }
  size_t size() const { return size_; }

 private:
  const uint8_t* data_;
  size_t size_;
};

// One table: its fields found through its vtable.
struct Table {
  const Reader* buf;
  size_t at;
  size_t vtable;
  uint16_t vtable_size;
  Table(const Reader& reader, size_t position, const char* what) : buf(&reader), at(position) {
    int64_t vt = int64_t(position) - reader.read<int32_t>(position, what);
    if (vt < 0 || size_t(vt) >= reader.size()) throw bad(std::string(what) + "'s vtable lies outside the buffer.");
    vtable = size_t(vt);
    vtable_size = reader.read<uint16_t>(vtable, what);
    if (vtable_size < 4 || vtable_size % 2) throw bad(std::string(what) + " has a malformed vtable.");
    reader.bytes(vtable, vtable_size, what);
  }
  size_t field(int slot) const {  // 0: absent
    size_t entry = 4 + 2 * size_t(slot);
    if (entry + 2 > vtable_size) return 0;
    uint16_t offset = buf->read<uint16_t>(vtable + entry, "a vtable entry");
    return offset == 0 ? 0 : at + offset;
  }
  template <typename T>
  T scalar(int slot, T fallback, const char* what) const {
    size_t where = field(slot);
    return where ? buf->read<T>(where, what) : fallback;
  }
  bool has(int slot) const { return field(slot) != 0; }
  size_t vector(int slot, uint32_t element, uint32_t* count, const char* what) const {  // 0: absent
    size_t where = field(slot);
    if (!where) return 0;
    size_t start = buf->follow(where, what);
    *count = buf->read<uint32_t>(start, what);
    buf->bytes(start + 4, size_t(*count) * element, what);
    return start + 4;
  }
  std::string string(int slot, const char* what) const {
    uint32_t count = 0;
    size_t start = vector(slot, 1, &count, what);
    if (!start) throw bad(std::string(what) + " is missing.");
    return std::string(reinterpret_cast<const char*>(buf->bytes(start, count, what)), count);
  }
  std::vector<Table> tables(int slot, const char* what, bool* present) const {
    uint32_t count = 0;
    size_t start = vector(slot, 4, &count, what);
    *present = start != 0;
    std::vector<Table> found;
    for (uint32_t i = 0; i < count; i++) found.emplace_back(*buf, buf->follow(start + 4 * size_t(i), what), what);
    return found;
  }
};

Named read_tensor(const Table& table) {
  Named named;
  named.name = table.string(0, "a tensor's name");
  uint32_t rank = 0;
  size_t dims_at = table.vector(2, 8, &rank, "a tensor's dims");
  if (!dims_at) throw bad("tensor '" + named.name + "' has no dims.");
  std::vector<int64_t> dims(rank);
  int64_t count = 1;
  for (uint32_t i = 0; i < rank; i++) {
    dims[i] = table.buf->read<int64_t>(dims_at + 8 * size_t(i), "a tensor's dims");
    if (dims[i] < 0 || (dims[i] > 0 && count > (int64_t(1) << 40) / dims[i]))
      throw bad("tensor '" + named.name + "' has dims whose size is negative or too large.");
    count *= dims[i];
  }
  if (table.scalar<int64_t>(6, -1, "external_data_offset") >= 0)
    throw Error(ORT_NOT_IMPLEMENTED, "checkpoint tensor '" + named.name +
                                         "' is in an external data file; the packaged runtime reads inline data only");
  at::ScalarType type = scalar_type(table.scalar<int32_t>(3, 0, "data_type"), "tensor '" + named.name + "'");
  uint32_t length = 0;
  size_t raw = table.vector(4, 1, &length, "raw_data");
  size_t needed = size_t(count) * at::elementSize(type);
  if (!raw || length != needed)
    throw bad("tensor '" + named.name + "' holds " + std::to_string(length) + " bytes of raw_data; its dims need " +
              std::to_string(needed) + ".");
  named.tensor = at::empty(dims, at::TensorOptions().dtype(type));
  if (needed) std::memcpy(named.tensor.data_ptr(), table.buf->bytes(raw, needed, "raw_data"), needed);
  return named;
}

std::vector<Named> read_tensors(const Table& table, int slot, const char* what) {
  bool present = false;
  std::vector<Named> tensors;
  for (const Table& item : table.tables(slot, what, &present)) tensors.push_back(read_tensor(item));
  if (!present) throw bad(std::string(what) + " is missing.");
  for (size_t i = 0; i < tensors.size(); i++)
    for (size_t j = 0; j < i; j++)
      if (tensors[i].name == tensors[j].name) throw bad(std::string(what) + " holds '" + tensors[i].name + "' twice.");
  return tensors;
}

}  // namespace

at::Tensor* CheckpointData::find(const std::string& name) {
  for (auto* list : {&trainable, &frozen})
    for (Named& named : *list)
      if (named.name == name) return &named.tensor;
  return nullptr;
}

CheckpointData read_checkpoint(const uint8_t* data, size_t size) {
  Reader buf(data, size);
  if (size < 8 || std::memcmp(data + 4, "ODTC", 4) != 0) throw bad("The file identifier is not ODTC.");
  Table root(buf, buf.follow(0, "the root table"), "the root table");
  if (root.scalar<int32_t>(0, 0, "version") != kVersion)
    throw bad("Checkpoint version " + std::to_string(root.scalar<int32_t>(0, 0, "version")) +
              " is not supported (this reader supports version 2 only).");
  CheckpointData state;
  if (root.has(1)) {
    Table module(buf, buf.follow(root.field(1), "module_state"), "module_state");
    state.trainable = read_tensors(module, 0, "module_state.requires_grad_params");
    state.frozen = read_tensors(module, 1, "module_state.frozen_params");
    state.is_nominal = module.scalar<uint8_t>(2, 0, "is_nominal_state") != 0;
    if (module.scalar<uint8_t>(3, 0, "has_external_data"))
      throw Error(ORT_NOT_IMPLEMENTED, "the checkpoint keeps its data in an external file; the packaged runtime "
                                       "reads inline data only");
    for (const Named& named : state.trainable)
      for (const Named& other : state.frozen)
        if (named.name == other.name) throw bad("module_state holds '" + named.name + "' twice.");
  }
  bool present = false;
  std::vector<Table> groups = root.tables(2, "optimizer_groups", &present);
  if (groups.size() > 1) throw Error(ORT_NOT_IMPLEMENTED, "the checkpoint has more than one optimizer group");
  for (const Table& group : groups) {
    state.has_optimizer = true;
    state.optimizer.name = group.string(0, "group_name");
    state.optimizer.step = group.scalar<int64_t>(1, 0, "step");
    state.optimizer.initial_learning_rate = group.scalar<float>(2, 0.0f, "initial_learning_rate");
    for (const Table& param : group.tables(3, "optimizer_states", &present)) {
      std::string name = param.string(0, "param_name");
      if (state.optimizer.momentums.count(name)) throw bad("the optimizer group lists '" + name + "' twice.");
      state.optimizer.momentums[name] = read_tensors(param, 1, "momentums");
    }
    if (!present) throw bad("the optimizer group has no optimizer_states.");
  }
  if (root.has(3)) {
    Table bag(buf, buf.follow(root.field(3), "property_bag"), "property_bag");
    for (int kind = 0; kind < 3; kind++)
      for (const Table& item : bag.tables(kind, "a property list", &present)) {
        Property property;
        property.name = item.string(0, "a property's name");
        property.kind = kind;
        if (kind == 0) property.int_value = item.scalar<int64_t>(1, 0, "a property's value");
        if (kind == 1) property.float_value = item.scalar<float>(1, 0.0f, "a property's value");
        if (kind == 2) property.string_value = item.string(1, "a property's value");
        for (const Property& other : state.properties)
          if (other.name == property.name) throw bad("property_bag holds '" + property.name + "' twice.");
        state.properties.push_back(property);
      }
  }
  return state;
}

}  // namespace ott
