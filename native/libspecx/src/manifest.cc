#include "manifest.h"

#include <cstdint>

#include <fstream>
#include <sstream>
#include <sys/stat.h>

#include "failure.h"
#include "json.h"

namespace specx {
namespace {

using json::Value;

struct Reader {
  std::string where;  // "manifest.json [target]" ...

  [[noreturn]] void bad(const std::string& what) const {
    throw artifact_error(where + ": " + what);
  }
  const Value& need(const Value& obj, const std::string& key) const {
    const Value* v = obj.find(key);
    if (v == nullptr || v->is_null()) bad("no field '" + key + "'");
    return *v;
  }
  int64_t integer(const Value& obj, const std::string& key, int64_t lo, int64_t hi) const {
    const Value& v = need(obj, key);
    if (!v.is_int() || v.number < double(lo) || v.number > double(hi))
      bad("'" + key + "' must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi));
    return int64_t(v.number);
  }
  std::string text(const Value& obj, const std::string& key) const {
    const Value& v = need(obj, key);
    if (!v.is_string()) bad("'" + key + "' must be a string");
    return v.string;
  }
  std::string text_or(const Value& obj, const std::string& key, const std::string& dflt) const {
    const Value* v = obj.find(key);
    if (v == nullptr || v->is_null()) return dflt;
    if (!v->is_string()) bad("'" + key + "' must be a string");
    return v->string;
  }
};

bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == std::string::npos && name.find('\\') == std::string::npos;
}

// A graph: a plain file name, or one folder and a name (an imported graph keeps its folder).
bool graph_path(const std::string& path) {
  const size_t slash = path.find('/');
  if (slash == std::string::npos) return plain_file_name(path);
  return plain_file_name(path.substr(0, slash)) && plain_file_name(path.substr(slash + 1));
}

std::vector<TensorSpec> tensors(const Reader& r, const Value& model, const std::string& key) {
  const Value& list = r.need(model, key);
  if (!list.is_array()) r.bad("'" + key + "' must be a list");
  std::vector<TensorSpec> out;
  for (const Value& t : list.array) {
    if (!t.is_object()) r.bad("'" + key + "' holds a non-object");
    TensorSpec spec{r.text(t, "name"), r.text(t, "dtype"), 0};
    const Value& shape = r.need(t, "shape");
    if (!shape.is_array() || shape.array.size() > 8) r.bad("a tensor's shape must be a list");
    spec.rank = shape.array.size();
    if (spec.dtype != "int64" && spec.dtype != "int32" && spec.dtype != "float32" &&
        spec.dtype != "float16" && spec.dtype != "bool")
      r.bad("tensor '" + spec.name + "' has dtype '" + spec.dtype + "'");
    out.push_back(spec);
  }
  return out;
}

ModelSpec model_spec(const Value& data, const std::string& where) {
  Reader r{where};
  if (!data.is_object()) r.bad("must be an object");
  ModelSpec m;
  m.role = r.text(data, "role");
  m.name = r.text_or(data, "name", m.role);
  m.graph = r.text(data, "graph");
  if (!graph_path(m.graph))
    r.bad("graph '" + m.graph + "' is not a file name (or one folder and a file name)");
  m.architecture = r.text(data, "architecture");
  m.num_layers = int(r.integer(data, "num_layers", 1, 4096));
  m.num_heads = int(r.integer(data, "num_heads", 1, 4096));
  m.kv_heads = int(r.integer(data, "kv_heads", 1, 4096));
  m.head_dim = int(r.integer(data, "head_dim", 1, 4096));
  m.hidden_size = int(r.integer(data, "hidden_size", 1, 1048576));
  m.vocab_size = r.integer(data, "vocab_size", 1, 16777216);
  m.max_length = r.integer(data, "max_length", 2, 2147483647);
  m.dtype = r.text(data, "dtype");
  if (m.dtype != "float32" && m.dtype != "float16") r.bad("dtype '" + m.dtype + "'");
  m.variant = r.text_or(data, "variant", "fp32");
  m.pair_id = r.text_or(data, "pair_id", "");
  m.attention = r.text_or(data, "attention", "plain");
  if (m.attention != "plain" && m.attention != "gqa" && m.attention != "batched" &&
      m.attention != "concat" && m.attention != "genai")
    r.bad("attention '" + m.attention + "'");
  if (m.num_heads % m.kv_heads) r.bad("kv_heads does not divide num_heads");
  if (const Value* bytes = data.find("weight_bytes"); bytes != nullptr && !bytes->is_null())
    m.weight_bytes = r.integer(data, "weight_bytes", 0, INT64_MAX);
  m.inputs = tensors(r, data, "inputs");
  m.outputs = tensors(r, data, "outputs");
  const Value* head = data.find("head");
  m.has_head = head != nullptr && !head->is_null();
  const Value* taps = data.find("feature_layers");
  if (taps != nullptr && taps->is_array())
    m.feature_size = int64_t(taps->array.size()) * m.hidden_size;
  if (const Value* ops = data.find("operators"); ops != nullptr && ops->is_array()) {
    for (const Value& op : ops->array)
      if (op.is_string() && op.string.rfind("specx:", 0) == 0) m.specx_ops.push_back(op.string);
  }
  if (const Value* libs = data.find("op_libraries"); libs != nullptr && libs->is_array()) {
    for (const Value& lib : libs->array) {
      if (!lib.is_object()) r.bad("op_libraries holds a non-object");
      OpLibrary op{r.text(lib, "domain"), r.text(lib, "name"), r.text_or(lib, "version", ""), 0};
      if (const Value* abi = lib.find("abi"); abi != nullptr && abi->is_int()) op.abi = int(abi->number);
      m.op_libraries.push_back(op);
    }
  }
  return m;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buf;
  buf << in.rdbuf();
  if (!in.good() && !in.eof())
    throw artifact_error(path + " cannot be read");
  return buf.str();
}

}  // namespace

bool ModelSpec::has_input(const std::string& n) const {
  for (const TensorSpec& t : inputs)
    if (t.name == n) return true;
  return false;
}

const ModelSpec* Manifest::find_draft(const std::string& name) const {
  for (const ModelSpec& d : drafts)
    if (d.name == name) return &d;
  return nullptr;
}

Manifest read_manifest(const std::string& folder) {
  struct stat st {};
  if (stat(folder.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw artifact_error(folder + " is not a folder",
                         "pass the folder written by `specx export -o FOLDER`");
  std::string path = folder + "/manifest.json";
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    throw artifact_error(folder + " holds no manifest.json",
                         "pass the folder written by `specx export -o FOLDER`, or re-export");
  Value data;
  try {
    data = json::parse(read_file(path));
  } catch (const std::runtime_error& e) {
    if (dynamic_cast<const Failure*>(&e) != nullptr) throw;
    throw artifact_error(path + " cannot be read as JSON: " + e.what(), "re-export");
  }
  Reader r{path};
  if (!data.is_object()) r.bad("does not hold a JSON object");
  const Value* version = data.find("format_version");
  if (version == nullptr || !version->is_int()) r.bad("no integer format_version");
  Manifest m;
  m.format_version = int(version->number);
  if (m.format_version > kFormatVersion)
    throw artifact_error(path + " has format version " + std::to_string(m.format_version) +
                             ", newer than this libspecx understands (" +
                             std::to_string(kFormatVersion) + ")",
                         "upgrade libspecx, or re-export the artifact with this version");
  m.pair_id = r.text(data, "pair_id");
  m.max_length = r.integer(data, "max_length", 2, 2147483647);
  m.tokenizer = r.text(data, "tokenizer");
  m.target = model_spec(r.need(data, "target"), path + " [target]");
  if (const Value* drafts = data.find("drafts"); drafts != nullptr && drafts->is_array()) {
    for (size_t i = 0; i < drafts->array.size(); ++i) {
      m.drafts.push_back(
          model_spec(drafts->array[i], path + " [drafts][" + std::to_string(i) + "]"));
      for (size_t j = 0; j < i; ++j)
        if (m.drafts[j].name == m.drafts[i].name)
          r.bad("two drafts are named '" + m.drafts[i].name + "'");
    }
  }
  const Value& special = r.need(data, "special_tokens");
  if (const Value* eos = special.find("eos_token_ids"); eos != nullptr && eos->is_array()) {
    for (const Value& id : eos->array) {
      if (!id.is_int()) r.bad("special_tokens.eos_token_ids holds a non-integer");
      m.eos_token_ids.push_back(int64_t(id.number));
    }
  }
  m.default_drafter = r.text_or(data, "default_drafter", "");
  if (const Value* profile = data.find("profile"); profile != nullptr && profile->is_object()) {
    if (const Value* k = profile->find("k_default"); k != nullptr && k->is_int()) m.k_default = int(k->number);
    if (const Value* k = profile->find("k_max"); k != nullptr && k->is_int()) m.k_max = int(k->number);
  }
  std::vector<const ModelSpec*> models{&m.target};
  for (const ModelSpec& d : m.drafts) models.push_back(&d);
  for (const ModelSpec* spec : models) {
    if (m.max_length > spec->max_length)
      r.bad("max_length " + std::to_string(m.max_length) + " exceeds the " +
            std::to_string(spec->max_length) + " positions of " + spec->graph);
  }
  return m;
}

}  // namespace specx
