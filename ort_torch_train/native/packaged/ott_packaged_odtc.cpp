// ORT's ODTC checkpoint (FlatBuffers, file identifier "ODTC", version 2): a bounds-checked reader of the untrusted
// file, and a writer building the buffer call for call as ort_torch_train/checkpoint/odtc_write.py (and ORT's
// save::FromCheckpointState) does, so that the bytes equal the Python engine's.
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

namespace {

// The FlatBuffers builder as python-flatbuffers' Builder works: back to front, alignment relative to the end,
// vtables shared when equal.
class Builder {
 public:
  size_t offset() const { return bytes_.size(); }
  void prep(size_t size, size_t additional) {
    minalign_ = std::max(minalign_, size);
    size_t align = (~(offset() + additional) + 1) & (size - 1);
    pad(align);
  }
  void pad(size_t count) { bytes_.insert(bytes_.end(), count, 0); }
  template <typename T>
  void place(T value) {  // stored reversed: the buffer is the reverse of bytes_
    uint8_t raw[sizeof(T)];
    std::memcpy(raw, &value, sizeof(T));
    for (size_t i = sizeof(T); i-- > 0;) bytes_.push_back(raw[i]);
  }
  template <typename T>
  void prepend(T value) {
    prep(sizeof(T), 0);
    place(value);
  }
  void prepend_offset(size_t target) {
    prep(4, 0);
    place(uint32_t(offset() - target + 4));
  }
  template <typename T>
  void slot(int index, T value, T fallback) {
    if (value == fallback) return;
    prepend(value);
    vtable_[size_t(index)] = offset();
  }
  void offset_slot(int index, size_t target) {
    if (target == 0) return;
    prepend_offset(target);
    vtable_[size_t(index)] = offset();
  }
  void start_object(size_t fields) {
    vtable_.assign(fields, 0);
    object_end_ = offset();
  }
  size_t end_object();
  void start_vector(size_t element, size_t count, size_t alignment) {
    prep(4, element * count);
    prep(alignment, element * count);
    vector_count_ = count;
  }
  size_t end_vector() {
    place(uint32_t(vector_count_));
    return offset();
  }
  size_t string(const std::string& text) {
    prep(4, text.size() + 1);
    place(uint8_t(0));
    bytes_.insert(bytes_.end(), text.rbegin(), text.rend());
    vector_count_ = text.size();
    return end_vector();
  }
  size_t byte_vector(const uint8_t* data, size_t size) {
    prep(4, size);
    for (size_t i = size; i-- > 0;) bytes_.push_back(data[i]);
    vector_count_ = size;
    return end_vector();
  }
  size_t offsets(const std::vector<size_t>& targets) {
    start_vector(4, targets.size(), 4);
    for (size_t i = targets.size(); i-- > 0;) prepend_offset(targets[i]);
    return end_vector();
  }
  std::vector<uint8_t> finish(size_t root, const char identifier[4]) {
    prep(minalign_, 8);
    prep(4, 4);
    for (int i = 3; i >= 0; i--) place(uint8_t(identifier[i]));
    prepend_offset(root);
    return std::vector<uint8_t>(bytes_.rbegin(), bytes_.rend());
  }

