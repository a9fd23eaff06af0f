//===- JsonFields.h - Checked fields of a JSON manifest ---------*- C++ -*-===//
//
// Part of flashopt.
//
//===----------------------------------------------------------------------===//
///
/// \file
/// JsonFields: the members of a JSON document read with their type checked,
/// every failure a ManifestError naming the file and the field's path
/// ("<file>: field 'states[1].encoding.compand': ..."). The manifest reader
/// (ManifestReader.cpp) is written over it. Private to abi/src.
///
//===----------------------------------------------------------------------===//

#ifndef FLASHOPT_ABI_SRC_JSONFIELDS_H
#define FLASHOPT_ABI_SRC_JSONFIELDS_H

#include "flashopt/abi/DType.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

namespace flashopt::abi::detail {

using json = nlohmann::json;

/// Thrown inside the parser only; always caught in parse_manifest.
struct ManifestError {
  std::string message;
};

/// `s` in double quotes, as messages show values.
inline std::string quote(const std::string &s) { return "\"" + s + "\""; }

/// `j` as JSON text, cut to 60 characters.
inline std::string describe(const json &j) {
  std::string s = j.dump();
  if (s.size() > 60)
    s = s.substr(0, 57) + "...";
  return s;
}

/// The JSON type of `j` ("null", "string", "number", ...).
inline std::string typeName(const json &j) {
  return j.is_null() ? "null" : std::string(j.type_name());
}

/// Typed, checked access to members; the manifest Parser derives from it.
class JsonFields {
public:
  /// `origin` (the file) starts every message.
  explicit JsonFields(std::string origin) : origin_(std::move(origin)) {}

  /// Throws "<origin>: field '<field>': <what>" (no field: "<origin>: <what>").
  [[noreturn]] void fail(const std::string &field, const std::string &what) {
    if (field.empty())
      throw ManifestError{origin_ + ": " + what};
    throw ManifestError{origin_ + ": field '" + field + "': " + what};
  }

  /// The path of member `key` of `path` ("a.b").
  static std::string join(const std::string &path, const std::string &key) {
    return path.empty() ? key : path + "." + key;
  }
  /// The path of element `i` of `path` ("a[i]").
  static std::string index(const std::string &path, size_t i) {
    return path + "[" + std::to_string(i) + "]";
  }

  /// Member `key` of `obj` (at `path`); "missing" when absent.
  const json &member(const json &obj, const std::string &path,
                     const std::string &key) {
    auto it = obj.find(key);
    if (it == obj.end())
      fail(join(path, key), "missing");
    return *it;
  }

  /// The member, which must be an object.
  const json &object(const json &obj, const std::string &path,
                     const std::string &key) {
    const json &v = member(obj, path, key);
    if (!v.is_object())
      fail(join(path, key), "expected an object, got " + typeName(v));
    return v;
  }

  /// The member, which must be an array.
  const json &array(const json &obj, const std::string &path,
                    const std::string &key) {
    const json &v = member(obj, path, key);
    if (!v.is_array())
      fail(join(path, key), "expected an array, got " + typeName(v));
    return v;
  }

  /// The member, which must be a string (and, with `nonEmpty`, not "").
  std::string string(const json &obj, const std::string &path,
                     const std::string &key, bool nonEmpty = true) {
    const json &v = member(obj, path, key);
    if (!v.is_string())
      fail(join(path, key),
           "expected a string, got " + typeName(v) + " " + describe(v));
    std::string s = v.get<std::string>();
    if (nonEmpty && s.empty())
      fail(join(path, key), "must not be empty");
    return s;
  }

  /// The member, which must be an integer.
  int64_t integer(const json &obj, const std::string &path,
                  const std::string &key) {
    const json &v = member(obj, path, key);
    if (!v.is_number_integer())
      fail(join(path, key),
           "expected an integer, got " + typeName(v) + " " + describe(v));
    return v.get<int64_t>();
  }

  /// The member, which must be a number.
  double number(const json &obj, const std::string &path,
                const std::string &key) {
    const json &v = member(obj, path, key);
    if (!v.is_number())
      fail(join(path, key),
           "expected a number, got " + typeName(v) + " " + describe(v));
    return v.get<double>();
  }

  /// The member, a dtype name among `allowed` (`context` is added to the
  /// message that lists them).
  DType dtype(const json &obj, const std::string &path, const std::string &key,
              std::initializer_list<DType> allowed, const char *context) {
    std::string s = string(obj, path, key);
    std::optional<DType> t = parse_dtype(s);
    bool ok =
        t && std::find(allowed.begin(), allowed.end(), *t) != allowed.end();
    if (!ok) {
      std::string list;
      for (DType a : allowed)
        list += std::string(list.empty() ? "" : ", ") + dtype_name(a);
      fail(join(path, key),
           std::string("expected one of ") + list +
               (context ? std::string(" (") + context + ")" : "") + ", got " +
               quote(s));
    }
    return *t;
  }

  /// Calls `fn(element, path, i)` for each element of array `key` of `obj`,
  /// each of which must be an object.
  template <typename Fn>
  void forEachObject(const json &obj, const std::string &key, Fn &&fn) {
    const json &a = array(obj, "", key);
    for (size_t i = 0; i < a.size(); ++i) {
      std::string p = index(key, i);
      if (!a[i].is_object())
        fail(p, "expected an object, got " + typeName(a[i]));
      fn(a[i], p, i);
    }
  }

protected:
  std::string origin_;
};

} // namespace flashopt::abi::detail

#endif // FLASHOPT_ABI_SRC_JSONFIELDS_H