 private:
  std::vector<uint8_t> bytes_;  // reversed
  std::vector<size_t> vtable_;
  std::map<std::vector<size_t>, size_t> vtables_;  // key -> offset of a vtable written
  size_t object_end_ = 0, vector_count_ = 0, minalign_ = 1;
};

size_t Builder::end_object() {
  prepend(int32_t(0));
  size_t object = offset();
  std::vector<size_t> key;
  bool trim = true;
  size_t trailing = 0;
  for (size_t i = vtable_.size(); i-- > 0;) {
    if (vtable_[i] == 0 && trim) {
      trailing++;
      continue;
    }
    trim = false;
    key.push_back(vtable_[i] ? object - vtable_[i] : 0);
  }
  key.push_back(object - object_end_);
  auto found = vtables_.find(key);
  size_t vtable;
  if (found == vtables_.end()) {
    for (size_t i = 0; i + 1 < key.size(); i++) prepend(uint16_t(key[i]));
    prepend(uint16_t(object - object_end_));
    prepend(uint16_t((vtable_.size() - trailing + 2) * 2));
    vtable = offset();
    vtables_[key] = vtable;
  } else {
    vtable = found->second;
  }
  int32_t relative = int32_t(int64_t(vtable) - int64_t(object));
  if (found != vtables_.end()) bytes_.resize(object);  // nothing was written past the object
  uint8_t raw[4];
  std::memcpy(raw, &relative, 4);
  for (int i = 0; i < 4; i++) bytes_[object - 1 - size_t(i)] = raw[i];
  return object;
}

size_t write_tensor(Builder& b, const Named& named, bool nominal) {
  size_t name = b.string(named.name);
  std::vector<int64_t> dims = named.tensor.sizes().vec();
  if (nominal && named.tensor.numel() == 0) dims.clear();
  b.start_vector(8, dims.size(), dims.empty() ? 4 : 8);
  for (size_t i = dims.size(); i-- > 0;) b.prepend(dims[i]);
  size_t dims_at = b.end_vector();
  at::Tensor data = named.tensor.contiguous();
  size_t raw = b.byte_vector(static_cast<const uint8_t*>(data.data_ptr()), data.nbytes());
  b.start_object(7);
  b.offset_slot(0, name);
  b.offset_slot(2, dims_at);
  b.slot<int32_t>(3, int32_t(onnx_type(named.tensor.scalar_type())), 0);
  b.offset_slot(4, raw);
  return b.end_object();
}

std::vector<size_t> write_tensors(Builder& b, std::vector<Named> tensors, bool nominal) {
  std::sort(tensors.begin(), tensors.end(), [](const Named& x, const Named& y) { return x.name < y.name; });
  std::vector<size_t> written;
  for (const Named& named : tensors) written.push_back(write_tensor(b, named, nominal));
  return written;
}

}  // namespace

std::vector<uint8_t> write_checkpoint(const CheckpointData& state, bool include_optimizer_state) {
  Builder b;
  size_t module = 0;
  if (!state.trainable.empty() || !state.frozen.empty()) {
    std::vector<size_t> trainable_tensors = write_tensors(b, state.trainable, state.is_nominal);
    std::vector<size_t> frozen_tensors = write_tensors(b, state.frozen, state.is_nominal);
    size_t trainable = b.offsets(trainable_tensors);
    size_t frozen = b.offsets(frozen_tensors);
    b.start_object(4);
    b.offset_slot(0, trainable);
    b.offset_slot(1, frozen);
    b.slot<uint8_t>(2, state.is_nominal, 0);
    module = b.end_object();
  }
  std::vector<size_t> groups;
  if (include_optimizer_state && state.has_optimizer) {
    std::vector<size_t> params;
    for (const auto& [param, moments] : state.optimizer.momentums) {  // std::map: sorted by name
      std::vector<size_t> tensors = write_tensors(b, moments, state.is_nominal);
      size_t name = b.string(param);
      size_t list = b.offsets(tensors);
      b.start_object(2);
      b.offset_slot(0, name);
      b.offset_slot(1, list);
      params.push_back(b.end_object());
    }
    size_t name = b.string(state.optimizer.name);
    size_t list = b.offsets(params);
    b.start_object(4);
    b.offset_slot(0, name);
    b.slot<float>(2, state.optimizer.initial_learning_rate, 0.0f);
    b.slot<int64_t>(1, state.optimizer.step, 0);
    b.offset_slot(3, list);
    groups.push_back(b.end_object());
  }
  size_t bag = 0;
  if (!state.properties.empty()) {
    std::vector<Property> sorted = state.properties;
    std::sort(sorted.begin(), sorted.end(), [](const Property& x, const Property& y) { return x.name < y.name; });
    std::vector<size_t> kinds[3];
    for (const Property& property : sorted) {
      size_t name = b.string(property.name);
      size_t value = property.kind == 2 ? b.string(property.string_value) : 0;
      b.start_object(2);
      b.offset_slot(0, name);
      if (property.kind == 0) b.slot<int64_t>(1, property.int_value, 0);
      if (property.kind == 1) b.slot<float>(1, property.float_value, 0.0f);
      if (property.kind == 2) b.offset_slot(1, value);
      kinds[property.kind].push_back(b.end_object());
    }
    size_t vectors[3];
    for (int kind = 0; kind < 3; kind++) vectors[kind] = b.offsets(kinds[kind]);
    b.start_object(3);
    for (int kind = 0; kind < 3; kind++) b.offset_slot(kind, vectors[kind]);
    bag = b.end_object();
  }
  size_t group_list = b.offsets(groups);
  b.start_object(4);
  b.slot<int32_t>(0, kVersion, 0);
  b.offset_slot(1, module);
  b.offset_slot(2, group_list);
  b.offset_slot(3, bag);
  return b.finish(b.end_object(), "ODTC");
}

}  // namespace ott
